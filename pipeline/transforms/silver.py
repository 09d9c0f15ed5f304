"""Bronze -> silver: read the landing lines, open envelopes, deduplicate exactly, validate.

Pure: DataFrames in, DataFrames out (no reads, no writes, no clock). ``stage`` turns the
landing lines into one row per distinct message, each with a ``kind``:

- ``reading`` / ``health``: valid, deduplicated by (bridge gateway, sequence number);
  ``copies`` counts the identical redeliveries folded into it;
- ``quarantine``: anything that could not be accepted, with the ``reason``;
- ``ignored``: status topics (``.../status``), which are not data (with or without marks).

The rules follow ``drivers.model.reading_from_message`` and ``health_from_message`` (a
test runs both on the same inputs), written as Spark expressions so that no row leaves
the JVM.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from drivers.model import GATEWAY_PROPERTY, SEQUENCE_PROPERTY
from pipeline.config import PipelineConfig
from pipeline.schema import CORRUPT, HEALTH, QUARANTINE, READINGS, conform

READING: Final = "reading"
HEALTH_REPORT: Final = "health"
QUARANTINED: Final = "quarantine"
IGNORED: Final = "ignored"

#: A topic level made from a name (drivers.model): 1 to 128 characters, none of ``/ + #``
#: or NUL, not starting with ``$``.
_NAME: Final = r"^[^$/+#\x00][^/+#\x00]{0,127}$"
#: ISO 8601 with a UTC offset, as ``datetime.isoformat()`` writes it (and ``Z``).
_ISO_WITH_OFFSET: Final = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$"
_NAIVE_ISO: Final = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$"
_INTEGER_TYPES: Final = ("TINYINT", "SMALLINT", "INT", "BIGINT")


def _problem(*checks: tuple[Column, str | Column]) -> Column:
    """The message of the first check whose condition holds (null conditions do not)."""
    return F.coalesce(
        *[F.when(cond, msg if isinstance(msg, Column) else F.lit(msg)) for cond, msg in checks]
    )


def _keep_first(reason: Column, *checks: tuple[Column, str | Column]) -> Column:
    """``reason`` if already set, else the first failing check's message."""
    return F.coalesce(reason, _problem(*checks))


def _get(variant: Column, key: str, kind: str = "variant") -> Column:
    """A top-level field of a JSON object as ``kind``; null if absent or not convertible."""
    return F.try_variant_get(variant, f"$.{key}", kind)


def _type(variant: Column) -> Column:
    """The JSON type of a variant: ``BIGINT``, ``DECIMAL(3,1)``, ``STRING``, ``OBJECT<...>``..."""
    return F.schema_of_variant(variant)


def _is_number(kind: Column) -> Column:
    return kind.isin(*_INTEGER_TYPES, "FLOAT", "DOUBLE") | kind.startswith("DECIMAL")


def _is_object(kind: Column) -> Column:
    return kind.startswith("OBJECT<")


def _quoted(col: Column) -> Column:
    return F.concat(F.lit("'"), col, F.lit("'"))


# ------------------------------------------------------------------ marks and envelopes


