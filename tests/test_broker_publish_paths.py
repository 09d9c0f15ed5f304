"""PUBLISH paths of the broker core, pinned where a client or an operator sees them.

The acknowledgement flows towards a subscriber (a PUBACK, PUBREC or PUBCOMP of the
wrong flow closes the connection with its reason; unknown ones are ignored and logged;
a freed window sends the next queued message with its remaining expiry), what waits
for the store and what does not, the gates and the full store as the publisher sees
them, topic aliases per connection, the in-process publisher, and the output plumbing
(dropped oversized messages, problem details stripped to fit, the dirty list).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gateway.broker import publish_policy
from gateway.broker.acl import parse_acl_file
from gateway.broker.journal import AddIncoming, Journal, MoveEntry, RemoveIncoming
from gateway.broker.output import FLUSH_AT
from gateway.broker.state import Flow
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    SubscriptionRequest,
)
from tests.support.harness import FakeClient, Harness

LOGGER = "ledge.broker"


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def commit(h: Harness) -> None:
    """As if the store committed everything journaled so far."""
    batch = h.broker.seal_batch()
    if batch is not None:
        h.broker.batch_committed(batch[0])


def stored_client(h: Harness, client_id: str, expiry: int, peer: str = "127.0.0.1:9") -> FakeClient:
    """A connected MQTT 5 client of a broker with a store (expiry 0: a clean session)."""
    c = h.client(peer=peer)
    props = Properties(session_expiry_interval=expiry) if expiry else Properties()
    c.send(Connect(client_id, MQTT_5, not expiry, 0, properties=props))
    commit(h)
    c.expect(ConnAck)
    return c


def stored_subscribe(h: Harness, c: FakeClient, topic_filter: str, qos: int) -> None:
    c.send(Subscribe(c.pid(), (SubscriptionRequest(topic_filter, qos),)))
    commit(h)
    c.expect(SubAck)


# ------------------------------------------------------------ acknowledgements from a subscriber


@pytest.mark.parametrize(
    ("sub_qos", "before", "wrong"),
    [
        (2, None, PubAck),
        (1, None, PubRec),
        (1, None, PubComp),
        (2, None, PubComp),  # QoS 2 before its PUBREC: no PUBREL went out yet
        (2, PubRec, PubAck),  # QoS 2 after its PUBREC: still not a PUBACK
    ],
    ids=["puback-qos2", "pubrec-qos1", "pubcomp-qos1", "pubcomp-before-pubrec", "puback-late"],
)
def test_an_acknowledgement_of_the_other_flow_closes_with_its_reason(
    caplog: pytest.LogCaptureFixture,
    sub_qos: int,
    before: type[PubRec] | None,
    wrong: type[PubAck | PubRec | PubComp],
) -> None:
    """A subscriber that mixes up the QoS 1 and QoS 2 flows would otherwise be left with a
    message stuck in flight, or be dropped without saying why (MQTT 5.0 4.3, 4.13)."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t/#", sub_qos)
    pub = h.client(peer="10.0.0.2:1")
    pub.connect("pub")
    pub.publish("t/a", b"m", 2)
    [msg] = sub.publishes()
    assert msg.qos == sub_qos
    if before is not None:
        sub.send(before(msg.packet_id))
        assert sub.take() == [PubRel(msg.packet_id)]
    caplog.set_level(logging.INFO, logger=LOGGER)
    sub.send(wrong(msg.packet_id))
    name = wrong.__name__.upper()
    reason = f"{name} for packet id {msg.packet_id}, a QoS {sub_qos} message"
    assert sub.take() == [Disconnect(ReasonCode.PROTOCOL_ERROR, Properties(reason_string=reason))]
    assert sub.closed
    assert h.broker.stats.protocol_errors == 1
    assert f"closing 'sub' (127.0.0.1:9): {reason} (protocol error)" in lines(caplog)


