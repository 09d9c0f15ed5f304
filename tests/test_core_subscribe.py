"""SUBSCRIBE / UNSUBSCRIBE: filters, options, identifiers, overlap, denial, shared groups."""

from __future__ import annotations

import pytest

from gateway.mqtt import MQTT_5, MQTT_311, Disconnect, Publish, ReasonCode, SubAck, Subscribe
from gateway.mqtt.packets import SubscriptionRequest, Unsubscribe
from tests.support.harness import Harness


@pytest.mark.parametrize(
    ("topic_filter", "topic", "delivered"),
    [
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/d", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("#", "anything/at/all", True),
        ("+/+", "/x", True),
        ("+", "/x", False),
        ("#", "$SYS/broker/uptime", False),
        ("+/broker/uptime", "$SYS/broker/uptime", False),
        ("a//b", "a//b", True),
    ],
)
def test_wildcard_matching(topic_filter: str, topic: str, delivered: bool) -> None:
    h = Harness()
    sub = h.client()
    sub.connect("s")
    sub.subscribe(topic_filter)
    pub = h.client()
    pub.connect("p")
    h.broker.publish_local(topic, b"x", h.now) if topic.startswith("$") else pub.publish(topic)
    assert bool(sub.publishes()) is delivered


@pytest.mark.parametrize(
    "bad", ["a/#/b", "a/b#", "a+/b", "", "#/x", "$share/g", "$share//x", "$share/g+/x"]
)
def test_a_filter_that_is_no_filter_makes_the_subscribe_malformed(bad: str) -> None:
    """MQTT 5.0 4.7.1, 4.7.3, 4.8.2: the packet is malformed -- DISCONNECT 0x81 (3.1.1:
    the connection is closed) -- and nothing of it is applied."""
    h = Harness()
    five = h.client()
    five.connect("five")
    five.send(Subscribe(1, (SubscriptionRequest("fine/+", 0), SubscriptionRequest(bad, 0))))
    assert five.expect(Disconnect).reason_code == ReasonCode.MALFORMED_PACKET
    assert five.closed
    three = h.client(MQTT_311)
    three.connect("three")
    three.send(Subscribe(1, (SubscriptionRequest(bad, 0),)))
    assert three.take() == [] and three.closed
    assert h.broker.index.count == 0


def test_unsubscribe_of_a_filter_that_is_no_filter_is_malformed() -> None:
    h = Harness()
    c = h.client()
    c.connect("c")
    c.subscribe("a")
    c.send(Unsubscribe(2, ("a", "bad/#/x")))
    assert c.expect(Disconnect).reason_code == ReasonCode.MALFORMED_PACKET
    assert c.closed


def test_granted_qos_in_suback() -> None:
    h = Harness()
    c = h.client()
    c.connect("c")
    c.send(
        Subscribe(
            1,
            (SubscriptionRequest("a", 0), SubscriptionRequest("b", 1), SubscriptionRequest("c", 2)),
        )
    )
    assert c.expect(SubAck).reason_codes == (0, 1, 2)


@pytest.mark.parametrize(("version", "code"), [(MQTT_5, 0x80), (MQTT_311, 0x80)])
def test_denied_filter_refused(version: int, code: int) -> None:
    h = Harness(deny_subscriptions=("test/nosubscribe", "secret/#"))
    c = h.client(version)
    c.connect("c")
    assert c.subscribe("test/nosubscribe", 2).reason_codes == (code,)
    assert c.subscribe("secret/a/b", 1).reason_codes == (code,)
    assert c.subscribe("secret/#", 1).reason_codes == (code,)
    assert c.subscribe("public/#", 1).reason_codes == (1,)


def test_denied_filter_reason_can_be_not_authorized() -> None:
    h = Harness(deny_subscriptions=("x",), deny_subscription_reason="not_authorized")
    c = h.client()
    c.connect("c")
    assert c.subscribe("x").reason_codes == (ReasonCode.NOT_AUTHORIZED,)


