"""The scanner watchdog: a scan that silently stops is found and repaired. Pure.

When no advert from a known device arrives for ``silence`` seconds it escalates, one
step per further ``silence`` seconds without adverts:

1. restart discovery (stop and start the scanner);
2. power-cycle the adapter (Powered off and on over D-Bus);
3. report the adapter as failed, then keep trying (power cycle and restart) with a
   backoff that doubles up to ``backoff_max``.

The first advert after any step ends the episode (``recovered``). BlueZ leaving the
bus or the adapter disappearing puts the watchdog straight into the failed state
(it is reported at once); their return asks for an immediate restart. So does a
scanner that does not start (no system bus, no BlueZ, no adapter): the state says
``failed`` with the reason at once, and the start is retried with the backoff -- even
with the silence watchdog off, since a scanner that never started is not a silence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

#: Seconds before the first retry of a failed adapter when the silence watchdog is off.
FIRST_RETRY: Final = 5.0


class State(StrEnum):
    SCANNING = "scanning"
    RESTARTED = "restarted"
    POWER_CYCLED = "power-cycled"
    FAILED = "failed"
    ABSENT = "absent"  # BlueZ or the adapter is gone


class Action(StrEnum):
    RESTART = "restart"
    POWER_CYCLE = "power-cycle"
    REPORT_FAILED = "report-failed"
    RETRY = "retry"  # power cycle, then restart
    RECOVERED = "recovered"


@dataclass(slots=True)
class Counts:
    restarts: int = 0
    power_cycles: int = 0
    failures: int = 0
    retries: int = 0
    recoveries: int = 0
    bluez_lost: int = 0
    adapter_lost: int = 0


@dataclass(slots=True)
class Watchdog:
    silence: float
    backoff_max: float = 300.0
    state: State = State.SCANNING
    last_heard: float = 0.0
    step_at: float = 0.0
    backoff: float = 0.0
    reason: str = ""
    counts: Counts = field(default_factory=Counts)

    def start(self, now: float) -> None:
        self.last_heard = now
        self.step_at = now
        self.state = State.SCANNING

    def heard(self, now: float) -> Action | None:
        """An advert from a known device arrived."""
        self.last_heard = now
        if self.state is State.SCANNING:
            return None
        if self.state is State.ABSENT:
            return None  # a late signal: the return of BlueZ or the adapter decides
        self.state = State.SCANNING
        self.step_at = now
        self.backoff = 0.0
        self.counts.recoveries += 1
        return Action.RECOVERED

    def tick(self, now: float) -> Action | None:
        """What to do now, if anything (call it about once a second)."""
        if self.silence <= 0 and self.state not in (State.FAILED, State.ABSENT):
            return None
        quiet_since = max(self.last_heard, self.step_at)
        if self.state is State.SCANNING:
            if now - quiet_since >= self.silence:
                self.state = State.RESTARTED
                self.step_at = now
                self.reason = f"no advert from a known device for {now - self.last_heard:.0f} s"
                self.counts.restarts += 1
                return Action.RESTART
        elif self.state is State.RESTARTED:
            if now - quiet_since >= self.silence:
                self.state = State.POWER_CYCLED
                self.step_at = now
                self.counts.power_cycles += 1
                return Action.POWER_CYCLE
        elif self.state is State.POWER_CYCLED:
            if now - quiet_since >= self.silence:
                return self._fail(now, self.reason)
        elif self.state in (State.FAILED, State.ABSENT) and now - self.step_at >= self.backoff:
            self.step_at = now
            self.backoff = min(self.backoff * 2, self.backoff_max)
            self.counts.retries += 1
            return Action.RETRY
        return None

    def _fail(self, now: float, reason: str, state: State = State.FAILED) -> Action:
        self.state = state
        self.step_at = now
        self.backoff = min(self.silence if self.silence > 0 else FIRST_RETRY, self.backoff_max)
        self.reason = reason
        self.counts.failures += 1
        return Action.REPORT_FAILED

    def start_failed(self, now: float, reason: str) -> Action | None:
        """The scanner did not start: failed now (``REPORT_FAILED``) unless it already
        is; then only the reason is brought up to date (BlueZ's absence stays the
        reason while it lasts)."""
        if self.state is State.ABSENT:
            return None
        if self.state is State.FAILED:
            self.reason = reason
            return None
        return self._fail(now, reason)

    def lost(self, now: float, what: str) -> Action:
        """BlueZ left the bus (``what`` = "bluez") or the adapter was removed."""
        if what == "bluez":
            self.counts.bluez_lost += 1
            reason = "BlueZ (org.bluez) left the system bus"
        else:
            self.counts.adapter_lost += 1
            reason = "the adapter was removed"
        return self._fail(now, reason, State.ABSENT)

    def back(self, now: float) -> Action:
        """BlueZ or the adapter is back: restart at once (still failed until heard)."""
        self.state = State.FAILED
        self.step_at = now
        self.counts.restarts += 1
        return Action.RESTART
