"""``python -m bench.pipeline``: ``ledge-pipeline run`` as a user runs it, beside a
single-pass reference in plain PySpark, the bare session and DuckDB.

For each size (landing lines, default 0.25M, 1M and 4M) it generates a fleet's landing
files once (``pipeline.generate``: redeliveries, a day-late backlog, malformed input;
kept under ``--dir`` for the next run), then in one run, one after another (the order
turned by one each ``--repeat``):

- **spark**: ``ledge-pipeline run --master local[2]`` in a fresh process (JVM start, the
  session, silver and gold, Parquet written) on an empty root, wall clock; with the class
  archive ``ledge-pipeline prepare`` wrote, as after the install (it says which);
- **reference**: ``bench.pipeline_reference`` in a fresh process: the core work (read
  once with an explicit schema, dedup by (gateway, seq), per sensor 1-minute and 1-hour
  count/min/max/mean into Parquet) the way a competent Spark engineer would write it;
- **session**: the reference's session alone in a fresh process (the floor any Spark
  run pays);
- **duckdb**: the same rows as the reference by DuckDB, wall clock of the queries
  (DuckDB starts in microseconds);

and prints Spark/reference and reference/DuckDB with the machine's load. ``--floor``
also times, each in a fresh process, what any run
pays before its own work: the session alone, reading every landing line, and reading
and judging every line (silver's rules); and DuckDB's own query run by Spark SQL
(``SPARK_SQL``, the same rows), which tells how much of the ratio is the engine's. The
Spark run keeps an event log; from it the report shows that silver scans each landing
line once (the stages that read landing files and the lines they read) and the slowest
stages. Load on the machine is printed beside each run
(two cores shared with other jobs make single runs noisy: repeat with ``--repeat``).
Needs the ``pipeline-bench`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from bench.results import record
from pipeline.generate import Spec, generate, write_landing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The reference: dedup by (gateway, seq), first to arrive kept, then per sensor the
#: bucket's count/min/max/mean. A line whose sequence number or receive time cannot be
#: read is left out (the pipeline quarantines it): every cast is a TRY_CAST, so a malformed
#: field never fails the query (Spark 4's casts are strict).
DUCKDB_SQL = """
COPY (
  WITH lines AS (
    SELECT topic, payload, gateway, TRY_CAST(seq AS BIGINT) AS seq,
           TRY_CAST(received AS TIMESTAMP) AS received
    FROM read_json('{landing}/date=*/hour=*/*.jsonl', format='newline_delimited',
                   columns={{topic:'VARCHAR', payload:'VARCHAR', gateway:'VARCHAR',
                             seq:'VARCHAR', received:'VARCHAR'}}, ignore_errors=true)
    WHERE gateway IS NOT NULL AND regexp_matches(seq, '^[0-9]{{1,18}}$')
  ),
  firsts AS (
    SELECT * FROM lines WHERE received IS NOT NULL QUALIFY row_number() OVER (
      PARTITION BY gateway, seq ORDER BY received, payload) = 1
  ),
  readings AS (
    SELECT split_part(topic, '/', 2) AS gw, split_part(topic, '/', 4) AS device,
           split_part(topic, '/', 5) AS quantity,
           CASE WHEN json_valid(payload)
                THEN TRY_CAST(json_extract(payload, '$.value') AS DOUBLE) END AS value,
           CASE WHEN json_valid(payload)
                THEN TRY_CAST(json_extract_string(payload, '$.timestamp') AS TIMESTAMPTZ)
           END AS ts
    FROM firsts WHERE len(string_split(topic, '/')) = 5
  )
  SELECT gw, device, quantity, date_trunc('{bucket}', ts) AS start, count(*) AS n,
         min(value) AS min, max(value) AS max, avg(value) AS mean
  FROM readings WHERE value IS NOT NULL AND ts IS NOT NULL
  GROUP BY ALL
) TO '{out}' (FORMAT parquet)
"""
#: ``DUCKDB_SQL`` in Spark SQL, over the landing lines as the view ``landing_lines``
#: (``LANDING_COLUMNS``): the same rows (``spark_reference``). Spark's JSON path gives a
#: value's text (``true``, a quoted ``"Infinity"`` for a number beyond a double), where
#: DuckDB casts the JSON value: the CASE makes them agree.
SPARK_SQL = """
WITH lines AS (
  SELECT topic, payload, gateway, try_cast(seq AS BIGINT) AS seq,
         try_cast(received AS TIMESTAMP) AS received
  FROM landing_lines
  WHERE gateway IS NOT NULL AND seq RLIKE '^[0-9]{{1,18}}$'
),
firsts AS (
  SELECT * FROM (
    SELECT *, row_number() OVER (PARTITION BY gateway, seq ORDER BY received, payload) AS _n
    FROM lines WHERE received IS NOT NULL
  ) WHERE _n = 1
),
readings AS (
  SELECT split_part(topic, '/', 2) AS gw, split_part(topic, '/', 4) AS device,
         split_part(topic, '/', 5) AS quantity,
         CASE get_json_object(payload, '$.value')
           WHEN 'true' THEN 1D WHEN 'false' THEN 0D
           WHEN '"Infinity"' THEN double('inf') WHEN '"-Infinity"' THEN double('-inf')
           ELSE try_cast(get_json_object(payload, '$.value') AS DOUBLE) END AS value,
         try_cast(get_json_object(payload, '$.timestamp') AS TIMESTAMP) AS ts
  FROM firsts WHERE size(split(topic, '/')) = 5
)
SELECT gw, device, quantity, date_trunc('{bucket}', ts) AS start, count(*) AS n,
       min(value) AS min, max(value) AS max, avg(value) AS mean
