"""The MQTT-SN gateway logic, message by message, on the real broker core and a fake clock.

Every message goes through the real codec both ways (``tests.support.mqttsn``); an MQTT
client of the same broker watches what MQTT-SN clients publish and publishes what they
subscribe to. Section numbers are those of the MQTT-SN 1.2 specification.
"""

from __future__ import annotations

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.mqtt import MQTT_311
from gateway.mqtt import Publish as MqttPublish
from gateway.mqttsn.packets import (
    Advertise,
    ConnAck,
    Connect,
    Disconnect,
    GwInfo,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    ReturnCode,
    SearchGw,
    TopicIdType,
    UnsubAck,
    Unsubscribe,
    WillMsgResp,
    WillMsgUpd,
    WillTopicResp,
    WillTopicUpd,
)
from gateway.mqttsn.state import TransportPolicy
from tests.support.harness import FakeClient
from tests.support.mqttsn import SnHarness

SHORT_TT = int.from_bytes(b"tt", "big")


def watcher(h: SnHarness, topic_filter: str = "#", qos: int = 1) -> FakeClient:
    client = h.client(MQTT_311)
    client.connect("watcher")
    client.subscribe(topic_filter, qos)
    return client


def mqtt_messages(client: FakeClient) -> list[tuple[str, bytes, int, bool]]:
    out = []
    for p in client.take():
        assert isinstance(p, MqttPublish), p
        out.append((p.topic, p.payload, p.qos, p.retain))
        if p.qos:
            client.ack(p)
    return out


# ---------------------------------------------------------------------- connect (6.2)


def test_connect_is_accepted_and_counts_as_a_connected_client() -> None:
    h = SnHarness()
    dev = h.device()
    assert dev.connect("dev1") == ConnAck(ReturnCode.ACCEPTED)
    assert h.broker.connected == 1
    values = h.broker.sys_values(h.now)
    assert values["$SYS/broker/clients/connected"] == "1"
    assert h.gateway.sys_values()["mqttsn/clients/connected"] == "1"


def test_connect_with_a_wrong_protocol_id_or_client_id_is_not_supported() -> None:
    h = SnHarness()
    dev = h.device()
    dev.send(Connect("dev1", 60, protocol_id=0x02))
    assert dev.expect(ConnAck) == ConnAck(ReturnCode.NOT_SUPPORTED)
    dev.send(Connect("", 60))
    assert dev.expect(ConnAck) == ConnAck(ReturnCode.NOT_SUPPORTED)
    dev.send(Connect("a/b", 60))
    assert dev.expect(ConnAck) == ConnAck(ReturnCode.NOT_SUPPORTED)
    assert h.broker.connected == 0


def test_allow_list_refuses_other_client_ids_and_qos_minus_one() -> None:
    h = SnHarness([TransportPolicy("udp", frozenset({"good"}))], predefined_topics={1: "p/one"})
    w = watcher(h)
    dev = h.device()
    assert dev.connect("bad").return_code == ReturnCode.NOT_SUPPORTED
    assert dev.connect("good").return_code == ReturnCode.ACCEPTED
    other = h.device(("10.0.0.9", 1))
    other.publish(1, b"anon", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert mqtt_messages(w) == []


def test_a_client_id_used_by_an_mqtt_client_is_refused() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("shared-id")
    dev = h.device()
    assert dev.connect("shared-id").return_code == ReturnCode.NOT_SUPPORTED


def test_messages_that_need_a_connection_get_disconnect() -> None:
    """After a gateway restart a device's PUBLISH or PINGREQ tells it to connect again."""
    h = SnHarness()
    dev = h.device()
    dev.publish(1, b"x", qos=1)
    assert dev.expect(Disconnect) == Disconnect()
    dev.send(PingReq())
    assert dev.expect(Disconnect) == Disconnect()
    dev.send(PingReq("never-seen"))
    assert dev.expect(Disconnect) == Disconnect()


# ---------------------------------------------------------------------- discovery (6.1)


def test_searchgw_is_answered_with_gwinfo_and_advertise_is_periodic() -> None:
    h = SnHarness([TransportPolicy("udp", can_broadcast=True)], gateway_id=7, advertise_interval=30)
    dev = h.device()
    dev.send(SearchGw(1))
    assert dev.expect(GwInfo) == GwInfo(7)
    h.advance(0)  # the first one goes out at start-up
    assert h.broadcasts() == [Advertise(7, 30)]
    h.advance(29)
    assert h.broadcasts() == []
    h.advance(1)
    assert h.broadcasts() == [Advertise(7, 30)]


# ---------------------------------------------------------------------- register, publish


def test_register_then_publish_qos_0_1_2_reach_mqtt_subscribers() -> None:
    h = SnHarness()
    w = watcher(h, qos=2)
    dev = h.device()
    dev.connect()
    ack = dev.register("sensors/t")
    assert ack.return_code == ReturnCode.ACCEPTED and ack.topic_id not in (0, 0xFFFF)
    assert dev.register("sensors/t").topic_id == ack.topic_id  # the same id again
    tid = ack.topic_id
    dev.publish(tid, b"q0")
    pid = dev.publish(tid, b"q1", qos=1)
    assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.ACCEPTED)
    pid2 = dev.publish(tid, b"q2", qos=2)
    assert dev.expect(PubRec) == PubRec(pid2)
    dev.send(Publish(tid, pid2, b"q2", 2, dup=True))  # a resend before PUBREL
    assert dev.expect(PubRec) == PubRec(pid2)
    dev.send(PubRel(pid2))
    assert dev.expect(PubComp) == PubComp(pid2)
    assert mqtt_messages(w) == [
        ("sensors/t", b"q0", 0, False),
        ("sensors/t", b"q1", 1, False),
        ("sensors/t", b"q2", 2, False),
    ]
    assert h.broker.stats.publish_received == 3


def test_publish_to_an_unknown_topic_id_is_rejected_invalid_topic_id() -> None:
    """6.6: the gateway answers PUBACK "rejected: invalid topic ID" (any QoS)."""
    h = SnHarness()
    dev = h.device()
    dev.connect()
    pid = dev.publish(42, b"x", qos=1)
    assert dev.expect(PubAck) == PubAck(42, pid, ReturnCode.INVALID_TOPIC_ID)
    dev.publish(42, b"x", qos=0)
    assert dev.expect(PubAck) == PubAck(42, 0, ReturnCode.INVALID_TOPIC_ID)
    pid = dev.publish(7, b"x", qos=1, id_type=TopicIdType.PREDEFINED)
    assert dev.expect(PubAck) == PubAck(7, pid, ReturnCode.INVALID_TOPIC_ID)


def test_register_of_a_wildcard_topic_is_not_supported_and_a_full_table_is_congestion() -> None:
    h = SnHarness(max_topics_per_client=2)
    dev = h.device()
    dev.connect()
    assert dev.register("a/#").return_code == ReturnCode.NOT_SUPPORTED
    assert dev.register("a/1").return_code == ReturnCode.ACCEPTED
    assert dev.register("a/2").return_code == ReturnCode.ACCEPTED
    assert dev.register("a/3").return_code == ReturnCode.CONGESTION


