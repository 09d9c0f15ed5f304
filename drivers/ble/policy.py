"""When a device's values become messages: on change, at most every ``min_interval``
seconds, a heartbeat every ``heartbeat`` seconds; and whether a device is home or
away. Pure: time is an argument.

A sensor advertising ten times a second publishes a changed value at once, then
holds further changes back until ``min_interval`` has passed since that quantity was
last published, and publishes the latest value then (nothing is lost, only
coalesced). Unchanged values are republished every ``heartbeat`` seconds while the
device is heard. Events (a button press) are published every time.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from drivers.parsers import Sample


@dataclass(slots=True)
class _Field:
    value: object
    unit: str
    sent_at: float
    pending: Sample | None = None


class Publisher:
    """One device's publishing policy."""

    __slots__ = ("_fields", "heartbeat", "min_interval", "suppressed")

    def __init__(self, min_interval: float, heartbeat: float) -> None:
        self.min_interval = min_interval
        self.heartbeat = heartbeat
        self._fields: dict[str, _Field] = {}
        #: Samples that did not become a message (unchanged or coalesced).
        self.suppressed = 0

    def offer(self, samples: list[Sample], events: Collection[str], now: float) -> list[Sample]:
        """The samples to publish now; the rest are held (changed) or dropped (same)."""
        out: list[Sample] = []
        fields = self._fields
        for sample in samples:
            name = sample.field
            known = fields.get(name)
            if name in events:
                out.append(sample)
                continue
            if known is None:
                fields[name] = _Field(sample.value, sample.unit, now)
                out.append(sample)
            elif known.value == sample.value and type(known.value) is type(sample.value):
                known.pending = None  # back to the published value: nothing to send
                self.suppressed += 1
            elif now - known.sent_at >= self.min_interval:
                known.value = sample.value
                known.sent_at = now
                known.pending = None
                out.append(sample)
            else:
                if known.pending is not None:
                    self.suppressed += 1
                known.pending = sample
        return out

    def due(self, now: float, present: bool) -> list[Sample]:
        """Held changes whose interval has passed, and heartbeats (only while present)."""
        out: list[Sample] = []
        for name, known in self._fields.items():
            if known.pending is not None and now - known.sent_at >= self.min_interval:
                sample = known.pending
                known.value = sample.value
                known.pending = None
                known.sent_at = now
                out.append(sample)
            elif present and self.heartbeat and now - known.sent_at >= self.heartbeat:
                known.sent_at = now
                out.append(Sample(name, known.value, known.unit))  # type: ignore[arg-type]
        return out


class Presence:
    """Home while heard within ``away_after`` seconds, away after."""

    __slots__ = ("away_after", "home", "last_heard")

    def __init__(self, away_after: float) -> None:
        self.away_after = away_after
        self.last_heard: float | None = None
        self.home: bool | None = None  # None: not decided yet

    def heard(self, now: float) -> bool:
        """Note an advert; True when this makes the device home (a change)."""
        self.last_heard = now
        if self.home is not True:
            self.home = True
            return True
        return False

    def check(self, now: float) -> bool:
        """True when the device has just gone away (a change)."""
        if self.home and self.last_heard is not None and now - self.last_heard >= self.away_after:
            self.home = False
            return True
        return False

    def start(self) -> None:
        """Not yet heard since start-up: counts as away until it is."""
        if self.home is None:
            self.home = False