FROM readings WHERE value IS NOT NULL AND ts IS NOT NULL
GROUP BY ALL
"""
LANDING_COLUMNS = "topic string, payload string, gateway string, seq string, received string"
SIZES = (250_000, 1_000_000, 4_000_000)
#: ``--floor``: what each fresh process does (each step but the last includes the ones
#: before it; the last is DuckDB's own query run by Spark instead of the pipeline).
FLOOR_STEPS = {
    "session": "JVM and session",
    "read": "+ read every landing line",
    "judge": "+ judge every line",
    "reference": "JVM and session + DuckDB's query in Spark SQL",
}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"


def landing(cache: Path, lines: int) -> tuple[Path, int]:
    """Landing files of about ``lines`` lines, generated once into ``cache``."""
    folder = cache / f"fleet-{lines}"
    done = folder / "lines.txt"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        started = time.perf_counter()
        # 1.0386 landing lines per reading asked for (redeliveries, health reports, faults)
        messages, _ = generate(Spec(readings=int(lines / 1.0386), envelope_gateways=0))
        write_landing(folder, messages)
        done.write_text(str(len(messages)))
        print(
            f"generated {len(messages):,} landing lines in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        del messages
    return folder / "landing", int(done.read_text())


def duckdb_reference(landing_dir: Path, out: Path, threads: int) -> float:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    con.execute("SET TimeZone = 'UTC'")
    started = time.perf_counter()
    for bucket in ("minute", "hour"):
        target = out / f"duckdb_{bucket}.parquet"
        con.execute(DUCKDB_SQL.format(landing=landing_dir, bucket=bucket, out=target))
    return time.perf_counter() - started


def spark_reference(spark: SparkSession, landing_dir: Path, out: Path) -> None:
    """``SPARK_SQL`` for both buckets into Parquet under ``out`` (``spark_minute/`` and
    ``spark_hour/``), as ``duckdb_reference`` does: DuckDB's own work, done by Spark."""
    lines = spark.read.schema(LANDING_COLUMNS).json(str(landing_dir))
    lines.createOrReplaceTempView("landing_lines")
    for bucket in ("minute", "hour"):
        query = spark.sql(SPARK_SQL.format(bucket=bucket))
        query.write.mode("overwrite").parquet(str(out / f"spark_{bucket}"))


@dataclass
class SparkRun:
    seconds: float
    log: str
    event_log: Path


