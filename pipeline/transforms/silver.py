"""Bronze -> silver: judge the landing lines, deduplicate exactly.

Pure: DataFrames in, DataFrames out (no reads, no writes, no clock). ``stage`` turns the
landing lines into one row per distinct message, each with a ``kind``:

- ``reading`` / ``health``: valid, deduplicated by (bridge gateway, sequence number, day);
  ``copies`` counts the identical redeliveries folded into it;
- ``quarantine``: anything that could not be accepted, with the ``reason``;
- ``ignored``: status topics (``.../status``), which are not data (with or without marks).

Every rule that looks at one message alone runs first, line by line, in
``pipeline.transforms.judge`` (the contract's own code judges each payload), on whole
Arrow batches where the lines are read. Only then are copies grouped, and only messages
judged for the same silver day meet: that day's rows depend only on the landing days
``[day - 1, day + horizon]``, so any run that recomputes a day gets the same rows. One
pass over the landing lines, one shuffle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.functions import arrow_udf

from drivers.model import SEQUENCE_PROPERTY
from pipeline.config import PipelineConfig
from pipeline.schema import HEALTH, QUARANTINE, READINGS, conform, struct
from pipeline.transforms import judge as J

READING: Final = J.READING
HEALTH_REPORT: Final = J.HEALTH_REPORT
QUARANTINED: Final = J.QUARANTINED
IGNORED: Final = J.IGNORED
#: ``stage``'s column that is true for the rows grouped by their landing day alone (refused
#: or ignored on their own, or without marks): what one landing day's lines decide.
BY_LANDING: Final = "by_landing"

#: The landing lines ``stage`` takes: each line's text, its file and its landing day.
_LINES: Final = {"line": "string", "file": "string", "landing_date": "date"}
LINES: Final = struct(_LINES)


def judged(lines: DataFrame, cfg: PipelineConfig) -> DataFrame:
    """Every landing line judged on its own (``pipeline.transforms.judge``): the columns
    of ``judge.JUDGED`` with ``day`` set for every row (the landing day where the judge
    set none), ``extra`` (``judge.EXTRA``, null when usual), the line (kept only when
    it is not a landing record), its file and landing day. Only the line travels to
    Python; its file and landing day wait here.

    When the session has the JVM judge (``judge.JVM_JUDGE``), it judges the lines of a
    bridge's readings first, and only the others travel to Python (the rest as nulls)."""
    either = python_judge(cfg)("line")
    if lines.sparkSession.catalog.functionExists(J.JVM_JUDGE):
        fast = jvm_judged(F.col("line"), cfg).alias("_fast")
        # A line the JVM judged goes on as null: Spark's Python operator copies every row
        # it takes into a queue while Python judges, and again into its output, and only
        # an unreadable line (judged in Python) is kept. 1M landing lines: the stage that
        # judges them 5.54 to 5.85 CPU-s against 5.79 to 5.91, and the run 0.3 s sooner
        # (means of 13 interleaved runs).
        left = F.when(F.col("_fast").isNull(), F.col("line")).alias("line")
        lines = lines.select("line", "file", "landing_date", fast).select(
            left, "file", "landing_date", "_fast"
        )
        reading = F.struct(
            *[_from_jvm(name).alias(name) for name in J.JUDGED],
            _extra_from_jvm(cfg).alias("extra"),
        )
        either = F.when(F.col("_fast").isNotNull(), reading).otherwise(either)
    out = lines.select("line", "file", "landing_date", either.alias("_j"))
    unreadable = F.coalesce(~F.col("_j.extra.readable"), F.lit(False))
    # An unreadable line is kept as text with U+FFFD for each byte that is not UTF-8 (and
    # then as its bytes too, the judge's base64): Parquet's strings are UTF-8, and other
    # readers refuse a column holding anything else. UTF-8 text is kept as it is.
    return out.select(
        F.when(unreadable, F.make_valid_utf8("line")).alias("line"),
        "file",
        "landing_date",
        *[F.col(f"_j.{name}").alias(name) for name in J.JUDGED if name != "day"],
        F.coalesce(F.col("_j.day"), F.col("landing_date")).alias("day"),
        F.col("_j.extra").alias("extra"),
    )


