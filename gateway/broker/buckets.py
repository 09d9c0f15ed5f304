"""Token buckets for rates of events (CONNECTs per second), one shared and one per
source, with a bounded table of sources. Pure: time is an argument."""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

#: A bucket holds this many seconds of its rate: a burst that size passes at once.
BURST_SECONDS: Final = 2.0
#: Sources with a bucket at once; the least recently seen is forgotten first (a
#: forgotten source starts again with a full bucket).
MAX_SOURCES: Final = 4096


class TokenBucket:
    """``rate`` events a second on average, ``rate * BURST_SECONDS`` at once."""

    __slots__ = ("capacity", "rate", "tokens", "updated")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate * BURST_SECONDS)
        self.tokens = self.capacity
        self.updated = now

    def take(self, now: float) -> bool:
        """One event now: True if the rate allows it (a token is spent)."""
        elapsed = now - self.updated
        if elapsed > 0:
            self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
            self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class SourceBuckets:
    """One ``TokenBucket`` per source, at most ``max_sources`` of them."""

    __slots__ = ("buckets", "max_sources", "rate")

    def __init__(self, rate: float, max_sources: int = MAX_SOURCES) -> None:
        self.rate = rate
        self.max_sources = max_sources
        self.buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, source: str, now: float) -> bool:
        bucket = self.buckets.get(source)
        if bucket is None:
            if len(self.buckets) >= self.max_sources:
                self.buckets.popitem(last=False)
            bucket = self.buckets[source] = TokenBucket(self.rate, now)
        else:
            self.buckets.move_to_end(source)
        return bucket.take(now)