def test_predefined_and_short_topics() -> None:
    h = SnHarness(predefined_topics={5: "plant/boiler/temp"})
    w = watcher(h)
    dev = h.device()
    dev.connect()
    dev.publish(5, b"80", qos=1, id_type=TopicIdType.PREDEFINED)
    assert dev.expect(PubAck).return_code == ReturnCode.ACCEPTED
    dev.publish(SHORT_TT, b"s", qos=1, id_type=TopicIdType.SHORT)
    assert dev.expect(PubAck).return_code == ReturnCode.ACCEPTED
    assert mqtt_messages(w) == [("plant/boiler/temp", b"80", 1, False), ("tt", b"s", 1, False)]


def test_qos_minus_one_needs_no_connection_and_only_predefined_or_short_topics() -> None:
    """6.8: a device publishes at QoS -1 without connecting; nothing is answered."""
    h = SnHarness(predefined_topics={1: "p/one"})
    w = watcher(h)
    dev = h.device()
    dev.publish(1, b"a", qos=-1, id_type=TopicIdType.PREDEFINED)
    dev.publish(SHORT_TT, b"b", qos=-1, id_type=TopicIdType.SHORT)
    dev.publish(1, b"c", qos=-1, id_type=TopicIdType.NORMAL)  # dropped: no registration
    dev.publish(99, b"d", qos=-1, id_type=TopicIdType.PREDEFINED)  # dropped: unknown
    dev.nothing()
    assert mqtt_messages(w) == [("p/one", b"a", 0, False), ("tt", b"b", 0, False)]
    assert h.broker.connected == 1  # the watcher only
    assert h.gateway.stats.qos_minus_one == 2


def test_retained_publish_and_retained_delivery_after_suback() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect()
    tid = dev.register("state/door").topic_id
    dev.publish(tid, b"open", qos=1, retain=True)
    dev.expect(PubAck)
    other = h.device(("10.0.0.3", 1))
    other.connect("dev2")
    suback = other.subscribe("state/#", qos=1)
    assert suback.return_code == ReturnCode.ACCEPTED and suback.topic_id == 0
    reg = other.expect(Register)  # after the SUBACK, never before
    assert reg.topic_name == "state/door"
    other.send(RegAck(reg.topic_id, reg.msg_id))
    pub = other.expect(Publish)
    assert (pub.topic_id, pub.data, pub.retain, pub.qos) == (reg.topic_id, b"open", True, 1)


# ---------------------------------------------------------------------- subscribe, deliver


def test_wildcard_delivery_registers_the_topic_first_then_publishes() -> None:
    """6.10: a topic the client does not know is REGISTERed before its PUBLISH."""
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    assert dev.subscribe("cmd/+", qos=1).return_code == ReturnCode.ACCEPTED
    mqtt.publish("cmd/led", b"on", qos=1)
    mqtt.publish("cmd/led", b"off", qos=0)
    reg = dev.expect(Register)
    assert reg.topic_name == "cmd/led"
    dev.nothing()  # the PUBLISH waits for the REGACK
    dev.send(RegAck(reg.topic_id, reg.msg_id))
    first = dev.expect(Publish)
    assert (first.topic_id, first.data, first.qos) == (reg.topic_id, b"on", 1)
    dev.nothing()  # one QoS 1 message in flight at a time
    dev.ack(first)
    second = dev.expect(Publish)
    assert (second.topic_id, second.data, second.qos, second.msg_id) == (reg.topic_id, b"off", 0, 0)


def test_subscribe_to_a_plain_topic_returns_its_id_and_delivery_uses_it() -> None:
    h = SnHarness(predefined_topics={9: "p/nine"})
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    suback = dev.subscribe("cmd/x", qos=0)
    assert suback.topic_id != 0
    assert dev.subscribe(9, 0, TopicIdType.PREDEFINED).topic_id == 9
    assert dev.subscribe("tt", 0, TopicIdType.SHORT).return_code == ReturnCode.ACCEPTED
    mqtt.publish("cmd/x", b"1")
    mqtt.publish("p/nine", b"2")
    mqtt.publish("tt", b"3")
    got = [(p.topic_id, p.topic_id_type, p.data) for p in dev.take() if isinstance(p, Publish)]
    assert got == [
        (suback.topic_id, TopicIdType.NORMAL, b"1"),
        (9, TopicIdType.PREDEFINED, b"2"),
        (SHORT_TT, TopicIdType.SHORT, b"3"),
    ]
    assert dev.subscribe(77, 0, TopicIdType.PREDEFINED).return_code == ReturnCode.INVALID_TOPIC_ID
    assert dev.subscribe("a/#/b", 0).return_code == ReturnCode.INVALID_TOPIC_ID
    assert dev.subscribe("x", -1).return_code == ReturnCode.NOT_SUPPORTED
    dev.send(Unsubscribe(50, "cmd/x"))
    assert dev.expect(UnsubAck) == UnsubAck(50)
    mqtt.publish("cmd/x", b"gone")
    dev.nothing()


def test_qos2_delivery_to_a_client_runs_pubrec_pubrel_pubcomp() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    tid = dev.subscribe("q/two", qos=2).topic_id
    mqtt.publish("q/two", b"once", qos=2)
    pub = dev.expect(Publish)
    assert (pub.topic_id, pub.qos) == (tid, 2)
    dev.send(PubRec(pub.msg_id))
    assert dev.expect(PubRel) == PubRel(pub.msg_id)
    h.advance(10)  # Tretry: the PUBREL is resent
    assert dev.expect(PubRel) == PubRel(pub.msg_id)
    dev.send(PubComp(pub.msg_id))
    h.advance(60)
    dev.nothing()


def test_unacknowledged_publish_is_resent_with_dup_then_the_client_is_lost() -> None:
    """6.13: Tretry / Nretry; after the last retry the client is lost and its will fires."""
    h = SnHarness(retry_interval=5, max_retries=2)
    w = watcher(h, "status/#")
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("dev1", duration=600, will=("status/dev1", b"gone", 1, False))
    tid = dev.subscribe("inbox", qos=1).topic_id
    mqtt.publish("inbox", b"m", qos=1)
    first = dev.expect(Publish)
    assert not first.dup and first.topic_id == tid
    h.advance(5)
    again = dev.expect(Publish)
    assert again.dup and again.msg_id == first.msg_id
    h.advance(5)
    assert dev.expect(Publish).dup
    assert mqtt_messages(w) == []
    h.advance(5)
    assert mqtt_messages(w) == [("status/dev1", b"gone", 1, False)]
    assert h.gateway.stats.clients_lost == 1
    dev.publish(tid, b"late", qos=1)
    assert dev.expect(Disconnect) == Disconnect()


def test_puback_invalid_topic_id_from_a_client_re_registers_and_resends() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    dev.subscribe("cmd/#", qos=1)
    mqtt.publish("cmd/a", b"v", qos=1)
    reg = dev.expect(Register)
    dev.send(RegAck(reg.topic_id, reg.msg_id))
    pub = dev.expect(Publish)
    dev.send(PubAck(pub.topic_id, pub.msg_id, ReturnCode.INVALID_TOPIC_ID))
    reg2 = dev.expect(Register)
    assert reg2.topic_name == "cmd/a"
    dev.send(RegAck(reg2.topic_id, reg2.msg_id))
    assert dev.expect(Publish).data == b"v"


