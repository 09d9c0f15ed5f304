"""MQTT-SN client pool choices (which client makes room, at which exact moment) and
the lines an operator reads about a client's life: connected, moved, lost, evicted.

In-process, on the real broker core and the fake clock of ``tests.support.mqttsn``.
"""

from __future__ import annotations

import logging

import pytest

from gateway.mqttsn.packets import Connect, Disconnect, ReturnCode
from tests.support.mqttsn import SnHarness
from tests.test_mqttsn_gateway import mqtt_messages, watcher

LOGGER = "ledge.mqttsn"


def log_lines(caplog: pytest.LogCaptureFixture, part: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if part in r.getMessage()]


# ---------------------------------------------------------------------- pool choices


def test_a_full_pool_forgets_the_first_of_equally_old_disconnected_sessions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness(max_clients=2)
    for n in (1, 2):
        dev = h.device((f"10.0.0.{n}", 1))
        dev.connect(f"d{n}", clean=False)
        dev.ping()
    for n in (1, 2):  # both end at the same moment
        dev = h.device((f"10.0.0.{n}", 1))
        dev.send(Disconnect())
        dev.expect(Disconnect)
    assert h.device(("10.0.0.9", 1)).connect("new").return_code == ReturnCode.ACCEPTED
    assert set(h.gateway.by_id) == {"d2", "new"}
    assert h.gateway.stats.clients_evicted == 1
    (line,) = log_lines(caplog, "forgetting the disconnected session")
    assert line == "forgetting the disconnected session of 'd1' to make room (1 forgotten so far)"