def marks(lines: DataFrame) -> DataFrame:
    """Landing lines -> messages with their bridge marks (``bridge``, ``seq``) resolved.

    ``lines`` has the landing columns (``pipeline.schema.LANDING``) plus ``file`` and
    ``landing_date``. A message carries the marks as MQTT 5 user properties, or (from a
    bridge whose remote speaks MQTT 3.1.1) inside an envelope, recognised by its shape
    ``{"gateway": text, "seq": integer, "payload" | "payload_base64": ...}`` and opened
    here like ``drivers.model.open_envelope``. Sets ``reason`` for lines that cannot be
    read and messages without usable marks (they cannot be deduplicated exactly)."""
    received = F.col("received").try_cast("timestamp")
    has_props = F.col("gateway").isNotNull() | F.col("seq").isNotNull()

    # Only a message without user properties can be an envelope: parse only those.
    env = F.when(~has_props, _json(F.col("payload")))
    env_gateway, env_seq = _get(env, "gateway"), _get(env, "seq")
    env_inner, env_b64 = _get(env, "payload"), _get(env, "payload_base64")
    is_envelope = (
        ~has_props
        & _is_object(_type(env))
        & env_gateway.isNotNull()
        & env_seq.isNotNull()
        & (env_inner.isNotNull() | env_b64.isNotNull())
    )
    b64_text = _get(env, "payload_base64", "string")

    reason = _problem(
        (F.col(CORRUPT).isNotNull(), "unreadable landing line (not a landing record)"),
        (
            F.col("topic").isNull() | F.col("received").isNull(),
            "landing line lacks its topic or receive time",
        ),
        (
            received.isNull(),
            F.format_string(
                "landing line has an unreadable receive time %s", _quoted(F.col("received"))
            ),
        ),
        (
            F.col("payload").isNull() & F.col("payload_base64").isNull(),
            "landing line has no payload",
        ),
        # MQTT 5 user properties
        (
            has_props & F.col("gateway").isNull(),
            f"message has a {SEQUENCE_PROPERTY} property but no {GATEWAY_PROPERTY}",
        ),
        (
            has_props & F.col("seq").isNull(),
            f"message has a {GATEWAY_PROPERTY} property but no {SEQUENCE_PROPERTY}",
        ),
        (
            has_props & ~F.col("seq").rlike(r"^[0-9]{1,18}$"),
            F.format_string(
                f"{SEQUENCE_PROPERTY} %s is not a decimal number", _quoted(F.col("seq"))
            ),
        ),
        # envelopes
        (
            is_envelope
            & ((_type(env_gateway) != "STRING") | ~_type(env_seq).isin(*_INTEGER_TYPES)),
            "envelope lacks a gateway (text) or seq (integer)",
        ),
        (
            is_envelope & env_inner.isNull() & F.try_to_binary(b64_text, F.lit("base64")).isNull(),
            "envelope payload_base64 is not base64 text",
        ),
        (
            ~has_props & ~is_envelope,
            f"no {GATEWAY_PROPERTY}/{SEQUENCE_PROPERTY} marks (not sent by a Ledge bridge): "
            "cannot be deduplicated exactly",
        ),
    )
    return lines.select(
        "file",
        "landing_date",
        "topic",
        F.col("qos").try_cast("int").alias("qos"),
        F.col("retain").try_cast("boolean").alias("retain"),
        F.col(CORRUPT).alias("line"),
        received.alias("received"),
        F.when(is_envelope, _get(env, "gateway", "string"))
        .otherwise(F.col("gateway"))
        .alias("bridge"),
        F.when(is_envelope, _get(env, "seq", "string")).otherwise(F.col("seq")).alias("seq_text"),
        F.when(is_envelope, F.to_json(env_inner))
        .when(~is_envelope, F.col("payload"))
        .alias("payload"),
        F.when(is_envelope, b64_text).otherwise(F.col("payload_base64")).alias("payload_base64"),
        reason.alias("reason"),
    ).withColumn("seq", F.when(F.col("reason").isNull(), F.col("seq_text").cast("long")))


# ------------------------------------------------------------------------ deduplication


