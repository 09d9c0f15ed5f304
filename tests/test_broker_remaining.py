"""Broker behaviour the other broker tests left unpinned: who No Local spares, the
retain flag of overlapping subscriptions, queued QoS 0 messages and their counters,
the queue-full warning cadence, the connect log line and CONNACK properties, the
subscription refusal log lines, and a replaced subscription's QoS.

The pure core on a fake clock (``tests.support.harness``).
"""

from __future__ import annotations

import itertools
import logging

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.broker.auth import PasswordAuthenticator, hash_password
from gateway.broker.message import Message
from gateway.broker.proxy import ProxyClient
from gateway.broker.state import LoginAttempt
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    ConnAck,
    Connect,
    Disconnect,
)
from tests.support.harness import FakeClient, Harness


def connected(h: Harness, client_id: str, version: int = MQTT_5, **kw: object) -> FakeClient:
    c = h.client(version)
    assert c.connect(client_id, **kw).reason_code == 0  # type: ignore[arg-type]
    return c


def messages(c: FakeClient) -> list[tuple[str, bytes, int, bool, tuple[int, ...]]]:
    return [
        (p.topic, p.payload, p.qos, p.retain, p.properties.subscription_identifiers)
        for p in c.publishes()
    ]


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ledge.broker"]


# ------------------------------------------------------------------------ delivery


def test_no_local_spares_only_the_publisher_and_overlapping_retain_as_published() -> None:
    """Broken, a No Local subscriber would miss everyone else's messages, or a retained
    message matched by two subscriptions would lose the retain flag one asked to keep."""
    h = Harness()
    a = connected(h, "a")
    b = connected(h, "b")
    a.subscribe("t/#", no_local=True)
    b.subscribe("t/#", no_local=True)
    a.publish("t/1", b"from-a")
    assert messages(a) == []
    assert messages(b) == [("t/1", b"from-a", 0, False, ())]
    b.publish("t/2", b"from-b")
    assert messages(a) == [("t/2", b"from-b", 0, False, ())]
    assert messages(b) == []

    # Two No Local subscriptions of one session: others' messages come once, own none.
    a.subscribe("t/+", no_local=True)
    b.publish("t/3", b"again")
    assert messages(a) == [("t/3", b"again", 0, False, ())]
    a.publish("t/4", b"own")
    assert messages(a) == []
    assert messages(b) == [("t/4", b"own", 0, False, ())]

    # Two subscriptions of one session match: one delivery, retain kept as published.
    c = connected(h, "c")
    c.subscribe("r/#", qos=0)
    c.subscribe("r/+", qos=0, retain_as_published=True)
    a.publish("r/x", b"kept", retain=True)
    assert messages(c) == [("r/x", b"kept", 0, True, ())]
    # Without retain_as_published on either, the live message is not retained.
    d = connected(h, "d")
    d.subscribe("r/#", retain_handling=2)
    d.subscribe("r/+", retain_handling=2)
    a.publish("r/y", b"live", retain=True)
    assert messages(d) == [("r/y", b"live", 0, False, ())]


