"""PUBLISH and the QoS 0/1/2 flows in both directions, redelivery, flow control."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    Disconnect,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
)
from tests.support.harness import FakeClient, Harness


def pair(h: Harness, qos: int = 2, version: int = MQTT_5) -> tuple[FakeClient, FakeClient]:
    sub = h.client(version)
    sub.connect("sub", clean_start=False, session_expiry_interval=3600)
    sub.subscribe("t/#", qos)
    pub = h.client(version)
    pub.connect("pub")
    return sub, pub


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_message_delivered_at_min_of_publish_and_subscription_qos(version: int, qos: int) -> None:
    h = Harness()
    sub, pub = pair(h, qos=1, version=version)
    pub.publish("t/a", b"payload", qos)
    [msg] = sub.publishes()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == ("t/a", b"payload", min(qos, 1), False)
    assert (msg.packet_id != 0) == (msg.qos > 0)


def test_qos1_ack_from_broker_is_no_matching_subscribers_v5() -> None:
    h = Harness()
    c = h.client()
    c.connect("lonely")
    c.send(Publish("nobody/here", b"x", 1, packet_id=7))
    ack = c.expect(PubAck)
    assert (ack.packet_id, ack.reason_code) == (7, ReasonCode.NO_MATCHING_SUBSCRIBERS)


def test_qos2_inbound_duplicate_is_not_routed_twice() -> None:
    """MQTT-4.3.3-9 (method A): a re-sent PUBLISH before PUBREL is acknowledged, not routed."""
    h = Harness()
    sub, pub = pair(h)
    pub.send(Publish("t/x", b"once", 2, packet_id=5))
    assert pub.expect(PubRec).packet_id == 5
    pub.send(Publish("t/x", b"once", 2, dup=True, packet_id=5))
    assert pub.expect(PubRec).packet_id == 5
    pub.send(PubRel(5))
    assert pub.expect(PubComp).packet_id == 5
    assert [p.payload for p in sub.publishes()] == [b"once"]
    # after PUBCOMP the identifier is free again and a new message gets routed
    pub.send(Publish("t/x", b"twice", 2, packet_id=5))
    pub.expect(PubRec)
    assert [p.payload for p in sub.publishes()] == [b"twice"]


def test_pubrel_for_unknown_id_gets_pubcomp_0x92_v5() -> None:
    h = Harness()
    c = h.client()
    c.connect("x")
    c.send(PubRel(99))
    comp = c.expect(PubComp)
    assert (comp.packet_id, comp.reason_code) == (99, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)


def test_pubrel_for_unknown_id_gets_plain_pubcomp_311() -> None:
    h = Harness()
    c = h.client(MQTT_311)
    c.connect("x")
    c.send(PubRel(99))
    assert c.expect(PubComp) == PubComp(99)


def test_outbound_qos2_flow_completes_and_frees_the_identifier() -> None:
    h = Harness()
    sub, pub = pair(h)
    pub.publish("t/1", b"a", 2)
    [msg] = sub.publishes()
    assert msg.qos == 2
    session = h.broker.sessions["sub"]
    sub.send(PubRec(msg.packet_id))
    assert sub.expect(PubRel).packet_id == msg.packet_id
    assert session.inflight[msg.packet_id].state == 2
    sub.send(PubComp(msg.packet_id))
    assert not session.inflight


def test_pubrec_error_ends_outbound_qos2_flow() -> None:
    h = Harness()
    sub, pub = pair(h)
    pub.publish("t/1", b"a", 2)
    [msg] = sub.publishes()
    sub.send(PubRec(msg.packet_id, ReasonCode.UNSPECIFIED_ERROR))
    assert sub.take() == []
    assert not h.broker.sessions["sub"].inflight


def test_unknown_puback_is_ignored() -> None:
    h = Harness()
    c = h.client()
    c.connect("x")
    c.send(PubAck(1234))
    assert not c.closed
    assert c.take() == []


def test_receive_maximum_of_client_limits_inflight() -> None:
    """The server never has more unacknowledged QoS 1/2 than the client's Receive Maximum."""
    h = Harness()
    sub = h.client()
    sub.connect("sub", receive_maximum=2)
    sub.subscribe("t", 1)
    pub = h.client()
    pub.connect("pub")
    for i in range(5):
        pub.publish("t", b"%d" % i, 1)
    first = sub.publishes()
    assert [p.payload for p in first] == [b"0", b"1"]
    sub.send(PubAck(first[0].packet_id))
    [third] = sub.publishes()
    assert third.payload == b"2"
    sub.send(PubAck(first[1].packet_id))
    sub.send(PubAck(third.packet_id))
    assert [p.payload for p in sub.publishes()] == [b"3", b"4"]


def test_exceeding_our_receive_maximum_is_disconnect_0x93() -> None:
    h = Harness(receive_maximum=3)
    c = h.client()
    c.connect("greedy")
    for pid in range(1, 4):
        c.send(Publish("t", b"x", 2, packet_id=pid))
        assert c.expect(PubRec).packet_id == pid
    c.send(Publish("t", b"x", 2, packet_id=4))
    assert c.expect(Disconnect).reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    assert c.closed