def test_overlapping_subscriptions_one_copy_highest_qos_all_identifiers() -> None:
    h = Harness()
    sub = h.client()
    sub.connect("s")
    sub.subscribe("a/#", 2, sub_id=3)
    sub.subscribe("a/+", 1, sub_id=2)
    sub.subscribe("a/b", 0)
    pub = h.client()
    pub.connect("p")
    pub.publish("a/b", b"x", 2)
    [msg] = sub.publishes()
    assert msg.qos == 2
    assert sorted(msg.properties.subscription_identifiers) == [2, 3]


def test_subscription_identifier_sent_with_matching_messages_only() -> None:
    h = Harness()
    sub = h.client()
    sub.connect("s")
    sub.subscribe("id/#", 1, sub_id=456789)
    sub.subscribe("noid/#", 1)
    pub = h.client()
    pub.connect("p")
    pub.publish("id/x", b"1", 1)
    pub.publish("noid/x", b"2", 1)
    got = sub.publishes()
    assert [p.properties.subscription_identifiers for p in got] == [(456789,), ()]


def test_subscription_replacement_changes_qos_and_keeps_one_subscription() -> None:
    """MQTT-3.8.4-3."""
    h = Harness()
    sub = h.client()
    sub.connect("s")
    sub.subscribe("r", 2)
    sub.subscribe("r", 0)
    assert h.broker.index.count == 1
    pub = h.client()
    pub.connect("p")
    pub.publish("r", b"x", 2)
    assert [p.qos for p in sub.publishes()] == [0]


def test_no_local_suppresses_own_messages() -> None:
    h = Harness()
    a = h.client()
    a.connect("a")
    a.subscribe("nl", 1, no_local=True)
    b = h.client()
    b.connect("b")
    b.subscribe("nl", 1, no_local=True)
    a.publish("nl", b"from a", 1)
    assert a.publishes() == []
    assert [p.payload for p in b.publishes()] == [b"from a"]


def test_retain_as_published_keeps_flag() -> None:
    h = Harness()
    sub = h.client()
    sub.connect("s")
    sub.subscribe("rap", 1, retain_as_published=True)
    sub.subscribe("plain", 1)
    pub = h.client()
    pub.connect("p")
    pub.publish("rap", b"r", 1, retain=True)
    pub.publish("plain", b"r", 1, retain=True)
    assert [(p.topic, p.retain) for p in sub.publishes()] == [("rap", True), ("plain", False)]


def test_unsubscribe_reason_codes() -> None:
    h = Harness()
    c = h.client()
    c.connect("c")
    c.subscribe("a")
    ack = c.unsubscribe("a", "never")
    assert ack.reason_codes == (ReasonCode.SUCCESS, ReasonCode.NO_SUBSCRIPTION_EXISTED)
    assert h.broker.index.count == 0


def test_unsuback_311_has_no_codes() -> None:
    h = Harness()
    c = h.client(MQTT_311)
    c.connect("c")
    c.subscribe("a")
    assert c.unsubscribe("a").reason_codes == ()


def test_unsubscribe_stops_delivery() -> None:
    h = Harness()
    sub = h.client()
    sub.connect("s")
    for t in ("t/0", "t/1", "t/2"):
        sub.subscribe(t, 2)
    sub.unsubscribe("t/0")
    pub = h.client()
    pub.connect("p")
    for t in ("t/0", "t/1", "t/2"):
        pub.publish(t, b"x", 1)
    assert [p.topic for p in sub.publishes()] == ["t/1", "t/2"]


def test_subscription_limit_per_client() -> None:
    h = Harness(max_subscriptions_per_client=2)
    c = h.client()
    c.connect("c")
    assert c.subscribe("a").reason_codes == (0,)
    assert c.subscribe("b").reason_codes == (0,)
    assert c.subscribe("c").reason_codes == (ReasonCode.QUOTA_EXCEEDED,)
    assert c.subscribe("a", 1).reason_codes == (1,)  # replacing is not adding


