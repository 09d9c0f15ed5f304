"""``python -m bench.pipeline_reference LANDING OUT``: the pipeline's core work as a
competent Spark engineer would write it in plain PySpark, single pass, for
``bench.pipeline`` to time ``ledge-pipeline run`` against.

The work: read the landing lines once with an explicit schema (no inference pass); leave
out what cannot be read (no bridge marks, a sequence number that is not 1 to 18 digits,
a receive time that cannot be read: ``try_to_timestamp``, so a malformed field never
fails the job); keep the first copy of each (gateway, seq) to arrive (an aggregation,
not a window: no sort of every line); per sensor the 1-minute count/min/max/mean, and the
1-hour ones rolled up from the minutes (kept in memory, a few rows per sensor and
minute), both into Parquet. Settings for a small local machine: shuffle partitions at
twice the cores, no UI. It computes DuckDB's rows (``bench.pipeline.DUCKDB_SQL``;
``tests/test_pipeline_bench.py`` compares them). What it leaves out of the pipeline's
work: the contract's checks of each payload, the quarantine and its reasons, ``copies``,
the late-data horizon and implausible clocks, health, gaps, re-runnable partitions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: The landing line's fields the reference reads, all as text (the JSON reader then never
#: fails a line on a type; the casts below decide).
SCHEMA = "topic string, payload string, gateway string, seq string, received string"
#: The bucket columns every output has (DuckDB's names).
KEYS = ("gw", "device", "quantity", "start")


def session(master: str) -> SparkSession:
    from pyspark.sql import SparkSession

    from pipeline.session import local_cores

    cores = local_cores(master) or 2
    return (
        SparkSession.builder.master(master)
        .appName("ledge-pipeline-reference")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(2 * cores))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def _value(payload: Column) -> Column:
    """The payload's ``value`` as DuckDB casts it (``bench.pipeline.SPARK_SQL``'s CASE)."""
    from pyspark.sql import functions as F

    text = F.get_json_object(payload, "$.value")
    special = {"true": 1.0, "false": 0.0, '"Infinity"': float("inf"), '"-Infinity"': -float("inf")}
    value = text.try_cast("double")
    for when, number in special.items():
        value = F.when(text == when, F.lit(number)).otherwise(value)
    return value


def minutes(lines: DataFrame) -> DataFrame:
    """Landing lines (``SCHEMA``) -> per sensor and minute: n, min, max, sum."""
    from pyspark.sql import functions as F

    received = F.try_to_timestamp(F.col("received"))
    seq = F.col("seq")
    marked = lines.where(
        F.col("gateway").isNotNull() & seq.rlike("^[0-9]{1,18}$") & received.isNotNull()
    ).select(
        "gateway",
        seq.cast("long").alias("seq"),
        # the first to arrive: the least (receive time, payload), then its topic
        F.struct(received.alias("received"), "payload", "topic").alias("copy"),
    )
    firsts = marked.groupBy("gateway", "seq").agg(F.min("copy").alias("copy"))
    levels = F.split(F.col("copy.topic"), "/")
    payload = F.col("copy.payload")
    readings = firsts.where(F.size(levels) == 5).select(
        levels[1].alias("gw"),
        levels[3].alias("device"),
        levels[4].alias("quantity"),
        _value(payload).alias("value"),
        F.get_json_object(payload, "$.timestamp").try_cast("timestamp").alias("ts"),
    )
    return (
        readings.where(F.col("value").isNotNull() & F.col("ts").isNotNull())
        .groupBy("gw", "device", "quantity", F.date_trunc("minute", "ts").alias("start"))
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.sum("value").alias("sum"),
        )
    )


def run(spark: SparkSession, landing: Path, out: Path) -> None:
    """The reference over ``landing`` into ``out/reference_minute`` and
    ``out/reference_hour`` (Parquet, DuckDB's columns)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    lines = spark.read.schema(SCHEMA).json(str(landing / "date=*" / "hour=*" / "*.jsonl"))
    minute = minutes(lines).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        mean = (F.col("sum") / F.col("n")).alias("mean")
        minute.select(*KEYS, "n", "min", "max", mean).write.mode("overwrite").parquet(
            str(out / "reference_minute")
        )
        hour = minute.groupBy("gw", "device", "quantity", F.date_trunc("hour", "start")).agg(
            F.sum("n").alias("n"),
            F.min("min").alias("min"),
            F.max("max").alias("max"),
            F.sum("sum").alias("sum"),
        )
        hour = hour.withColumnRenamed(hour.columns[3], "start")
        hour.select(*KEYS, "n", "min", "max", mean).write.mode("overwrite").parquet(
            str(out / "reference_hour")
        )
    finally:
        minute.unpersist()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline_reference", description=__doc__)
    parser.add_argument("landing", type=Path, help="the landing folder (date=*/hour=*/*.jsonl)")
    parser.add_argument("out", type=Path, help="where reference_minute/ and reference_hour/ go")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--session-only", action="store_true", help="start the session and stop (the floor)"
    )
    args = parser.parse_args(argv)
    spark = session(args.master)
    try:
        if not args.session_only:
            run(spark, args.landing, args.out)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