def test_late_and_unknown_acknowledgements_are_answered_or_ignored_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A repeated or stray acknowledgement must neither close the client nor pass
    silently: PUBREC gets PUBREL 0x92, PUBACK and PUBCOMP a debug line naming it."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t/#", 2)
    pub = h.client()
    pub.connect("pub")
    pub.publish("t/a", b"m", 1)
    [msg] = sub.publishes()
    sub.send(PubAck(msg.packet_id))
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    sub.send(PubAck(msg.packet_id))  # the flow is over: a late duplicate
    sub.send(PubComp(77))
    sub.send(PubRec(55))
    assert sub.take() == [PubRel(55, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)]
    assert not sub.closed
    got = lines(caplog)
    assert f"PUBACK from 'sub' (127.0.0.1:9) for unknown packet id {msg.packet_id}" in got
    assert "PUBCOMP from 'sub' (127.0.0.1:9) for unknown packet id 77" in got
    assert h.broker.stats.protocol_errors == 0


@pytest.mark.parametrize(
    ("qos", "finish"),
    [(1, "puback"), (2, "pubcomp"), (2, "pubrec-error")],
)
def test_an_ended_flow_sends_the_next_queued_message_with_its_remaining_expiry(
    qos: int, finish: str
) -> None:
    """When the window opens again the waiting message must go out at once, and say how
    long it has left, or the subscriber acts on stale data or waits forever."""
    h = Harness()
    sub = h.client()
    sub.connect("sub", receive_maximum=1)
    sub.subscribe("t/#", qos)
    pub = h.client()
    pub.connect("pub")
    pub.publish("t/a", b"first", qos, message_expiry_interval=100)
    pub.publish("t/a", b"second", qos, message_expiry_interval=100)
    [first] = sub.publishes()
    assert first.payload == b"first"
    h.advance(30)
    if finish == "puback":
        sub.send(PubAck(first.packet_id))
    elif finish == "pubcomp":
        sub.send(PubRec(first.packet_id))
        assert sub.expect(PubRel).packet_id == first.packet_id
        sub.send(PubComp(first.packet_id))
    else:
        sub.send(PubRec(first.packet_id, ReasonCode.UNSPECIFIED_ERROR))
    [second] = sub.publishes()
    assert (second.payload, second.qos) == (b"second", qos)
    assert second.properties.message_expiry_interval == 70
    assert list(h.broker.sessions["sub"].inflight) == [second.packet_id]


# ------------------------------------------------------------------ the store's holds


@pytest.mark.parametrize("persisted", [True, False], ids=["persistent", "clean"])
def test_a_pubrel_waits_for_its_pubrec_stage_only_on_a_persistent_session(
    persisted: bool,
) -> None:
    """A PUBREL sent before the PUBREC stage is stored makes a restart re-send the
    PUBLISH (a duplicate QoS 2 delivery); one held for a clean session only adds delay."""
    h = Harness()
    journal = h.broker.journal = Journal()
    sub = stored_client(h, "sub", 600 if persisted else 0)
    stored_subscribe(h, sub, "t/#", 2)
    pub = stored_client(h, "pub", 0)
    pub.send(Publish("t/a", b"m", 2, packet_id=3))
    commit(h)
    assert pub.take() == [PubRec(3)]
    [msg] = sub.publishes()
    pid = msg.packet_id
    entry = h.broker.sessions["sub"].inflight[pid]
    for repeat in (False, True):
        sub.send(PubRec(pid))
        if persisted:
            assert sub.take() == []  # held for the store
            moved = [] if repeat else [MoveEntry("sub", entry.seq, pid, Flow.AWAIT_COMP)]
            assert journal.ops == moved
            commit(h)
        else:
            assert journal.ops == []
        assert sub.take() == [PubRel(pid)]
        assert entry.state is Flow.AWAIT_COMP