def test_wildcards_refused_when_disabled() -> None:
    h = Harness(wildcard_subscriptions=False)
    c = h.client()
    c.connect("c")
    assert c.subscribe("a/+").reason_codes == (ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,)
    assert c.subscribe("a/b").reason_codes == (0,)


# --------------------------------------------------------------------------- shared


def test_shared_subscription_round_robin_each_message_once() -> None:
    h = Harness()
    members = []
    for name in ("m1", "m2", "m3"):
        m = h.client()
        m.connect(name)
        m.subscribe("$share/g/work/#", 1)
        members.append(m)
    pub = h.client()
    pub.connect("p")
    for i in range(9):
        pub.publish("work/item", b"%d" % i, 1)
    counts = [len(m.publishes()) for m in members]
    assert counts == [3, 3, 3]


def test_shared_and_normal_subscription_both_deliver() -> None:
    h = Harness()
    a = h.client()
    a.connect("a")
    a.subscribe("$share/g/x", 1)
    a.subscribe("x", 1)
    b = h.client()
    b.connect("b")
    b.subscribe("$share/g/x", 1)
    b.subscribe("x", 1)
    pub = h.client()
    pub.connect("p")
    pub.publish("x", b"m", 1)
    total = len(a.publishes()) + len(b.publishes())
    assert total == 3  # each normal subscription once, the group once


def test_shared_member_gone_next_member_gets_its_unacknowledged_messages() -> None:
    h = Harness()
    m1 = h.client()
    m1.connect("m1")
    m1.subscribe("$share/g/job", 1)
    m2 = h.client()
    m2.connect("m2")
    m2.subscribe("$share/g/job", 1)
    pub = h.client()
    pub.connect("p")
    pub.publish("job", b"first", 1)
    pub.publish("job", b"second", 1)
    got1 = m1.publishes()
    got2 = m2.publishes()
    assert len(got1) == 1 and len(got2) == 1
    m1.drop()  # never acknowledged; its session ends (expiry 0)
    assert [p.payload for p in m2.publishes()] == [got1[0].payload]


def test_shared_group_skips_disconnected_members() -> None:
    h = Harness()
    m1 = h.client()
    m1.connect("m1", clean_start=False, session_expiry_interval=100)
    m1.subscribe("$share/g/job", 1)
    m2 = h.client()
    m2.connect("m2")
    m2.subscribe("$share/g/job", 1)
    m1.drop()
    pub = h.client()
    pub.connect("p")
    for _ in range(4):
        pub.publish("job", b"x", 1)
    assert len(m2.publishes()) == 4


def test_no_local_on_shared_subscription_is_protocol_error() -> None:
    """MQTT-3.8.3-4."""
    h = Harness()
    c = h.client()
    c.connect("c")
    c.send(Subscribe(1, (SubscriptionRequest("$share/g/x", 1, no_local=True),)))
    assert c.expect(Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR


def test_shared_subscriptions_refused_when_disabled() -> None:
    h = Harness(shared_subscriptions=False)
    c = h.client()
    c.connect("c")
    assert c.subscribe("$share/g/x").reason_codes == (
        ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
    )


def test_unsubscribe_shared() -> None:
    h = Harness()
    c = h.client()
    c.connect("c")
    c.subscribe("$share/g/x", 1)
    assert c.unsubscribe("$share/g/x").reason_codes == (0,)
    pub = h.client()
    pub.connect("p")
    pub.publish("x", b"m")
    assert c.take() == []
    assert not h.broker.index.shared


def test_publish_to_many_sessions_encodes_once_per_kind() -> None:
    """Fan-out shares one encoding per (version, QoS, retain) across subscribers."""
    h = Harness()
    subs = []
    for i in range(5):
        s = h.client(MQTT_311)
        s.connect(f"s{i}")
        s.subscribe("fan", 0)
        subs.append(s)
    pub = h.client()
    pub.connect("p")
    pub.publish("fan", b"shared bytes")
    chunks = [s.conn.out[0] for s in subs]
    assert all(c is chunks[0] for c in chunks)
    assert all(isinstance(p, Publish) for s in subs for p in s.publishes())