def test_in_process_and_qos0_deliveries_count_one_publish_sent_each() -> None:
    """Broken, $SYS publish counters would miscount messages handed to local clients."""
    h = Harness()
    got: list[tuple[str, bytes, int, bool, tuple[int, ...]]] = []

    def sink(msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
        got.append((msg.topic, msg.payload, qos, retain, sub_ids))

    dev = ProxyClient(h.broker, "dev", sink, acl=None, now=h.now)
    dev.subscribe("s/#", 1, h.now)
    pub = connected(h, "pub")
    before = h.broker.stats.publish_sent
    pub.publish("s/1", b"one", qos=1)
    pub.publish("s/2", b"two")
    assert got == [("s/1", b"one", 1, False, ()), ("s/2", b"two", 0, False, ())]
    assert h.broker.stats.publish_sent == before + 2
    # A device's message (no forwarded bytes) reaches a plain QoS 0 subscriber.
    sub = connected(h, "sub")
    sub.subscribe("d/#")
    dev.publish_counted("d/1", b"dev", h.now)
    assert messages(sub) == [("d/1", b"dev", 0, False, ())]


def test_a_qos0_delivery_from_a_qos1_publish_and_with_an_expiry_and_identifier() -> None:
    """Broken, a QoS 0 subscriber would get nothing (or a crash) for a message published
    at QoS 1, or one with a Message Expiry and a Subscription Identifier."""
    h = Harness()
    sub = connected(h, "sub")
    sub.subscribe("q/#", qos=0)
    sub.subscribe("e/#", qos=0, sub_id=7)
    pub = connected(h, "pub")
    pub.publish("q/1", b"at-one", qos=1)
    assert messages(sub) == [("q/1", b"at-one", 0, False, ())]
    pub.publish("e/1", b"exp", message_expiry_interval=60)
    [p] = sub.publishes()
    assert (p.topic, p.payload, p.properties.subscription_identifiers) == ("e/1", b"exp", (7,))
    assert p.properties.message_expiry_interval == 60
    old = connected(h, "old", MQTT_311)
    old.subscribe("e/#")
    pub.publish("e/2", b"to-311", message_expiry_interval=60)
    assert [(p.topic, p.payload) for p in old.publishes()] == [("e/2", b"to-311")]


def test_queued_qos0_messages_go_out_in_order_with_identifiers_and_free_their_bytes() -> None:
    """Broken, an offline session's queued QoS 0 messages would be lost, reordered,
    stripped of their Subscription Identifier, or fill the byte bound for good."""
    h = Harness(queue_qos0_offline=True, max_queued_bytes=600)
    sub = connected(h, "sub", clean_start=False, session_expiry_interval=3600)
    sub.subscribe("q/#", qos=1, sub_id=5)
    pub = connected(h, "pub")
    for rnd in range(3):
        sub.drop()
        pub.publish("q/a", b"A" * 100)
        pub.publish("q/b", b"B" * 100, qos=1)
        pub.publish("q/c", b"C" * 100)
        sent = h.broker.stats.publish_sent
        sub = connected(h, "sub", clean_start=False, session_expiry_interval=3600)
        got = sub.publishes()
        assert [(p.topic, p.qos, p.properties.subscription_identifiers) for p in got] == [
            ("q/a", 0, (5,)),
            ("q/b", 1, (5,)),
            ("q/c", 0, (5,)),
        ], rnd
        assert h.broker.stats.publish_sent == sent + 3
        for p in got:
            sub.ack(p)
    assert h.broker.stats.dropped_queue_full == 0
    # A queued QoS 0 message keeps only the expiry it has left.
    sub.drop()
    pub.publish("q/e", b"E", message_expiry_interval=60)
    h.advance(10)
    sub = connected(h, "sub", clean_start=False, session_expiry_interval=3600)
    [p] = sub.publishes()
    assert (p.topic, p.qos, p.properties.message_expiry_interval) == ("q/e", 0, 50)


def test_a_queued_shared_qos0_message_goes_to_the_next_member_when_its_session_ends() -> None:
    """Broken, a shared-subscription message queued for a member whose session expired
    would be lost instead of reaching another member of the group."""
    h = Harness(queue_qos0_offline=True)
    a = connected(h, "a", clean_start=False, session_expiry_interval=60)
    a.subscribe("$share/g/s/#")
    a.drop()
    pub = connected(h, "pub")
    pub.publish("s/1", b"job")
    b = connected(h, "b")
    b.subscribe("$share/g/s/#")
    assert messages(b) == []
    h.advance(61)
    assert messages(b) == [("s/1", b"job", 0, False, ())]


def test_queue_full_warnings_come_at_1_2_4_8_drops(caplog: pytest.LogCaptureFixture) -> None:
    """Broken, an operator would see a full queue's warning never, or for every drop."""
    h = Harness(max_queued_messages=1)
    sub = connected(h, "sub", clean_start=False, session_expiry_interval=3600)
    sub.subscribe("q/#", qos=1)
    sub.drop()
    pub = connected(h, "pub")
    pub.publish("q/0", b"kept", qos=1)
    caplog.set_level(logging.WARNING, "ledge.broker")
    for _ in range(9):
        pub.publish("q/x", b"dropped", qos=1)
    assert h.broker.stats.dropped_queue_full == 9
    assert [m for m in lines(caplog) if "full" in m] == [
        f"queue of 'sub' full (1 messages, {Message('q/0', b'kept', 1).size} bytes): "
        f"dropping new messages ({n} dropped so far)"
        for n in (1, 2, 4, 8)
    ]


# ------------------------------------------------------------------------ connect


def test_connect_log_lines_say_version_bridge_keep_alive_and_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Broken, the connect log would misname a client's address, protocol or session."""
    caplog.set_level(logging.INFO, "ledge.broker")
    h = Harness()
    c = h.client(MQTT_5, peer="10.0.0.5:1234")
    assert c.connect("dev", keep_alive=30, clean_start=False, session_expiry_interval=60)
    b = h.client(MQTT_311, peer="10.0.0.6:99")
    b.send(Connect("br", MQTT_311, protocol_name="MQTT", bridge=True, keep_alive=10))
    assert b.expect(ConnAck).reason_code == 0
    c.drop()
    c2 = h.client(MQTT_5, peer="10.0.0.7:1")
    assert c2.connect("dev", clean_start=False, session_expiry_interval=60).session_present
    assert [m for m in lines(caplog) if " connected from " in m] == [
        "client 'dev' connected from 10.0.0.5:1234 (MQTT 5.0, keep alive 30 s, session new)",
        "client 'br' connected from 10.0.0.6:99 (MQTT 3.1.1 bridge, keep alive 10 s, session new)",
        "client 'dev' connected from 10.0.0.7:1 (MQTT 5.0, keep alive 0 s, session resumed)",
    ]


@pytest.mark.parametrize(("setting", "sent"), [(65_535, None), (65_534, 65_534)])
def test_connack_receive_maximum_is_sent_only_below_the_default(
    setting: int, sent: int | None
) -> None:
    """Broken, clients would be told a Receive Maximum that is the default anyway."""
    h = Harness(receive_maximum=setting)
    ack = h.client().connect("c")
    assert ack.properties.receive_maximum == sent


def test_a_taken_over_client_is_told_why_and_disconnect_reasons_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Broken, a client whose session is taken over would get a wrong reason string,
    and a client's error DISCONNECT would be logged with a made-up reason."""
    caplog.set_level(logging.INFO, "ledge.broker")
    h = Harness()
    old = connected(h, "dup")
    connected(h, "dup")
    d = old.expect(Disconnect)
    assert (d.reason_code, d.properties.reason_string) == (0x8E, "session taken over")
    x = connected(h, "x")
    x.send(Disconnect(0x80))
    assert "client 'x' (127.0.0.1:9) disconnected with reason 0x80 " in lines(caplog)


def test_zero_length_ids_refused_with_a_reason_or_assigned_past_taken_ones() -> None:
    """Broken, a refused client would get a wrong reason string, or an assigned client
    identifier colliding with a session would be lost."""
    h = Harness(allow_zero_length_client_id=False)
    ack = h.client().connect("")
    assert (ack.reason_code, ack.properties.reason_string) == (
        0x85,
        "zero-length client id not allowed",
    )
    h = Harness(assigned_client_id_prefix="auto-")
    ids = itertools.count(1)
    h.broker.client_id_factory = lambda: str(next(ids) // 2)  # 0, 1, 1, 2, 2, ...
    first = h.client().connect("")
    assert first.properties.assigned_client_identifier == "auto-0"
    connected(h, "auto-1")
    second = h.client().connect("")
    assert second.properties.assigned_client_identifier == "auto-2"


# ------------------------------------------------------------------------ subscribe


def test_subscription_refusals_and_acl_grants_are_logged_with_client_and_filter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Broken, an operator could not tell which client's subscription was refused, why."""
    caplog.set_level(logging.INFO, "ledge.broker")
    h = Harness(deny_subscriptions=["secret/#"], max_subscriptions_per_client=2)
    h.broker.acl = parse_acl_file("topic read ok/#\n")
    c = h.client(peer="10.1.1.1:5")
    assert c.connect("c").reason_code == 0
    assert c.subscribe("secret/x").reason_codes == (0x80,)
    assert c.subscribe("no/x").reason_codes == (0x87,)
    h2 = Harness(acl_denied_subscribe="grant")
    h2.broker.acl = parse_acl_file("topic read ok/#\n")
    g = h2.client(peer="10.1.1.2:6")
    assert g.connect("g").reason_code == 0
    assert g.subscribe("no/x").reason_codes == (0,)
    assert c.subscribe("ok/1").reason_codes == (0,)
    assert c.subscribe("ok/2").reason_codes == (0,)
    assert c.subscribe("ok/3").reason_codes == (0x97,)
    got = [m for m in lines(caplog) if "subscription" in m]
    assert got == [
        "refusing subscription 'secret/x' of 'c' (10.1.1.1:5): denied by 'secret/#'",
        "refusing subscription 'no/x' of 'c' (10.1.1.1:5): not authorized by the ACL",
        "subscription 'no/x' of 'g' (10.1.1.2:6) can deliver nothing the ACL allows",
        "refusing subscription 'ok/3' of 'c' (10.1.1.1:5): limit of 2 subscriptions per client",
    ]


def test_retained_messages_after_one_held_back_still_arrive() -> None:
    """Broken (the retained messages stop at the first one the ACL or No Local holds
    back), a new subscriber would miss every retained message after it."""
    h = Harness()
    own = connected(h, "s")
    pub = connected(h, "pub")
    pub.publish("t/secret1", b"x", retain=True)
    pub.publish("t/ok1", b"1", retain=True)
    own.publish("t/own", b"mine", retain=True)
    pub.publish("t/ok2", b"2", retain=True)
    pub.publish("t/secret2", b"y", retain=True)
    pub.publish("t/ok3", b"3", retain=True)
    own.drop()
    h.broker.acl = parse_acl_file(
        "topic read t/ok1\ntopic read t/ok2\ntopic read t/ok3\ntopic read t/own\n"
    )
    s = connected(h, "s")
    s.subscribe("t/#", no_local=True)
    got = sorted((topic, payload) for topic, payload, *_ in messages(s))
    assert got == [("t/ok1", b"1"), ("t/ok2", b"2"), ("t/ok3", b"3")]


def test_a_resubscription_replaces_the_old_qos() -> None:
    """Broken, lowering a subscription's QoS would keep delivering at the old one."""
    h = Harness()
    sub = connected(h, "sub")
    sub.subscribe("t", qos=1)
    sub.subscribe("t", qos=0)
    pub = connected(h, "pub")
    pub.publish("t", b"m", qos=1)
    assert messages(sub) == [("t", b"m", 0, False, ())]


def test_input_piled_up_during_a_login_check_is_bounded_to_the_byte(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Broken, a client waiting for its password check could pile up input without end,
    or be closed one byte early, without the log saying why."""
    caplog.set_level(logging.DEBUG, "ledge.broker")
    h = Harness(max_packet_size=1000)
    h.broker.authenticator = PasswordAuthenticator(False, {"ann": hash_password("pw", 1)})
    handed: list[LoginAttempt] = []
    h.broker.verifier = handed.append
    c = h.client(peer="10.2.2.2:7")
    c.send(Connect("x", MQTT_5, username="ann", password=b"pw"))
    assert len(handed) == 1
    c.send_raw(b"\xc0\x00" * ((1000 + 65_536) // 2))  # PINGREQs, exactly at the bound
    assert not c.closed
    c.send_raw(b"\xc0")
    assert c.closed
    assert "closing 'x' (10.2.2.2:7): too much input before CONNACK" in lines(caplog)