@pytest.mark.parametrize(
    "code", [ReturnCode.CONGESTION, ReturnCode.INVALID_TOPIC_ID, ReturnCode.NOT_SUPPORTED]
)
def test_a_refused_regack_drops_that_message_once_and_the_next_one_goes_out(code: int) -> None:
    """A device that will not take a topic (REGACK with a return code other than
    accepted): the message that needed it is dropped and counted, the gateway does not
    ask again, and what is queued behind it is delivered in order."""
    h = SnHarness(retry_interval=5)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    dev.subscribe("cmd/#", qos=1)
    mqtt.publish("cmd/refused", b"1", qos=1)
    mqtt.publish("cmd/ok", b"2", qos=1)
    reg = dev.expect(Register)
    assert reg.topic_name == "cmd/refused"
    dev.send(RegAck(0, reg.msg_id, code))
    reg2 = dev.expect(Register)
    assert reg2.topic_name == "cmd/ok"
    dev.send(RegAck(reg2.topic_id, reg2.msg_id))
    pub = dev.expect(Publish)
    assert (pub.topic_id, pub.data) == (reg2.topic_id, b"2")
    dev.ack(pub)
    h.advance(60)  # no REGISTER of the refused topic comes back, nor a resend
    dev.nothing()
    assert h.gateway.stats.publish_refused == 1
    assert h.gateway.stats.retransmissions == 0
    mqtt.publish("cmd/refused", b"3", qos=1)  # a later message asks again, once
    assert dev.expect(Register).topic_name == "cmd/refused"


@pytest.mark.parametrize("answer", ["accepted", "refused"])
def test_a_full_queue_drops_the_oldest_waiting_message_not_the_register_in_flight(
    answer: str,
) -> None:
    """A message REGISTERING (its REGISTER on the wire) is in flight, not waiting: it
    does not count against ``max_queued_messages``, and with ``drop-oldest`` a full
    queue drops the oldest message waiting behind it, so the REGACK still finds its
    message and a refusal drops only that one. Each message lost is counted once, as
    queue full or as refused."""
    h = SnHarness(retry_interval=5, max_queued_messages=3)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    dev.subscribe("cmd/#", qos=1)
    mqtt.publish("cmd/new", b"0", qos=1)  # needs a REGISTER: heads the queue, in flight
    reg = dev.expect(Register)
    assert reg.topic_name == "cmd/new"
    for n in (b"1", b"2", b"3", b"4"):  # 3 wait; the fourth drops "1", the oldest
        mqtt.publish("cmd/new", n, qos=1)
    assert h.gateway.stats.dropped_queue_full == 1
    if answer == "accepted":
        dev.send(RegAck(reg.topic_id, reg.msg_id))
        expected = [b"0", b"2", b"3", b"4"]
    else:
        dev.send(RegAck(0, reg.msg_id, ReturnCode.NOT_SUPPORTED))
        reg2 = dev.expect(Register)  # asked again for what waits, once
        assert reg2.topic_name == "cmd/new"
        dev.send(RegAck(reg2.topic_id, reg2.msg_id))
        expected = [b"2", b"3", b"4"]
    got = []
    for _ in expected:
        pub = dev.expect(Publish)
        got.append(pub.data)
        dev.ack(pub)
    assert got == expected
    h.advance(60)
    dev.nothing()
    stats = h.gateway.stats
    assert (stats.dropped_queue_full, stats.publish_refused) == (
        (1, 0) if answer == "accepted" else (1, 1)
    )


def test_invalid_topic_id_then_re_register_keeps_the_order_of_what_follows() -> None:
    """PUBACK "invalid topic id" (the device lost its registrations): the gateway
    REGISTERs again and resends that message before the ones queued behind it."""
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    dev.subscribe("cmd/#", qos=1)
    for n in (b"1", b"2", b"3"):
        mqtt.publish("cmd/a", n, qos=1)
    reg = dev.expect(Register)
    dev.send(RegAck(reg.topic_id, reg.msg_id))
    first = dev.expect(Publish)
    assert first.data == b"1"
    dev.send(PubAck(first.topic_id, first.msg_id, ReturnCode.INVALID_TOPIC_ID))
    reg2 = dev.expect(Register)
    dev.send(RegAck(reg2.topic_id, reg2.msg_id))
    got = []
    for _ in range(3):
        pub = dev.expect(Publish)
        got.append(pub.data)
        dev.ack(pub)
    assert got == [b"1", b"2", b"3"]
    assert h.gateway.stats.publish_refused == 0


@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_in_flight_when_the_device_sleeps_is_resent_when_it_wakes(qos: int) -> None:
    """6.14 with 6.13: the QoS 1/2 step in flight when a device went to sleep is not
    resent while it sleeps; when it wakes it comes again (PUBLISH with DUP, or PUBREL),
    then the rest of the buffer, then PINGRESP."""
    h = SnHarness(retry_interval=5)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("sleeper")
    tid = dev.subscribe("to/sleeper", qos=qos).topic_id
    mqtt.publish("to/sleeper", b"in flight", qos=qos)
    first = dev.expect(Publish)
    if qos == 2:
        dev.send(PubRec(first.msg_id))
        assert dev.expect(PubRel) == PubRel(first.msg_id)
    dev.sleep(120)
    mqtt.publish("to/sleeper", b"queued", qos=qos)
    h.advance(60)  # asleep: nothing is resent
    dev.nothing()
    assert h.gateway.stats.retransmissions == 0
    dev.wake("sleeper")
    if qos == 1:
        again = dev.expect(Publish)
        assert (again.dup, again.msg_id, again.data) == (True, first.msg_id, b"in flight")
        dev.ack(again)
    else:
        assert dev.expect(PubRel) == PubRel(first.msg_id)
        dev.send(PubComp(first.msg_id))
    nxt = dev.expect(Publish)
    assert (nxt.data, nxt.topic_id, nxt.dup) == (b"queued", tid, False)
    if qos == 1:
        dev.ack(nxt)
    else:
        dev.send(PubRec(nxt.msg_id))
        assert dev.expect(PubRel) == PubRel(nxt.msg_id)
        dev.send(PubComp(nxt.msg_id))
    assert dev.expect(PingResp) == PingResp()
    assert h.gateway.stats.retransmissions == 1


def test_a_device_answering_congestion_has_that_message_dropped_and_counted() -> None:
    """PUBACK "rejected: congestion" from a device: the message is not resent (it was
    received and refused), counted as refused, and the next one goes out."""
    h = SnHarness(retry_interval=5)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    tid = dev.subscribe("busy", qos=1).topic_id
    mqtt.publish("busy", b"1", qos=1)
    mqtt.publish("busy", b"2", qos=1)
    first = dev.expect(Publish)
    dev.send(PubAck(tid, first.msg_id, ReturnCode.CONGESTION))
    second = dev.expect(Publish)
    assert second.data == b"2" and not second.dup
    dev.ack(second)
    h.advance(30)
    dev.nothing()
    assert h.gateway.stats.publish_refused == 1