@pytest.mark.parametrize("persisted", [True, False], ids=["persistent", "clean"])
def test_a_pubcomp_waits_for_the_released_identifier_only_on_a_persistent_session(
    persisted: bool,
) -> None:
    """A PUBCOMP sent before the store forgets the identifier lets a restart drop the
    client's next message under that id as a duplicate; a clean session must not wait."""
    h = Harness()
    journal = h.broker.journal = Journal()
    pub = stored_client(h, "pub", 600 if persisted else 0)
    pub.send(Publish("t/a", b"m", 2, packet_id=9))
    if persisted:  # the PUBREC waits for the identifier to be stored
        assert pub.take() == []
        assert journal.ops == [AddIncoming("pub", 9)]
        commit(h)
    else:
        assert journal.ops == []
    assert pub.take() == [PubRec(9, ReasonCode.NO_MATCHING_SUBSCRIBERS)]
    for known in (True, False):  # the PUBREL, then a repeated one: unknown by now
        pub.send(PubRel(9))
        answer = PubComp(9) if known else PubComp(9, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
        if persisted:
            assert pub.take() == []
            assert journal.ops == ([RemoveIncoming("pub", 9)] if known else [])
            commit(h)
        else:
            assert journal.ops == []
        assert pub.take() == [answer]
    assert not h.broker.sessions["pub"].incoming_qos2


# ------------------------------------------------------------------ policy: gates, store, $SYS


def test_gates_see_payload_and_property_bytes_and_refuse_with_their_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bridge's outbox bound counts what a message holds; its refusal must reach the
    publisher (0x97) and the log with the gate's own words, and never touch QoS 0."""
    h = Harness()
    h.broker.acl = parse_acl_file("topic readwrite #\n")
    seen: list[tuple[str, int]] = []

    def gate(topic: str, size: int) -> str | None:
        seen.append((topic, size))
        return "outbox of 'cloud' full" if topic.startswith("full/") else None

    h.broker.publish_gates.append(gate)
    sub = h.client(peer="10.0.0.2:1")
    sub.connect("sub")
    sub.subscribe("#", 1)
    pub = h.client()
    pub.connect("pub")
    caplog.set_level(logging.INFO, logger=LOGGER)
    pub.send(Publish("ok/a", b"0123456789", 1, packet_id=1))
    # a property block of 8 bytes: its length, 0x26, then "k" and "v" with 2-byte lengths
    pub.send(
        Publish(
            "ok/b",
            b"0123456789",
            1,
            packet_id=2,
            properties=Properties(user_properties=(("k", "v"),)),
        )
    )
    pub.send(Publish("full/c", b"0123456789", 1, packet_id=3))
    pub.send(Publish("full/d", b"qos 0", 0))
    assert seen == [("ok/a", 10), ("ok/b", 18), ("full/c", 10)]
    assert pub.take() == [PubAck(1), PubAck(2), PubAck(3, ReasonCode.QUOTA_EXCEEDED)]
    assert [(p.topic, p.payload) for p in sub.publishes()] == [
        ("ok/a", b"0123456789"),
        ("ok/b", b"0123456789"),
        ("full/d", b"qos 0"),
    ]
    assert h.broker.stats.publish_denied == 1
    assert "refusing PUBLISH from 'pub' (127.0.0.1:9): outbox of 'cloud' full" in lines(caplog)


def test_a_full_store_refuses_a_retained_message_but_not_a_transient_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A retained QoS 1 message would be written to the full store: it is refused with
    0x97 and not retained; one only clean sessions get still flows."""
    h = Harness()
    journal = h.broker.journal = Journal()
    sub = stored_client(h, "sub", 0, peer="10.0.0.2:1")
    stored_subscribe(h, sub, "r/#", 1)
    pub = stored_client(h, "pub", 0)
    h.broker.store_full = True
    caplog.set_level(logging.INFO, logger=LOGGER)
    pub.send(Publish("r/1", b"kept?", 1, retain=True, packet_id=1))
    assert pub.take() == [PubAck(1, ReasonCode.QUOTA_EXCEEDED)]
    assert sub.take() == []
    assert journal.ops == []
    assert len(h.broker.retained) == 0
    assert (
        "refusing PUBLISH from 'pub' (127.0.0.1:9): "
        "store full: message on 'r/1' for persistent sessions refused"
    ) in lines(caplog)
    pub.send(Publish("r/1", b"live", 1, packet_id=2))
    assert pub.take() == [PubAck(2)]
    assert [p.payload for p in sub.publishes()] == [b"live"]
    assert h.broker.stats.publish_denied == 1


def test_a_bridge_named_with_capitals_may_publish_its_own_state() -> None:
    """A bridge whose client id has an upper-case X must still be able to say it is
    connected, or monitoring shows every such bridge as down."""
    h = Harness()
    watcher = h.client()
    watcher.connect("watcher")
    watcher.subscribe("$SYS/broker/connection/+/state", 1)
    bridge = h.client()
    bridge.connect("edgeX")
    bridge.send(Publish("$SYS/broker/connection/edgeX/state", b"1", 1, True, packet_id=4))
    assert bridge.take() == [PubAck(4)]
    [state] = watcher.publishes()
    assert (state.topic, state.payload) == ("$SYS/broker/connection/edgeX/state", b"1")
    assert h.broker.stats.publish_denied == 0


def test_the_inlined_guard_is_may_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """``receive`` calls ``authorize`` exactly when ``may_refuse`` says it could refuse:
    the two documented halves of one guard must not drift apart."""
    calls: list[str] = []
    real = publish_policy.authorize

    def spy(*args: Any, **kwargs: Any) -> publish_policy.Verdict | None:
        calls.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(publish_policy, "authorize", spy)
    for acl in (None, "topic readwrite #\n"):
        for gated in (False, True):
            for store_full in (False, True):
                h = Harness()
                h.broker.acl = parse_acl_file(acl) if acl else None
                h.broker.store_full = store_full
                if gated:
                    h.broker.publish_gates.append(lambda topic, size: None)
                c = h.client()
                c.connect("c")
                for qos in (0, 1, 2):
                    for topic in ("plain/t", "$x/t"):
                        calls.clear()
                        c.send(Publish(topic, b"p", qos, packet_id=qos and c.pid()))
                        c.take()
                        expected = publish_policy.may_refuse(h.broker, c.conn.rules, topic, qos)
                        assert (calls == [topic]) is expected, (acl, gated, store_full, qos, topic)
                        assert calls in ([], [topic])


# ------------------------------------------------------------------ topic aliases


def test_topic_aliases_are_per_connection_and_reach_the_maximum() -> None:
    """An alias is the connection's own (another client cannot use it, MQTT 5.0
    3.3.2.3.4), the announced maximum itself is valid, and refusals say why."""
    h = Harness(topic_alias_maximum=4)
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t/#")
    a = h.client()
    a.connect("a")
    a.send(Publish("t/a", b"1", properties=Properties(topic_alias=4)))
    a.send(Publish("", b"2", properties=Properties(topic_alias=4)))
    b = h.client()
    b.connect("b")
    b.send(Publish("", b"3", properties=Properties(topic_alias=4)))
    assert b.take() == [
        Disconnect(
            ReasonCode.PROTOCOL_ERROR, Properties(reason_string="topic alias 4 was never set")
        )
    ]
    c = h.client()
    c.connect("c")
    c.send(Publish("t/c", b"4", properties=Properties(topic_alias=5)))
    assert c.take() == [
        Disconnect(
            ReasonCode.TOPIC_ALIAS_INVALID,
            Properties(reason_string="topic alias 5 is outside 1..4"),
        )
    ]
    assert not a.closed
    assert [(p.topic, p.payload) for p in sub.publishes()] == [("t/a", b"1"), ("t/a", b"2")]


# ------------------------------------------------------------------ in-process publishers


def test_an_in_process_message_keeps_its_properties_and_expiry() -> None:
    """A bridge's or driver's message must reach subscribers with its user properties
    and an expiry counted from when it was published, not from the clock's origin."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("loc/#", 1)
    props = Properties(message_expiry_interval=60, user_properties=(("unit", "C"),))
    assert h.broker.publish_local("loc/t", b"21.5", h.now, qos=1, properties=props) == 1
    [msg] = sub.publishes()
    assert (msg.topic, msg.payload, msg.qos) == ("loc/t", b"21.5", 1)
    assert msg.properties.message_expiry_interval == 60
    assert msg.properties.user_properties == (("unit", "C"),)
    assert h.broker.stats.dropped_expired == 0


