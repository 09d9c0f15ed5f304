"""The jobs end to end over a few thousand generated landing lines with the field's faults
(redeliveries, a gateway's day-late backlog, rows beyond the horizon, implausible clocks,
every kind of malformed input), checked row for row against what was generated; re-runs
and backfills must give identical tables; stream mode must keep the late backlog.
"""

from __future__ import annotations

import io
import shutil
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import cli, jobs
from pipeline.config import PipelineConfig
from pipeline.generate import Message, Spec, Truth, generate, write_landing
from pipeline.progress import Progress
from pipeline.records import landing_line
from pipeline.report import write_report
from pipeline.storage import Layout, Storage
from pipeline.stream import stream
from pipeline.transforms import silver as silver_t

CFG = PipelineConfig()
SPEC = Spec()  # 3 gateways x 4 sensors, 3,000 readings, every fault
TABLES = (
    "silver/readings",
    "silver/health",
    "quarantine",
    *(f"gold/{t}" for t in jobs.GOLD_TABLES),
)


@pytest.fixture(scope="module")
def fleet() -> tuple[list[Message], Truth]:
    return generate(SPEC)


def split(messages: list[Message]) -> tuple[list[Message], list[Message]]:
    """What arrived on the first day, and the rest (gw0's backlog, the too-late rows...)."""
    cutoff = SPEC.start + timedelta(hours=12)
    return [m for m in messages if m.received < cutoff], [
        m for m in messages if m.received >= cutoff
    ]


