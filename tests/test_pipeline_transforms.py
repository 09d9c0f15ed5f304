"""Silver and gold transforms on small inline frames (no files): the rules one by one.

Every input line is built with the gateway's own contract (``drivers.model``) or the
lander's record format (``pipeline.records``), so the rules are checked against what a
Ledge bridge really sends.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from drivers.model import (
    Health,
    Reading,
    envelope,
    health_payload,
    reading_from_message,
    reading_payload,
    reading_topic,
)
from pipeline.config import PipelineConfig
from pipeline.records import landing_line
from pipeline.schema import READINGS
from pipeline.transforms import gold, silver

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
CFG = PipelineConfig()


def reading(value: float | bool | str = 21.5, at: datetime = T0, **kw: Any) -> Reading:
    fields: dict[str, Any] = {
        "device": "env",
        "quantity": "temperature",
        "unit": "°C",
        "driver": "serial",
    }
    fields.update(kw)
    return Reading(value=value, timestamp=at, **fields)


def line(
    topic: str,
    payload: bytes,
    seq: int | None,
    received: datetime,
    gateway: str | None = "gw1",
    file: str = "f1",
) -> dict[str, Any]:
    text = landing_line(
        topic, payload, 1, False, gateway if seq is not None else None,
        None if seq is None else str(seq), received,
    )  # fmt: skip
    return {"line": text.rstrip("\n"), "file": file, "landing_date": received.date()}


def edited(row: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``row`` with fields of its landing record replaced (None: removed)."""
    record = json.loads(row["line"])
    record.update(fields)
    kept = {k: v for k, v in record.items() if v is not None}
    return {**row, "line": json.dumps(kept, ensure_ascii=False)}


def of_reading(r: Reading, seq: int, received: datetime | None = None, **kw: Any) -> dict[str, Any]:
    return line(reading_topic(r, "gw1"), reading_payload(r), seq, received or r.timestamp, **kw)


def frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame(
        [{f.name: r.get(f.name) for f in silver.LINES.fields} for r in rows], silver.LINES
    )