def test_oversized_messages_are_counted_logged_and_sys_values_go_out_at_qos_0(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every message too large for a client is counted (an operator sees the total in
    ``$SYS``, delivered at QoS 0 as a QoS 1 subscriber asked) and logged by topic and client."""
    h = Harness(sys_interval=10)
    watcher = h.client(peer="10.0.0.3:1")
    watcher.connect("watcher")
    watcher.subscribe("$SYS/broker/publish/messages/dropped/too large", 1)
    small = h.client()
    small.connect("small", maximum_packet_size=64)
    small.subscribe("t/#", 1)
    pub = h.client(peer="10.0.0.2:1")
    pub.connect("pub")
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    pub.publish("t/big", b"." * 64, 1)
    pub.publish("t/big", b"." * 64, 0)  # forwarded as received: checked the same way
    pub.publish("t/ok", b".", 1)
    assert [p.topic for p in small.publishes()] == ["t/ok"]
    assert h.broker.stats.dropped_too_large == 2
    line = "message on 't/big' exceeds the maximum packet size of 'small' (127.0.0.1:9)"
    assert lines(caplog).count(line) == 2
    h.advance(0)
    [value] = watcher.publishes()
    assert (value.payload, value.qos) == (b"2", 0)


def test_a_disconnect_loses_its_reason_string_to_fit_the_clients_maximum() -> None:
    """A client with a small Maximum Packet Size must still be told why it is closed
    (MQTT-3.1.2-25): the reason string goes, the reason code stays."""
    h = Harness()
    sub = h.client()
    sub.connect("sub", maximum_packet_size=24)
    sub.subscribe("t", 2)
    pub = h.client()
    pub.connect("pub")
    pub.publish("t", b"m", 2)
    [msg] = sub.publishes()
    sub.send(PubAck(msg.packet_id))
    assert sub.take() == [Disconnect(ReasonCode.PROTOCOL_ERROR)]
    assert sub.closed


def test_the_shell_gets_each_connection_with_output_once_and_urgency_resets() -> None:
    """The shell writes what ``take_dirty`` lists: a connection missing from it never
    gets its bytes, a stale urgent flag makes every event flush at once."""
    h = Harness()
    broker = h.broker
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t/#", 1)
    pub = h.client()
    pub.connect("pub")
    assert broker.take_dirty() == []
    for payload in (b"a", b"b"):
        pub.send(Publish("t/x", payload, 1, packet_id=pub.pid()))
    assert broker.take_dirty() == [sub.conn, pub.conn]  # once each, in order
    assert not broker.urgent
    got: list[Packet] = sub.take()
    assert [p.payload for p in got if isinstance(p, Publish)] == [b"a", b"b"]
    pub.take()
    assert broker.take_dirty() == []
    # a QoS 0 PUBLISH on "t/x" of n payload bytes is 1 + 3 (remaining length, n > 16 K)
    # + 5 (topic) + 1 (no properties) + n bytes: exactly FLUSH_AT may wait for the loop
    for n, urgent in ((FLUSH_AT - 10, False), (FLUSH_AT - 9, True)):
        pub.send(Publish("t/x", b"." * n, 0))
        assert sub.conn.out_bytes == n + 10
        assert bool(broker.urgent) is urgent
        assert broker.take_dirty() == [sub.conn]
        assert not broker.urgent
        assert len(sub.publishes()[0].payload) == n


# ------------------------------------------------------------------ the policy's answers


@pytest.mark.parametrize(
    ("settings", "packets", "code", "reason"),
    [
        (
            {},
            [Publish("t", b"x", properties=Properties(subscription_identifiers=(3,)))],
            ReasonCode.PROTOCOL_ERROR,
            "a client's PUBLISH must not carry a subscription identifier",
        ),
        ({}, [Publish("", b"x")], ReasonCode.PROTOCOL_ERROR, "PUBLISH without topic name or alias"),
        (
            {"retain_available": False},
            [Publish("t", b"x", 0, True)],
            ReasonCode.RETAIN_NOT_SUPPORTED,
            "retained messages are disabled",
        ),
        (
            {},
            [Publish("t", b"\xff", properties=Properties(payload_format_indicator=1))],
            ReasonCode.PAYLOAD_FORMAT_INVALID,
            "payload format indicator says UTF-8 but the payload is not",
        ),
        (
            {"receive_maximum": 2},
            [Publish("t", b"x", 2, packet_id=pid) for pid in (1, 2, 3)],
            ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
            "more than 2 QoS 2 messages unacknowledged",
        ),
    ],
    ids=["subscription-id", "no-topic", "retain-off", "not-utf8-qos0", "receive-maximum"],
)
def test_a_publish_that_breaks_the_protocol_closes_with_its_reason(
    caplog: pytest.LogCaptureFixture,
    settings: dict[str, Any],
    packets: list[Publish],
    code: ReasonCode,
    reason: str,
) -> None:
    """A client closed for a bad PUBLISH must learn which rule it broke (reason code and
    reason string), and the operator must read the same in the log."""
    h = Harness(**settings)
    c = h.client()
    c.connect("x")
    caplog.set_level(logging.INFO, logger=LOGGER)
    for packet in packets:
        c.send(packet)
    got = c.take()
    assert got[-1] == Disconnect(code, Properties(reason_string=reason))
    assert all(isinstance(p, PubRec) for p in got[:-1])
    assert c.closed
    words = {
        ReasonCode.PROTOCOL_ERROR: "protocol error",
        ReasonCode.RETAIN_NOT_SUPPORTED: "retain not supported",
        ReasonCode.PAYLOAD_FORMAT_INVALID: "payload format invalid",
        ReasonCode.RECEIVE_MAXIMUM_EXCEEDED: "receive maximum exceeded",
    }[code]
    assert f"closing 'x' (127.0.0.1:9): {reason} ({words})" in lines(caplog)


def test_refusals_are_logged_with_client_topic_and_reason_and_not_remembered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each refused PUBLISH must be traceable in the log (who, which topic, why, how many
    so far), and a refused QoS 2 identifier must not be taken as one awaiting PUBREL."""
    h = Harness()
    h.broker.acl = parse_acl_file("topic readwrite open/#\n")
    c = h.client()
    c.connect("x")
    caplog.set_level(logging.INFO, logger=LOGGER)
    bad = Properties(payload_format_indicator=1)
    c.send(Publish("open/t", b"\xff", 2, packet_id=1, properties=bad))
    assert c.take() == [PubRec(1, ReasonCode.PAYLOAD_FORMAT_INVALID)]
    c.send(PubRel(1))
    assert c.take() == [PubComp(1, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)]
    c.send(Publish("closed/t", b"no", 1, packet_id=2))
    c.send(Publish("$share/g/t", b"no", 1, packet_id=3))
    assert c.take() == [
        PubAck(2, ReasonCode.NOT_AUTHORIZED),
        PubAck(3, ReasonCode.TOPIC_NAME_INVALID),
    ]
    assert lines(caplog) == [
        "refusing PUBLISH from 'x' (127.0.0.1:9) on 'open/t': "
        "payload format indicator says UTF-8 but the payload is not",
        "refusing PUBLISH from 'x' (127.0.0.1:9) to 'closed/t': not authorized (1 refused so far)",
        "refusing PUBLISH from 'x' (127.0.0.1:9) to '$share/g/t': $share/ is not a topic",
    ]
    assert not c.closed
    assert (h.broker.stats.publish_received, h.broker.stats.publish_denied) == (3, 2)


@pytest.mark.parametrize("persisted", [True, False], ids=["persistent", "clean"])
def test_a_resent_qos2_publish_is_acknowledged_after_the_first_is_stored(persisted: bool) -> None:
    """A re-sent QoS 2 PUBLISH must not be acknowledged before its first copy is
    durable (a restart would then route it again); on a clean session it must not wait."""
    h = Harness()
    journal = h.broker.journal = Journal()
    sub = stored_client(h, "sub", 0, peer="10.0.0.2:1")
    stored_subscribe(h, sub, "t", 2)
    pub = stored_client(h, "pub", 600 if persisted else 0)
    pub.send(Publish("t", b"once", 2, packet_id=5))
    pub.send(Publish("t", b"once", 2, dup=True, packet_id=5))
    if persisted:
        assert pub.take() == []
        assert len(journal.ops) == 1  # the identifier, once
        commit(h)
    assert pub.take() == [PubRec(5), PubRec(5)]
    assert [p.payload for p in sub.publishes()] == [b"once"]
    assert h.broker.stats.publish_received == 2


def test_a_full_retained_store_forwards_what_it_cannot_refuse(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the retained store full, a message that cannot be refused (QoS 0, or MQTT
    3.1.1) still reaches subscribers, only not retained, and the operator is told; a
    QoS 1 MQTT 5.0 one is refused; deleting a retained message always works."""
    h = Harness(max_retained_messages=1)
    sub = h.client(peer="10.0.0.2:1")
    sub.connect("sub")
    sub.subscribe("r/#", 1)
    p5 = h.client()
    p5.connect("p5")
    p3 = h.client(MQTT_311, peer="10.0.0.3:1")
    p3.connect("p3")
    p5.publish("r/1", b"kept", 1, retain=True)
    caplog.set_level(logging.INFO, logger=LOGGER)
    p5.send(Publish("r/2", b"zero", 0, True))
    p3.send(Publish("r/3", b"old", 1, True, packet_id=7))
    p5.send(Publish("r/4", b"new", 1, True, packet_id=8))
    assert p3.take() == [PubAck(7)]
    assert p5.take() == [PubAck(8, ReasonCode.QUOTA_EXCEEDED)]
    assert [p.payload for p in sub.publishes()] == [b"kept", b"zero", b"old"]
    size = h.broker.retained.bytes
    assert lines(caplog) == [
        f"retained store full (1 messages, {size} bytes): {topic!r} from {who} not retained"
        for topic, who in [
            ("r/2", "'p5' (127.0.0.1:9)"),
            ("r/3", "'p3' (10.0.0.3:1)"),
            ("r/4", "'p5' (127.0.0.1:9)"),
        ]
    ]
    assert h.broker.retained.refused == 3
    p5.send(Publish("r/1", b"", 1, True, packet_id=9))
    assert p5.take() == [PubAck(9)]
    assert len(h.broker.retained) == 0


def test_one_clients_refusals_do_not_hide_another_clients(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refusal lines are limited per source address: a second client refused the same
    way within the minute must still get its own line, or its trouble goes unseen."""
    h = Harness()
    h.broker.acl = parse_acl_file("topic readwrite open/#\n")
    h.broker.publish_gates.append(lambda topic, size: "outbox full" if "full" in topic else None)
    clients = []
    for name, peer in (("a", "10.0.0.1:1"), ("b", "10.0.0.2:1")):
        c = h.client(peer=peer)
        c.connect(name)
        clients.append(c)
    caplog.set_level(logging.INFO, logger=LOGGER)
    bad = Properties(payload_format_indicator=1)
    for c in clients:
        c.send(Publish("open/t", b"\xff", 1, packet_id=1, properties=bad))
        c.send(Publish("closed/t", b"x", 1, packet_id=2))
        c.send(Publish("$share/g/t", b"x", 1, packet_id=3))
        c.send(Publish("open/full", b"x", 1, packet_id=4))
        assert [p.reason_code for p in c.take() if isinstance(p, PubAck)] == [
            ReasonCode.PAYLOAD_FORMAT_INVALID,
            ReasonCode.NOT_AUTHORIZED,
            ReasonCode.TOPIC_NAME_INVALID,
            ReasonCode.QUOTA_EXCEEDED,
        ]
    expected = []
    # the ACL's count is publish/messages/denied with this one: a's 3 refusals precede b's
    for who, denied in (("'a' (10.0.0.1:1)", 1), ("'b' (10.0.0.2:1)", 4)):
        expected += [
            f"refusing PUBLISH from {who} on 'open/t': "
            "payload format indicator says UTF-8 but the payload is not",
            f"refusing PUBLISH from {who} to 'closed/t': not authorized ({denied} refused so far)",
            f"refusing PUBLISH from {who} to '$share/g/t': $share/ is not a topic",
            f"refusing PUBLISH from {who}: outbox full",
        ]
    assert lines(caplog) == expected


def test_a_311_publisher_refused_by_a_gate_is_closed_and_handed_to_the_shell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """MQTT 3.1.1 has no refusal code: the publisher is closed, the log says why, and the
    shell is told to close the socket although nothing is written to it."""
    h = Harness()
    h.broker.publish_gates.append(lambda topic, size: "outbox of 'cloud' full")
    pub = h.client(MQTT_311)
    pub.connect("p3")
    h.broker.take_dirty()
    caplog.set_level(logging.INFO, logger=LOGGER)
    pub.send(Publish("t", b"x", 1, packet_id=1))
    assert h.broker.take_dirty() == [pub.conn]
    assert pub.closed
    assert pub.conn.take_output() == []
    assert "closing 'p3' (127.0.0.1:9): outbox of 'cloud' full (quota exceeded)" in lines(caplog)
    assert (h.broker.stats.publish_denied, h.broker.stats.protocol_errors) == (1, 1)


def test_packets_and_publishes_sent_are_counted_once_each() -> None:
    """``$SYS/broker/messages/sent`` and ``publish/messages/sent`` must count every
    packet and every PUBLISH written, once, or an operator's rates are wrong."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")  # CONNACK: 1
    sub.subscribe("t/#", 1)  # SUBACK: 2
    pub = h.client()
    pub.connect("pub")  # CONNACK: 3
    pub.publish("t/a", b"1", 1)  # PUBLISH to sub, PUBACK to pub: 5
    pub.publish("t/a", b"2", 1)  # 7
    pub.publish("t/a", b"3", 0)  # PUBLISH only: 8
    assert len(sub.publishes()) == 3
    stats = h.broker.stats
    assert (stats.messages_sent, stats.publish_sent) == (8, 3)
    values = h.broker.sys_values(h.now)
    assert values["$SYS/broker/messages/sent"] == "8"
    assert values["$SYS/broker/publish/messages/sent"] == "3"


def test_control_packets_that_cannot_fit_are_not_sent_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing above the client's Maximum Packet Size is sent (MQTT-3.1.2-24), and the
    operator can see what was left out and for whom."""
    h = Harness()
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    c = h.client()
    c.connect("x", maximum_packet_size=24)
    filters = tuple(SubscriptionRequest(f"f/{i}") for i in range(24))
    c.send(Subscribe(1, filters))  # a SUBACK of 2 + 2 + 1 + 24 bytes
    assert c.take() == []
    assert h.broker.sessions["x"].subscriptions.keys() >= {"f/0", "f/23"}
    suback = SubAck(1, (0,) * 24)
    tail = "exceeds its maximum packet size"
    assert f"not sending {suback} to 'x' (127.0.0.1:9): {tail}" in lines(caplog)
    # a refused CONNACK without its reason string is 5 bytes: not even that fits in 4
    tiny = h.client(peer="10.0.0.4:1")
    tiny.send(Connect("tiny", MQTT_5, True, 0, properties=Properties(maximum_packet_size=4)))
    assert tiny.take() == []
    assert tiny.closed
    refusal = ConnAck(False, ReasonCode.PACKET_TOO_LARGE, Properties())
    assert f"not sending {refusal} to 'tiny' (10.0.0.4:1): {tail}" in lines(caplog)


def test_an_acknowledgement_waits_only_for_its_own_changes() -> None:
    """A clean publisher's PUBACK must not wait for another client's change to reach
    the store (a slow SD card would stall every publisher)."""
    h = Harness()
    journal = h.broker.journal = Journal()
    pub = stored_client(h, "pub", 0)
    keeper = h.client(peer="10.0.0.2:1")
    keeper.connect("keeper", clean_start=False, session_expiry_interval=600)
    pending = list(journal.ops)
    assert pending  # the keeper's new session, not committed yet
    pub.send(Publish("t", b"x", 1, packet_id=1))
    assert pub.take() == [PubAck(1, ReasonCode.NO_MATCHING_SUBSCRIBERS)]
    assert journal.ops == pending
