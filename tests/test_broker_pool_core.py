"""The connection pool and the broker's shell API as a client and an operator see them:
slots coming back once (and counted once on the metrics page), the log lines of lost
connections, slow consumers and evictions (label, age, newcomer, which budget), the
connecting budget trimmed at the exact instant a grace is over, listener limits across
evictions, shutdown, flow control, in-process publishing, the reason strings of refused
wills and of AUTH, assigned client identifiers; and the pure parts under them (timers,
token buckets).

Pure-core tests (``tests.support.harness``): real encoded packets, a fake clock.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gateway.broker.auth import ListenerPolicy, PasswordAuthenticator, hash_password
from gateway.broker.buckets import SourceBuckets, TokenBucket
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.broker.pool import OVERFLOW_SLOTS
from gateway.broker.state import LoginAttempt, State
from gateway.broker.timers import Timers
from gateway.metrics.collect import BrokerSource, Collector
from gateway.mqtt import (
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    ReasonCode,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from tests.support.harness import Harness

LOGGER = "ledge.broker"


def _lines(caplog: pytest.LogCaptureFixture, level: int = logging.DEBUG) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= level]


def _budget(**settings: Any) -> Harness:
    """A harness with the gateway's connecting budget (the plain harness lifts it)."""
    settings.setdefault("connecting_share", 0.25)
    settings.setdefault("max_connecting_per_address", 32)
    settings.setdefault("connecting_grace", 0.0)
    return Harness(**settings)


def _connected_gauge(h: Harness) -> list[str]:
    """The ``ledge_clients_connected`` lines of the metrics page."""
    collector = Collector(h.broker, "gw1", lambda: h.now)
    collector.register(BrokerSource(h.broker, lambda: h.now))
    return [
        line
        for line in collector.metrics().splitlines()
        if line.startswith("ledge_clients_connected{")
    ]


# ------------------------------------------------------------------ slots coming back


def test_a_lost_connection_is_logged_and_gives_its_slot_back_exactly_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Otherwise an operator could not see which client's network went away, a second
    report of the same loss would put one slot in the pool twice (two clients sharing
    it), and the metrics page would count a reused slot's client twice."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    h = Harness(max_connections=2)
    c = h.client(peer="10.0.0.1:1000")
    c.connect("c")
    silent = h.client(peer="10.0.0.2:2000")  # never sends CONNECT
    caplog.clear()
    c.drop()
    silent.drop()
    assert _lines(caplog, logging.INFO) == [
        "client 'c' (10.0.0.1:1000) disconnected: connection lost"
    ]
    c.drop()  # the shell reports the same loss again
    assert len(h.broker.free) == 2
    assert h.broker.listener_open["test"] == 0
    assert c.closed
    for name in ("d", "e"):  # both slots reused
        assert h.client(peer="10.0.0.3:3000").connect(name).reason_code == 0
    assert _connected_gauge(h) == ['ledge_clients_connected{listener="test",protocol="5.0"} 2']


