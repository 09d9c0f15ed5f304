"""Stream mode: Structured Streaming over the landing files, run as availableNow.

Why not a streaming aggregation with a watermark: a watermark is global to the query.
When one gateway has been offline and its backlog lands after the others' current data,
the watermark has already passed the backlog's timestamps and Spark drops those rows
silently. Per-gateway watermarks do not exist.

So the stream keeps no event-time state at all. Spark's file source only tracks, exactly
once in its checkpoint, which landing files are new; each micro-batch finds the landing
days they belong to and recomputes the silver and gold days those could touch
(``[first - horizon, last + 1]``) with the same idempotent batch job as ``run``. A late
backlog is folded in like any other row as long as it is within the late-data horizon,
and quarantined with its reason (never dropped) beyond it. ``maxFilesPerTrigger`` bounds
each micro-batch; ``availableNow`` processes everything present, then stops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date

from pyspark.sql import DataFrame, SparkSession

from pipeline import jobs
from pipeline.config import PipelineConfig
from pipeline.schema import struct
from pipeline.storage import Layout, Storage

log = logging.getLogger(__name__)

#: Landing lines as text, plus the partition columns the file source fills from the paths
#: (only the landing days are read here: the batch job reads the lines).
STREAM_SOURCE = struct({"value": "string", "date": "date", "hour": "int"})


@dataclass
class StreamResult:
    batches: int = 0
    #: The landing days each micro-batch brought.
    landing_days: list[list[date]] = field(default_factory=list)


def stream(
    spark: SparkSession,
    layout: Layout,
    cfg: PipelineConfig,
    max_files_per_trigger: int = 1000,
    progress: bool = True,
) -> StreamResult:
    """Process every landing file not processed yet, in micro-batches, then return."""
    Storage(spark)  # fail early, before starting a query, if the root is unusable
    result = StreamResult()
    source = (
        spark.readStream.schema(STREAM_SOURCE)
        .option("maxFilesPerTrigger", max_files_per_trigger)
        .text(layout.landing)
    )

    def batch(frame: DataFrame, batch_id: int) -> None:
        days = sorted(r["date"] for r in frame.select("date").distinct().collect() if r["date"])
        result.batches += 1
        result.landing_days.append(days)
        if not days:
            return
        first, last = days[0] - jobs.DAY * cfg.horizon_days, days[-1] + jobs.DAY
        log.info("stream: batch %d brought landing days %s", batch_id, jobs.span(days))
        jobs.silver(spark, layout, cfg, (first, last), progress=progress, fresh=days)
        jobs.gold(spark, layout, cfg, jobs.days_between(first, last), progress=progress)

    query = (
        source.writeStream.foreachBatch(batch)
        .option("checkpointLocation", f"{layout.checkpoints}/stream")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    log.info("stream: %d micro-batches, caught up", result.batches)
    return result
