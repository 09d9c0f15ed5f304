"""Bronze -> silver: read the landing lines, open envelopes, validate, deduplicate exactly.

Pure: DataFrames in, DataFrames out (no reads, no writes, no clock). ``stage`` turns the
landing lines into one row per distinct message, each with a ``kind``:

- ``reading`` / ``health``: valid, deduplicated by (bridge gateway, sequence number, day);
  ``copies`` counts the identical redeliveries folded into it;
- ``quarantine``: anything that could not be accepted, with the ``reason``;
- ``ignored``: status topics (``.../status``), which are not data (with or without marks).

Every rule that looks at one message alone runs first, row by row: the marks, the
payload (``pipeline.transforms.payload``: exactly ``drivers.model.reading_from_message``),
the plausibility of the timestamp and the late-data horizon. Only then are copies
grouped, and only messages judged for the same silver day meet: that day's rows depend
only on the landing days ``[day - 1, day + horizon]``, so any run that recomputes a day
gets the same rows. One pass over the landing lines, one shuffle, no Python in the row
path.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from drivers.model import GATEWAY_PROPERTY, SEQUENCE_PROPERTY
from pipeline.config import PipelineConfig
from pipeline.schema import CORRUPT, HEALTH, QUARANTINE, READINGS, conform
from pipeline.transforms import payload as P

READING: Final = "reading"
HEALTH_REPORT: Final = "health"
QUARANTINED: Final = "quarantine"
IGNORED: Final = "ignored"

#: A topic level made from a name (drivers.model): 1 to 128 characters, none of ``/ + #``
#: or NUL, not starting with ``$``.
_NAME: Final = r"^[^$/+#\x00][^/+#\x00]{0,127}\z"
#: Python's strict base64 (``base64.b64decode(validate=True)``).
_BASE64: Final = r"^(?:[A-Za-z0-9+/]{4})*+(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?\z"
#: A sequence number as text (MQTT 5 property, or an envelope's integer).
_SEQ: Final = r"^[0-9]{1,18}\z"
_ENVELOPE_SEQ: Final = r"^-?[0-9]{1,18}\z"


def _problem(*checks: tuple[Column, str | Column]) -> Column:
    """The message of the first check whose condition holds (null conditions do not)."""
    return F.coalesce(
        *[F.when(cond, msg if isinstance(msg, Column) else F.lit(msg)) for cond, msg in checks]
    )


def _quoted(col: Column) -> Column:
    return F.concat(F.lit("'"), col, F.lit("'"))


def _has(fields: Column, key: str) -> Column:
    return F.coalesce(F.map_contains_key(fields, P.MARK + key), F.lit(False))


def _raw(fields: Column, key: str) -> Column:
    return fields[P.MARK + key]


# ------------------------------------------------------------------ marks and envelopes


def marks(lines: DataFrame) -> DataFrame:
    """Landing lines -> messages with their bridge marks (``bridge``, ``seq``) resolved.

    ``lines`` has the landing columns (``pipeline.schema.LANDING``) plus ``file`` and
    ``landing_date``. A message carries the marks as MQTT 5 user properties, or (from a
    bridge whose remote speaks MQTT 3.1.1) inside an envelope, recognised by its shape
    ``{"gateway", "seq", "payload" | "payload_base64"}`` and opened as
    ``drivers.model.open_envelope`` opens it. ``body`` is the message's payload as marked
    JSON text (``payload.marked``) for the payload rules; ``payload``/``payload_base64``
    are what the quarantine keeps. Sets ``reason`` for lines that cannot be read and
    messages without usable marks (they cannot be deduplicated exactly)."""
    received = F.col("received").try_cast("timestamp")
    has_props = F.col("gateway").isNotNull() | F.col("seq").isNotNull()
    text = F.col("payload")

    # Only a message without user properties can be an envelope: parse only those.
    lines = lines.select(
        "*",
        has_props.alias("_props"),
        F.when(has_props, P.marked(text)).alias("_marked"),
        F.when(~has_props, P.marked(text)).alias("_env_text"),
    )
    has_props = F.col("_props")
    lines = P.with_object(lines, "_env_text", "_env")
    env = F.col("_env")
    is_envelope = (
        ~has_props
        & _has(env, "gateway")
        & _has(env, "seq")
        & (_has(env, "payload") | _has(env, "payload_base64"))
    )
    lines = lines.select(
        "*",
        is_envelope.alias("_is_env"),
        _raw(env, "gateway").alias("_env_gateway"),
        _raw(env, "seq").alias("_env_seq"),
        F.when(_has(env, "payload"), F.coalesce(_raw(env, "payload"), F.lit("null"))).alias(
            "_inner"
        ),
        F.when(P.kind_of(_raw(env, "payload_base64")) == "text",
               P.text_of(_raw(env, "payload_base64"))).alias("_b64"),
    )  # fmt: skip
    is_envelope, inner, b64_text = F.col("_is_env"), F.col("_inner"), F.col("_b64")
    env_gateway, env_seq = F.col("_env_gateway"), F.col("_env_seq")
    lines = lines.select("*", b64_text.rlike(_BASE64).alias("_b64_ok"))
    b64_ok = F.col("_b64_ok")
    lines = lines.select(
        "*",
        F.try_validate_utf8(F.unbase64(F.when(b64_ok, b64_text)).cast("string")).alias("_b64_utf8"),
    )
    b64_utf8 = F.col("_b64_utf8")

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
        (text.isNull() & F.col("payload_base64").isNull(), "landing line has no payload"),
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
            has_props & ~F.col("seq").rlike(_SEQ),
            F.format_string(
                f"{SEQUENCE_PROPERTY} %s is not a decimal number", _quoted(F.col("seq"))
            ),
        ),
        # envelopes (drivers.envelope.open_envelope)
        (
            is_envelope
            & (
                (P.kind_of(env_gateway) != "text")
                | (P.kind_of(env_seq) != "number")
                | ~env_seq.rlike(_ENVELOPE_SEQ)
            ),
            "envelope lacks a gateway (text) or seq (integer)",
        ),
        (is_envelope & inner.isNull() & ~b64_ok, "envelope payload_base64 is not base64 text"),
        (
            ~has_props & ~is_envelope,
            f"no {GATEWAY_PROPERTY}/{SEQUENCE_PROPERTY} marks (not sent by a Ledge bridge): "
            "cannot be deduplicated exactly",
        ),
    )
    body = (
        F.when(has_props, F.col("_marked"))
        .when(is_envelope & inner.isNotNull(), inner)
        .when(is_envelope, P.marked(b64_utf8))
    )
    bridge = F.when(is_envelope, P.text_of(env_gateway)).otherwise(F.col("gateway"))
    seq_text = F.when(is_envelope, env_seq).otherwise(F.col("seq"))
    return lines.select(
        "file",
        "landing_date",
        "topic",
        F.col("qos").try_cast("int").alias("qos"),
        F.col("retain").try_cast("boolean").alias("retain"),
        F.col(CORRUPT).alias("line"),
        received.alias("received"),
        bridge.alias("bridge"),
        seq_text.alias("seq_text"),
        # what the quarantine keeps: the message as it arrived, an envelope opened
        F.when(is_envelope & inner.isNotNull(), P.unmarked(inner))
        .when(~is_envelope, text)
        .alias("payload"),
        F.when(is_envelope, b64_text).otherwise(F.col("payload_base64")).alias("payload_base64"),
        body.alias("body"),
        # undecodable bytes of an envelope: the same verdict as a non-UTF-8 payload
        (is_envelope & inner.isNull() & b64_ok & b64_utf8.isNull()).alias("_not_utf8"),
        # what copies are compared by: the landing record's own content
        F.col("topic").alias("_c_topic"),
        text.alias("_c_payload"),
        F.col("payload_base64").alias("_c_b64"),
        reason.alias("reason"),
    ).withColumn("seq", F.when(F.col("reason").isNull(), F.col("seq_text").cast("long")))


# ------------------------------------------------------------------------------- parsing


def _levels(prefix: str) -> Column:
    """The topic's levels after ``<prefix>/`` (null when it lacks the prefix)."""
    head = prefix + "/"
    rest = F.when(F.col("topic").startswith(head), F.substr(F.col("topic"), F.lit(len(head) + 1)))
    return F.split(rest, "/", -1)