def deduplicate(messages: DataFrame) -> DataFrame:
    """One row per (bridge, seq): the first copy to arrive, with ``copies`` counted.

    Copies are identical redeliveries (same topic and payload). A different message under
    a sequence number already used is not a copy: it is quarantined, never merged. Rows
    that already have a ``reason`` pass through untouched (``copies`` 1). The order is
    total (receive time, file, content), so the same input always keeps the same copy."""
    content = ("topic", "payload", "payload_base64")
    # A hash of the content completes the order cheaply (comparing payloads in the sort
    # would cost more); copies are still told apart by comparing the content itself.
    digest = F.xxhash64(*[F.concat(F.lit("<"), F.col(c)) for c in content])
    marked = messages.where(F.col("reason").isNull()).withColumn("_digest", digest)
    by_key = Window.partitionBy("bridge", "seq")
    in_order = by_key.orderBy("received", "file", "_digest")
    ranked = marked.select(
        "*",
        F.row_number().over(in_order).alias("_rank"),
        *[F.first(c).over(in_order).alias(f"_first_{c}") for c in content],
        F.first("received").over(in_order).alias("_first_received"),
    )
    same = F.lit(True)
    for c in content:
        same = same & F.col(c).eqNullSafe(F.col(f"_first_{c}"))
    counted = ranked.select("*", F.sum(same.cast("int")).over(by_key).alias("_copies"))
    conflict = F.format_string(
        f"{SEQUENCE_PROPERTY} %d of gateway '%s' was already used by another message "
        "(received first at %s)",
        F.col("seq"),
        F.col("bridge"),
        F.col("_first_received").cast("string"),
    )
    survivors = counted.where((F.col("_rank") == 1) | ~same).select(
        *messages.columns,
        F.when(F.col("_rank") == 1, F.col("_copies")).otherwise(1).alias("copies"),
        F.when(F.col("_rank") > 1, conflict).alias("_conflict"),
    )
    survivors = survivors.withColumn(
        "reason", F.coalesce("reason", "_conflict").alias("reason")
    ).drop("_conflict")
    unmarked = messages.where(F.col("reason").isNotNull()).withColumn("copies", F.lit(1))
    return survivors.unionByName(unmarked)


# ------------------------------------------------------------------------------- parsing


def _levels(prefix: str) -> tuple[Column, Column]:
    """The topic's levels after ``<prefix>/`` (null when it lacks the prefix), and count."""
    head = prefix + "/"
    rest = F.when(F.col("topic").startswith(head), F.substr(F.col("topic"), F.lit(len(head) + 1)))
    levels = F.split(rest, "/", -1)
    return levels, F.size(levels)


def _timestamp_checks(what: str) -> list[tuple[Column, str | Column]]:
    """Checks of the ``_stamp_*`` columns ``_fields`` made."""
    text = F.col("_stamp_text")
    return [
        (F.col("_stamp_type").isNull(), f"payload lacks {what}"),
        (F.col("_stamp_type") != "STRING", f"{what} must be ISO 8601 text"),
        (text.rlike(_NAIVE_ISO), f"{what} must carry a time zone (use UTC)"),
        (
            ~text.rlike(_ISO_WITH_OFFSET) | F.col("_stamp").isNull(),
            F.format_string(f"{what} %s is not ISO 8601 with a UTC offset", _quoted(text)),
        ),
    ]


def _json(text: Column) -> Column:
    """``text`` parsed as JSON, or null when it is not JSON.

    Spark's parser stops after the first complete value and ignores what follows
    (``21.5 V`` reads as 21.5), so text must also end the way a JSON value ends."""
    return F.when(F.rtrim(text).rlike(r"[\]}\"0-9el]$"), F.try_parse_json(text))


def _fields(messages: DataFrame, prefix: str) -> DataFrame:
    """Parse each payload once and take apart what readings and health reports use."""
    levels, _ = _levels(prefix)
    parsed = messages.select("*", _json(F.col("payload")).alias("_body"), levels.alias("_lv"))
    body = F.col("_body")
    meta_types = F.map_values(
        F.transform_values(
            _get(body, "metadata", "map<string,variant>"), lambda _k, v: F.schema_of_variant(v)
        )
    )
    fields = parsed.select(
        "*",
        _type(body).alias("_body_type"),
        _type(_get(body, "value")).alias("_value_type"),
        _get(body, "value", "double").alias("_number"),
        _get(body, "value", "string").alias("_string"),
        _get(body, "timestamp", "string").alias("_stamp_text"),
        _type(_get(body, "timestamp")).alias("_stamp_type"),
        _type(_get(body, "unit")).alias("_unit_type"),
        _get(body, "unit", "string").alias("_unit"),
        _type(_get(body, "metadata")).alias("_meta_type"),
        F.forall(
            meta_types,
            lambda t: ~(t.startswith("OBJECT") | t.startswith("ARRAY") | (t == "VOID")),
        ).alias("_meta_scalar"),
        F.to_json(_get(body, "metadata")).alias("_metadata"),
        *[
            x
            for name in ("dropped", "queued", "uptime")
            for x in (
                _type(_get(body, name)).alias(f"_{name}_type"),
                _get(body, name, "double").alias(f"_{name}"),
            )
        ],
    )
    return fields.withColumn("_stamp", F.col("_stamp_text").try_cast("timestamp"))