def test_inbound_qos2_beyond_its_bound_is_refused_congestion() -> None:
    """A device with MAX_INBOUND_QOS2 QoS 2 messages between PUBLISH and PUBREL gets
    PUBACK congestion for the next; once one is released, another is taken."""
    from gateway.mqttsn.state import MAX_INBOUND_QOS2

    h = SnHarness()
    w = watcher(h, "q2/#", qos=2)
    dev = h.device()
    dev.connect()
    tid = dev.register("q2/x").topic_id
    ids = []
    for _ in range(MAX_INBOUND_QOS2):
        ids.append(dev.publish(tid, b"m", qos=2))
        assert dev.expect(PubRec) == PubRec(ids[-1])
    over = dev.publish(tid, b"over", qos=2)
    assert dev.expect(PubAck) == PubAck(tid, over, ReturnCode.CONGESTION)
    dev.send(PubRel(ids[0]))
    assert dev.expect(PubComp) == PubComp(ids[0])
    dev.send(Publish(tid, over, b"now", 2, False, False, TopicIdType.NORMAL))
    assert dev.expect(PubRec) == PubRec(over)
    assert len(mqtt_messages(w)) == MAX_INBOUND_QOS2 + 1


# ---------------------------------------------------------------------- wills (6.3, 6.4)


def test_keep_alive_loss_publishes_the_will() -> None:
    h = SnHarness()
    w = watcher(h, "status/#")
    dev = h.device()
    assert dev.connect("dev1", 10, will=("status/dev1", b"offline", 0, True)).return_code == 0
    h.advance(14)
    dev.send(PingReq())
    assert dev.expect(PingResp) == PingResp()
    h.advance(14.9)
    assert mqtt_messages(w) == []
    h.advance(0.2)  # 1.5 x keep alive after the PINGREQ
    # Live delivery to an existing 3.1.1 subscriber clears retain (MQTT-3.3.1-9) ...
    assert mqtt_messages(w) == [("status/dev1", b"offline", 0, False)]
    # ... but the will was published retained.
    assert [m.payload for m in h.broker.retained.matching("status/dev1", h.now)] == [b"offline"]
    assert h.broker.connected == 1  # the watcher


def test_disconnect_publishes_no_will_and_updates_change_it() -> None:
    h = SnHarness()
    w = watcher(h, "status/#")
    dev = h.device()
    dev.connect("dev1", 10, will=("status/dev1", b"v1", 0, False))
    dev.send(WillTopicUpd("status/new", 1, False))
    assert dev.expect(WillTopicResp) == WillTopicResp(ReturnCode.ACCEPTED)
    dev.send(WillMsgUpd(b"v2"))
    assert dev.expect(WillMsgResp) == WillMsgResp(ReturnCode.ACCEPTED)
    dev.send(WillTopicUpd("bad/#"))
    assert dev.expect(WillTopicResp) == WillTopicResp(ReturnCode.NOT_SUPPORTED)
    h.advance(16)
    assert mqtt_messages(w) == [("status/new", b"v2", 1, False)]

    dev2 = h.device(("10.0.0.5", 2))
    dev2.connect("dev2", 10, will=("status/dev2", b"x", 0, False))
    dev2.send(Disconnect())
    assert dev2.expect(Disconnect) == Disconnect()
    h.advance(60)
    assert mqtt_messages(w) == []


def test_a_will_topic_the_acl_forbids_refuses_the_connect() -> None:
    acl = parse_acl_file("pattern write devices/%c/#\n")
    h = SnHarness(acl=acl)
    dev = h.device()
    assert dev.connect("d1", will=("elsewhere/x", b"", 0, False)).return_code == (
        ReturnCode.NOT_SUPPORTED
    )
    assert dev.connect("d1", will=("devices/d1/status", b"", 0, False)).return_code == 0


def test_a_will_under_sys_is_refused_except_the_devices_own_connection_state() -> None:
    """The one rule MQTT clients have: ``$SYS/broker/connection/<own id>/state`` may
    be written (a bridge's notification), nothing else under ``$SYS``."""
    h = SnHarness()
    w = watcher(h, "$SYS/broker/connection/#")
    dev = h.device()
    for topic in ("$SYS/broker/uptime", "$SYS/broker/connection/other/state"):
        assert dev.connect("d1", will=(topic, b"0", 0, False)).return_code == (
            ReturnCode.NOT_SUPPORTED
        )
    own = "$SYS/broker/connection/d1/state"
    assert dev.connect("d1", duration=10, will=(own, b"0", 1, True)).return_code == 0
    dev.send(WillTopicUpd("$SYS/broker/load", 0, False))
    assert dev.expect(WillTopicResp) == WillTopicResp(ReturnCode.NOT_SUPPORTED)
    dev.send(WillTopicUpd(own, 1, True))
    assert dev.expect(WillTopicResp) == WillTopicResp(ReturnCode.ACCEPTED)
    h.advance(16)  # lost: its will is published
    assert mqtt_messages(w) == [(own, b"0", 1, False)]


# ---------------------------------------------------------------------- sleeping clients (6.14)


def test_sleeping_client_gets_its_buffered_messages_once_then_pingresp() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("sleeper", 30, clean=True)
    tid = dev.subscribe("to/sleeper", qos=1).topic_id
    dev.sleep(120)
    mqtt.publish("to/sleeper", b"a", qos=1)
    mqtt.publish("to/sleeper", b"b", qos=0)
    dev.nothing()  # asleep: buffered
    h.advance(100)  # longer than 1.5 x keep alive: asleep clients use their duration
    dev.wake("sleeper")
    a = dev.expect(Publish)
    assert (a.data, a.qos, a.topic_id) == (b"a", 1, tid)
    dev.nothing()
    dev.ack(a)
    b = dev.expect(Publish)
    assert (b.data, b.qos) == (b"b", 0)
    assert dev.expect(PingResp) == PingResp()
    dev.wake("sleeper")  # nothing new: only PINGRESP, nothing is sent twice
    assert dev.take() == [PingResp()]


def test_sleeping_client_wakes_from_a_new_address() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device(("10.0.0.2", 1000))
    dev.connect("sleeper")
    dev.subscribe("x", 0)
    dev.sleep(60)
    mqtt.publish("x", b"1")
    moved = h.device(("10.0.0.2", 2000))
    moved.wake("sleeper")
    assert [type(p) for p in moved.take()] == [Publish, PingResp]


def test_sleep_buffer_is_bounded_drop_oldest_and_counted() -> None:
    h = SnHarness(max_queued_messages=3)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("s")
    dev.subscribe("n", 0)
    dev.sleep(600)
    for i in range(5):
        mqtt.publish("n", str(i).encode())
    dev.wake("s")
    got = [p.data for p in dev.take() if isinstance(p, Publish)]
    assert got == [b"2", b"3", b"4"]
    assert h.gateway.stats.dropped_queue_full == 2


def test_sleep_buffer_drop_new_policy_keeps_the_oldest() -> None:
    h = SnHarness(max_queued_messages=2, queue_policy="drop-new")
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("s")
    dev.subscribe("n", 0)
    dev.sleep(600)
    for i in range(4):
        mqtt.publish("n", str(i).encode())
    dev.wake("s")
    assert [p.data for p in dev.take() if isinstance(p, Publish)] == [b"0", b"1"]


def test_a_client_not_back_within_its_sleep_duration_is_lost() -> None:
    h = SnHarness()
    w = watcher(h, "status/#")
    dev = h.device()
    dev.connect("s", 10, will=("status/s", b"dead", 0, False))
    dev.sleep(100)
    h.advance(149)
    assert mqtt_messages(w) == []
    h.advance(2)
    assert mqtt_messages(w) == [("status/s", b"dead", 0, False)]