def test_a_slow_consumer_is_named_with_its_drops_when_its_connection_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator must learn which client lost QoS 0 messages by not reading, and how
    many, when it goes away."""
    h = Harness()
    sub = h.client(peer="10.0.0.7:7000")
    sub.connect("slow")
    sub.subscribe("t")
    pub = h.client()
    pub.connect("pub")
    h.broker.set_writable(sub.conn, False, h.now)
    for _ in range(3):
        pub.publish("t")
    caplog.set_level(logging.INFO, logger=LOGGER)
    sub.drop()
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "client 'slow' (10.0.0.7:7000) was a slow consumer: 3 QoS 0 messages dropped"
    ]


def test_refusal_slots_come_back_one_for_one(caplog: pytest.LogCaptureFixture) -> None:
    """A client beyond the pool must still get its refusal once earlier refused ones
    have gone, the refusal slots must stay bounded however many come and go, and an
    operator must read why a connection was closed without a word, and how often."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = Harness(max_connections=1)
    h.client().connect("inside")
    waiting = [
        h.broker.open_connection(f"10.1.0.1:{i}", "test", h.now) for i in range(OVERFLOW_SLOTS)
    ]
    assert all(w is not None and w.overflow for w in waiting)
    assert h.broker.open_connection("10.1.0.2:1", "test", h.now) is None
    first = waiting[0]
    assert first is not None
    h.broker.connection_lost(first, h.now)
    again = h.broker.open_connection("10.1.0.3:1", "test", h.now)
    assert again is not None and again.overflow
    assert h.broker.open_connection("10.1.0.4:1", "test", h.now) is None
    assert h.broker.sys_values(h.now)["$SYS/broker/clients/refused"] == "2"
    h.advance(9.999)
    assert again.state < State.CLOSING
    h.advance(0.001)  # connect_timeout: a silent refusal slot is not held for ever
    assert all(w is not None and w.state >= State.CLOSING for w in [*waiting[1:], again])
    assert _lines(caplog) == [
        f"connection from 10.1.0.{n}:1 closed at once: all 1 slots and {OVERFLOW_SLOTS} "
        f"refusal slots in use ({k} refused so far)"
        for n, k in ((2, 1), (4, 2))
    ]


# ------------------------------------------------------------------ eviction


def test_an_eviction_says_whom_it_closed_after_how_long_for_whom_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The warning is an operator's only clue to a flood of silent connections: the
    victim, its age, the newcomer and which budget was full must be right."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    h = _budget(max_connections=64, max_connecting_per_address=2)
    victim = h.client(peer="10.0.0.1:1")
    h.advance(1.5)
    h.client(peer="10.0.0.1:2")
    h.client(peer="10.0.0.1:3")
    assert victim.closed and victim.conn.abort
    assert _lines(caplog) == [
        "closing #1 (10.0.0.1:1), without CONNACK after 1.5 s, to admit 10.0.0.1:3: "
        "10.0.0.1 has 2 connections in CONNECT (max_connecting_per_address) (1 evicted so far)",
        "closing #1 (10.0.0.1:1): evicted to admit a newer connection",
    ]

    caplog.clear()
    h = _budget(max_connections=8, connecting_share=0.5)  # 4 slots for connecting
    first = h.client(peer="10.0.0.1:1")
    h.advance(2.5)
    for i in range(2, 5):
        h.client(peer=f"10.0.0.{i}:1")
    h.client(peer="10.0.0.9:9")
    assert first.closed
    assert _lines(caplog) == [
        "closing #1 (10.0.0.1:1), without CONNACK after 2.5 s, to admit 10.0.0.9:9: "
        "4 connections in CONNECT hold 4 of 8 slots (1 evicted so far)",
        "closing #1 (10.0.0.1:1): evicted to admit a newer connection",
    ]


def test_when_a_grace_is_over_every_connection_over_the_budget_goes_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A burst let in during the grace must be cut back to the budget the moment the
    oldest one's grace is over, not one connection per expiring grace; the survivor
    keeps the connect deadline counted from its own opening."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = _budget(max_connections=16, max_connecting_per_address=1, connecting_grace=1.0)
    a = h.client(peer="10.0.0.1:1")
    h.advance(0.5)
    b, c, d = (h.client(peer=f"10.0.0.1:{port}") for port in (2, 3, 4))
    assert not any(x.closed for x in (a, b, c, d))  # within the grace, the pool has room
    h.advance(0.4999)
    assert not a.closed
    h.advance(0.0001)  # a's grace is over
    assert [x.closed for x in (a, b, c, d)] == [True, True, True, False]
    assert h.broker.stats.evicted_address_full == 3
    assert _lines(caplog) == [  # evictions 1 and 2 are logged, 3 is not a power of two
        "closing #1 (10.0.0.1:1), without CONNACK after 1.0 s, to admit no one (its grace "
        "is over): 10.0.0.1 has 1 connections in CONNECT (max_connecting_per_address) "
        "(1 evicted so far)",
        "closing #2 (10.0.0.1:2), without CONNACK after 0.5 s, to admit no one (its grace "
        "is over): 10.0.0.1 has 1 connections in CONNECT (max_connecting_per_address) "
        "(2 evicted so far)",
    ]
    h.advance(9.4999)  # d opened at +0.5: its connect_timeout of 10 s ends at +10.5
    assert not d.closed
    h.advance(0.0001)
    assert d.closed