def test_a_full_pool_evicts_the_first_of_equally_silent_idle_clients(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = SnHarness(max_clients=2)
    w = watcher(h, "st/#")
    for n in (1, 2):
        dev = h.device((f"10.0.0.{n}", 1))
        dev.connect(f"d{n}", 0, will=(f"st/d{n}", b"gone", 0, False))
        dev.ping()
    h.advance(30)
    assert h.device(("10.0.0.9", 1)).connect("new").return_code == ReturnCode.ACCEPTED
    assert set(h.gateway.by_id) == {"d2", "new"}
    assert h.gateway.stats.clients_evicted_silent == 1
    assert h.device(("10.0.0.1", 1)).take() == [Disconnect()]
    assert mqtt_messages(w) == [("st/d1", b"gone", 0, False)]
    (line,) = log_lines(caplog, "evicted for")
    assert line == (
        "client 'd1' at 10.0.0.1:1 (udp) evicted for 'new': all 2 client slots in use and"
        " it has no keep alive and was silent for 30 s (1 evicted so far)"
    )


def test_the_pool_is_never_over_its_size() -> None:
    h = SnHarness(max_clients=2)
    for n in (1, 2):
        dev = h.device((f"10.0.0.{n}", 1))
        dev.connect(f"d{n}", 0)
        dev.ping()
    h.device(("10.0.0.9", 1)).connect("new")
    assert len(h.gateway.by_id) == 2


def test_an_unproven_client_is_evicted_exactly_at_its_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = SnHarness(max_clients=4, unproven_share=0.25, unproven_grace=10)
    ghost = h.device(("10.0.1.1", 1))
    ghost.connect("ghost")
    h.advance(9.5)
    assert h.device(("10.0.2.1", 1)).connect("early").return_code == ReturnCode.ACCEPTED
    assert "ghost" in h.gateway.by_id  # within its grace
    h.advance(0.5)  # ghost exactly 10 s silent
    assert h.device(("10.0.3.1", 1)).connect("late").return_code == ReturnCode.ACCEPTED
    assert "ghost" not in h.gateway.by_id
    assert h.gateway.stats.clients_evicted_unproven == 1
    (line,) = log_lines(caplog, "since its CONNACK")
    assert line == (
        "client 'ghost' at 10.0.1.1:1 (udp), silent for 10.0 s since its CONNACK, evicted"
        " to admit 'late': 2 unproven clients (mqttsn.unproven_share of 1) (1 evicted so far)"
    )


def test_an_address_at_its_limit_evicts_its_own_oldest_unproven_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = SnHarness(max_clients_per_address=2, max_connect_rate_per_address=1e6)
    a = h.device(("10.0.0.5", 1))
    a.connect("a")
    h.advance(1)
    h.device(("10.0.0.5", 2)).connect("b")
    h.advance(1)
    assert h.device(("10.0.0.5", 3)).connect("c").return_code == ReturnCode.ACCEPTED
    assert set(h.gateway.by_id) == {"b", "c"}
    assert a.take() == [Disconnect()]
    (line,) = log_lines(caplog, "since its CONNACK")
    assert line == (
        "client 'a' at 10.0.0.5:1 (udp), silent for 2.0 s since its CONNACK, evicted"
        " to admit 'c': 2 clients from 10.0.0.5 (1 evicted so far)"
    )


def test_the_last_unproven_client_makes_room_when_every_slot_is_taken(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = SnHarness(max_clients=2, unproven_grace=100)
    keeper = h.device(("10.0.0.1", 1))
    keeper.connect("keeper")
    keeper.ping()
    h.device(("10.0.0.2", 1)).connect("ghost")
    assert h.device(("10.0.0.3", 1)).connect("new").return_code == ReturnCode.ACCEPTED
    assert set(h.gateway.by_id) == {"keeper", "new"}
    (line,) = log_lines(caplog, "since its CONNACK")
    assert line.endswith("evicted to admit 'new': all 2 slots in use (1 evicted so far)")


def test_a_reconnect_puts_an_unproven_client_last_in_line() -> None:
    """A client that CONNECTs again is as new as its last CONNACK: the other, older
    unproven client makes room first."""
    h = SnHarness(max_clients=3, unproven_grace=100)
    keeper = h.device(("10.0.0.1", 1))
    keeper.connect("keeper")
    keeper.ping()
    first = h.device(("10.0.0.2", 1))
    first.connect("first")
    h.device(("10.0.0.3", 1)).connect("second")
    first.connect("first")  # again: now the newest unproven
    assert h.device(("10.0.0.4", 1)).connect("new").return_code == ReturnCode.ACCEPTED
    assert set(h.gateway.by_id) == {"keeper", "first", "new"}


# ---------------------------------------------------------------------- life lines


def test_a_clients_life_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness()
    dev = h.device(("10.0.0.2", 1))
    dev.connect("d1", 10, clean=False)
    moved = h.device(("10.0.0.3", 7))
    moved.connect("d1", 10, clean=False)
    moved.send(Disconnect())
    moved.expect(Disconnect)
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno >= logging.INFO and "refus" not in r.getMessage()
    ]
    assert lines == [
        "client 'd1' connected from 10.0.0.2:1 (udp) (keep alive 10 s, clean session False)",
        "client 'd1' moves from 10.0.0.2:1 (udp) to 10.0.0.3:7 (udp)",
        "client 'd1' connected from 10.0.0.3:7 (udp) (keep alive 10 s, clean session False)",
        "client 'd1' disconnected",
    ]


def test_an_unfinished_connect_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness(connect_timeout=5)
    h.device().send(Connect("d1", 60, will=True))
    h.advance(5)
    assert log_lines(caplog, "not completed") == ["client 'd1': CONNECT not completed in time"]


def test_a_taken_over_address_logs_the_loss(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness()
    dev = h.device(("10.0.0.2", 1))
    dev.connect("old")
    dev.connect("new")
    assert log_lines(caplog, "lost:") == [
        "client 'old' at 10.0.0.2:1 (udp) lost: address taken over by client 'new'"
    ]


def test_an_evicted_unproven_kept_session_is_then_forgotten_to_keep_the_pool_size() -> None:
    """Evicting an unproven client with a kept session leaves its session in the
    table: the pool is still full, so the longest-disconnected session goes too."""
    h = SnHarness(max_clients=2, unproven_grace=100)
    keeper = h.device(("10.0.0.1", 1))
    keeper.connect("keeper")
    keeper.ping()
    h.device(("10.0.0.2", 1)).connect("ghost", clean=False)
    assert h.device(("10.0.0.3", 1)).connect("new").return_code == ReturnCode.ACCEPTED
    assert set(h.gateway.by_id) == {"keeper", "new"}
    assert h.gateway.stats.clients_evicted == 1


def test_each_forgotten_session_is_counted() -> None:
    h = SnHarness(max_clients=1)
    for n in range(3):
        dev = h.device((f"10.0.0.{n}", 1))
        assert dev.connect(f"d{n}", clean=False).return_code == ReturnCode.ACCEPTED
        dev.ping()
        dev.send(Disconnect())
        dev.expect(Disconnect)
    assert set(h.gateway.by_id) == {"d2"}
    assert h.gateway.stats.clients_evicted == 2