def naive(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(tzinfo=None)


def snapshot(spark: SparkSession, root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows; the quarantine's ``file`` relative to the landing folder (so
    roots holding copies of the same landing files compare equal)."""
    tables = {t: jobs.table_rows(spark, str(root / t)) for t in TABLES if (root / t).exists()}
    for row in tables.get("quarantine", []):
        if row["file"]:
            row["file"] = row["file"].split("/landing/", 1)[-1]
    return tables


def check_silver(spark: SparkSession, root: Path, truth: Truth) -> None:
    """Silver holds exactly the generated readings and reports, each once."""
    got = {
        (r.bridge, r.seq): (r.value, r.text, r.timestamp, r.received, r.implausible, r.unit)
        for r in spark.read.parquet(str(root / "silver/readings")).collect()
    }
    want = {
        (s.gateway, s.seq): (
            s.value, s.text, naive(s.timestamp), naive(s.received), s.implausible, s.unit
        )
        for s in truth.readings
    }  # fmt: skip
    assert len(got) == len(want) == len(truth.readings)
    assert got == want
    health = {
        (r.bridge, r.seq): (r.timestamp, r.dropped, r.queued)
        for r in spark.read.parquet(str(root / "silver/health")).collect()
    }
    assert health == {
        (h.gateway, h.seq): (naive(h.timestamp), h.dropped, h.queued) for h in truth.health
    }
    reasons = [r.reason for r in spark.read.parquet(str(root / "quarantine")).collect()]
    assert len(reasons) == sum(truth.quarantined.values())
    for start, count in truth.quarantined.items():
        assert sum(start in reason for reason in reasons) >= count, (start, reasons)


def check_gold(spark: SparkSession, root: Path, truth: Truth) -> None:
    """Gold's minute aggregates and fleet health, recomputed here from the truth."""
    buckets: dict[tuple[str, str, datetime], list[float]] = defaultdict(list)
    for s in truth.readings:
        if s.value is not None and not s.implausible:
            minute = naive(s.timestamp).replace(second=0, microsecond=0)
            buckets[(s.gateway, f"{s.device}/{s.quantity}", minute)].append(s.value)
    got = {
        (r.gateway, f"{r.device}/{r.quantity}", r.start): (r["count"], r["min"], r["max"], r.mean)
        for r in spark.read.parquet(str(root / "gold/sensor_minute")).collect()
    }
    assert set(got) == set(buckets)
    for key, values in buckets.items():
        count, low, high, mean = got[key]
        assert (count, low, high) == (len(values), min(values), max(values))
        assert mean == pytest.approx(sum(values) / len(values))
    health = spark.read.parquet(str(root / "gold/health")).collect()
    per_gateway: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    for row in health:
        per_gateway[row.gateway] += row.messages
        dropped[row.gateway] += row.dropped
    assert per_gateway == Counter(s.gateway for s in truth.readings) + Counter(
        h.gateway for h in truth.health
    )
    assert dropped == Counter({h.gateway: 0 for h in truth.health}) + Counter(
        {g: sum(h.dropped for h in truth.health if h.gateway == g) for g in ("gw0", "gw1", "gw2")}
    )
    assert sum(r.duplicates for r in health) == sum(truth.duplicates.values())


@pytest.fixture(scope="module")
def landed(
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
    fleet: tuple[list[Message], Truth],
) -> tuple[Path, jobs.SilverResult, jobs.SilverResult]:
    """A root where the first day landed and ran, then the rest landed and ran."""
    root = tmp_path_factory.mktemp("landed")
    messages, _ = fleet
    first, rest = split(messages)
    layout = Layout(str(root))
    write_landing(root, first, name="first")
    early, _ = jobs.run(spark, layout, CFG, progress=False)
    write_landing(root, rest, name="rest")  # a day later: the backlog, too-late rows
    done, _ = jobs.run(spark, layout, CFG, progress=False)
    return root, early, done


Landed = tuple[Path, jobs.SilverResult, jobs.SilverResult]


def test_silver_is_exact_once_the_late_backlog_is_folded_in(
    spark: SparkSession, landed: Landed, fleet: tuple[list[Message], Truth]
) -> None:
    root, early, done = landed
    truth = fleet[1]
    assert 0 < early.readings < len(truth.readings)  # gw0's backlog had not landed yet
    assert done.duplicates == sum(truth.duplicates.values())
    check_silver(spark, root, truth)


def test_gold_aggregates_and_fleet_health_are_exact(
    spark: SparkSession, landed: Landed, fleet: tuple[list[Message], Truth]
) -> None:
    check_gold(spark, landed[0], fleet[1])


def test_the_report_plots_fleet_health_and_sensor_series(
    spark: SparkSession, landed: Landed
) -> None:
    root = landed[0]
    out = root / "report.html"
    data = write_report(spark, Layout(str(root)), out, days=30, max_series=3, progress=False)
    page = out.read_text()
    assert sorted(g.gateway for g in data.gateways) == ["gw0", "gw1", "gw2"]
    assert len(data.sensors) == 3
    assert page.count("<svg") >= 3 + 4 and "gw2" in page and "<script" not in page


def differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Per table: rows missing and rows extra (empty when the snapshots are equal)."""
    out = []
    for table in sorted(set(got) | set(want)):
        g, w = got.get(table, []), want.get(table, [])
        missing = [r for r in w if r not in g]
        extra = [r for r in g if r not in w]
        if missing or extra or len(g) != len(w):
            out.append(f"{table}: {len(missing)} missing e.g. {missing[:1]}, "
                       f"{len(extra)} extra e.g. {extra[:1]}")  # fmt: skip
    return out


def test_reruns_give_identical_tables(spark: SparkSession, landed: Landed) -> None:
    root = landed[0]
    before = snapshot(spark, root)
    assert set(before) == set(TABLES) and before["silver/readings"] and before["quarantine"]
    for _ in range(2):  # nothing new landed: nothing changes, however often it runs
        jobs.run(spark, Layout(str(root)), CFG, progress=False)
        assert differences(snapshot(spark, root), before) == []


def test_replace_days_writes_each_day_as_one_file_unless_told_not_to(
    spark: SparkSession, tmp_path: Path
) -> None:
    days = {date(2026, 11, 1), date(2026, 11, 2)}
    rows = [(n, date(2026, 11, 1 + n % 2)) for n in range(40)]
    frame = spark.createDataFrame(rows, "n long, date date").repartition(4)  # both days in each
    for whole in (True, False):
        table = tmp_path / str(whole)
        written = jobs.replace_days(Storage(spark), frame, str(table), days, whole_days=whole)
        assert (written.rows, written.days) == (40, days)
        files = [len(list(day.glob("*.parquet"))) for day in sorted(table.glob("date=*"))]
        assert files == [1, 1] if whole else len(files) == 2 and min(files) > 1, (whole, files)
        got = sorted(r.n for r in spark.read.parquet(str(table)).collect())
        assert got == list(range(40))


def test_a_partition_counts_when_it_holds_a_data_file_at_any_depth(
    spark: SparkSession, tmp_path: Path
) -> None:
    """And finding out starts no process (Hadoop's local file system runs ``ls`` for a
    file's owner and mode): the JVM's own record of the processes it started says so."""
    table = tmp_path / "table"
    files = [
        "date=2026-01-01/part-0.parquet",  # counts
        "date=2026-01-02/_SUCCESS",  # hidden names only
        "date=2026-01-02/.part-0.parquet.crc",
        "date=2026-01-03/more/part-0.parquet",  # counts: deeper down
        "date=2026-01-04/empty/",
        "not-a-partition/part-0.parquet",
    ]
    for name in files:
        path = table / name
        (path if name.endswith("/") else path.parent).mkdir(parents=True, exist_ok=True)
        if not name.endswith("/"):
            path.write_text("x")
    (table / "date=2026-01-05").write_text("a file, not a folder")
    jvm: Any = spark.sparkContext._jvm
    recording = jvm.jdk.jfr.Recording()
    recording.enable("jdk.ProcessStart")
    recording.start()
    try:
        days = Storage(spark).partition_dates(str(table))
    finally:
        recording.stop()
    record = jvm.java.io.File(str(tmp_path / "processes.jfr")).toPath()
    recording.dump(record)
    recording.close()
    started = [
        e.getString("command") for e in jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(record)
    ]
    assert days == [date(2026, 1, 1), date(2026, 1, 3)]
    assert [c for c in started if str(table) in c] == []


def test_every_table_but_the_readings_is_written_a_file_a_day(landed: Landed) -> None:
    """Small tables are not scattered over a file per task and day (the readings may be:
    every task holding rows of a day writes them)."""
    root = landed[0]
    checked = set()
    for table in set(TABLES) - {"silver/readings"}:
        files = {
            day.name: len(list(day.glob("*.parquet"))) for day in (root / table).glob("date=*")
        }
        assert set(files.values()) <= {1}, (table, files)
        checked |= {table} if files else set()
    assert checked >= {"silver/health", "quarantine", "gold/sensor_minute", "gold/health"}


def test_tables_store_timestamps_as_utc_microseconds(spark: SparkSession, landed: Landed) -> None:
    """Another reader (here pyarrow) gets the instants Spark wrote, in Parquet's own
    timestamp type (64-bit microseconds, UTC), not the legacy 96-bit one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = landed[0]
    checked = set()
    for table in TABLES:
        for file in (root / table).glob("date=*/*.parquet"):
            times = [f for f in pq.ParquetFile(file).schema_arrow if pa.types.is_timestamp(f.type)]
            assert times and {f.type for f in times} == {pa.timestamp("us", tz="UTC")}, file
            checked.add(table)
    assert checked >= {"silver/readings", "silver/health", "quarantine", "gold/sensor_minute"}
    read = pq.read_table(root / "silver/readings", columns=["bridge", "seq", "received"])
    theirs = {(r["bridge"], r["seq"]): r["received"].replace(tzinfo=None) for r in read.to_pylist()}
    ours = {
        (r.bridge, r.seq): r.received
        for r in spark.read.parquet(str(root / "silver/readings")).collect()
    }
    assert theirs == ours


def full_range(landed: Landed) -> tuple[date, date]:
    _, early, done = landed
    return min(early.days), max(done.days)


def test_a_backfill_rebuilds_every_table_of_an_empty_root(
    spark: SparkSession, landed: Landed, tmp_path: Path
) -> None:
    """The landing files alone, backfilled in one go, give the tables the incremental
    runs built (every table, every row)."""
    root = landed[0]
    shutil.copytree(root / "landing", tmp_path / "landing")
    jobs.backfill(spark, Layout(str(tmp_path)), CFG, *full_range(landed), progress=False)
    assert differences(snapshot(spark, tmp_path), snapshot(spark, root)) == []


def test_runs_let_go_of_the_rows_they_kept(
    spark: SparkSession, landed: Landed, tmp_path: Path
) -> None:
    """Silver's rows, kept for its writes, and the quarantine rows a backfill keeps from
    before are let go when the run ends (a stream runs silver for every batch)."""
    shutil.copytree(landed[0] / "landing", tmp_path / "landing")

    def kept() -> int:
        return int(spark.sparkContext._jsc.getPersistentRDDs().size())

    before = kept()
    layout = Layout(str(tmp_path))
    jobs.run(spark, layout, CFG, progress=False)
    assert kept() == before
    # a backfill of the last day keeps the quarantine rows judged for other days
    last = full_range(landed)[1]
    jobs.backfill(spark, layout, CFG, last, last, progress=False)
    assert kept() == before
    assert spark.read.parquet(str(tmp_path / "quarantine")).count() > 0


def test_a_local_sessions_python_workers_start_once_while_silver_is_planned(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once per application, a job of one task per core through the Python judge; none
    on a cluster, none again in the same application."""
    monkeypatch.setattr(jobs, "_python_started", set())
    tracker = spark.sparkContext.statusTracker()
    cores = spark.sparkContext.defaultParallelism

    def started(group: str) -> list[int]:
        """The tasks of each job the block ran, in the job group ``group``."""
        spark.sparkContext.setJobGroup(group, group)  # (the workers' thread inherits it)
        try:
            with jobs.python_workers_started(spark, CFG):
                pass
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        found = []
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            assert info is not None and info.status == "SUCCEEDED", info
            stages = [tracker.getStageInfo(s) for s in info.stageIds]
            found.append(sum(s.numCompletedTasks for s in stages if s is not None))
        return found

    assert started("ledge-test-first") == [cores]
    assert started("ledge-test-again") == []
    monkeypatch.setattr(jobs, "_python_started", set())
    monkeypatch.setattr(jobs, "local_cores", lambda master: 0)  # as on a cluster
    assert started("ledge-test-cluster") == []


def test_python_workers_that_do_not_start_ahead_leave_silver_to_go_on(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A judge that fails in its workers fails the job that starts them: logged, and the
    block goes on (the first task of silver's own job reports it, if it fails there too)."""
    from pyspark.sql.functions import udf

    def fail(line: str | None) -> str:
        raise RuntimeError("no worker today")

    broken = udf(fail, "string", useArrow=False)
    monkeypatch.setattr(jobs, "_python_started", set())
    monkeypatch.setattr(silver_t, "python_judge", lambda cfg: broken)
    caplog.set_level("DEBUG", logger=jobs.__name__)
    with jobs.python_workers_started(spark, CFG):
        pass
    assert "the Python workers were not started ahead" in caplog.text
    assert "no worker today" in caplog.text


def test_kept_rows_are_held_as_bytes_until_let_go(spark: SparkSession) -> None:
    """A checkpoint keeps its rows serialised, memory then disk (not an object a row, which
    the JVM's collector copies and compacts), and drops them at the end."""
    frame = spark.range(5000).selectExpr("id", "cast(id * 7 as string) as text")
    with jobs.checkpointed(frame) as kept:
        rdd = kept._jdf.queryExecution().logical().rdd()
        level = rdd.getStorageLevel()
        assert (level.useMemory(), level.useDisk(), level.deserialized()) == (True, True, False)
        assert kept.where("text = '35'").collect() == [(5, "35")]
        assert rdd.id() in spark.sparkContext._jsc.getPersistentRDDs()
    assert rdd.id() not in spark.sparkContext._jsc.getPersistentRDDs()


@pytest.mark.parametrize("by_first_query", [False, True])
def test_rows_computed_once_are_computed_once_now_or_by_the_first_query(
    spark: SparkSession, by_first_query: bool
) -> None:
    """The rows of ``computed_once`` are computed once: as the block starts, or by its
    first query; every later query reads them kept."""
    from pyspark.sql.functions import udf

    made = spark.sparkContext.accumulator(0)

    def counted(value: int) -> int:
        made.add(1)
        return value

    frame = spark.range(0, 40, 1, 2).select(udf(counted, "long", useArrow=False)("id").alias("id"))
    with jobs.computed_once(frame, by_first_query=by_first_query) as kept:
        assert made.value == (0 if by_first_query else 40)
        assert kept.where("id % 10 = 3").count() == 4
        assert made.value == 40
        assert sorted(r.id for r in kept.collect()) == list(range(40))
        assert made.value == 40


def test_a_backfill_of_the_landing_days_alone_keeps_what_they_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Into an empty root, a backfill of one landing day quarantines what that day's lines
    refused on their own, whatever day each was judged for (a plausible timestamp years
    old, beyond the horizon; a payload that is not JSON), as a run does."""
    day = date(2026, 11, 12)
    at = datetime(2026, 11, 12, 10, tzinfo=UTC)
    topic = "ledge/gw1/serial/env/t"
    payloads = (
        b'{"value":1.5,"unit":"V","timestamp":"2026-11-12T09:59:00Z"}',
        b'{"value":3.5,"unit":"V","timestamp":"2000-01-01T00:00:00+00:00"}',
        b"not json",
    )
    text = "".join(
        landing_line(topic, p, 1, False, "gw1", str(seq), at)
        for seq, p in enumerate(payloads, start=10)
    )
    roots = {how: tmp_path / how for how in ("run", "backfill")}
    for root in roots.values():
        (root / "landing" / f"date={day}" / "hour=10").mkdir(parents=True)
        (root / "landing" / f"date={day}" / "hour=10" / "x.jsonl").write_text(text)
    jobs.run(spark, Layout(str(roots["run"])), CFG, progress=False)
    jobs.backfill(spark, Layout(str(roots["backfill"])), CFG, day, day, progress=False)
    ran, backfilled = (snapshot(spark, root) for root in roots.values())
    assert sorted(r["day"] for r in ran["quarantine"]) == [date(2000, 1, 1), day]
    assert differences(backfilled, ran) == []


def test_a_backfill_repairs_a_damaged_root(
    spark: SparkSession, landed: Landed, tmp_path: Path
) -> None:
    root = landed[0]
    reference = snapshot(spark, root)
    damaged = tmp_path / "root"
    shutil.copytree(root, damaged)
    days = {t: sorted((damaged / t).glob("date=*")) for t in TABLES}
    shutil.rmtree(days["silver/readings"][1])  # a lost day
    shutil.rmtree(days["quarantine"][-1])
    shutil.rmtree(days["gold/health"][0])
    for table in ("silver/health", "gold/sensor_minute"):  # a day holding another's rows
        first, second = days[table][0], days[table][1]
        shutil.rmtree(second)
        shutil.copytree(first, second)
    assert differences(snapshot(spark, damaged), reference) != []
    jobs.backfill(spark, Layout(str(damaged)), CFG, *full_range(landed), progress=False)
    assert differences(snapshot(spark, damaged), reference) == []


def test_a_backfill_with_a_larger_horizon_folds_in_what_was_too_late(
    spark: SparkSession, landed: Landed, tmp_path: Path, fleet: tuple[list[Message], Truth]
) -> None:
    root = tmp_path / "root"
    shutil.copytree(landed[0], root)
    before = snapshot(spark, root)
    late = [r for r in before["quarantine"] if "late-data horizon" in r["reason"]]
    assert late and len(late) == fleet[1].quarantined["arrived"]
    day = min(r["day"] for r in late)
    wider = PipelineConfig(horizon_days=CFG.horizon_days + 3)
    jobs.backfill(spark, Layout(str(root)), wider, day, day, progress=False)
    after = snapshot(spark, root)
    folded = {(r["bridge"], int(r["seq"])) for r in late if r["day"] == day}
    kept = {(r["bridge"], r["seq"]): r for r in after["silver/readings"]}
    assert folded and folded <= set(kept)
    assert all(kept[k]["date"] == day and kept[k]["copies"] == 1 for k in folded)
    # ...and they left the quarantine; nothing else there changed
    assert [r for r in after["quarantine"] if r not in before["quarantine"]] == []
    assert len(before["quarantine"]) - len(after["quarantine"]) == len(folded)
    # gold counts them on that day; other days' gold is as it was
    minute = [r for r in after["gold/sensor_minute"] if r["date"] == day]
    assert sum(r["count"] for r in minute) == len(folded) + sum(
        r["count"] for r in before["gold/sensor_minute"] if r["date"] == day
    )
    for table in TABLES[:2] + TABLES[3:]:
        assert [r for r in after[table] if r["date"] != day] == [
            r for r in before[table] if r["date"] != day
        ], table


def test_a_redelivery_days_later_gives_the_same_tables_in_one_run_or_two(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A message landed on day D and again on D+5 (the lander was down): one run over
    both, a second run, and a run per landing day agree on every table (the copy is too
    late either way: it is quarantined, never folded in by one run and refused by the
    next)."""
    from drivers.model import Reading, reading_payload, reading_topic
    from pipeline.records import landing_line

    day0 = datetime(2026, 11, 10, 12, tzinfo=UTC)
    messages = []
    for i in range(6):
        r = Reading(device="env", quantity="t", value=float(i), unit="V",
                    timestamp=day0 + timedelta(minutes=i), driver="serial")  # fmt: skip
        line = landing_line(reading_topic(r, "gw1"), reading_payload(r), 1, False, "gw1",
                            str(100 + i), r.timestamp + timedelta(seconds=1))  # fmt: skip
        messages.append(Message(r.timestamp + timedelta(seconds=1), line))
        if i % 2 == 0:  # redelivered five days later
            late = r.timestamp + timedelta(days=5)
            again = landing_line(reading_topic(r, "gw1"), reading_payload(r), 1, False, "gw1",
                                 str(100 + i), late)  # fmt: skip
            messages.append(Message(late, again))
    once, twice = tmp_path / "once", tmp_path / "twice"
    write_landing(once, messages)
    jobs.run(spark, Layout(str(once)), CFG, progress=False)
    reference = snapshot(spark, once)
    jobs.run(spark, Layout(str(once)), CFG, progress=False)  # the second run of the field
    assert differences(snapshot(spark, once), reference) == []
    early = [m for m in messages if m.received < day0 + timedelta(days=1)]
    write_landing(twice, early)
    jobs.run(spark, Layout(str(twice)), CFG, progress=False)
    write_landing(twice, [m for m in messages if m not in early])
    jobs.run(spark, Layout(str(twice)), CFG, progress=False)
    assert differences(snapshot(spark, twice), reference) == []
    # The reason says what a late copy is and what a backfill would change, and that is
    # what a backfill with a larger horizon does: each late copy counted as a copy.
    reasons = [r["reason"] for r in reference["quarantine"]]
    assert len(reasons) == 3, reasons
    for reason in reasons:
        assert reason.startswith("arrived 5 days after its timestamp, beyond the late-data")
        late_copy = (
            "if it is a late copy of a message already in silver, it is not counted in "
            "copies, and a backfill with a larger horizon would count it as a copy"
        )
        assert late_copy in reason and "(backfill with a larger horizon to fold" not in reason
    assert sorted(r["copies"] for r in reference["silver/readings"]) == [1] * 6
    first = day0.date()
    jobs.backfill(
        spark, Layout(str(once)), PipelineConfig(horizon_days=5), first, first, progress=False
    )
    after = snapshot(spark, once)
    copies = {int(r["seq"]): r["copies"] for r in after["silver/readings"]}
    assert copies == {100 + i: 2 if i % 2 == 0 else 1 for i in range(6)}
    assert after["quarantine"] == []


def test_stream_mode_keeps_a_gateways_late_backlog(
    spark: SparkSession, tmp_path: Path, fleet: tuple[list[Message], Truth]
) -> None:
    messages, truth = fleet
    first, rest = split(messages)
    layout = Layout(str(tmp_path))
    write_landing(tmp_path, first, name="first")
    assert stream(spark, layout, CFG, progress=False).batches == 1
    # The backlog's timestamps are a day older than what the stream has already seen:
    # a global watermark would drop it; the stream must fold it in.
    write_landing(tmp_path, rest, name="rest")
    result = stream(spark, layout, CFG, progress=False)
    assert result.batches == 1  # only the new files
    check_silver(spark, tmp_path, truth)
    assert stream(spark, layout, CFG, progress=False).batches == 0  # caught up


def test_long_jobs_show_progress_and_a_summary(spark: SparkSession) -> None:
    out = io.StringIO()
    with Progress(spark, "probe", out=out, interval=0.01) as progress:
        spark.range(200_000).selectExpr("sum(id * id)").collect()
    assert progress.summary is not None and progress.summary.jobs >= 1
    assert progress.summary.tasks >= 1
    assert out.getvalue().splitlines()[-1].startswith("probe: done in ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["silver", "--root", "r", "--conf", "novalue"], "--conf 'novalue' is not key=value"),
        (["run", "--root", "r", "--horizon", "-1"], "horizon_days must be 0 or more"),
    ],
)
def test_bad_options_are_refused_before_a_jvm_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