def stage(spark: SparkSession, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = silver.stage(frame(spark, rows), CFG).collect()
    return sorted((r.asDict() for r in out), key=lambda r: (r["bridge"] or "", r["seq"] or 0))


MALFORMED = [
    ("ledge/gw1/serial/env/t", b"21.5 V", "payload is not JSON"),
    ("ledge/gw1/serial/env/t", b"\xff\x00", "payload is not JSON (not UTF-8 text)"),
    ("ledge/gw1/serial/env/t", b'{"value":1}', "payload lacks value or timestamp"),
    ("ledge/gw1/serial/env/t", b'{"value":[1],"timestamp":"2026-11-21T10:00:00Z"}',
     "value must be a number, boolean or text, not array"),
    ("ledge/gw1/serial/env/t", b'{"value":1,"timestamp":"2026-11-21T10:00:00"}',
     "timestamp must carry a time zone (use UTC)"),
    ("ledge/gw1/serial/env/t", b'{"value":1,"timestamp":"yesterday"}',
     "timestamp 'yesterday' is not ISO 8601 with a UTC offset"),
    ("ledge/gw1/serial/env/t", b'{"value":1,"unit":5,"timestamp":"2026-11-21T10:00:00Z"}',
     "unit must be text"),
    ("ledge/gw1/serial/env+x/t", b'{"value":1,"timestamp":"2026-11-21T10:00:00Z"}',
     "device 'env+x' is not a valid topic name"),
    ("ledge/gw1/t", b'{"value":1,"timestamp":"2026-11-21T10:00:00Z"}',
     "topic 'ledge/gw1/t' is not ledge/<gateway>/<driver>/<device>/<quantity>"),
    ("ledge/gw1/health", b'{"timestamp":"2026-11-21T10:00:00Z","dropped":-1}',
     "health dropped must be 0 or more"),
]  # fmt: skip
#: The day of a reading two days older than the horizon allows.
TOO_OLD = T0 - timedelta(days=CFG.horizon_days + 1)
EDGE = T0 - timedelta(days=CFG.horizon_days)


@pytest.fixture(scope="module")
def staged(spark: SparkSession) -> dict[tuple[str | None, int | None], list[dict[str, Any]]]:
    """Every case below in one frame, staged once (each ``stage`` costs Spark ~2 s of
    planning): the rows by (bridge, seq), sequence numbers keeping the cases apart."""
    r = reading()
    opened = reading(True, quantity="open", unit="")
    wrapped = envelope("gw9", 41, reading_payload(opened))
    h = Health(timestamp=T0, dropped=4, queued=2, uptime=9.5)
    s = timedelta(seconds=1)
    rows = [
        # redeliveries: three copies of 7, arriving in another order than the files sort
        of_reading(r, 7, T0 + 5 * s, file="b"),
        of_reading(r, 7, T0 + s, file="a"),
        of_reading(r, 7, T0 + 9 * s, file="c"),
        of_reading(reading(22.0), 8, T0),
        # a sequence number used twice by different messages
        of_reading(reading(1.0), 5, T0),
        of_reading(reading(2.0), 5, T0 + s),
        # ... and the second of them redelivered
        of_reading(reading(1.0), 6, T0),
        of_reading(reading(2.0), 6, T0 + 3 * s, file="b"),
        of_reading(reading(2.0), 6, T0 + 2 * s, file="c"),
        # two refused messages under one sequence number, the first redelivered
        line("ledge/gw1/serial/env/t", b"not json", 9, T0 + s),
        line("ledge/gw1/serial/env/t", b"not json", 9, T0 + 2 * s),
        line("ledge/gw1/serial/env/t", b"{}", 9, T0),
        # an MQTT 3.1.1 bridge's envelope, twice
        line(reading_topic(opened, "gw9"), wrapped, None, T0),
        line(reading_topic(opened, "gw9"), wrapped, None, T0 + 3 * s),
        # status topics and a health report
        line("ledge/gw1/status", b"online", 200, T0),
        line("ledge/gw1/serial/env/status", b"offline", 201, T0),
        line("ledge/gw1/health", health_payload(h), 202, T0 + s),
        line("ledge/gw1/status", b"offline", None, T0, gateway=None),  # a bridge's will
        # clocks: two days ahead, never set, within the tolerance
        of_reading(reading(at=T0 + timedelta(days=2)), 300, T0),
        of_reading(reading(at=datetime(1970, 1, 1, tzinfo=UTC)), 301, T0),
        of_reading(reading(at=T0 + timedelta(minutes=4)), 302, T0),
        # the late-data horizon
        of_reading(reading(at=TOO_OLD), 400, T0),
        of_reading(reading(at=EDGE), 401, T0),
        # no marks, a bad mark, an unreadable line
        edited(of_reading(r, 500, T0), gateway=None, seq=None),
        edited(of_reading(r, 501, T0), seq="x2"),
        {"line": "not a record", "file": "f", "landing_date": T0.date()},
        *[line(topic, payload, 100 + i, T0) for i, (topic, payload, _) in enumerate(MALFORMED)],
    ]
    out: dict[tuple[str | None, int | None], list[dict[str, Any]]] = {}
    for row in stage(spark, rows):
        out.setdefault((row["bridge"], row["seq"]), []).append(row)
    return out


def one(staged: dict[tuple[str | None, int | None], list[dict[str, Any]]], seq: int) -> Any:
    (row,) = staged[("gw1", seq)]
    return row


Staged = dict[tuple[str | None, int | None], list[dict[str, Any]]]


def test_redeliveries_fold_into_the_first_copy_and_are_counted(staged: Staged) -> None:
    first, other = one(staged, 7), one(staged, 8)
    assert (first["kind"], first["copies"], other["kind"], other["copies"]) == (
        "reading", 3, "reading", 1,
    )  # fmt: skip
    assert first["received"] == (T0 + timedelta(seconds=1)).replace(tzinfo=None)
    assert first["value"] == 21.5 and other["value"] == 22.0


def test_a_reused_sequence_number_is_quarantined_not_merged(staged: Staged) -> None:
    rows = staged[("gw1", 5)]
    assert [g["value"] for g in rows if g["kind"] == "reading"] == [1.0]
    (bad,) = [g for g in rows if g["kind"] == "quarantine"]
    assert bad["reason"].startswith("ledge-seq 5 of gateway 'gw1' was already used")


def test_copies_of_a_message_under_a_reused_sequence_number_are_folded(staged: Staged) -> None:
    rows = sorted(staged[("gw1", 6)], key=lambda g: g["kind"])
    assert [(g["kind"], g["copies"]) for g in rows] == [("quarantine", 2), ("reading", 1)]
    assert rows[0]["received"] == (T0 + timedelta(seconds=2)).replace(tzinfo=None)
    assert json.loads(rows[0]["payload"])["value"] == 2.0
    assert rows[0]["reason"].endswith(f"(received first at {T0.replace(tzinfo=None)})")


def test_copies_of_refused_messages_are_quarantined_once_each(staged: Staged) -> None:
    rows = {g["payload"]: (g["kind"], g["copies"]) for g in staged[("gw1", 9)]}
    assert rows == {"not json": ("quarantine", 2), "{}": ("quarantine", 1)}


def test_envelopes_from_a_311_bridge_are_opened(staged: Staged) -> None:
    (got,) = staged[("gw9", 41)]
    assert (got["kind"], got["gateway"], got["copies"]) == ("reading", "gw9", 2)
    assert (got["value"], got["text"], got["quantity"]) == (1.0, "true", "open")


@pytest.mark.parametrize(("index", "case"), list(enumerate(MALFORMED)))
def test_malformed_messages_are_quarantined_with_the_reason(
    staged: Staged, index: int, case: tuple[str, bytes, str]
) -> None:
    topic, payload, reason = case
    got = one(staged, 100 + index)
    assert got["kind"] == "quarantine"
    assert got["reason"].startswith(reason), got["reason"]
    assert got["topic"] == topic  # kept as it arrived
    if topic.count("/") == 4 and "UTF-8" not in reason:
        with pytest.raises(ValueError):  # the gateway's own reader refuses it too
            reading_from_message(topic, payload)


def test_lines_without_marks_or_unreadable_are_quarantined(staged: Staged) -> None:
    reasons = sorted(
        g["reason"]
        for (_, seq), rows in staged.items()
        if seq is None
        for g in rows
        if g["kind"] == "quarantine"
    )
    assert len(reasons) == 3
    assert reasons[0].startswith("ledge-seq 'x2' is not a decimal number")
    assert reasons[1].startswith("no ledge-gateway/ledge-seq marks")
    assert reasons[2] == "unreadable landing line (not a landing record)"


def test_status_topics_are_ignored_and_health_reports_parsed(staged: Staged) -> None:
    assert [one(staged, s)["kind"] for s in (200, 201, 202)] == ["ignored", "ignored", "health"]
    h = one(staged, 202)
    (will,) = [r for r in staged[(None, None)] if r["topic"] == "ledge/gw1/status"]
    assert (will["kind"], will["reason"]) == ("ignored", None)
    assert (h["dropped"], h["queued"], h["uptime"]) == (4, 2, 9.5)


def test_implausible_timestamps_are_kept_flagged_and_filed_by_receive_time(
    staged: Staged,
) -> None:
    got = [one(staged, s) for s in (300, 301, 302)]
    assert [(g["kind"], g["implausible"], g["date"]) for g in got] == [
        ("reading", True, T0.date()),
        ("reading", True, T0.date()),
        ("reading", False, T0.date()),
    ]


def test_rows_later_than_the_horizon_are_quarantined_not_dropped(staged: Staged) -> None:
    old, edge = one(staged, 400), one(staged, 401)
    assert old["kind"] == "quarantine" and "late-data horizon" in old["reason"]
    assert old["date"] == T0.date()  # filed under its landing day
    assert edge["kind"] == "reading" and edge["date"] == EDGE.date()


# ----------------------------------------------------------------------------------- gold


def silver_rows(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    base = {
        "gateway": "gw1", "driver": "serial", "device": "env", "quantity": "t", "unit": "°C",
        "text": None, "metadata": None, "bridge": "gw1", "copies": 1, "implausible": False,
    }  # fmt: skip
    full = []
    for i, r in enumerate(rows):
        row = {**base, "seq": i, **r}
        row.setdefault("received", row["timestamp"] + timedelta(seconds=2))
        row["date"] = row["timestamp"].date()
        full.append(row)
    return spark.createDataFrame(full, READINGS)


def naive(at: datetime) -> datetime:
    return at.replace(tzinfo=None)


def test_sensor_aggregates_per_minute_and_hour(spark: SparkSession) -> None:
    rows: list[dict[str, Any]] = [
        {"timestamp": T0 + timedelta(seconds=10), "value": 1.0},
        {"timestamp": T0 + timedelta(seconds=50), "value": 3.0},
        {"timestamp": T0 + timedelta(seconds=70), "value": 5.0},
        {"timestamp": T0 + timedelta(seconds=80), "value": None, "text": "auto"},  # text
        {"timestamp": T0 + timedelta(days=3), "value": 99.0, "implausible": True},
    ]
    readings = silver_rows(spark, rows)
    minutes = gold.minutes(readings)
    minute = sorted(gold.sensor_aggregates(minutes, "minute").collect(), key=lambda r: r.start)
    assert [(r.start, r["count"], r["min"], r["max"], r["mean"]) for r in minute] == [
        (naive(T0), 2, 1.0, 3.0, 2.0),
        (naive(T0 + timedelta(minutes=1)), 1, 5.0, 5.0, 5.0),
    ]
    (hour,) = gold.sensor_aggregates(minutes, "hour").collect()
    assert (hour.start, hour["count"], hour["mean"], hour.date) == (naive(T0), 3, 3.0, T0.date())


def test_gaps_longer_than_the_span_are_found_across_midnight(spark: SparkSession) -> None:
    midnight = datetime(2026, 11, 22, tzinfo=UTC)
    rows = [
        {"timestamp": midnight - timedelta(minutes=3), "value": 1.0},
        {"timestamp": midnight + timedelta(minutes=4), "value": 1.0},  # 7 min: a gap
        {"timestamp": midnight + timedelta(minutes=8), "value": 1.0},  # 4 min: none
    ]
    (gap,) = gold.gaps(silver_rows(spark, rows), PipelineConfig(gap=timedelta(minutes=5))).collect()
    assert (gap.seconds, gap.date) == (420.0, date(2026, 11, 22))


def test_gaps_over_minutes_are_the_gaps_between_every_reading(spark: SparkSession) -> None:
    """With a span of a minute or more gaps are found over per-minute rows: the same rows
    as over every reading, for silences of every length, text readings and implausible
    ones among them."""
    rng = random.Random(7)
    steps = (0.5, 1, 5, 30, 59, 60, 61, 119, 299, 300, 301, 600, 3600)
    rows: list[dict[str, Any]] = []
    at = T0
    for i in range(600):
        at += timedelta(seconds=rng.choice(steps) + rng.random() * (i % 2))
        rows.append(
            {
                "timestamp": at,
                "value": None if i % 4 == 0 else 1.0,
                "text": "auto" if i % 4 == 0 else None,
                "device": f"d{i % 3}",
                # a unit changing within a minute gives that minute a row per unit
                "unit": "K" if i % 5 == 0 else "°C",
                "implausible": i % 17 == 0,
            }
        )
    readings = silver_rows(spark, rows)
    for span in (timedelta(minutes=1), timedelta(minutes=5), timedelta(minutes=10)):
        cfg = PipelineConfig(gap=span)
        by_minute = sorted(gold.gaps(readings, cfg, by_minute=True).collect())
        every = sorted(gold.gaps(readings, cfg, by_minute=False).collect())
        assert len(every) > 10
        assert by_minute == every


def test_sensor_aggregates_from_minutes_are_those_over_every_reading(
    spark: SparkSession,
) -> None:
    """The aggregates are taken over per-minute rows (``gold.minutes``): counts, minima
    and maxima equal those over every reading, means to the last bits (their sums are
    added in another order)."""
    rng = random.Random(11)
    rows: list[dict[str, Any]] = []
    at = T0
    for i in range(800):
        at += timedelta(seconds=rng.choice((0.2, 3, 20, 59, 61, 400)))
        is_text = i % 6 == 0
        rows.append(
            {
                "timestamp": at,
                "value": None if is_text else rng.uniform(-40, 60),
                "text": "auto" if is_text else None,
                "device": f"d{i % 2}",
                "unit": "K" if i % 7 == 0 else "°C",
                "implausible": i % 13 == 0,
            }
        )
    readings = silver_rows(spark, rows)
    minutes = gold.minutes(readings)
    for bucket in gold.BUCKETS:
        got = sorted(gold.sensor_aggregates(minutes, bucket).collect())
        start = F.date_trunc(bucket, "timestamp")
        numeric = readings.where(~F.col("implausible") & F.col("value").isNotNull())
        direct = numeric.groupBy(*gold.SENSOR, "unit", start.alias("start")).agg(
            F.count("*").alias("count"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.avg("value").alias("mean"),
        )
        want = sorted(direct.withColumn("date", F.to_date("start")).collect())
        assert len(got) == len(want) > 5
        for g, w in zip(got, want, strict=True):
            assert g.asDict() == {**w.asDict(), "mean": pytest.approx(w["mean"], rel=1e-12)}


def test_gold_is_the_same_bits_however_the_readings_are_split(spark: SparkSession) -> None:
    """Means are sums of doubles, whose last bits depend on the order they are added:
    gold adds them in an order of their own, so a backfill whose files split the same
    readings differently gives the same tables to the last bit."""
    rng = random.Random(3)
    rows: list[dict[str, Any]] = []
    at = T0
    for i in range(3000):
        at += timedelta(seconds=rng.choice((0.5, 2, 7)))
        rows.append(
            {
                "timestamp": at,
                "value": rng.uniform(-1e3, 1e3) * 10 ** rng.randint(-6, 6),
                "device": f"d{i % 3}",
                "received": at + timedelta(seconds=rng.uniform(0, 4)),
            }
        )
    readings = silver_rows(spark, rows)
    from pipeline.schema import HEALTH

    health = spark.createDataFrame([], HEALTH)

    def tables(frame: DataFrame, partitions: int) -> list[list[Any]]:
        # (every shuffle split in ``partitions``, as a larger or smaller run splits it)
        settings = {
            "spark.sql.shuffle.partitions": str(partitions),
            "spark.sql.adaptive.coalescePartitions.enabled": "false",
        }
        before = {key: str(spark.conf.get(key)) for key in settings}
        try:
            for key, value in settings.items():
                spark.conf.set(key, value)
            minutes = gold.minutes(frame)
            return [
                sorted(gold.sensor_aggregates(minutes, "minute").collect()),
                sorted(gold.sensor_aggregates(minutes, "hour").collect()),
                sorted(gold.fleet_health(frame, health).collect()),
            ]
        finally:
            for key, old in before.items():
                spark.conf.set(key, old)

    whole = tables(readings.coalesce(1).sortWithinPartitions("seq"), 1)
    split = tables(readings.orderBy(F.rand(9)).repartition(7), 5)
    assert whole == split


def test_percentile_is_sparks_percentile(spark: SparkSession) -> None:
    """The 95th percentile of fleet health is the same double as Spark's ``percentile``
    for groups of every size, ties and nulls among the values."""
    rng = random.Random(5)
    rows = []
    for group in range(60):
        size = rng.choice((1, 2, 3, 7, 20, 21, 100, 333))
        for _ in range(size):
            value = rng.choice((None, 0.0, 1.5, rng.uniform(0, 3), rng.expovariate(0.2)))
            rows.append((group, value))
    rows += [(60, None), (60, None)]  # no value at all: null
    frame = spark.createDataFrame(rows, "g int, v double")
    got = frame.groupBy("g").agg(
        gold.percentile(F.array_sort(F.collect_list("v")), 0.95).alias("p"),
        F.percentile("v", F.lit(0.95)).alias("want"),
    )
    checked = got.collect()
    assert len(checked) == 61 and any(r.p is None for r in checked)
    assert [(r.g, r.p) for r in checked if r.p != r.want] == []


def test_fleet_health_counts_rate_lag_duplicates_and_reported_drops(spark: SparkSession) -> None:
    readings = silver_rows(
        spark,
        [
            {"timestamp": T0, "value": 1.0, "received": T0 + timedelta(seconds=1)},
            {"timestamp": T0 + timedelta(minutes=1), "value": 1.0, "copies": 3,
             "received": T0 + timedelta(minutes=1, seconds=3)},
        ],
    )  # fmt: skip
    h = [
        ("gw1", T0, 4, 7, 1.0, "gw1", 10, T0 + timedelta(seconds=2), 1, False, T0.date()),
        ("gw1", T0 + timedelta(minutes=30), 1, 2, 1.0, "gw1", 11, T0 + timedelta(minutes=30),
         1, False, T0.date()),
    ]  # fmt: skip
    from pipeline.schema import HEALTH

    (row,) = gold.fleet_health(readings, spark.createDataFrame(h, HEALTH)).collect()
    assert (row.messages, row.duplicates, row.dropped, row.queued_max) == (4, 2, 5, 7)
    assert row.rate == pytest.approx(4 / 3600)
    assert row.lag_max == 3.0 and row.lag_mean == pytest.approx((1 + 3 + 2 + 0) / 4)
