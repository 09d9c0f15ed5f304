"""The jobs end to end over a few thousand generated landing lines with the field's faults
(redeliveries, a gateway's day-late backlog, rows beyond the horizon, implausible clocks,
every kind of malformed input), checked row for row against what was generated; re-runs
and backfills must give identical tables; stream mode must keep the late backlog.
"""

from __future__ import annotations

import io
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import cli, jobs
from pipeline.config import PipelineConfig
from pipeline.generate import Message, Spec, Truth, generate, write_landing
from pipeline.progress import Progress
from pipeline.report import write_report
from pipeline.storage import Layout
from pipeline.stream import stream

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
    return {t: jobs.table_rows(spark, str(root / t)) for t in TABLES if (root / t).exists()}


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


def test_reruns_and_backfills_give_identical_tables(spark: SparkSession, landed: Landed) -> None:
    root, early, done = landed
    layout = Layout(str(root))
    before = snapshot(spark, root)
    assert before["silver/readings"] and before["gold/health"]
    jobs.run(spark, layout, CFG, progress=False)  # nothing new landed: nothing changes
    assert snapshot(spark, root) == before
    first, last = min(early.days), max(done.days)
    jobs.backfill(spark, layout, CFG, first, last, progress=False)  # everything again
    assert snapshot(spark, root) == before


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
