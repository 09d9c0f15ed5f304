"""The scanner watchdog's counts and reasons over a long life, with a clock in hand:
every step is counted each time it happens (twice is two, not one), the reason says
what was silent and for how long, and what left; an advert after a failure resets
the backoff; a return of BlueZ restarts at once and is counted as a restart."""

from __future__ import annotations

from drivers.ble.watchdog import Action, State, Watchdog


def escalate(w: Watchdog, start: float) -> list[Action | None]:
    """From scanning, silent on: one tick per silence period."""
    return [w.tick(start + w.silence * k) for k in (1, 2, 3)]


def test_every_step_counted_each_time_and_the_reason_says_how_long() -> None:
    w = Watchdog(silence=30.0, backoff_max=100.0)
    w.start(0.0)
    assert w.tick(29.9) is None
    assert escalate(w, 0.0) == [Action.RESTART, Action.POWER_CYCLE, Action.REPORT_FAILED]
    assert (w.state, w.reason, w.backoff) == (
        State.FAILED, "no advert from a known device for 30 s", 30.0
    )  # fmt: skip
    assert w.tick(119.9) is None and w.tick(120.0) is Action.RETRY and w.backoff == 60.0
    assert w.heard(125.0) is Action.RECOVERED
    assert (w.state, w.backoff, w.step_at) == (State.SCANNING, 0.0, 125.0)
    # a second episode: the silence counts from the advert; each count is now two
    assert w.tick(154.9) is None
    assert escalate(w, 125.0) == [Action.RESTART, Action.POWER_CYCLE, Action.REPORT_FAILED]
    assert w.reason == "no advert from a known device for 30 s"
    assert w.heard(216.0) is Action.RECOVERED
    c = w.counts
    assert (c.restarts, c.power_cycles, c.failures, c.retries, c.recoveries) == (2, 2, 2, 1, 2)


def test_bluez_or_the_adapter_lost_and_back_twice() -> None:
    w = Watchdog(silence=30.0)
    w.start(0.0)
    assert w.lost(10.0, "bluez") is Action.REPORT_FAILED
    assert (w.state, w.reason, w.step_at) == (
        State.ABSENT, "BlueZ (org.bluez) left the system bus", 10.0
    )  # fmt: skip
    assert w.heard(11.0) is None and w.state is State.ABSENT  # a late advert decides nothing
    assert w.back(20.0) is Action.RESTART and (w.state, w.step_at) == (State.FAILED, 20.0)
    assert w.heard(21.0) is Action.RECOVERED
    assert w.lost(40.0, "adapter") is Action.REPORT_FAILED
    assert (w.state, w.reason) == (State.ABSENT, "the adapter was removed")
    assert w.back(50.0) is Action.RESTART and w.heard(51.0) is Action.RECOVERED
    c = w.counts
    assert (c.bluez_lost, c.adapter_lost, c.restarts, c.failures, c.recoveries) == (1, 1, 2, 2, 2)
    w.lost(60.0, "bluez")
    assert (c.bluez_lost, c.adapter_lost, c.failures) == (2, 1, 3)


def test_silence_off_ticks_nothing_while_scanning() -> None:
    w = Watchdog(silence=0.0)
    w.start(0.0)
    assert [w.tick(t) for t in (0.5, 1.0, 10_000.0)] == [None, None, None]
    assert w.state is State.SCANNING and w.counts.restarts == 0
    w.silence = 1.0  # (the watchdog on, at one second: it does act)
    assert w.tick(1.0) is Action.RESTART