def spark_run(landing_dir: Path, root: Path, master: str, conf: Sequence[str]) -> SparkRun:
    """``ledge-pipeline run`` in a fresh process on a root holding only the landing files."""
    root.mkdir(parents=True)
    (root / "landing").symlink_to(landing_dir)
    events = root.parent / f"{root.name}-events"
    events.mkdir()
    command = [
        sys.executable, "-m", "pipeline", "run", "--root", str(root), "--master", master,
        "--quiet", "--conf", "spark.eventLog.enabled=true",
        "--conf", f"spark.eventLog.dir={events.as_uri()}",
        "--conf", "spark.eventLog.compress=false",
        *[x for c in conf for x in ("--conf", c)],
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"ledge-pipeline run failed:\n{done.stderr[-4000:]}")
    # one file, or (rolling event logs) a folder of parts
    (log,) = list(events.iterdir())
    return SparkRun(seconds, done.stderr, log)


def read_events(path: Path) -> tuple[int, int, list[tuple[float, str]]]:
    """(stages that read landing files, landing lines they read, slowest stages)."""
    scans = lines = 0
    stages: list[tuple[float, str]] = []
    parts = sorted(path.glob("events_*")) if path.is_dir() else [path]
    for part in parts:
        for raw in part.read_text().splitlines():
            event = json.loads(raw)
            if event.get("Event") != "SparkListenerStageCompleted":
                continue
            info = event["Stage Info"]
            scopes = " ".join(r.get("Scope", "") for r in info.get("RDD Info", []))
            took = (info.get("Completion Time", 0) - info.get("Submission Time", 0)) / 1000
            stages.append((took, f"stage {info['Stage ID']}: {info['Stage Name'][:60]}"))
            if "Scan text" in scopes:
                scans += 1
                lines += sum(
                    int(a.get("Value", 0))
                    for a in info.get("Accumulables", [])
                    if a.get("Name") == "internal.metrics.input.recordsRead"
                )
    return scans, lines, sorted(stages, reverse=True)[:6]


def floor_step(step: str, landing_dir: Path, master: str) -> None:
    """One ``--floor`` step, in this (fresh) process."""
    from pyspark.sql import functions as F

    from pipeline.config import PipelineConfig
    from pipeline.jobs import read_landing
    from pipeline.session import build
    from pipeline.storage import Layout, Storage
    from pipeline.transforms import silver

    spark = build(master)
    try:
        if step == "session":
            return
        if step == "reference":
            with tempfile.TemporaryDirectory(prefix="reference-", dir=landing_dir.parent) as out:
                spark_reference(spark, landing_dir, Path(out))
            return
        layout = Layout(str(landing_dir.parent))  # (the landing files' own reader)
        lines = read_landing(spark, layout, Storage(spark).partition_dates(layout.landing))
        if step == "judge":
            # a filter on a judged column: the rules run on every line
            lines = silver.judged(lines, PipelineConfig()).where(F.col("kind").isNull())
        lines.count()
    finally:
        spark.stop()


def floors(landing_dir: Path, master: str) -> list[tuple[str, float]]:
    """Wall clock of each ``FLOOR_STEPS`` step in a fresh process."""
    out = []
    for step, label in FLOOR_STEPS.items():
        command = [
            sys.executable, "-m", "bench.pipeline", "--floor-step", step,
            "--master", master, "--dir", str(landing_dir),
        ]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        out.append((label, time.perf_counter() - started))
    return out


@dataclass
class Result:
    """One interleaved run of a size: wall clock in seconds of each contender."""

    lines: int
    spark: float
    reference: float
    session: float
    duckdb: float
    load: str
    scans: int
    read: int
    slowest: list[tuple[float, str]]