def test_connect_while_asleep_makes_the_client_active_and_keeps_subscriptions() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("s")
    tid = dev.subscribe("k", 0).topic_id
    dev.sleep(60)
    mqtt.publish("k", b"buffered")
    assert dev.connect("s", clean=True) == ConnAck(ReturnCode.ACCEPTED)
    pub = dev.expect(Publish)
    assert (pub.topic_id, pub.data) == (tid, b"buffered")


# ---------------------------------------------------------------------- sessions


def test_clean_session_false_keeps_subscriptions_and_qos1_messages_across_connections() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("p", clean=False)
    tid = dev.subscribe("keep", 1).topic_id
    dev.send(Disconnect())
    dev.expect(Disconnect)
    mqtt.publish("keep", b"while away", qos=1)
    mqtt.publish("keep", b"qos0 lost", qos=0)
    dev.connect("p", clean=False)
    pub = dev.expect(Publish)
    assert (pub.topic_id, pub.data) == (tid, b"while away")
    dev.ack(pub)
    dev.nothing()
    assert h.gateway.stats.dropped_offline_qos0 == 1
    dev.connect("p", clean=True)
    mqtt.publish("keep", b"after clean", qos=1)
    dev.nothing()


def test_takeover_from_a_new_address_keeps_the_session_without_a_will() -> None:
    h = SnHarness()
    w = watcher(h, "status/#")
    old = h.device(("10.0.0.2", 1))
    old.connect("dev", will=("status/dev", b"x", 0, False))
    new = h.device(("10.0.0.2", 2))
    assert new.connect("dev", clean=False) == ConnAck(ReturnCode.ACCEPTED)
    old.publish(1, b"x", qos=1)
    assert old.expect(Disconnect) == Disconnect()
    assert mqtt_messages(w) == []
    assert h.broker.connected == 2


# ---------------------------------------------------------------------- bounds, hostile input


def test_a_connect_flood_cannot_evict_established_clients() -> None:
    h = SnHarness(max_clients=3, max_connect_rate_per_address=1e6)
    devices = [h.device(("10.0.0.2", i)) for i in range(3)]
    for i, d in enumerate(devices):
        assert d.connect(f"d{i}").return_code == ReturnCode.ACCEPTED
    for d in devices[:2]:
        d.send(PingReq())  # heard from after the CONNACK: proven
        assert d.expect(PingResp) == PingResp()
    devices[2].sleep(600)  # asleep counts as established too
    for i in range(200):
        flood = h.device(("10.9.0.1", 10_000 + i))
        assert flood.connect(f"flood{i}").return_code == ReturnCode.CONGESTION
    for d in devices[:2]:
        d.send(PingReq())
        assert d.expect(PingResp) == PingResp()
    assert h.gateway.stats.clients_refused == 200
    assert len(h.gateway.by_id) == 3


def test_the_longest_disconnected_remembered_session_makes_room() -> None:
    h = SnHarness(max_clients=2)
    a, b, c = (h.device(("10.0.0.2", i)) for i in range(3))
    a.connect("a", clean=False)
    a.send(Disconnect())
    h.advance(1)
    b.connect("b")
    b.ping()
    assert c.connect("c").return_code == ReturnCode.ACCEPTED
    assert set(h.gateway.by_id) == {"b", "c"}
    assert h.gateway.stats.clients_evicted == 1


def test_a_client_without_keep_alive_is_lost_after_idle_timeout() -> None:
    """Duration 0 turns the keep-alive off (5.4.4); the gateway still bounds how long
    a silent client holds its slot: lost like an expired keep-alive, will published."""
    h = SnHarness(idle_timeout=30)
    w = watcher(h, "status/#")
    dev = h.device()
    dev.connect("dev1", duration=0, will=("status/dev1", b"gone", 1, False))
    h.advance(20)
    dev.send(PingReq())  # traffic restarts the idle clock
    assert dev.expect(PingResp) == PingResp()
    h.advance(20)
    assert "dev1" in h.gateway.by_id and mqtt_messages(w) == []
    h.advance(11)
    assert "dev1" not in h.gateway.by_id
    assert mqtt_messages(w) == [("status/dev1", b"gone", 1, False)]
    assert h.gateway.stats.clients_lost == 1
    dev.send(PingReq())
    assert dev.expect(Disconnect) == Disconnect()


def test_a_full_table_evicts_the_longest_silent_client_without_keep_alive() -> None:
    """Policy "evict longest silent": a newcomer takes the slot of the Duration-0
    client silent longest (its will published, DISCONNECT sent); clients with a
    keep-alive and sleeping clients keep theirs through a flood of Duration-0 CONNECTs."""
    h = SnHarness(max_clients=4, max_connect_rate=1e6, max_connect_rate_per_address=1e6)
    w = watcher(h, "status/#")
    kept = h.device(("10.0.0.2", 1))
    kept.connect("kept", duration=60)
    kept.ping()
    sleeper = h.device(("10.0.0.2", 2))
    sleeper.connect("sleeper", duration=60)
    sleeper.sleep(3600)
    old = h.device(("10.0.0.3", 1))
    old.connect("old", duration=0, will=("status/old", b"evicted", 0, False))
    old.ping()
    h.advance(1)
    busy = h.device(("10.0.0.3", 2))
    busy.connect("busy", duration=0)
    busy.ping()
    h.advance(1)
    newcomer = h.device(("10.0.0.4", 1))
    assert newcomer.connect("newcomer", duration=0).return_code == ReturnCode.ACCEPTED
    assert old.expect(Disconnect) == Disconnect()
    assert mqtt_messages(w) == [("status/old", b"evicted", 0, False)]
    assert set(h.gateway.by_id) == {"kept", "sleeper", "busy", "newcomer"}
    assert h.gateway.stats.clients_evicted_silent == 1
    assert h.gateway.stats.clients_lost == 0
    h.advance(1)
    newcomer.ping()
    h.advance(1)
    busy.ping()  # busy spoke last: newcomer is now the longest silent
    for i in range(1100):
        flood = h.device((f"10.9.{i // 250}.{i % 250}", 10_000 + i))
        assert flood.connect(f"flood{i}", duration=0).return_code == ReturnCode.ACCEPTED
        if i % 20 == 0:
            h.advance(1)
            kept.ping()  # within its keep-alive: established
    # The first flood CONNECT took the longest-silent proven slot (newcomer's); each
    # later one the slot of the unproven flood client before it.
    assert {"kept", "sleeper", "busy"} <= set(h.gateway.by_id)
    assert len(h.gateway.by_id) == 4
    assert h.gateway.stats.clients_evicted_silent == 2
    assert h.gateway.stats.clients_evicted_unproven == 1099
    assert h.gateway.stats.clients_refused == 0
    sleeper.wake("sleeper")
    assert sleeper.expect(PingResp) == PingResp()


