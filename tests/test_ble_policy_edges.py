"""The BLE publishing policy at its edges, with a clock in hand: a change at exactly
``min_interval`` after the last one goes out, a moment earlier it is held; every
sample that does not become a message is counted once (unchanged, or replaced while
held); an event goes out every time and other samples of the advert still follow;
a held change goes out when due with the time it went out remembered."""

from __future__ import annotations

from drivers.ble.policy import Presence, Publisher
from drivers.parsers import Sample


def t(value: object) -> Sample:
    return Sample("temperature", value, "°C")  # type: ignore[arg-type]


def test_the_interval_edge_and_the_suppressed_count() -> None:
    p = Publisher(min_interval=10.0, heartbeat=0.0)
    assert p.suppressed == 0
    assert p.offer([t(20.0)], (), 100.0) == [t(20.0)]
    assert p.offer([t(20.0)], (), 101.0) == [] and p.suppressed == 1  # unchanged
    assert p.offer([t(21.0)], (), 109.99) == []  # held: nothing dropped yet
    assert p.suppressed == 1
    assert p.offer([t(22.0)], (), 109.995) == [] and p.suppressed == 2  # replaced while held
    assert p.due(109.999, present=True) == []
    assert p.due(110.0, present=True) == [t(22.0)]  # at exactly the interval
    assert p.offer([t(23.0)], (), 119.99) == []  # the interval counts from 110, not 100
    assert p.offer([t(24.0)], (), 120.0) == [t(24.0)]  # a change at exactly the interval
    assert p.offer([t(25.0)], (), 129.99) == []  # and the next interval counts from 120
    assert p.due(200.0, present=True) == [t(25.0)]  # held, then due
    assert p.due(300.0, present=True) == []  # (no heartbeat configured)


def test_events_go_out_every_time_and_the_rest_of_the_advert_follows() -> None:
    p = Publisher(min_interval=10.0, heartbeat=0.0)
    press = Sample("button", "press")
    assert p.offer([press, t(20.0)], {"button"}, 0.0) == [press, t(20.0)]
    assert p.offer([press, t(20.0)], {"button"}, 1.0) == [press]
    assert p.suppressed == 1  # the unchanged temperature, not the press


def test_heartbeats_only_while_present_and_a_device_goes_away_after_its_time() -> None:
    p = Publisher(min_interval=10.0, heartbeat=60.0)
    p.offer([t(20.0)], (), 0.0)
    assert p.due(59.0, present=True) == []
    assert p.due(60.0, present=False) == []
    assert p.due(60.0, present=True) == [t(20.0)]
    assert p.due(119.0, present=True) == [] and p.due(120.0, present=True) == [t(20.0)]
    presence = Presence(away_after=30.0)
    assert (presence.home, presence.last_heard) == (None, None)
    assert presence.check(0.0) is False  # never heard: nothing to change
    assert presence.heard(0.0) is True and presence.heard(5.0) is False
    assert presence.check(34.9) is False and presence.check(35.0) is True
    assert presence.home is False and presence.check(100.0) is False
    assert presence.heard(101.0) is True