def reference_run(landing_dir: Path, out: Path, master: str, session_only: bool) -> float:
    """``bench.pipeline_reference`` in a fresh process (or its session alone), wall clock."""
    command = [
        sys.executable, "-m", "bench.pipeline_reference", str(landing_dir), str(out),
        "--master", master, *(["--session-only"] if session_only else []),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the reference failed:\n{done.stderr[-4000:]}")
    return seconds


def interleaved(
    landing_dir: Path,
    lines: int,
    tmp: Path,
    args: argparse.Namespace,
    threads: int,
    attempt: int,
) -> Result:
    """The four contenders on one size, one after another, the order turned by one each
    attempt (so none always runs first, or right after the heaviest)."""
    before = load()
    runs: list[SparkRun] = []

    def pipeline() -> float:
        runs.append(spark_run(landing_dir, tmp / "root", args.master, args.conf))
        return runs[-1].seconds

    steps: dict[str, Callable[[], float]] = {
        "spark": pipeline,
        "reference": partial(reference_run, landing_dir, tmp, args.master, session_only=False),
        "session": partial(reference_run, landing_dir, tmp, args.master, session_only=True),
        "duckdb": partial(duckdb_reference, landing_dir, tmp, threads),
    }
    turn = attempt % len(steps)
    order = [*steps][turn:] + [*steps][:turn]
    took = {name: steps[name]() for name in order}
    scans, read, slowest = read_events(runs[0].event_log)
    return Result(
        lines, took["spark"], took["reference"], took["session"], took["duckdb"], before,
        scans, read, slowest,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__)
    parser.add_argument(
        "--lines",
        type=int,
        action="append",
        help=f"landing lines (repeatable; default: {', '.join(f'{s:,}' for s in SIZES)})",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size (default: 1)")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="passed to Spark"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "ledge-pipeline-bench",
        help="where the generated landing files are kept (default: %(default)s)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the session alone, reading every line, judging every line, and "
        "DuckDB's query run by Spark SQL",
    )
    parser.add_argument("--floor-step", choices=FLOOR_STEPS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_step:
        floor_step(args.floor_step, args.dir, args.master)
        return 0
    from pipeline.session import local_cores, ready_archive

    threads = local_cores(args.master) or 2
    archive = ready_archive()
    print(f"class archive: {archive or 'none (ledge-pipeline prepare writes it)'}", flush=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for size in args.lines or SIZES:
        landing_dir, lines = landing(args.dir, size)
        for attempt in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="run-", dir=args.dir) as tmp:
                r = interleaved(landing_dir, lines, Path(tmp), args, threads, attempt)
                results.append(r)
                print(
                    f"{lines:>10,} lines  run {attempt + 1}: spark {r.spark:6.1f} s  "
                    f"reference {r.reference:6.1f} s  session {r.session:5.1f} s  "
                    f"duckdb {r.duckdb:5.1f} s  spark/reference {r.spark / r.reference:4.2f}  "
                    f"load {r.load}  landing scanned by {r.scans} stage(s), "
                    f"{r.read:,} lines read",
                    flush=True,
                )
                for took, name in r.slowest:
                    print(f"{'':14}{took:6.1f} s  {name}")
            if args.floor:
                for label, took in floors(landing_dir, args.master):
                    print(f"{'':14}{took:6.1f} s  floor: {label} (fresh process)", flush=True)
    print(
        f"\n`ledge-pipeline run --master {args.master}` beside the single-pass reference "
        "(plain PySpark), the bare session and DuckDB; each in a fresh process but DuckDB"
    )
    print(
        "| landing lines | Spark s | reference s | session s | DuckDB s | Spark/reference "
        "| reference/DuckDB | load (1/5 min) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r.lines:,} | {r.spark:.1f} | {r.reference:.1f} | {r.session:.1f} | "
            f"{r.duckdb:.1f} | {r.spark / r.reference:.2f} | {r.reference / r.duckdb:.1f} | "
            f"{r.load} |"
        )
    written = record(
        "pipeline",
        [
            {
                "lines": r.lines,
                "run_s": round(r.spark, 2),
                "reference_s": round(r.reference, 2),
                "session_s": round(r.session, 2),
                "duckdb_s": round(r.duckdb, 2),
                "load": r.load,
                "master": args.master,
            }
            for r in results
        ],
    )
    print(f"results: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