def _parse(messages: DataFrame, cfg: PipelineConfig) -> DataFrame:
    """Classify kept messages by topic and parse readings and health reports."""
    fields = _fields(messages, cfg.prefix)
    levels, n = F.col("_lv"), F.size("_lv")  # F.get: null beyond the end (ANSI mode)
    is_status = ((n == 4) & (F.get(levels, 3) == "status")) | (
        (n == 2) & (F.get(levels, 1) == "status")
    )
    is_health = (n == 2) & (F.get(levels, 1) == "health")
    is_reading = (n == 4) & ~is_status

    kind, number = F.col("_value_type"), F.col("_number")
    is_number, is_bool = _is_number(kind), kind == "BOOLEAN"
    names = [
        (
            ~F.get(levels, i).rlike(_NAME),
            F.format_string(
                f"{level} %s is not a valid topic name (1 to 128 characters, none of / + # "
                "or NUL, no leading $)",
                _quoted(F.get(levels, i)),
            ),
        )
        for i, level in enumerate(("gateway", "driver", "device", "quantity"))
    ]
    not_json = [
        (F.col("payload").isNull(), "payload is not JSON (not UTF-8 text)"),
        (F.col("_body").isNull(), "payload is not JSON"),
    ]
    reading_problem = _problem(
        *names,
        *not_json,
        (
            ~_is_object(F.col("_body_type")) | kind.isNull() | F.col("_stamp_type").isNull(),
            "payload lacks value or timestamp",
        ),
        (
            ~(is_number | is_bool | (kind == "STRING")),
            F.format_string("value must be a number, boolean or text, not %s", F.lower(kind)),
        ),
        (is_number & (F.isnan(number) | (F.abs(number) == float("inf"))), "value must be finite"),
        (F.col("_unit_type").isNotNull() & (F.col("_unit_type") != "STRING"), "unit must be text"),
        *_timestamp_checks("timestamp"),
        (
            F.col("_meta_type").isNotNull()
            & (~_is_object(F.col("_meta_type")) | ~F.col("_meta_scalar")),
            "metadata must be an object of numbers, booleans or text",
        ),
    )

    def count_problem(name: str, required: bool) -> list[tuple[Column, str | Column]]:
        kind, value = F.col(f"_{name}_type"), F.col(f"_{name}")
        present = F.lit(True) if required else kind.isNotNull()
        return [
            (present & ~kind.isin(*_INTEGER_TYPES), f"health {name} must be an integer"),
            (present & (value < 0), f"health {name} must be 0 or more"),
        ]

    health_problem = _problem(
        names[0],
        *not_json,
        (~_is_object(F.col("_body_type")), "health payload is not a JSON object"),
        *_timestamp_checks("health timestamp"),
        (F.col("_dropped_type").isNull(), "health payload lacks dropped"),
        *count_problem("dropped", required=True),
        *count_problem("queued", required=False),
        (
            F.col("_uptime_type").isNotNull()
            & (~_is_number(F.col("_uptime_type")) | (F.col("_uptime") < 0)),
            "health uptime must be a number, 0 or more",
        ),
    )
    topic_problem = F.format_string(
        f"topic %s is not {cfg.prefix}/<gateway>/<driver>/<device>/<quantity>",
        _quoted(F.col("topic")),
    )
    # Status topics are not data, marked or not: a bridge sends the gateway's status as
    # its birth and will on the upstream connection, which carry no sequence number.
    readable = F.col("topic").isNotNull() & F.col("received").isNotNull()
    status = F.coalesce(readable & is_status, F.lit(False))
    kind_of = (
        F.when(status, IGNORED)
        .when(F.col("reason").isNotNull(), QUARANTINED)
        .when(is_health, HEALTH_REPORT)
        .when(is_reading, READING)
        .otherwise(QUARANTINED)
    )
    reason = F.when(
        ~status,
        F.coalesce(
            F.col("reason"),
            F.when(is_health, health_problem)
            .when(is_reading, reading_problem)
            .otherwise(topic_problem),
        ),
    )
    truth = F.col("_string") == "true"
    out = fields.select(
        *messages.columns,
        kind_of.alias("_kind"),
        reason.alias("_reason"),
        F.get(levels, 0).alias("gateway"),
        F.when(is_reading, F.get(levels, 1)).alias("driver"),
        F.when(is_reading, F.get(levels, 2)).alias("device"),
        F.when(is_reading, F.get(levels, 3)).alias("quantity"),
        F.when(is_bool, F.when(truth, 1.0).otherwise(0.0)).when(is_number, number).alias("value"),
        F.when(is_bool | (kind == "STRING"), F.col("_string")).alias("text"),
        F.coalesce(F.col("_unit"), F.lit("")).alias("unit"),
        F.col("_stamp").alias("timestamp"),
        F.col("_metadata").alias("metadata"),
        F.col("_dropped").cast("long").alias("dropped"),
        F.coalesce(F.col("_queued").cast("long"), F.lit(0)).alias("queued"),
        F.coalesce(F.col("_uptime"), F.lit(0.0)).alias("uptime"),
    )
    return out.drop("reason")