def test_a_grace_longer_than_the_connect_timeout_does_not_extend_it() -> None:
    """A silent connection must be closed at ``connect_timeout`` whatever grace the
    connecting budget gives, or a misconfigured grace would keep slots held longer."""
    h = _budget(connecting_grace=20.0, connect_timeout=5.0)
    silent = h.client(peer="10.0.0.1:1")
    h.advance(4.999)
    assert not silent.closed
    h.advance(0.001)
    assert silent.closed


def test_a_listener_at_its_limit_stays_at_it_through_evictions() -> None:
    """A listener's own connection limit must hold however many of its silent
    connections are evicted, and count nothing twice once they are gone."""
    h = Harness(max_connections=16)
    h.broker.policies = {"lan": ListenerPolicy(PasswordAuthenticator(), None, max_connections=3)}
    lan = [h.client(peer=f"10.0.0.{i}:1", listener="lan") for i in range(5)]
    assert [c.closed for c in lan] == [True, True, False, False, False]
    assert h.broker.listener_open["lan"] == 3
    for c in lan:
        c.drop()
    assert h.broker.listener_open["lan"] == 0
    assert h.client(peer="10.0.0.9:1", listener="lan").connect("back").reason_code == 0


# ------------------------------------------------------------------ the shell API


def test_shutdown_closes_waiting_connections_keeps_wills_and_refuses_latecomers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At shutdown nobody did anything wrong: no will may go out, a connection still
    before its CONNECT must be closed too, and a CONNECT arriving meanwhile must be told
    the server is unavailable instead of being let in."""
    h = Harness()
    heard: list[Message] = []
    watcher = LocalClient(h.broker, "watch", lambda msg, qos, retain, ids: heard.append(msg))
    watcher.subscribe("will/#", now=h.now)
    h.client().connect("x", will=Will("will/x", b"gone"))
    waiting = h.client(peer="10.0.0.5:5")
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    h.broker.shutdown(h.now)
    assert heard == []
    assert waiting.closed and waiting.take() == []
    assert "closing #2 (10.0.0.5:5): server shutting down" in _lines(caplog)
    late = h.client()
    ack = late.connect("late")
    assert ack.reason_code == ReasonCode.SERVER_UNAVAILABLE
    assert ack.properties.reason_string == "server shutting down"
    assert late.closed


def test_flow_control_before_connack_and_queued_messages_keep_their_remaining_lifetime() -> None:
    """The shell may report a connection writable before its CONNECT; a subscriber that
    stopped reading gets its queued messages when it reads again, minus those expired,
    each with the lifetime it has left (MQTT-3.3.2-5, -6)."""
    h = Harness()
    early = h.client()
    h.broker.set_writable(early.conn, False, h.now)
    h.broker.set_writable(early.conn, True, h.now)
    assert early.connect("early").reason_code == 0
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t", 1)
    pub = h.client()
    pub.connect("pub")
    h.broker.set_writable(sub.conn, False, h.now)
    pub.publish("t", b"short", 1, message_expiry_interval=5)
    pub.publish("t", b"long", 1, message_expiry_interval=60)
    assert sub.take() == []
    h.advance(10)
    h.broker.set_writable(sub.conn, True, h.now)
    [got] = sub.publishes()
    assert (got.payload, got.qos, got.properties.message_expiry_interval) == (b"long", 1, 50)
    assert h.broker.stats.dropped_expired == 1


def test_packets_after_a_login_decided_later_are_read_whole() -> None:
    """After a password check decided off the event loop, the client's next packets
    must be read as it sent them (nothing spliced in front of them)."""
    h = Harness()
    h.broker.authenticator = PasswordAuthenticator(
        False, {"ann": hash_password("pw", iterations=1)}
    )
    handed: list[LoginAttempt] = []
    h.broker.verifier = handed.append
    c = h.client()
    c.send(Connect("ann1", MQTT_5, username="ann", password=b"pw"))
    h.advance(1)
    h.broker.password_checked(handed[0], True, h.now)
    assert c.expect(ConnAck).reason_code == 0
    c.send(PingReq())
    assert c.take() == [PingResp()]


def test_an_in_process_publish_is_delivered_as_asked() -> None:
    """Drivers and the bridge publish in-process: by default once at QoS 0 and not
    retained; what they ask for (QoS, retain, properties, No Local of their own
    client id) must reach subscribers exactly."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t/#", 2)
    me = h.client()
    me.connect("me")
    me.send(Subscribe(me.pid(), (SubscriptionRequest("t/#", 2, no_local=True),)))
    me.take()
    assert h.broker.publish_local("t/a", b"plain", h.now) == 2
    assert [(p.topic, p.payload, p.qos, p.retain) for p in sub.publishes()] == [
        ("t/a", b"plain", 0, False)
    ]
    assert [p.topic for p in me.publishes()] == ["t/a"]
    rich = Properties(message_expiry_interval=60, content_type="text/plain")
    sent = h.broker.publish_local(
        "t/b", b"rich", h.now, qos=1, retain=True, properties=rich, origin="me"
    )
    assert sent == 1
    [live] = sub.publishes()
    assert (live.topic, live.qos, live.properties.content_type) == ("t/b", 1, "text/plain")
    sub.ack(live)
    assert me.take() == []  # its own message, and it asked for No Local
    h.advance(10)
    late = h.client()
    late.connect("late")
    late.subscribe("t/#", 2)
    [kept] = late.publishes()
    assert (kept.topic, kept.payload, kept.qos, kept.retain) == ("t/b", b"rich", 1, True)
    assert kept.properties.message_expiry_interval == 50
    assert kept.properties.content_type == "text/plain"


