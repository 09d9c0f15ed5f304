"""``python -m bench.pipeline``: silver and gold throughput on ``local[2]``, DuckDB beside it.

Generates a fleet's landing files (``pipeline.generate``: redeliveries, a day-late
backlog, malformed input), then times, in one process:

- **silver**: ``jobs.silver`` (parse, open, deduplicate exactly, quarantine, write);
- **gold**: ``jobs.gold`` (1-minute and 1-hour aggregates, gaps, fleet health, write);
- **duckdb**: the reference, the same landing files -> dedup by (gateway, seq) -> per
  sensor 1-minute and 1-hour count/min/max/mean, in one SQL statement, into Parquet.

Rows/s counts landing lines in. The JVM's start is not timed (one session serves both
phases); a first, smaller warm-up run is, separately. Needs the ``pipeline-bench`` extra.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pipeline import jobs
from pipeline.config import PipelineConfig
from pipeline.generate import Spec, generate, write_landing
from pipeline.session import build
from pipeline.storage import Layout

DUCKDB_SQL = """
COPY (
  WITH lines AS (
    SELECT topic, payload, gateway, CAST(seq AS BIGINT) AS seq,
           CAST(received AS TIMESTAMP) AS received
    FROM read_json('{landing}/date=*/hour=*/*.jsonl', format='newline_delimited',
                   columns={{topic:'VARCHAR', payload:'VARCHAR', gateway:'VARCHAR',
                             seq:'VARCHAR', received:'VARCHAR'}}, ignore_errors=true)
    WHERE gateway IS NOT NULL AND regexp_matches(seq, '^[0-9]{{1,18}}$')
  ),
  firsts AS (
    SELECT * FROM lines QUALIFY row_number() OVER (
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


def duckdb_reference(root: Path, threads: int) -> tuple[float, int]:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    con.execute("SET TimeZone = 'UTC'")
    started = time.perf_counter()
    for bucket in ("minute", "hour"):
        out = root / f"duckdb_{bucket}.parquet"
        con.execute(DUCKDB_SQL.format(landing=root / "landing", bucket=bucket, out=out))
    seconds = time.perf_counter() - started
    row = con.execute(f"SELECT sum(n) FROM '{root / 'duckdb_minute.parquet'}'").fetchone()
    return seconds, int(row[0]) if row else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="readings to generate")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ledge-pipeline-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        messages, truth = generate(Spec(readings=args.rows, envelope_gateways=0))
        write_landing(root / "main", messages)
        warm_messages, _ = generate(Spec(readings=3000, envelope_gateways=0))
        write_landing(root / "warm", warm_messages)
        lines = len(messages)
        print(f"generated {lines:,} landing lines in {time.perf_counter() - t:.0f} s", flush=True)
        del messages, warm_messages

        spark = build(args.master, {"spark.driver.memory": "2g"})
        cfg = PipelineConfig()
        t = time.perf_counter()
        jobs.run(spark, Layout(str(root / "warm")), cfg, progress=False)
        print(f"warm-up run (3,000 readings): {time.perf_counter() - t:.1f} s", flush=True)

        layout = Layout(str(root / "main"))
        t = time.perf_counter()
        silver = jobs.silver(spark, layout, cfg, progress=False)
        silver_s = time.perf_counter() - t
        t = time.perf_counter()
        gold = jobs.gold(spark, layout, cfg, progress=False)
        gold_s = time.perf_counter() - t
        spark.stop()
        if silver.readings != len(truth.readings):
            print(f"silver kept {silver.readings:,} readings, expected {len(truth.readings):,}")
            return 1

        cores = spark_cores(args.master)
        duck_s, duck_rows = duckdb_reference(root / "main", cores)
        numeric = sum(1 for s in truth.readings if s.value is not None and not s.implausible)

        total = silver_s + gold_s
        print(
            f"\n{lines:,} landing lines, {silver.readings:,} readings after dedup, on {args.master}"
        )
        print(f"{'phase':<22}{'seconds':>10}{'lines/s':>14}")
        print(f"{'spark silver':<22}{silver_s:>10.1f}{lines / silver_s:>14,.0f}")
        print(f"{'spark gold':<22}{gold_s:>10.1f}{lines / gold_s:>14,.0f}")
        print(f"{'spark silver+gold':<22}{total:>10.1f}{lines / total:>14,.0f}")
        print(f"{'duckdb dedup+aggs':<22}{duck_s:>10.1f}{lines / duck_s:>14,.0f}")
        print(f"spark / duckdb time ratio: {total / duck_s:.1f}")
        print(
            f"gold rows: {gold.rows}; duckdb counted {duck_rows:,} numeric readings in its "
            f"minute aggregates (expected about {numeric:,}: it applies no horizon or "
            "plausibility rules)"
        )
    return 0


def spark_cores(master: str) -> int:
    from pipeline.session import local_cores

    return local_cores(master) or 2


if __name__ == "__main__":
    sys.exit(main())