def test_clients_per_address_are_bounded_and_forwarded_nodes_count_there() -> None:
    h = SnHarness(max_clients_per_address=3, max_clients=50)
    for port in range(3):
        device = h.device(("10.1.1.1", port))
        assert device.connect(f"a{port}").return_code == 0
        device.ping()
    fourth = h.device(("10.1.1.1", 99))
    assert fourth.connect("a99").return_code == ReturnCode.CONGESTION
    assert h.gateway.stats.clients_refused_per_address == 1
    assert h.gateway.stats.clients_refused == 1
    # A known client coming back from a new port replaces itself: not refused.
    moved = h.device(("10.1.1.1", 50))
    assert moved.connect("a0").return_code == ReturnCode.ACCEPTED
    # Another IP is not affected.
    assert h.device(("10.1.1.2", 0)).connect("b").return_code == ReturnCode.ACCEPTED
    # Nodes behind one forwarder (5.5) share its address and its limit.
    for n in range(3):
        node = h.device(("10.2.2.2", 7), node_id=bytes((n,)))
        assert node.connect(f"node{n}").return_code == ReturnCode.ACCEPTED
        node.ping()
    extra = h.device(("10.2.2.2", 7), node_id=b"\x09")
    assert extra.connect("node9").return_code == ReturnCode.CONGESTION
    assert h.gateway.stats.clients_refused_per_address == 2
    # IPv6: a /64 counts as one address (one host has all of it to pick from).
    for n in range(3):
        v6_device = h.device((f"2001:db8::{n + 1}", 1884, 0, 0))
        assert v6_device.connect(f"v6-{n}").return_code == 0
        v6_device.ping()
    v6 = h.device(("2001:db8::ff:1", 1884, 0, 0))
    assert v6.connect("v6-9").return_code == ReturnCode.CONGESTION
    assert h.device(("2001:db8:0:1::1", 1884, 0, 0)).connect("v6-x").return_code == 0
    assert h.gateway.stats.clients_refused_per_address == 3
    # A serial line (one wired coordinator) is not limited per address.
    for n in range(5):
        node = h.device("uart0", transport="serial", node_id=bytes((n,)))
        assert node.connect(f"serial{n}").return_code == ReturnCode.ACCEPTED
    # Once one leaves, the address has room again.
    h.device(("10.1.1.1", 1)).send(Disconnect())
    assert fourth.connect("a99").return_code == ReturnCode.ACCEPTED
    # Full again (a0 and a99 unproven, a2 proven): a newcomer from there takes the slot
    # of the oldest client not heard from since its CONNACK, a0, which is told so.
    moved.take()
    assert h.device(("10.1.1.1", 51)).connect("a100").return_code == ReturnCode.ACCEPTED
    assert moved.expect(Disconnect) == Disconnect()
    assert set(h.gateway.by_id) >= {"a2", "a99", "a100"} and "a0" not in h.gateway.by_id
    assert h.gateway.stats.clients_evicted_unproven == 1
    assert h.gateway.stats.clients_refused_per_address == 3


def test_half_finished_connects_time_out_and_are_bounded() -> None:
    h = SnHarness(max_connecting=2, connect_timeout=5)
    for i in range(2):
        h.device(("10.0.0.3", i)).send(Connect(f"w{i}", 60, will=True))
    third = h.device(("10.0.0.3", 9))
    third.send(Connect("w9", 60, will=True))
    assert third.expect(ConnAck) == ConnAck(ReturnCode.CONGESTION)
    h.advance(5)
    assert h.gateway.by_id == {}
    third.send(Connect("w9", 60, will=True))
    assert third.take()[0] != ConnAck(ReturnCode.CONGESTION)


# ---------------------------------------------------------------------- a hostile LAN