def _timestamp_checks(what: str, raw: Column, stamp: Column, naive: Column) -> list[
    tuple[Column, str | Column]
]:  # fmt: skip
    text = P.text_of(raw)
    return [
        (P.kind_of(raw) != "text", f"{what} must be ISO 8601 text"),
        (naive, f"{what} must carry a time zone (use UTC)"),
        (
            stamp.isNull(),
            F.format_string(f"{what} %s is not ISO 8601 with a UTC offset", _quoted(text)),
        ),
    ]


def _name_problem(level: str, name: Column) -> tuple[Column, Column]:
    return (
        ~name.rlike(_NAME),
        F.format_string(
            f"{level} %s is not a valid topic name (1 to 128 characters, none of / + # "
            "or NUL, no leading $)",
            _quoted(name),
        ),
    )


def _parse(messages: DataFrame, cfg: PipelineConfig) -> DataFrame:
    """Classify messages by topic; parse readings and health reports (row by row)."""
    levels = _levels(cfg.prefix)
    with_levels = messages.select("*", levels.alias("_lv"))
    lv, n = F.col("_lv"), F.size("_lv")  # F.get: null beyond the end (ANSI mode)
    is_status = ((n == 4) & (F.get(lv, 3) == "status")) | ((n == 2) & (F.get(lv, 1) == "status"))
    is_health = (n == 2) & (F.get(lv, 1) == "health")
    is_reading = (n == 4) & ~is_status
    candidate = F.col("reason").isNull() & (is_health | is_reading)
    parsed = P.with_object(with_levels.select("*", F.when(candidate, F.col("body")).alias("_b")),
                           "_b", "_f")  # fmt: skip
    f = F.col("_f")
    parsed = parsed.select(
        "*",
        *[_raw(f, k).alias(f"_{k}") for k in ("value", "unit", "timestamp", "metadata")],
        *[_has(f, k).alias(f"_has_{k}") for k in ("value", "unit", "timestamp", "metadata")],
    )
    value, unit, stamp_raw, meta = (
        F.col(f"_{k}") for k in ("value", "unit", "timestamp", "metadata")
    )
    parsed = parsed.select(
        "*",
        P.kind_of(value).alias("_kind_value"),
        P.number_of(value).alias("_number"),
        F.when(P.kind_of(stamp_raw) == "text", P.text_of(stamp_raw)).alias("_stamp_text"),
        F.when(F.col("_has_metadata"), P.scalar_object(meta)).alias("_meta_scalar"),
    )
    parsed = P.with_timestamp(parsed, "_stamp_text", "_stamp")
    kind, number = F.col("_kind_value"), F.col("_number")
    stamp, naive = F.col("_stamp"), F.col("_stamp_naive")

    not_json = [
        (F.col("_not_utf8") | F.col("body").isNull(), "payload is not JSON (not UTF-8 text)"),
        (~F.col("_f_json"), "payload is not JSON"),
    ]
    # drivers.model.reading_from_message, in its order: the topic, json.loads, the keys,
    # fromisoformat (an argument, so before the model), then Reading's own validation.
    reading_problem = _problem(
        _name_problem("gateway", F.get(lv, 0)),
        *not_json,
        (
            ~F.col("_f_object") | ~F.col("_has_value") | ~F.col("_has_timestamp"),
            "payload lacks value or timestamp",
        ),
        *_timestamp_checks("timestamp", stamp_raw, stamp, naive),
        *[
            _name_problem(level, F.get(lv, i))
            for i, level in ((2, "device"), (3, "quantity"), (1, "driver"))
        ],
        (
            ~kind.isin("number", "boolean", "text"),
            F.format_string(
                "value must be a number, boolean or text, not %s", F.coalesce(kind, F.lit("null"))
            ),
        ),
        ((kind == "number") & (F.isnan(number) | (F.abs(number) == float("inf"))),
         "value must be finite"),
        (F.col("_has_unit") & (P.kind_of(unit) != "text"), "unit must be text"),
        (
            F.col("_has_metadata")
            & ((P.kind_of(meta) != "object") | ~F.coalesce(F.col("_meta_scalar"), F.lit(False))),
            "metadata must be an object of numbers, booleans or text",
        ),
    )  # fmt: skip

    def count_problem(name: str, required: bool) -> list[tuple[Column, str | Column]]:
        raw = _raw(f, name)
        present = F.lit(True) if required else _has(f, name)
        integral = (P.kind_of(raw) == "number") & raw.rlike(r"^-?[0-9]+\z")
        return [
            (present & ~integral, f"health {name} must be an integer"),
            (present & (P.number_of(raw) < 0), f"health {name} must be 0 or more"),
        ]

    uptime = _raw(f, "uptime")
    health_problem = _problem(
        _name_problem("gateway", F.get(lv, 0)),
        *not_json,
        (~F.col("_f_object"), "health payload is not a JSON object"),
        (~F.col("_has_timestamp"), "health payload lacks timestamp"),
        *_timestamp_checks("health timestamp", stamp_raw, stamp, naive),
        (~_has(f, "dropped"), "health payload lacks dropped"),
        *count_problem("dropped", required=True),
        *count_problem("queued", required=False),
        (
            _has(f, "uptime") & ((P.kind_of(uptime) != "number") | ~(P.number_of(uptime) >= 0)),
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
    reason = F.when(
        ~status,
        F.coalesce(
            F.col("reason"),
            F.when(is_health, health_problem)
            .when(is_reading, reading_problem)
            .otherwise(topic_problem),
        ),
    )
    kind_of = (
        F.when(status, IGNORED)
        .when(reason.isNotNull(), QUARANTINED)
        .when(is_health, HEALTH_REPORT)
        .otherwise(READING)
    )
    is_bool, is_text = kind == "boolean", kind == "text"
    parsed = parsed.select("*", reason.alias("_reason"))
    reason = F.col("_reason")
    out = parsed.select(
        *[c for c in messages.columns if c not in ("reason", "body")],
        kind_of.alias("_kind"),
        reason,
        F.get(lv, 0).alias("gateway"),
        F.when(is_reading, F.get(lv, 1)).alias("driver"),
        F.when(is_reading, F.get(lv, 2)).alias("device"),
        F.when(is_reading, F.get(lv, 3)).alias("quantity"),
        F.when(is_bool, F.when(value == "true", 1.0).otherwise(0.0))
        .when(kind == "number", number)
        .alias("value"),
        F.when(is_bool, value).when(is_text, P.text_of(value)).alias("text"),
        F.coalesce(P.text_of(unit), F.lit("")).alias("unit"),
        stamp.alias("timestamp"),
        F.when(F.col("_has_metadata"), P.unmarked(meta)).alias("metadata"),
        P.number_of(_raw(f, "dropped")).try_cast("long").alias("dropped"),
        F.coalesce(P.number_of(_raw(f, "queued")).try_cast("long"), F.lit(0)).alias("queued"),
        F.coalesce(P.number_of(uptime), F.lit(0.0)).alias("uptime"),
    )
    return out


def _judge(parsed: DataFrame, cfg: PipelineConfig) -> DataFrame:
    """Flag implausible timestamps, choose each message's day, quarantine the too late.

    ``day`` is the silver day a message is judged for: its timestamp's UTC date (its
    receive date when the timestamp is implausible); the landing date when it was refused
    before a timestamp was read. ``date`` is where it is stored: ``day`` for accepted
    messages, the landing date for quarantined and ignored ones."""
    ts, received = F.col("timestamp"), F.col("received")
    tolerance = int(cfg.future_tolerance.total_seconds() * 1e6)
    implausible = (F.unix_micros(ts) > F.unix_micros(received) + tolerance) | (
        ts < F.lit(cfg.earliest)
    )
    days_late = F.datediff(F.to_date(received), F.to_date(ts))
    accepted = F.col("_kind").isin(READING, HEALTH_REPORT)
    too_late = accepted & ~implausible & (days_late > cfg.horizon_days)
    late_reason = F.format_string(
        f"arrived %d days after its timestamp, beyond the late-data horizon of "
        f"{cfg.horizon_days} days (backfill with a larger horizon to fold it in)",
        days_late,
    )
    day = F.when(accepted, F.when(implausible, F.to_date(received)).otherwise(F.to_date(ts)))
    reason = F.when(too_late, late_reason).otherwise(F.col("_reason"))
    kind = F.when(too_late, QUARANTINED).otherwise(F.col("_kind"))
    return parsed.select(
        "*",
        kind.alias("kind"),
        reason.alias("reason"),
        F.when(accepted, implausible).alias("implausible"),
        F.coalesce(day, F.col("landing_date")).alias("day"),
    ).drop("_kind", "_reason")


# ------------------------------------------------------------------------ deduplication


def deduplicate(judged: DataFrame) -> DataFrame:
    """One row per message: the first copy to arrive, with ``copies`` counted.

    Copies are identical redeliveries (same topic and payload) under one (bridge, seq).
    They are grouped with the messages judged for the same day: accepted messages by
    their silver day, refused ones by their landing day (so a redelivered bad message is
    quarantined once). In a group of accepted messages, a different message under a
    sequence number already used is quarantined, never merged. The order is total
    (receive time, file, content), so the same input always keeps the same copy."""
    acceptable = F.col("kind").isin(READING, HEALTH_REPORT)
    marked = F.col("bridge").isNotNull() & F.col("seq").isNotNull()
    group = [
        F.when(marked, F.col("bridge")),
        F.when(marked, F.col("seq")),
        F.when(marked, acceptable),
        F.when(marked, F.when(acceptable, F.col("day")).otherwise(F.col("landing_date"))),
        # (unmarked lines are spread by file; each is kept on its own)
        F.when(~marked, F.col("file")),
    ]
    content = ("_c_topic", "_c_payload", "_c_b64")
    # A hash completes the order cheaply; copies are told apart by the content itself.
    digest = F.xxhash64(*[F.concat(F.lit("<"), F.col(c)) for c in content])
    # The group's key and the digest as columns: both windows then partition by the same
    # columns, and Spark shuffles and sorts the rows once for the two (with expressions,
    # each window would shuffle every row again).
    keys = [f"_g{i}" for i in range(len(group))]
    keyed = judged.select(
        "*", *[g.alias(k) for g, k in zip(group, keys, strict=True)], digest.alias("_digest")
    )
    in_order = Window.partitionBy(*keys).orderBy("received", "file", "_digest")
    everyone = Window.partitionBy(*keys)
    ranked = keyed.select(
        "*",
        F.row_number().over(in_order).alias("_rank"),
        *[F.first(c).over(in_order).alias(f"_first{c}") for c in content],
        F.first("received").over(in_order).alias("_first_received"),
    )
    same = F.lit(True)
    for c in content:
        same = same & F.col(c).eqNullSafe(F.col(f"_first{c}"))
    counted = ranked.select("*", F.sum(same.cast("int")).over(everyone).alias("_copies"))
    conflict = F.format_string(
        f"{SEQUENCE_PROPERTY} %d of gateway '%s' was already used by another message "
        "(received first at %s)",
        F.col("seq"),
        F.col("bridge"),
        F.col("_first_received").cast("string"),
    )
    alone = ~marked  # lines without marks are never grouped: each is its own row
    first = (F.col("_rank") == 1) | alone
    clash = ~first & ~same & acceptable
    kept = counted.where(first | ~same)
    return kept.select(
        *[c for c in judged.columns if c not in ("kind", "reason")],
        F.when(clash, QUARANTINED).otherwise(F.col("kind")).alias("kind"),
        F.when(clash, conflict).otherwise(F.col("reason")).alias("reason"),
        F.when(first & ~alone, F.col("_copies")).otherwise(1).alias("copies"),
    )


def stage(lines: DataFrame, cfg: PipelineConfig) -> DataFrame:
    """Landing lines -> every distinct message once, with ``kind``, ``reason``, ``day``
    (see ``_judge``) and ``date`` (its partition: ``day`` for readings and health
    reports, the landing date for quarantined and ignored messages)."""
    staged = deduplicate(_judge(_parse(marks(lines), cfg), cfg))
    quarantined = F.col("kind") == QUARANTINED
    return staged.select(
        *[
            c
            for c in staged.columns
            if not c.startswith("_") and c not in ("payload", "payload_base64", "body")
        ],
        # the quarantine keeps the payload as it arrived; accepted rows have parsed it
        F.when(quarantined, F.col("payload")).alias("payload"),
        F.when(quarantined, F.col("payload_base64")).alias("payload_base64"),
        F.when(F.col("kind").isin(READING, HEALTH_REPORT), F.col("day"))
        .otherwise(F.col("landing_date"))
        .alias("date"),
    )


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
