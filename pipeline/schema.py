"""The pipeline's tables as Spark schemas, derived from the gateway's contract.

``drivers.model.FIELDS`` names the stored columns of a reading and their Spark types;
the silver table is exactly those columns, then what the pipeline adds (the bridge's
marks, the receive time, how many copies arrived, the plausibility flag, the partition
date). A field added to ``Reading`` without a column here fails at import, not in a job.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from drivers.model import FIELDS, Reading

_TYPES: Final[dict[str, T.DataType]] = {
    "string": T.StringType(),
    "double": T.DoubleType(),
    "timestamp": T.TimestampType(),
    "long": T.LongType(),
    "int": T.IntegerType(),
    "boolean": T.BooleanType(),
    "date": T.DateType(),
}


def struct(columns: dict[str, str]) -> T.StructType:
    """A Spark schema from ``{name: type name}`` (the vocabulary of ``FIELDS``)."""
    return T.StructType([T.StructField(name, _TYPES[kind], True) for name, kind in columns.items()])


def conform(frame: DataFrame, schema: T.StructType) -> DataFrame:
    """``frame``'s columns named in ``schema``, in its order and with its types.

    Written as SQL text: the whole projection is one call into the JVM, where a column
    object per field costs several (a cast to a type object, a dozen: a seventh of a
    small run's calls)."""
    return frame.selectExpr(
        *[f"CAST(`{f.name}` AS {f.dataType.simpleString()}) AS `{f.name}`" for f in schema.fields]
    )


#: Silver columns every stored message carries besides its own (the bridge's marks...).
MESSAGE_COLUMNS: Final[dict[str, str]] = {
    "bridge": "string",  # the gateway id the bridge marked the message with
    "seq": "long",  # the bridge's sequence number: (bridge, seq) is unique in silver
    "received": "timestamp",  # the lander's receive time of the first copy
    "copies": "int",  # how many identical copies arrived (1 + redeliveries)
    "implausible": "boolean",  # timestamp in the future or before ``earliest``
    "date": "date",  # partition: UTC date of timestamp (receive time if implausible)
}

#: Columns nearly unique from row to row (a sequence number, a receive time to the
#: microsecond): Parquet's dictionary encoding only costs time on them before it gives up
#: (a sixth of the readings' write at 1M landing lines), so they are written plain.
PLAIN_COLUMNS: Final = ("seq", "received")

#: Silver readings: ``drivers.model.FIELDS`` (numbers and booleans in ``value``, text and
#: booleans in ``text``), the reading's metadata as JSON text, then the message columns.
READINGS: Final = struct({**FIELDS, "metadata": "string", **MESSAGE_COLUMNS})

#: Silver health reports (``drivers.model.Health``), deduplicated like readings.
HEALTH: Final = struct(
    {
        "gateway": "string",
        "timestamp": "timestamp",
        "dropped": "long",
        "queued": "long",
        "uptime": "double",
        **MESSAGE_COLUMNS,
    }
)

#: Quarantine: every message or line silver could not accept, with the reason, as it
#: arrived. Partitioned by the landing date (the receive date) of its file.
QUARANTINE: Final = struct(
    {
        "reason": "string",
        "topic": "string",
        "payload": "string",
        "payload_base64": "string",
        "qos": "int",
        "retain": "boolean",
        "bridge": "string",
        "seq": "string",
        "received": "timestamp",
        "copies": "int",
        "file": "string",
        "line": "string",
        # the silver day the message was judged for: its timestamp's date, or the landing
        # date when it was refused before its timestamp was read (what a backfill redoes)
        "day": "date",
        "date": "date",
    }
)

#: Gold: per-sensor aggregates (one row per sensor, unit and minute or hour).
SENSOR_AGGREGATE: Final = struct(
    {
        "gateway": "string",
        "driver": "string",
        "device": "string",
        "quantity": "string",
        "unit": "string",
        "start": "timestamp",
        "count": "long",
        "min": "double",
        "max": "double",
        "mean": "double",
        "date": "date",
    }
)

#: Gold: silences longer than the configured gap between two readings of one sensor.
GAPS: Final = struct(
    {
        "gateway": "string",
        "driver": "string",
        "device": "string",
        "quantity": "string",
        "start": "timestamp",
        "end": "timestamp",
        "seconds": "double",
        "date": "date",
    }
)

#: Gold: per gateway and hour (of the messages' timestamps).
FLEET_HEALTH: Final = struct(
    {
        "gateway": "string",
        "hour": "timestamp",
        "messages": "long",  # readings and health reports, deduplicated
        "rate": "double",  # messages per second over the hour
        "lag_mean": "double",  # device-to-cloud lag in seconds: receive time - timestamp
        "lag_p95": "double",
        "lag_max": "double",
        "duplicates": "long",  # redelivered copies dropped by deduplication
        "dropped": "long",  # messages the gateway reported dropping (its health reports)
        "queued_max": "long",  # the largest outbox backlog it reported
        "implausible": "long",  # messages with implausible timestamps
        "date": "date",
    }
)


def _check_contract() -> None:
    """Every field of ``Reading`` has a column, so nothing a gateway sends is left out."""
    stored = {"value": ("value", "text")}  # a scalar is a number (or boolean) or text
    columns = set(READINGS.fieldNames())
    for name in Reading.model_fields:
        missing = [c for c in stored.get(name, (name,)) if c not in columns]
        if missing:
            raise RuntimeError(f"Reading.{name} has no silver column {missing}")


_check_contract()
