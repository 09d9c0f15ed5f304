"""What the pipeline's rules depend on, in one frozen value passed to every transform."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from drivers.model import DEFAULT_PREFIX


@dataclass(frozen=True)
class PipelineConfig:
    """The rules of silver and gold. Changing one changes what the tables hold: backfill."""

    #: Topic prefix of readings and health reports (``<prefix>/<gateway>/...``).
    prefix: str = DEFAULT_PREFIX
    #: Late-data horizon in days: a message that arrives more than this many calendar days
    #: after the day of its timestamp is quarantined (``backfill`` with a larger horizon
    #: folds it in, or counts it as a copy of a message already in silver). Each run
    #: recomputes the last ``horizon_days`` days of silver and gold.
    horizon_days: int = 3
    #: A timestamp later than the receive time by more than this is implausible (a clock
    #: running ahead); such rows are kept, flagged, and filed under their receive time.
    future_tolerance: timedelta = timedelta(minutes=5)
    #: A timestamp before this is implausible too (a clock that was never set).
    earliest: datetime = datetime(2000, 1, 1, tzinfo=UTC)
    #: A sensor silent for longer than this between two readings has a gap.
    gap: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if self.horizon_days < 0:
            raise ValueError("horizon_days must be 0 or more")
        if self.future_tolerance >= timedelta(days=1):
            raise ValueError("future_tolerance must be shorter than a day")
        if self.gap <= timedelta(0):
            raise ValueError("gap must be positive")
        if not self.prefix or self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise ValueError(f"prefix {self.prefix!r} must be topic levels without outer '/'")
