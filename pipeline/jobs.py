"""The jobs: landing -> silver -> gold, re-runnable, overwriting only what they recompute.

Which dates a run recomputes (``H`` = ``PipelineConfig.horizon_days``):

- Each message is judged for one silver day: its timestamp's UTC date (its receive date
  when the timestamp is implausible). It arrived between day ``e - 1`` (a clock a little
  ahead) and day ``e + H`` (later is quarantined as beyond the horizon), and it meets its
  copies only among the messages judged for the same day. So silver for the days
  ``[a, b]`` is exact once computed from the landing days ``[a - 1, b + H]``, whatever
  else a run reads.
- A regular run (``silver``, ``run``) recomputes ``[L - H, T + 1]``, where ``T`` is the
  newest landing day and ``L`` the newest landing day of the previous run (kept in
  ``_state/pipeline.json``; the first run starts from the oldest landing day). Every day a
  new landing file could have changed is recomputed, whenever and however often it runs.
- ``backfill --from A --to B`` recomputes exactly ``[A, B]``.
- Quarantine is partitioned by landing day. A run rewrites the quarantine of every
  landing day it read: the rows judged for a recomputed day are judged again, the others
  are kept as they were (they depend on landing days the run did not read, and a backfill
  may use other rules); the landing days new since the last run are judged whole. A
  landing day no run has judged (after the last regular run's, without a quarantine
  partition) also takes the rows its lines refused on their own, whatever day each was
  judged for: they are grouped by that landing day alone.
- Gold recomputes the days silver recomputed (kept as pending in the state until gold ran).

Each table is written with dynamic partition overwrite: the recomputed days are replaced,
every other day is left as it was; a recomputed day that is now empty is removed. The
rules depend only on what was landed and on the configuration, so re-running, or
backfilling any range, gives the same tables.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from pyspark import StorageLevel, inheritable_thread_target
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.config import PipelineConfig
from pipeline.progress import Progress
from pipeline.schema import HEALTH, PLAIN_COLUMNS, QUARANTINE, READINGS
from pipeline.session import local_cores
from pipeline.storage import Layout, Storage, partition_path
from pipeline.transforms import gold as gold_t
from pipeline.transforms import silver as silver_t

log = logging.getLogger(__name__)
DAY = timedelta(days=1)

#: Gold tables (``gold_frames``).
GOLD_TABLES = ("sensor_minute", "sensor_hour", "gaps", "health")
#: The columns of silver readings gold reads.
GOLD_COLUMNS = (
    *gold_t.SENSOR, "unit", "value", "timestamp", "received", "seq", "copies", "implausible",
    "date",
)  # fmt: skip


def days_between(first: date, last: date) -> list[date]:
    return [first + DAY * i for i in range((last - first).days + 1)]


def span(days: Iterable[date]) -> str:
    ordered = sorted(days)
    if not ordered:
        return "no days"
    if len(ordered) == 1:
        return ordered[0].isoformat()
    return f"{ordered[0]}..{ordered[-1]} ({len(ordered)} days)"


# --------------------------------------------------------------------------------- state


@dataclass
class State:
    """What the previous runs covered (``_state/pipeline.json``)."""

    landing_through: date | None = None
    gold_pending: set[date] = field(default_factory=set)

    @classmethod
    def load(cls, storage: Storage, layout: Layout) -> State:
        raw = storage.read_json(layout.state)
        if raw is None:
            return cls()
        through = raw.get("landing_through")
        return cls(
            date.fromisoformat(through) if through else None,
            {date.fromisoformat(d) for d in raw.get("gold_pending", [])},
        )

    def save(self, storage: Storage, layout: Layout) -> None:
        storage.write_json(
            layout.state,
            {
                "landing_through": self.landing_through.isoformat()
                if self.landing_through
                else None,
                "gold_pending": sorted(d.isoformat() for d in self.gold_pending),
            },
        )


# ------------------------------------------------------------------------------ reading


def read_landing(spark: SparkSession, layout: Layout, days: Iterable[date]) -> DataFrame:
    """The landing lines of ``days`` (``silver.LINES``: each line's text, its file and
    its landing day, the partition). Blank lines are skipped."""
    paths = [partition_path(layout.landing, d) for d in sorted(days)]
    if not paths:
        return spark.createDataFrame([], silver_t.LINES)
    lines = spark.read.option("basePath", layout.landing).text(paths)
    return lines.where(F.col("value").rlike(r"\S")).select(
        F.col("value").alias("line"),
        F.col("_metadata.file_path").alias("file"),
        F.col("date").alias("landing_date"),
    )


def read_table(
    spark: SparkSession, table: str, schema: T.StructType, days: Iterable[date], storage: Storage
) -> DataFrame:
    """The partitions of ``days`` that exist, with ``schema`` (empty if none exist)."""
    present = set(storage.partition_dates(table))
    paths = [partition_path(table, d) for d in sorted(set(days) & present)]
    if not paths:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", table).parquet(*paths)


# ------------------------------------------------------------------------------ writing


@dataclass(frozen=True)
class Written:
    """What ``replace_days`` wrote: rows, the days that have rows, and ``extra`` (the
    sums of the frame's ``observe`` columns, for callers that count more as it goes)."""

    rows: int
    days: set[date]
    extra: dict[str, Any] = field(default_factory=dict)


def replace_days(
    storage: Storage,
    frame: DataFrame,
    table: str,
    days: set[date],
    observe: Iterable[Column] = (),
    whole_days: bool = True,
) -> Written:
    """Make the ``days`` partitions of ``table`` exactly ``frame``'s rows of those days.

    One pass over the rows: they are counted, and the days that have rows seen, as they are
    written (dynamic partition overwrite replaces those days); then a day of ``days``
    without rows loses its partition. Other days keep theirs. ``observe``: more
    aggregates computed in the same pass (``Written.extra``).

    ``whole_days``: each day's rows are brought to one task, which writes the day as one
    file. Otherwise every task writes a file for each day it holds rows of: four files a
    day on two cores, each a few kB for the small tables (a 1M-line run wrote 211 files,
    44 of them for the 650 rows of fleet health), which readers then open one by one. Only
    the readings, the one large table, are written where they are (``False``): bringing a
    day to one task would shuffle them, and leave one task per day on a cluster."""
    # As SQL text: one call into the JVM, where a date object per day costs two.
    listed = ", ".join(f"DATE'{d.isoformat()}'" for d in sorted(days))
    rows = frame.where(f"date IN ({listed})" if days else "false")
    if whole_days:
        rows = rows.repartition("date")
    seen = Observation()
    rows = rows.observe(
        seen, F.count(F.lit(1)).alias("rows"), F.collect_set("date").alias("days"), *observe
    )
    writer = rows.write.mode("overwrite").partitionBy("date")
    for column in sorted(set(PLAIN_COLUMNS) & set(frame.columns)):
        writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
    writer.parquet(table)
    got = seen.get
    present = set(got.pop("days") or [])
    for day in sorted(days - present):
        if storage.delete(partition_path(table, day)):
            log.info("%s: removed the now empty partition %s", table, day)
    return Written(int(got.pop("rows") or 0), present, got)


@contextlib.contextmanager
def computed_once(frame: DataFrame, by_first_query: bool = False) -> Iterator[DataFrame]:
    """``frame`` computed once for the queries of the ``with`` block; let go after.

    A local session (``local[N]``) computes it now and keeps the rows as rows (an eager
    local checkpoint, ``checkpointed``: serialised rows in the process's memory,
    spilling to its disk); ``by_first_query``: the first query that reads it computes
    and keeps them as it goes (a lazy one, so that query should run alone), where
    computing them first would end one job and plan and start another that reads them
    back. Spark's cache would turn them into column batches and gather
    each column's statistics: at 1M landing lines silver's rows took a quarter more CPU
    to keep that way than as a checkpoint of row objects (4.5 against 3.5 s), and the
    readings' write a sixth more to read back. A checkpoint forgets how
    its rows were made, so a lost block cannot be made again, which in a local session
    happens only with the process. On a cluster, where an executor can go with its
    blocks, the frame is cached instead (memory, then disk) by the first query that reads
    it (so that one should run alone), and a lost block is recomputed."""
    if local_cores(frame.sparkSession.sparkContext.master or ""):
        with checkpointed(frame, eager=not by_first_query) as kept:
            yield kept
    else:
        cached = frame.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            yield cached
        finally:
            cached.unpersist()


_release_failed: list[bool] = []  # (once a warning was logged)


@contextlib.contextmanager
def checkpointed(frame: DataFrame, eager: bool = True) -> Iterator[DataFrame]:
    """``frame`` computed now as an eager local checkpoint (cut from what it was read
    from), or, not ``eager``, by the first query that reads it (Spark still runs the
    stages before its last one now), whose blocks are dropped when the ``with`` block
    ends: a stream's batches would
    otherwise keep theirs until the JVM collects the RDD. Dropping them takes Spark's
    internals: where they differ, a warning (once), and the blocks go when Spark cleans
    the RDD up.

    The rows are kept as bytes (PySpark's ``MEMORY_AND_DISK`` is serialised), not as a
    Java object each (Spark's default for a checkpoint): millions of live objects made
    every young collection copy them, and old ones be compacted. At 4M landing lines the
    run's GC pauses took 5.3 to 6.9 s that way, 0.9 s this way, and the run 48 to 50 s
    against 52 to 56 s; at 1M lines no difference beyond the noise."""
    kept = frame.localCheckpoint(eager=eager, storageLevel=StorageLevel.MEMORY_AND_DISK)
    try:
        yield kept
    finally:
        try:
            kept._jdf.queryExecution().logical().rdd().unpersist(True)
        except Exception:
            if not _release_failed:
                log.warning("kept rows are released only when the JVM collects them", exc_info=True)
                _release_failed.append(True)


def together(spark: SparkSession, *work: Callable[[], Any]) -> list[Any]:
    """Run independent Spark actions at once, each in its own thread (with the caller's
    job group): one's planning and small stages overlap another's tasks, where one after
    the other would leave cores idle. Their results in order; the first error is raised."""
    with ThreadPoolExecutor(max_workers=len(work), thread_name_prefix="ledge-job") as pool:
        inherit = inheritable_thread_target(spark)
        futures = [pool.submit(inherit(fn)) for fn in work]
        return [f.result() for f in futures]


# ------------------------------------------------------------------------------- silver

_python_started: set[str] = set()  # (the applications whose Python workers were started)


@contextlib.contextmanager
def python_workers_started(spark: SparkSession, cfg: PipelineConfig) -> Iterator[None]:
    """Start a local session's Python workers with silver's judge loaded while the ``with``
    block plans silver: a job of one null line per core through the Python judge, on a
    thread of its own, waited for as the block ends. Once per application; nothing on a
    cluster (its executors start their own workers as they go).

    The workers fork from a daemon that loads the judge, the contract, pyarrow and pandas
    first (``pipeline.worker_daemon``): started by the first task, about a second of a
    core, which the first tasks of silver would otherwise wait for, and while the driver
    plans, a core is mostly idle. 1M landing lines (before the daemon loaded them: each
    worker then imported them as it first judged): 25.36 s against 26.09 s (means of 5
    interleaved runs, each faster). A failure here is the first task's to report: logged,
    and left."""
    context = spark.sparkContext
    cores = local_cores(context.master or "")
    if not cores or context.applicationId in _python_started:
        yield
        return
    _python_started.add(context.applicationId)
    judge = silver_t.python_judge(cfg)
    nothing = F.lit(None).cast("string")

    def start() -> None:
        try:
            spark.range(0, cores, 1, cores).select(judge(nothing)).collect()
        except Exception:
            log.debug("silver: the Python workers were not started ahead", exc_info=True)

    thread = threading.Thread(
        target=inheritable_thread_target(spark)(start), name="ledge-python-start", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        thread.join()


@dataclass(frozen=True)
class SilverResult:
    days: list[date]
    readings: int = 0
    health: int = 0
    quarantined: int = 0
    ignored: int = 0
    duplicates: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


#: Session settings silver's rules rely on (``pipeline.session`` sets them too; a session
#: someone else built gets them here): UTC dates, and the last of duplicate JSON keys
#: winning as in ``json.loads``.
SILVER_SETTINGS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
}


def silver(
    spark: SparkSession,
    layout: Layout,
    cfg: PipelineConfig,
    days: tuple[date, date] | None = None,
    progress: bool = True,
    fresh: Iterable[date] = (),
) -> SilverResult:
    """Landing -> silver readings, silver health and quarantine, for ``days`` (first, last)
    or, when None, every day new landing files may have changed (see the module doc).

    ``fresh`` are landing days whose every line is judged again whatever day it is judged
    for (a regular run's new days, a stream batch's); otherwise only the quarantine rows
    judged for ``days`` are redone and the others kept as they were."""
    for key, value in SILVER_SETTINGS.items():
        spark.conf.set(key, value)
    storage = Storage(spark)
    state = State.load(storage, layout)
    landed = storage.partition_dates(layout.landing)
    if not landed:
        log.info("silver: nothing landed under %s yet", layout.landing)
        return SilverResult([])
    horizon = DAY * cfg.horizon_days
    if days is None:
        since = min(state.landing_through or min(landed), max(landed))
        first, last = since - horizon, max(landed) + DAY
        renewed = {d for d in landed if d >= since}
    else:
        first, last = days
        renewed = set(fresh)
    recomputed = set(days_between(first, last))
    window = [d for d in landed if first - DAY <= d <= last + horizon]
    log.info("silver: recomputing %s from the landing days %s", span(recomputed), span(window))

    # Landing days no regular run has judged and without a quarantine partition (an empty
    # root's): their messages refused on their own are grouped by the landing day alone,
    # so they are judged there whatever day they were judged for.
    through = state.landing_through
    quarantined = set(storage.partition_dates(layout.quarantine))
    unjudged = {
        d
        for d in window
        if (through is None or d > through) and d not in renewed and d not in quarantined
    }
    in_scope = (
        F.col("day").isin(sorted(recomputed))
        | F.col("date").isin(sorted(renewed))
        | (F.col(silver_t.BY_LANDING) & F.col("date").isin(sorted(unjudged)))
    )
    kind = F.col("kind")
    dups = [F.sum(F.col("copies") - 1).alias("dups")]
    with (
        python_workers_started(spark, cfg),  # (first: they start while silver is planned)
        Progress(spark, "silver", enabled=progress),
        # One pass over the landing lines: every row is computed once, and kept for the
        # writes and the reasons, by the first of them: the readings' write. 1M landing
        # lines: the readings written 0.46 s sooner, the run 23.32 s against 23.52 s
        # (means of 8 interleaved runs, 6 faster); 4M: 50.8 and 51.0 s against 53.5, 51.8 s.
        computed_once(
            silver_t.stage(read_landing(spark, layout, window), cfg).select(
                "*", in_scope.alias("in_scope")
            ),
            by_first_query=True,
        ) as staged,
    ):
        seen = Observation()
        counted = staged.observe(
            seen,
            *[
                F.count_if(F.col("in_scope") & (kind == k)).alias(k)
                for k in (silver_t.QUARANTINED, silver_t.IGNORED)
            ],
        )
        # the readings first and alone: their write computes the rows it keeps
        readings = replace_days(
            storage,
            silver_t.readings(counted),
            layout.readings,
            recomputed,
            dups,
            whole_days=False,
        )
        # The rest of silver's writes and the reasons take every row but the readings
        # (4% of them at 1M landing lines): cut from the kept rows once, not read from all
        # of them by each. 1M landing lines: 24.12 s against 24.69 s (means of 10
        # interleaved runs, faster in each pair); 4M: 53.2 and 53.2 s against 55.1, 53.5 s.
        with computed_once(staged.where(kind != silver_t.READING)) as others:
            health, _, reasons = together(
                spark,
                lambda: replace_days(
                    storage, silver_t.health(others), layout.health, recomputed, dups
                ),
                lambda: _replace_quarantine(
                    spark,
                    storage,
                    layout,
                    silver_t.quarantine(others.where(F.col("in_scope"))),
                    recomputed,
                    set(window),
                    renewed,
                    quarantined,
                ),
                lambda: (
                    others.where((kind == silver_t.QUARANTINED) & F.col("in_scope"))
                    .groupBy("reason")
                    .count()
                    .orderBy(F.desc("count"), "reason")
                    .limit(20)
                    .collect()
                ),
            )
        totals = seen.get

    result = SilverResult(
        days=sorted(recomputed),
        readings=readings.rows,
        health=health.rows,
        quarantined=int(totals[silver_t.QUARANTINED] or 0),
        ignored=int(totals[silver_t.IGNORED] or 0),
        duplicates=int(readings.extra["dups"] or 0) + int(health.extra["dups"] or 0),
        reasons={r["reason"]: int(r["count"]) for r in reasons},
    )
    log.info(
        "silver: %d readings and %d health reports (%d redelivered copies folded), "
        "%d quarantined, %d status messages ignored",
        result.readings,
        result.health,
        result.duplicates,
        result.quarantined,
        result.ignored,
    )
    for reason, count in list(result.reasons.items())[:5]:
        log.info("silver: quarantined %d: %s", count, reason[:160])

    if days is None:
        state.landing_through = max(landed)
    state.gold_pending |= recomputed
    state.save(storage, layout)
    return result


def _replace_quarantine(
    spark: SparkSession,
    storage: Storage,
    layout: Layout,
    judged: DataFrame,
    recomputed: set[date],
    window: set[date],
    renewed: set[date],
    present: set[date],
) -> None:
    """Rewrite the quarantine partitions of the landing days read (``window``).

    Each keeps, from before, the rows judged for days outside ``recomputed`` (their
    landing day was read, but not every line of their own day's groups was, and the rules
    may have changed since), and takes the rows ``judged`` again. A renewed day is taken
    whole from ``judged``. ``present``: the landing days the quarantine has partitions for."""
    kept_days = sorted(window - renewed)
    if not set(kept_days) & present:
        # nothing to keep from before (a first run, or every day read is renewed)
        replace_days(storage, judged, layout.quarantine, window)
        return
    old = read_table(spark, layout.quarantine, QUARANTINE, kept_days, storage)
    judged_for = F.coalesce(F.col("day"), F.col("date"))  # tables from before `day`
    kept = old.where(~judged_for.isin(sorted(recomputed)))
    # Cut from the files it came from: the write below replaces them.
    with checkpointed(kept) as cut:
        replace_days(storage, judged.unionByName(cut), layout.quarantine, window)


# --------------------------------------------------------------------------------- gold


@dataclass(frozen=True)
class GoldResult:
    days: list[date]
    rows: dict[str, int] = field(default_factory=dict)


def gold_frames(
    readings: DataFrame,
    readings_with_day_before: DataFrame,
    health: DataFrame,
    cfg: PipelineConfig,
    minute_rows: DataFrame,
) -> dict[str, DataFrame]:
    """Every gold table from silver (``GOLD_TABLES``); the sensors' tables from
    ``minute_rows`` (``gold.minutes`` of ``readings_with_day_before``). Rows of the day
    before come out too: the caller writes only its days."""
    return {
        "sensor_minute": gold_t.sensor_aggregates(minute_rows, "minute"),
        "sensor_hour": gold_t.sensor_aggregates(minute_rows, "hour"),
        "gaps": gold_t.gaps(readings_with_day_before, cfg, minute_rows=minute_rows),
        "health": gold_t.fleet_health(readings, health),
    }


def gold(
    spark: SparkSession,
    layout: Layout,
    cfg: PipelineConfig,
    days: Iterable[date] | None = None,
    progress: bool = True,
) -> GoldResult:
    """Silver -> gold for ``days``, or the days silver recomputed since gold last ran
    (all of silver when there is no state)."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    storage = Storage(spark)
    state = State.load(storage, layout)
    if days is None:
        todo = set(state.gold_pending) or set(
            storage.partition_dates(layout.readings) + storage.partition_dates(layout.health)
        )
    else:
        todo = set(days)
    if not todo:
        log.info("gold: nothing to do")
        return GoldResult([])
    log.info("gold: recomputing %s", span(todo))
    day_before = min(todo) - DAY
    readings_ext = read_table(
        spark, layout.readings, READINGS, todo | {day_before}, storage
    ).select(*GOLD_COLUMNS)
    health = read_table(spark, layout.health, HEALTH, todo, storage)
    readings = readings_ext.where(F.col("date").isin(sorted(todo)))
    # One aggregation over the readings for the three tables of sensors, kept (it is
    # about a tenth of the readings) while they are written.
    minute_rows = gold_t.minutes(readings_ext).persist(StorageLevel.MEMORY_AND_DISK)
    frames = gold_frames(readings, readings_ext, health, cfg, minute_rows)
    with Progress(spark, "gold", enabled=progress):
        try:
            write = [
                functools.partial(replace_days, storage, frame, layout.gold(name), todo)
                for name, frame in frames.items()
            ]
            written = together(spark, *write)
        finally:
            minute_rows.unpersist()
    rows = {name: w.rows for name, w in zip(frames, written, strict=True)}
    log.info("gold: %s", ", ".join(f"{n} {name} rows" for name, n in rows.items()))
    state = State.load(storage, layout)
    state.gold_pending -= todo
    state.save(storage, layout)
    return GoldResult(sorted(todo), rows)


def run(
    spark: SparkSession, layout: Layout, cfg: PipelineConfig, progress: bool = True
) -> tuple[SilverResult, GoldResult]:
    """Silver for what landed since the last run, then gold for what silver changed."""
    done = silver(spark, layout, cfg, progress=progress)
    return done, gold(spark, layout, cfg, progress=progress)


def backfill(
    spark: SparkSession,
    layout: Layout,
    cfg: PipelineConfig,
    first: date,
    last: date,
    progress: bool = True,
) -> tuple[SilverResult, GoldResult]:
    """Recompute silver and gold for the days ``[first, last]`` from the landing files."""
    if last < first:
        raise ValueError(f"backfill: --to {last} is before --from {first}")
    done = silver(spark, layout, cfg, (first, last), progress=progress)
    return done, gold(spark, layout, cfg, days_between(first, last), progress=progress)


def table_rows(spark: SparkSession, table: str) -> list[dict[str, Any]]:
    """Every row of a table as dicts, sorted (for comparing two runs); none if it is empty."""
    if not Storage(spark).partition_dates(table):
        return []
    rows = [r.asDict() for r in spark.read.parquet(table).collect()]
    return sorted(rows, key=lambda r: [(v is None, str(v)) for v in r.values()])