# ------------------------------------------------------------------ CONNECT and AUTH


@pytest.mark.parametrize(
    ("will", "settings", "code", "reason"),
    [
        (
            Will("state", b"x", retain=True),
            {"retain_available": False},
            ReasonCode.RETAIN_NOT_SUPPORTED,
            "retained wills need retained messages",
        ),
        (
            Will("$SYS/fake", b"x"),
            {},
            ReasonCode.NOT_AUTHORIZED,
            "a will may not be published under $SYS",
        ),
        (
            Will("t", b"\xff", properties=Properties(payload_format_indicator=1)),
            {},
            ReasonCode.PAYLOAD_FORMAT_INVALID,
            "will payload is not UTF-8",
        ),
    ],
    ids=["retain-unavailable", "sys-topic", "payload-not-utf8"],
)
def test_an_unpublishable_will_is_refused_with_its_reason(
    will: Will,
    settings: dict[str, bool],
    code: ReasonCode,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client whose will is refused must be told why in the CONNACK, and the
    operator must read the same reason with the client and its address."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    h = Harness(**settings)
    c = h.client(peer="10.0.0.4:44")
    ack = c.connect("w", will=will)
    assert ack.reason_code == code
    assert ack.properties.reason_string == reason
    name = code.name.lower().replace("_", " ")
    assert f"refusing connection 'w' (10.0.0.4:44): {reason} ({name})" in _lines(caplog)


def test_an_auth_packet_is_refused_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    """No authentication method is offered: a client sending AUTH must be told why it
    is disconnected, and the operator must see it in the log."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    h = Harness()
    c = h.client(peer="10.0.0.6:66")
    c.connect("x")
    c.send(Auth(ReasonCode.RE_AUTHENTICATE))
    disconnect = c.expect(Disconnect)
    assert disconnect.reason_code == ReasonCode.PROTOCOL_ERROR
    assert disconnect.properties.reason_string == "AUTH without an authentication method"
    assert (
        "closing 'x' (10.0.0.6:66): AUTH without an authentication method (protocol error)"
        in _lines(caplog)
    )


def test_a_client_disconnecting_with_an_error_is_logged_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that leaves because something went wrong on its side says so in its
    DISCONNECT: the operator must read its code and words; a normal leave logs nothing."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    h = Harness()
    ok = h.client(peer="10.0.0.8:80")
    ok.connect("ok")
    bad = h.client(peer="10.0.0.8:81")
    bad.connect("bad")
    caplog.clear()
    ok.send(Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    why = Properties(reason_string="sensor bus failed")
    bad.send(Disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, why))
    assert ok.closed and bad.closed
    assert _lines(caplog, logging.INFO) == [
        "client 'bad' (10.0.0.8:81) disconnected with reason 0x83 sensor bus failed"
    ]


def test_assigned_client_identifiers_fit_what_every_server_accepts() -> None:
    """A client given an identifier reuses it to resume its session, possibly through
    a server that accepts only the 23 characters MQTT-3.1.3-5 guarantees."""
    h = Harness()
    assigned = []
    for _ in range(2):
        ack = h.client().connect("", session_expiry_interval=60)
        ident = ack.properties.assigned_client_identifier
        assert ident is not None and ident.startswith("ledge-")
        int(ident.removeprefix("ledge-"), 16)
        assert len(ident) <= 23
        assigned.append(ident)
    assert assigned[0] != assigned[1]


# ------------------------------------------------------------------ timers and buckets


def test_a_deadline_without_argument_is_kept_and_live_deadlines_are_counted() -> None:
    """A deadline must fire whatever its argument, and the count of live deadlines
    (what the heap's compaction goes by) must stay exact as cancelled ones are shed."""
    timers = Timers()
    fired: list[object] = []
    timers.at(2.0, lambda arg, now: fired.append((arg, now)), None)
    early = timers.at(1.0, lambda arg, now: fired.append((arg, now)), "early")
    timers.cancel(early)
    assert len(timers) == 1
    assert timers.next_deadline() == 2.0
    assert len(timers) == 1
    assert timers.run_due(2.0) == 1
    assert fired == [(None, 2.0)]
    assert len(timers) == 0 and timers.next_deadline() is None


def test_token_buckets_allow_their_burst_and_forget_the_least_recently_seen_source() -> None:
    """A slow rate still lets one event through at once (not two); a source seen
    recently keeps its spent bucket while the least recently seen one is forgotten, so a
    flood from many sources cannot reset a busy one."""
    bucket = TokenBucket(0.25, 0.0)
    assert [bucket.take(0.0), bucket.take(0.0), bucket.take(3.9), bucket.take(4.0)] == [
        True,
        False,
        False,
        True,
    ]
    sources = SourceBuckets(0.5, max_sources=2)
    assert sources.take("a", 0.0) and not sources.take("a", 0.0)
    assert sources.take("b", 0.0)
    assert not sources.take("a", 0.0)  # a is now the most recently seen
    assert sources.take("c", 0.0)  # the table is full: b is forgotten
    assert list(sources.buckets) == ["a", "c"]
    assert not sources.take("a", 0.0)  # still spent
    assert sources.take("b", 0.0)  # forgotten: a full bucket again


def test_the_shell_is_handed_each_connection_to_write_or_close_once() -> None:
    """The shell writes and closes only what ``take_dirty`` hands it: a subscriber's
    message, or a connection to close, left out would never reach the network."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t")
    pub = h.client()
    pub.connect("pub")
    silent = h.client()
    pub.publish("t", b"hello")
    assert h.broker.take_dirty() == [sub.conn]
    assert h.broker.take_dirty() == []
    assert [p.payload for p in sub.publishes()] == [b"hello"]
    h.advance(10)  # no CONNECT in time: closed, with nothing to say
    assert h.broker.take_dirty() == [silent.conn]
    assert silent.conn.take_output() == [] and silent.closed
