"""A progress display for long jobs: Spark's status tracker, printed to stderr.

Each phase of a job (``silver``, ``gold``, ``report``...) runs its Spark jobs in a job
group; a background thread polls the status tracker and prints the running stage's task
count (rewriting one line on a terminal, a line every few seconds otherwise), and the
phase ends with a summary line: time, Spark jobs and tasks.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TextIO

from pyspark.sql import SparkSession

_groups = itertools.count(1)


@dataclass(frozen=True)
class Summary:
    phase: str
    seconds: float
    jobs: int
    tasks: int

    def __str__(self) -> str:
        return (
            f"{self.phase}: done in {self.seconds:.1f} s "
            f"({self.jobs} Spark jobs, {self.tasks} tasks)"
        )


class Progress:
    """``with Progress(spark, "silver"):`` around the Spark work of one phase."""

    def __init__(
        self,
        spark: SparkSession,
        phase: str,
        out: TextIO | None = None,
        enabled: bool = True,
        interval: float | None = None,
    ) -> None:
        self.sc = spark.sparkContext
        self.phase = phase
        self.out = out if out is not None else sys.stderr
        self.enabled = enabled
        self.tty = self.out.isatty()
        self.interval = interval if interval is not None else (0.5 if self.tty else 5.0)
        self.group = f"ledge-{phase}-{next(_groups)}"
        #: Set when the phase ends, if the progress is shown.
        self.summary: Summary | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._last = ""

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        self.sc.setJobGroup(self.group, self.phase)
        if self.enabled:
            self._thread = threading.Thread(target=self._poll, name=self.group, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
        if self.enabled:
            # Only when shown: it asks the status tracker about every stage, a few
            # hundred calls into the JVM per run, a tenth of a small run's time.
            self.summary = self._summarise()
            if exc is None:
                self._print(str(self.summary), final=True)

    def _summarise(self) -> Summary:
        tracker = self.sc.statusTracker()
        jobs = tracker.getJobIdsForGroup(self.group)
        tasks = 0
        for job in jobs:
            info = tracker.getJobInfo(job)
            for stage_id in info.stageIds if info else ():
                stage = tracker.getStageInfo(stage_id)
                tasks += stage.numCompletedTasks if stage else 0
        return Summary(self.phase, time.monotonic() - self._started, len(jobs), tasks)

    def line(self) -> str:
        """What is running now, e.g. ``silver: stage 7 12/48 tasks (2 running)``."""
        tracker = self.sc.statusTracker()
        parts = []
        for job in sorted(tracker.getJobIdsForGroup(self.group)):
            info = tracker.getJobInfo(job)
            if info is None or info.status != "RUNNING":
                continue
            for stage_id in info.stageIds:
                stage = tracker.getStageInfo(stage_id)
                if stage is None or stage.numActiveTasks == 0:
                    continue
                parts.append(
                    f"stage {stage_id} {stage.numCompletedTasks}/{stage.numTasks} tasks "
                    f"({stage.numActiveTasks} running)"
                )
        elapsed = time.monotonic() - self._started
        return f"{self.phase}: {', '.join(parts) or 'planning'} [{elapsed:.0f} s]"

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._print(self.line())

    def _print(self, text: str, final: bool = False) -> None:
        if self.tty:
            end = "\n" if final else ""
            self.out.write(f"\r\x1b[K{text}{end}")
        elif final or text != self._last:
            self.out.write(text + "\n")
        self._last = text
        self.out.flush()