def python_judge(cfg: PipelineConfig) -> Callable[[str | Column], Column]:
    """The Python judge (``judge.arrow_judge``) as an Arrow UDF: a column of landing lines
    in, the struct of ``judge.JUDGED`` and ``extra`` out (null lines give null rows)."""
    schema = T.StructType([*struct(J.JUDGED).fields, T.StructField("extra", struct(J.EXTRA))])
    # The type as a schema, not as text: text is parsed by the JVM's SQL parser, which in a
    # fresh JVM took 0.2 s before the first query. (PySpark's stubs know a scalar Arrow UDF
    # only by the functionType it now warns about.)
    return arrow_udf(J.arrow_judge(cfg), schema)  # type: ignore[call-overload,no-any-return]


def jvm_judged(line: Column, cfg: PipelineConfig) -> Column:
    """The JVM judge's reading of ``line`` (``judge.JVM_JUDGED``), or null: the Python
    judge's then."""
    return F.call_udf(
        J.JVM_JUDGE,
        line,
        F.lit(cfg.prefix),
        F.lit(cfg.future_tolerance // J.US).cast("long"),
        F.lit(J.micros(cfg.earliest)).cast("long"),
        # (an int; no date is 2^31 days after another)
        F.lit(min(cfg.horizon_days, 2**31 - 1)),
    )


def _from_jvm(name: str) -> Column:
    """A field of ``judge.JUDGED`` from the JVM judge's reading (``_fast``)."""
    if name == "kind":
        return F.when(F.col("_fast.late").isNull(), J.READING).otherwise(J.QUARANTINED)
    value = F.col(f"_fast.{name}")
    if J.JVM_JUDGED[name] == "long" and J.JUDGED[name] == "timestamp":
        return F.timestamp_micros(value)
    return F.date_from_unix_date(value) if name == "day" else value


def _extra_from_jvm(cfg: PipelineConfig) -> Column:
    """``extra`` of the JVM judge's reading: null (usual), but for a reading beyond the
    horizon, which is quarantined with its reason (``judge.BEYOND_HORIZON``)."""
    reason = J.BEYOND_HORIZON.format(late="%d", horizon=cfg.horizon_days)
    fields = [
        F.format_string(reason, F.col("_fast.late")) if name == "reason" else F.lit(usual)
        for name, usual in zip(J.EXTRA, J.EXTRA_USUAL, strict=True)
    ]
    late = F.struct(*fields).cast(struct(J.EXTRA))
    return F.when(F.col("_fast.late").isNotNull(), late)


def _extra(name: str) -> Column:
    """A field of ``extra`` with its usual value where ``extra`` is null."""
    usual = J.EXTRA_USUAL[list(J.EXTRA).index(name)]
    field = F.col(f"extra.{name}")
    return field if usual is None else F.when(F.col("extra").isNull(), usual).otherwise(field)


# ------------------------------------------------------------------------ deduplication


def deduplicate(judged: DataFrame) -> DataFrame:
    """One row per message: the first copy to arrive, with ``copies`` counted.

    Copies are identical redeliveries (same topic and payload) under one (bridge, seq).
    They are grouped with the messages judged for the same day: accepted messages by
    their silver day, refused ones by their landing day (so a redelivered bad message is
    quarantined once). In a group of accepted messages, a different message under a
    sequence number already used is quarantined, never merged, and its own copies are
    folded into it as well. The order is total (receive time, file, content), so the same
    input always keeps the same copy."""
    acceptable = F.col("kind").isin(READING, HEALTH_REPORT)
    marked = F.col("bridge").isNotNull() & F.col("seq").isNotNull()
    # (the sequence number first: rows are sorted by the group's columns in this order, and
    # a sort whose first column is nearly unique compares 8-byte prefixes, not rows)
    group = [
        F.when(marked, F.col("seq")),
        F.when(marked, F.col("bridge")),
        F.when(marked, acceptable),
        F.when(marked, F.when(acceptable, F.col("day")).otherwise(F.col("landing_date"))),
        # (unmarked lines are never grouped, each is kept on its own: spread by their
        # file, receive time and content (an unreadable line's text), not gathered a whole
        # file to a group)
        F.when(~marked, F.xxhash64("file", "received", "topic", "payload", "line")),
    ]
    content = ("topic", "payload", "_b64")  # the landing record's own
    # A hash completes the order cheaply; copies are told apart by the content itself.
    digest = F.xxhash64(*[F.concat(F.lit("<"), F.col(c)) for c in content])
    order = ("received", "file", "_digest")
    keys = [f"_g{i}" for i in range(len(group))]
    keyed = judged.select(
        "*",
        *[g.alias(k) for g, k in zip(group, keys, strict=True)],
        F.col("extra.payload_base64").alias("_b64"),
    )
    # The group's key, then the content, then the order: one shuffle by the group and one
    # sort serve both windows (by message, and by group), which Spark would otherwise
    # shuffle and sort again for the second.
    placed = (
        keyed.select("*", digest.alias("_digest"))
        .repartition(*keys)
        .sortWithinPartitions(*keys, *content, *order)
    )
    message = Window.partitionBy(*keys, *content).orderBy(*order)
    everything = message.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    ranked = placed.select(
        "*",
        F.row_number().over(message).alias("_rank"),
        F.count(F.lit(1)).over(everything).alias("_copies"),
    )
    arrival = F.struct(*order)
    grouped = ranked.select("*", F.min(arrival).over(Window.partitionBy(*keys)).alias("_first"))
    conflict = F.format_string(
        f"{SEQUENCE_PROPERTY} %d of gateway '%s' was already used by another message "
        "(received first at %s)",
        F.col("seq"),
        F.col("bridge"),
        F.col("_first.received").cast("string"),
    )
    alone = ~marked  # lines without marks are never grouped: each is its own row
    # a message's first copy (rank 1) holds its arrival; the group's first holds the first
    clash = ~arrival.eqNullSafe(F.col("_first")) & acceptable & ~alone
    kept = grouped.where((F.col("_rank") == 1) | alone)
    return kept.select(
        *[c for c in judged.columns if c != "kind"],
        F.when(clash, QUARANTINED).otherwise(F.col("kind")).alias("kind"),
        F.when(clash, conflict).otherwise(F.col("extra.reason")).alias("reason"),
        F.when(alone, 1).otherwise(F.col("_copies").cast("int")).alias("copies"),
        (alone | ~acceptable).alias(BY_LANDING),
    )


def stage(lines: DataFrame, cfg: PipelineConfig) -> DataFrame:
    """Landing lines (``LINES``) -> every distinct message once, with ``kind``,
    ``reason``, ``day`` (the silver day it was judged for: its timestamp's date, its
    receive date when implausible, the landing date when refused before a timestamp was
    read) and ``date`` (its partition: ``day`` for readings and health reports, the
    landing date for quarantined and ignored messages)."""
    staged = deduplicate(judged(lines, cfg))
    quarantined = F.col("kind") == QUARANTINED
    accepted = F.col("kind").isin(READING, HEALTH_REPORT)
    enveloped = _extra("enveloped")
    levels = F.split(F.substring(F.col("topic"), len(cfg.prefix) + 2, 1 << 30), "/", -1)
    four = F.size(levels) == 4
    kept = ("payload", "extra", "file", "line", "topic")
    return staged.select(
        *[c for c in staged.columns if c not in kept],
        # the topic's levels after the prefix: the gateway, and a reading's sensor
        F.get(levels, 0).alias("gateway"),
        *[F.when(four, F.get(levels, i)).alias(name) for i, name in _LEVELS],
        *[_extra(name).alias(name) for name in ("qos", "retain", "metadata", "dropped")],
        *[_extra(name).alias(name) for name in ("queued", "uptime")],
        F.coalesce(_extra("seq_text"), F.col("seq").cast("string")).alias("seq_text"),
        # what only the quarantine keeps: the message as it arrived (an envelope opened)
        *[F.when(~accepted, F.col(c)).alias(c) for c in ("file", "line", "topic")],
        F.when(quarantined, F.when(enveloped, _extra("opened")).otherwise(F.col("payload"))).alias(
            "payload"
        ),
        F.when(
            quarantined,
            F.when(enveloped, _extra("opened_base64")).otherwise(_extra("payload_base64")),
        ).alias("payload_base64"),
        F.when(accepted, F.col("day")).otherwise(F.col("landing_date")).alias("date"),
    )


_LEVELS: Final = ((1, "driver"), (2, "device"), (3, "quantity"))


def readings(staged: DataFrame) -> DataFrame:
    """Silver readings (``pipeline.schema.READINGS``) from ``stage``'s output."""
    return conform(staged.where(F.col("kind") == READING), READINGS)


def health(staged: DataFrame) -> DataFrame:
    """Silver health reports (``pipeline.schema.HEALTH``) from ``stage``'s output."""
    return conform(staged.where(F.col("kind") == HEALTH_REPORT), HEALTH)


def quarantine(staged: DataFrame) -> DataFrame:
    """Quarantined messages and lines (``pipeline.schema.QUARANTINE``) with their reason."""
    renamed = staged.where(F.col("kind") == QUARANTINED).withColumn("seq", F.col("seq_text"))
    return conform(renamed, QUARANTINE)