def test_redelivery_on_resume_with_dup_and_original_ids_then_pubrel() -> None:
    """MQTT-4.4.0-1: unacknowledged PUBLISH (DUP=1) and PUBREL are re-sent on resumption."""
    h = Harness()
    sub, pub = pair(h)
    pub.publish("t/1", b"one", 1)
    pub.publish("t/2", b"two", 2)
    pub.publish("t/3", b"three", 2)
    first = sub.publishes()
    assert [p.dup for p in first] == [False, False, False]
    sub.send(PubRec(first[2].packet_id))  # third reaches the PUBREL stage
    assert sub.expect(PubRel).packet_id == first[2].packet_id
    sub.drop()
    again = h.client()
    assert again.connect("sub", clean_start=False, session_expiry_interval=3600).session_present
    packets = again.take()
    assert [(type(p).__name__, getattr(p, "packet_id", None)) for p in packets] == [
        ("Publish", first[0].packet_id),
        ("Publish", first[1].packet_id),
        ("PubRel", first[2].packet_id),
    ]
    assert all(p.dup for p in packets if isinstance(p, Publish))


def test_no_retransmission_while_connected_v5() -> None:
    """Only resumption triggers redelivery; time alone never does."""
    h = Harness()
    sub, pub = pair(h)
    pub.publish("t/1", b"one", 1)
    assert len(sub.publishes()) == 1
    h.advance(3600)
    assert sub.take() == []


def test_offline_messages_queue_and_arrive_in_order_on_resume() -> None:
    h = Harness()
    sub, pub = pair(h, qos=1)
    sub.send(Disconnect())
    for i in range(10):
        pub.publish("t/q", b"%d" % i, 1)
    pub.publish("t/q", b"qos0 is not queued offline", 0)
    back = h.client()
    back.connect("sub", clean_start=False, session_expiry_interval=3600)
    got = back.publishes()
    assert [p.payload for p in got] == [b"%d" % i for i in range(10)]
    assert h.broker.stats.dropped_offline_qos0 == 1


def test_queue_bound_drops_new_messages_and_counts_them() -> None:
    h = Harness(max_queued_messages=3)
    sub, pub = pair(h, qos=1)
    sub.send(Disconnect())
    for i in range(5):
        pub.publish("t/q", b"%d" % i, 1)
    assert h.broker.stats.dropped_queue_full == 2
    back = h.client()
    back.connect("sub", clean_start=False, session_expiry_interval=3600)
    assert [p.payload for p in back.publishes()] == [b"0", b"1", b"2"]


def test_slow_consumer_qos0_dropped_and_counted_qos1_waits() -> None:
    h = Harness()
    sub, pub = pair(h, qos=1)
    h.broker.set_writable(sub.conn, False, h.now)
    pub.publish("t/a", b"zero", 0)
    pub.publish("t/a", b"one", 1)
    assert sub.take() == []
    assert h.broker.stats.dropped_slow_consumer == 1
    h.broker.set_writable(sub.conn, True, h.now)
    assert [p.payload for p in sub.publishes()] == [b"one"]


def test_message_expiry_counts_down_and_expired_messages_are_never_delivered() -> None:
    h = Harness()
    sub, pub = pair(h, qos=1)
    sub.send(Disconnect())
    pub.publish("t/e", b"short", 1, message_expiry_interval=2)
    pub.publish("t/e", b"long", 1, message_expiry_interval=10)
    h.advance(3)
    back = h.client()
    back.connect("sub", clean_start=False, session_expiry_interval=3600)
    [msg] = back.publishes()
    assert msg.payload == b"long"
    assert msg.properties.message_expiry_interval == 7
    assert h.broker.stats.dropped_expired == 1


def test_v5_properties_pass_through_unchanged() -> None:
    h = Harness()
    sub, pub = pair(h)
    props: dict[str, Any] = {
        "payload_format_indicator": 1,
        "content_type": "application/json",
        "response_topic": "reply/here",
        "correlation_data": b"\x00\x01corr",
        "user_properties": (("a", "1"), ("b", "2"), ("a", "3")),
    }
    pub.publish("t/p", b'{"v": 1}', 1, **props)
    [msg] = sub.publishes()
    got = msg.properties
    assert got.payload_format_indicator == 1
    assert got.content_type == "application/json"
    assert got.response_topic == "reply/here"
    assert got.correlation_data == b"\x00\x01corr"
    assert got.user_properties == (("a", "1"), ("b", "2"), ("a", "3"))


def test_invalid_utf8_with_payload_format_indicator_refused_0x99() -> None:
    h = Harness()
    c = h.client()
    c.connect("x")
    c.send(
        Publish("t", b"\xff\xfe", 1, packet_id=3, properties=Properties(payload_format_indicator=1))
    )
    assert c.expect(PubAck).reason_code == ReasonCode.PAYLOAD_FORMAT_INVALID


def test_sys_topics_are_read_only_for_clients() -> None:
    h = Harness()
    watcher = h.client()
    watcher.connect("w")
    watcher.subscribe("$SYS/#")
    c = h.client()
    c.connect("x")
    c.send(Publish("$SYS/broker/uptime", b"fake", 1, packet_id=1))
    assert c.expect(PubAck).reason_code == ReasonCode.NOT_AUTHORIZED
    assert watcher.take() == []