def test_a_sleeping_clients_messages_go_only_where_it_connected_from(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A PINGREQ naming a sleeping client wakes it only from its own source (IPv4
    address, any port; same transport and forwarder node): from anywhere else it is
    refused with DISCONNECT, counted and logged, and the buffer waits for the device."""
    h = SnHarness([TransportPolicy("udp"), TransportPolicy("serial")])
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device(("10.0.0.2", 1000))
    dev.connect("victim-1")
    tid = dev.subscribe("to/victim", qos=1).topic_id
    dev.sleep(600)
    mqtt.publish("to/victim", b"secret", qos=1)
    for thief in (
        h.device(("10.0.0.66", 1000)),  # another host
        h.device(("10.0.0.2", 1000), transport="serial"),  # another transport
        h.device(("10.0.0.2", 1001), node_id=b"\x07"),  # a node behind a forwarder there
    ):
        thief.wake("victim-1")
        assert thief.take() == [Disconnect()]
    assert h.gateway.stats.wakes_refused == 3
    assert any("PINGREQ waking 'victim-1' refused" in r.getMessage() for r in caplog.records)
    moved = h.device(("10.0.0.2", 2000))  # the device itself, from a new source port
    moved.wake("victim-1")
    got = moved.expect(Publish)
    assert (got.data, got.topic_id) == (b"secret", tid)
    moved.ack(got)
    assert moved.expect(PingResp) == PingResp()


def test_a_connect_naming_a_sleeping_client_from_elsewhere_is_refused_and_its_buffer_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A CONNECT is no way round the wake's origin: naming a sleeping client from
    another host, transport or forwarder node -- with clean session or without, with a
    Will or without -- it gets 0x01 congestion and nothing else, is counted as a wake
    refused and logged; the session stays where it was, and the device itself gets its
    message when it wakes (from a new port), or connects again, from its address."""
    h = SnHarness([TransportPolicy("udp"), TransportPolicy("serial")])
    w = watcher(h, "status/#")
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device(("10.0.0.2", 1000))
    dev.connect("victim-1", clean=False, will=("status/victim-1", b"gone", 0, False))
    tid = dev.subscribe("to/victim", qos=1).topic_id
    dev.sleep(600)
    mqtt.publish("to/victim", b"secret", qos=1)
    thieves = [
        h.device(("10.0.0.66", 1000)),  # another host
        h.device(("10.0.0.2", 1000), transport="serial"),  # another transport
        h.device(("10.0.0.2", 1001), node_id=b"\x07"),  # a node behind a forwarder there
    ]
    for thief in thieves:
        for clean in (True, False):
            thief.send(Connect("victim-1", 60, clean))
            assert thief.take() == [ConnAck(ReturnCode.CONGESTION)]
        thief.send(Connect("victim-1", 60, True, True))  # with the Will flag
        assert thief.take() == [ConnAck(ReturnCode.CONGESTION)]
    assert h.gateway.stats.wakes_refused == 9
    assert h.gateway.stats.clients_refused == 9
    victim = h.gateway.by_id["victim-1"]
    assert (victim.state.name, victim.key) == ("ASLEEP", ("udp", ("10.0.0.2", 1000), b""))
    assert (
        "10.0.0.66:1000 (udp): refusing CONNECT of 'victim-1': it is asleep, connected from"
        " 10.0.0.2:1000 (udp); from elsewhere it may connect once its sleep has run out"
    ) in [r.getMessage() for r in caplog.records]
    woken = h.device(("10.0.0.2", 2000))  # the device itself, from a new source port
    woken.wake("victim-1")
    got = woken.expect(Publish)
    assert (got.data, got.topic_id) == (b"secret", tid)
    woken.ack(got)
    assert woken.expect(PingResp) == PingResp()
    mqtt.publish("to/victim", b"second", qos=1)
    rebooted = h.device(("10.0.0.2", 3000))  # a CONNECT from its own address wakes it
    assert rebooted.connect("victim-1", clean=False) == ConnAck(ReturnCode.ACCEPTED)
    assert rebooted.expect(Publish).data == b"second"
    for thief in thieves:
        thief.nothing()
    assert mqtt_messages(w) == []  # no will: the device was never lost


def test_a_device_that_moved_while_asleep_connects_from_its_new_address_after_its_sleep() -> None:
    """MQTT-SN cannot tell a device with a new DHCP lease from a host naming it: its
    CONNECT from the new address waits (0x01 congestion) until its sleep has run out;
    then the sleeper is lost (its will published) and the CONNECT resumes the session
    of clean session 0 with the QoS 1 message it kept."""
    h = SnHarness()
    w = watcher(h, "status/#")
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device(("10.0.0.2", 1000))
    dev.connect("roamer", clean=False, will=("status/roamer", b"gone", 0, False))
    dev.subscribe("to/roamer", qos=1)
    dev.sleep(600)
    mqtt.publish("to/roamer", b"kept", qos=1)
    renewed = h.device(("10.0.0.9", 1000))  # a new DHCP lease
    renewed.wake("roamer")
    assert renewed.take() == [Disconnect()]  # connect again, says the gateway
    assert renewed.connect("roamer", clean=False) == ConnAck(ReturnCode.CONGESTION)
    h.advance(600 * 1.5 - 1)
    assert renewed.connect("roamer", clean=False) == ConnAck(ReturnCode.CONGESTION)
    h.advance(1)  # its sleep duration x keepalive_grace: lost
    assert mqtt_messages(w) == [("status/roamer", b"gone", 0, False)]
    assert renewed.connect("roamer", clean=False) == ConnAck(ReturnCode.ACCEPTED)
    assert renewed.expect(Publish).data == b"kept"
    assert h.gateway.stats.wakes_refused == 3


def test_unproven_clients_hold_a_share_and_the_oldest_past_its_grace_makes_room() -> None:
    """A CONNECT nobody follows up (a spoofed source, an abandoned device) leaves an
    unproven client: such clients hold at most unproven_share of the pool; past
    unproven_grace the oldest makes room for a newcomer, without its will; a client
    heard from after its CONNACK is proven and stays."""
    h = SnHarness(max_clients=20, unproven_share=0.25, unproven_grace=10)
    w = watcher(h, "status/#")
    steady = h.device(("10.0.0.2", 1))
    steady.connect("steady")
    steady.ping()
    for i in range(5):  # 5 = 25 % of 20
        ghost = h.device((f"10.0.1.{i}", 1))
        ghost.connect(f"ghost{i}", will=("status/ghost", b"gone", 0, False))
        h.advance(1)
    # Within the grace, a sixth is let in beyond the share (a burst of real devices).
    assert h.device(("10.0.2.1", 1)).connect("early").return_code == ReturnCode.ACCEPTED
    assert len(h.gateway.unproven) == 6 and h.gateway.stats.clients_evicted_unproven == 0
    h.advance(10)
    first = h.device(("10.0.1.0", 1))
    first.take()
    newcomer = h.device(("10.0.3.1", 1))
    assert newcomer.connect("newcomer").return_code == ReturnCode.ACCEPTED
    # Back to the share: the two oldest ghosts (past their grace) made room.
    assert h.gateway.stats.clients_evicted_unproven == 2
    assert first.take() == [Disconnect()]
    assert {"ghost0", "ghost1"}.isdisjoint(h.gateway.by_id)
    assert mqtt_messages(w) == []  # an unproven client's will is not published
    newcomer.ping()
    assert "newcomer" not in h.gateway.unproven and "steady" in h.gateway.by_id
    values = h.gateway.sys_values()
    assert values["mqttsn/clients/unproven"] == str(len(h.gateway.unproven)) == "4"
    assert values["mqttsn/clients/evicted unproven"] == "2"


def test_an_evicted_unproven_session_keeps_no_will_a_spoofed_connect_set() -> None:
    """A persistent session taken over by a CONNECT that was never followed up keeps
    its subscriptions when that client is evicted, but not the will the CONNECT set:
    the device reconnecting without one must not have it published later."""
    h = SnHarness(max_clients=10, unproven_share=0.1, unproven_grace=0)
    w = watcher(h, "status/#")
    spoofed = h.device(("10.0.0.66", 1))
    spoofed.connect("dev", clean=False, will=("status/dev", b"forged", 0, False))
    h.advance(1)
    assert h.device(("10.0.0.3", 1)).connect("other").return_code == ReturnCode.ACCEPTED
    assert spoofed.take() == [Disconnect()]
    assert h.gateway.by_id["dev"].state.name == "DISCONNECTED"  # the session is kept
    real = h.device(("10.0.0.4", 1))
    assert real.connect("dev", clean=False, duration=10).return_code == ReturnCode.ACCEPTED
    real.ping()
    h.advance(16)  # keep-alive x 1.5 without a word: lost, and it has no will
    assert h.gateway.stats.clients_lost == 1
    assert mqtt_messages(w) == []


def test_an_eight_address_flood_with_the_longest_keep_alive_leaves_a_new_device_served() -> None:
    """The attack from the field: 128 CONNECTs with a keep-alive of 65535 s from each of
    8 addresses fill all 1,024 slots and send nothing more. Established devices stay,
    and a new device takes the slot of the oldest unproven client."""
    h = SnHarness(max_connect_rate=1e6, max_connect_rate_per_address=1e6)
    devices = []
    for i in range(10):
        dev = h.device(("10.0.0.2", i))
        dev.connect(f"dev{i}", duration=60)
        dev.ping()
        devices.append(dev)
    for i in range(1014):
        flood = h.device((f"10.9.0.{i % 8}", 10_000 + i))
        assert flood.connect(f"flood{i}", duration=65535).return_code == ReturnCode.ACCEPTED
    assert len(h.gateway.by_id) == 1024
    newcomer = h.device(("10.0.0.99", 1))
    assert newcomer.connect("newcomer").return_code == ReturnCode.ACCEPTED
    newcomer.ping()
    assert h.gateway.stats.clients_evicted_unproven == 1
    h.advance(30)  # the flood's grace is over; the next CONNECT trims it to its share
    for dev in devices:
        dev.ping()
    late = h.device(("10.0.0.100", 1))
    assert late.connect("late").return_code == ReturnCode.ACCEPTED
    assert len(h.gateway.unproven) == h.settings.max_unproven == 256
    assert {f"dev{i}" for i in range(10)} | {"newcomer"} <= set(h.gateway.by_id)


def test_connects_beyond_the_rates_are_refused_per_address_and_in_all() -> None:
    h = SnHarness(max_connect_rate=50, max_connect_rate_per_address=5)
    # A burst of two seconds' worth from one address, then congestion.
    replies = [h.device(("10.0.0.2", i)).connect(f"a{i}").return_code for i in range(11)]
    assert replies == [ReturnCode.ACCEPTED] * 10 + [ReturnCode.CONGESTION]
    # Another address is not held back by that one.
    assert h.device(("10.0.0.3", 1)).connect("b").return_code == ReturnCode.ACCEPTED
    h.advance(0.2)  # one more token for 10.0.0.2
    assert h.device(("10.0.0.2", 99)).connect("a99").return_code == ReturnCode.ACCEPTED
    # All sources together: two seconds of 50 (100), less the 12 taken above, plus the
    # 10 that came back in 0.2 s: 98, then congestion.
    got = [h.device((f"10.1.0.{i}", 1)).connect(f"c{i}").return_code for i in range(100)]
    assert got == [ReturnCode.ACCEPTED] * 98 + [ReturnCode.CONGESTION] * 2
    assert h.gateway.stats.clients_refused_rate == 1 + 2
    # A serial line is one wired coordinator: no per-address rate, the global one.
    h.advance(10)
    uart = [
        h.device("uart0", transport="serial", node_id=bytes((n,))).connect(f"s{n}").return_code
        for n in range(20)
    ]
    assert uart == [ReturnCode.ACCEPTED] * 20


def test_refusals_are_logged_once_per_address_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    """135 refused CONNECTs from one address write one line, not 135; the next line,
    a minute later, says how many were left out."""
    h = SnHarness(max_clients=1, max_connect_rate_per_address=1e6)
    keeper = h.device(("10.0.0.2", 1))
    keeper.connect("keeper")
    keeper.ping()
    for i in range(135):
        assert h.device(("10.0.0.66", i)).connect(f"x{i}").return_code == ReturnCode.CONGESTION
    lines = [r.getMessage() for r in caplog.records if "refusing CONNECT" in r.getMessage()]
    assert len(lines) == 1 and "'x0'" in lines[0]
    h.advance(60)
    keeper.ping()
    h.device(("10.0.0.66", 999)).connect("x999")
    lines = [r.getMessage() for r in caplog.records if "refusing CONNECT" in r.getMessage()]
    assert len(lines) == 2
    assert "134 more from 10.0.0.66 in the last 60 s not logged" in lines[1]
    assert h.gateway.stats.clients_refused == 136


def test_a_will_refused_at_connack_gives_back_its_place_among_the_connecting() -> None:
    """A CONNECT whose Will is refused at the end of the prompts ends its CONNECT
    once: ``max_connecting`` holds for the CONNECTs that follow, however many were
    refused before."""
    h = SnHarness(max_connecting=2, connect_timeout=5)
    for i in range(5):
        refused = h.device(("10.0.0.3", i)).connect(f"r{i}", will=("$SYS/x", b"", 0, False))
        assert refused.return_code == ReturnCode.NOT_SUPPORTED
    assert h.gateway.connecting == 0
    for i in range(2):
        h.device(("10.0.0.4", i)).send(Connect(f"w{i}", 60, will=True))
    third = h.device(("10.0.0.4", 9))
    third.send(Connect("w9", 60, will=True))
    assert third.expect(ConnAck) == ConnAck(ReturnCode.CONGESTION)


def test_malformed_datagrams_are_counted_and_the_client_keeps_working() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect()
    for bad in (b"", b"\x00", b"\x05\x0c\x00", b"\x03\x11\x00", b"\x02\x0c", b"\x04\x16ab\xff"):
        dev.send_raw(bad)
    assert h.gateway.stats.malformed == 6
    dev.send(PingReq())
    assert dev.expect(PingResp) == PingResp()


def test_acl_denied_publish_is_not_supported_and_counted() -> None:
    acl = parse_acl_file("pattern write devices/%c/#\npattern read devices/%c/#\n")
    h = SnHarness(acl=acl)
    w = watcher(h)
    dev = h.device()
    dev.connect("d1")
    ok = dev.register("devices/d1/t").topic_id
    no = dev.register("other/t").topic_id
    dev.publish(ok, b"1", qos=1)
    assert dev.expect(PubAck).return_code == ReturnCode.ACCEPTED
    dev.publish(no, b"2", qos=1)
    assert dev.expect(PubAck).return_code == ReturnCode.NOT_SUPPORTED
    assert dev.subscribe("other/#").return_code == ReturnCode.NOT_SUPPORTED
    assert [m[0] for m in mqtt_messages(w)] == ["devices/d1/t"]
    assert h.broker.stats.publish_denied == 1


def test_a_message_the_broker_has_no_room_for_is_rejected_congestion() -> None:
    """A bridge outbox full with policy "refuse" (a publish gate) or a full store."""
    h = SnHarness()
    h.broker.publish_gates.append(lambda topic, size: "bridge outbox full")
    dev = h.device()
    dev.connect()
    tid = dev.register("up/x").topic_id
    pid = dev.publish(tid, b"1", qos=1)
    assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.CONGESTION)
    dev.publish(tid, b"2", qos=0)  # QoS 0 is not gated
    dev.nothing()