def _file(parsed: DataFrame, cfg: PipelineConfig) -> DataFrame:
    """Flag implausible timestamps, choose the partition date, quarantine the too late."""
    ts, received = F.col("timestamp"), F.col("received")
    tolerance = int(cfg.future_tolerance.total_seconds() * 1e6)
    implausible = (F.unix_micros(ts) > F.unix_micros(received) + tolerance) | (
        ts < F.lit(cfg.earliest)
    )
    days_late = F.datediff(F.to_date(received), F.to_date(ts))
    accepted = F.col("_kind").isin(READING, HEALTH_REPORT) & F.col("_reason").isNull()
    too_late = accepted & ~implausible & (days_late > cfg.horizon_days)
    late_reason = F.format_string(
        f"arrived %d days after its timestamp, beyond the late-data horizon of "
        f"{cfg.horizon_days} days (backfill with a larger horizon to fold it in)",
        days_late,
    )
    reason = F.when(too_late, late_reason).otherwise(F.col("_reason"))
    kind = F.when(reason.isNotNull(), QUARANTINED).otherwise(F.col("_kind"))
    return (
        parsed.select(
            "*",
            kind.alias("kind"),
            reason.alias("reason"),
            F.when(accepted, implausible).alias("implausible"),
        )
        .select(
            "*",
            F.when(
                F.col("kind").isin(READING, HEALTH_REPORT),
                F.when(F.col("implausible"), F.to_date(received)).otherwise(F.to_date(ts)),
            )
            .otherwise(F.col("landing_date"))
            .alias("date"),
        )
        .drop("_kind", "_reason")
    )


def stage(lines: DataFrame, cfg: PipelineConfig) -> DataFrame:
    """Landing lines -> every distinct message once, with ``kind``, ``reason`` and ``date``.

    ``date`` is the silver partition for readings and health reports (the UTC date of the
    timestamp; of the receive time when the timestamp is implausible) and the landing
    (receive) date for quarantined and ignored messages."""
    staged = _file(_parse(deduplicate(marks(lines)), cfg), cfg)
    # Quarantine keeps the payload as it arrived; accepted rows have parsed it already.
    return staged.withColumn(
        "payload", F.when(F.col("kind") == QUARANTINED, F.col("payload"))
    ).withColumn("payload_base64", F.when(F.col("kind") == QUARANTINED, F.col("payload_base64")))


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