def test_message_too_large_for_client_is_skipped_not_sent() -> None:
    """MQTT-3.1.2-25: never send a packet above the client's Maximum Packet Size."""
    h = Harness()
    sub = h.client()
    sub.connect("small", maximum_packet_size=64)
    sub.subscribe("t", 1)
    pub = h.client()
    pub.connect("pub")
    pub.publish("t", b"." * 32, 1)
    pub.publish("t", b"." * 64, 1)
    pub.publish("t", b"." * 16, 1)
    got = sub.publishes()
    assert [len(p.payload) for p in got] == [32, 16]
    assert h.broker.stats.dropped_too_large == 1
    assert len(h.broker.sessions["small"].inflight) == 2


def test_packet_too_large_from_client_is_disconnect_0x95() -> None:
    h = Harness(max_packet_size=128)
    c = h.client()
    c.connect("x")
    c.send(Publish("t", b"." * 200))
    assert c.expect(Disconnect).reason_code == ReasonCode.PACKET_TOO_LARGE
    assert c.closed


def test_topic_alias_inbound_sets_and_uses_alias() -> None:
    h = Harness(topic_alias_maximum=4)
    sub, pub = pair(h, qos=0)
    pub.send(Publish("t/aliased", b"1", properties=Properties(topic_alias=2)))
    pub.send(Publish("", b"2", properties=Properties(topic_alias=2)))
    assert [(p.topic, p.payload) for p in sub.publishes()] == [
        ("t/aliased", b"1"),
        ("t/aliased", b"2"),
    ]


@pytest.mark.parametrize("alias", [0, 5])
def test_topic_alias_outside_range_is_disconnect_0x94(alias: int) -> None:
    h = Harness(topic_alias_maximum=4)
    c = h.client()
    c.connect("x")
    c.send(Publish("t", b"x", properties=Properties(topic_alias=alias)))
    assert c.expect(Disconnect).reason_code == ReasonCode.TOPIC_ALIAS_INVALID


def test_unknown_topic_alias_is_protocol_error() -> None:
    h = Harness()
    c = h.client()
    c.connect("x")
    c.send(Publish("", b"x", properties=Properties(topic_alias=1)))
    assert c.expect(Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR


def test_outbound_topic_aliases_used_when_client_allows() -> None:
    h = Harness()
    sub = h.client()
    sub.connect("s", topic_alias_maximum=1)
    sub.subscribe("t/#", 2)
    pub = h.client()
    pub.connect("p")
    for qos in range(3):
        pub.publish("t/long/topic/name", b"x", qos)
    pub.publish("t/other", b"y", 0)
    got = sub.take()
    pubs = [p for p in got if isinstance(p, Publish)]
    assert [(p.topic, p.properties.topic_alias) for p in pubs] == [
        ("t/long/topic/name", 1),
        ("", 1),
        ("", 1),
        ("t/other", None),  # alias space full: the full topic is sent
    ]


def test_no_outbound_aliases_without_client_permission() -> None:
    h = Harness()
    sub, pub = pair(h)
    pub.publish("t/x", b"1")
    pub.publish("t/x", b"2")
    assert [p.properties.topic_alias for p in sub.publishes()] == [None, None]


def test_client_publish_must_not_carry_subscription_identifier() -> None:
    """MQTT-3.3.4-6."""
    h = Harness()
    c = h.client()
    c.connect("x")
    c.send(Publish("t", b"x", properties=Properties(subscription_identifiers=(3,))))
    assert c.expect(Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR


def test_retain_refused_when_unavailable() -> None:
    h = Harness(retain_available=False)
    c = h.client()
    c.connect("x")
    c.send(Publish("t", b"x", retain=True))
    assert c.expect(Disconnect).reason_code == ReasonCode.RETAIN_NOT_SUPPORTED


def test_mixed_versions_on_one_topic() -> None:
    h = Harness()
    old = h.client(MQTT_311)
    old.connect("old")
    old.subscribe("mix", 2)
    new = h.client(MQTT_5)
    new.connect("new")
    new.subscribe("mix", 2)
    new.publish("mix", b"from five", 2, user_properties=(("k", "v"),))
    old.publish("mix", b"from three", 1)
    assert [(p.payload, p.qos) for p in old.publishes()] == [(b"from five", 2), (b"from three", 1)]
    got = new.publishes()
    assert [(p.payload, p.qos) for p in got] == [(b"from five", 2), (b"from three", 1)]
    assert got[0].properties.user_properties == (("k", "v"),)


def test_message_forwarded_at_once_keeps_its_exact_expiry_interval() -> None:
    """No float rounding: at any clock value a 3600 s interval is forwarded as 3600."""
    h = Harness()
    h.now = 1_234_567.1
    sub, pub = pair(h, qos=1)
    pub.publish("t/e", b"x", 1, message_expiry_interval=3600)
    [msg] = sub.publishes()
    assert msg.properties.message_expiry_interval == 3600