def test_publish_under_sys_is_refused() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect()
    tid = dev.register("$SYS/fake").topic_id
    dev.publish(tid, b"1", qos=1)
    assert dev.expect(PubAck).return_code == ReturnCode.NOT_SUPPORTED


@pytest.mark.parametrize("qos", [0, 1])
def test_publish_to_share_is_refused_as_for_mqtt_clients(qos: int) -> None:
    """ "$share/..." names shared subscriptions, never a topic: refused (invalid topic),
    routed to no one, counted as denied, as a PUBLISH from an MQTT client is."""
    h = SnHarness()
    w = watcher(h, "$share/g/x")
    dev = h.device()
    dev.connect()
    tid = dev.register("$share/g/x").topic_id
    dev.publish(tid, b"1", qos=qos)
    if qos:
        assert dev.expect(PubAck).return_code == ReturnCode.INVALID_TOPIC_ID
    assert mqtt_messages(w) == []
    assert h.broker.stats.publish_denied == 1


def test_a_puback_that_needs_the_store_waits_for_its_commit() -> None:
    """Acknowledged means durable: a retained QoS 1 message is stored first."""
    from gateway.broker.journal import Journal

    h = SnHarness()
    h.broker.journal = Journal()
    dev = h.device()
    dev.connect()
    tid = dev.register("state/x").topic_id
    pid = dev.publish(tid, b"kept", qos=1, retain=True)
    dev.send(PingReq())  # later output to the same device waits behind the PUBACK
    dev.nothing()
    batch = h.broker.seal_batch()
    assert batch is not None and batch[1]  # the retained message, for the store
    h.gateway.committed(batch[0])
    assert dev.take() == [PubAck(tid, pid, ReturnCode.ACCEPTED), PingResp()]


# ---------------------------------------------------------------------- forwarders (5.5)


def test_nodes_behind_one_forwarder_are_separate_clients_answered_encapsulated() -> None:
    h = SnHarness()
    w = watcher(h)
    radio = ("serial0", None)
    n1 = h.device(radio, transport="uart", node_id=b"\x00\x01")
    n2 = h.device(radio, transport="uart", node_id=b"\x00\x02")
    assert n1.connect("node1").return_code == ReturnCode.ACCEPTED
    assert n2.connect("node2").return_code == ReturnCode.ACCEPTED
    t1 = n1.register("n/1").topic_id
    t2 = n2.register("n/2").topic_id
    n1.publish(t1, b"a", qos=1)
    n2.publish(t2, b"b", qos=1)
    assert n1.expect(PubAck).return_code == 0 and n2.expect(PubAck).return_code == 0
    assert {m[0] for m in mqtt_messages(w)} == {"n/1", "n/2"}
    assert {c.client_id for c in h.gateway.by_id.values()} == {"node1", "node2"}
