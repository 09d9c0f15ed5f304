"""The rows of the flow towards a device (``gateway.mqttsn.qos.SENDER``) that no other
test walks, the answers that have no row, and the gateway's one error path.

On the real broker core and a fake clock, every message through the real codec
(``tests.support.mqttsn``). Section numbers are those of the MQTT-SN 1.2
specification.
"""

from __future__ import annotations

import pytest

from gateway.mqtt import MQTT_311
from gateway.mqttsn.packets import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    ReturnCode,
    WillMsg,
    WillMsgReq,
    WillTopic,
    WillTopicReq,
)
from tests.support.harness import FakeClient
from tests.support.mqttsn import SnDevice, SnHarness


def qos2_subscriber(h: SnHarness, topic: str = "cmd/#") -> tuple[FakeClient, SnDevice]:
    """An MQTT publisher and a device subscribed to ``topic`` at QoS 2."""
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    dev.subscribe(topic, qos=2)
    return mqtt, dev


def registered_publish(dev: SnDevice) -> Publish:
    """REGISTER answered, the PUBLISH that follows it."""
    reg = dev.expect(Register)
    dev.send(RegAck(reg.topic_id, reg.msg_id))
    pub = dev.expect(Publish)
    assert pub.topic_id == reg.topic_id
    return pub


# ---------------------------------------------------------------------- PUBACK for QoS 2


def test_a_qos2_delivery_acknowledged_with_puback_is_done() -> None:
    """5.4.13: a PUBACK can answer a PUBLISH of QoS 1 or 2; accepted, the QoS 2 flow
    ends there (no PUBREL, no resend) and the next message goes out."""
    h = SnHarness(retry_interval=5)
    mqtt, dev = qos2_subscriber(h)
    mqtt.publish("cmd/a", b"1", qos=2)
    mqtt.publish("cmd/a", b"2", qos=2)
    first = registered_publish(dev)
    assert (first.qos, first.data) == (2, b"1")
    dev.send(PubAck(first.topic_id, first.msg_id))
    second = dev.expect(Publish)
    assert (second.data, second.dup) == (b"2", False)
    assert h.gateway.stats.publish_refused == 0


def test_a_qos2_delivery_refused_with_puback_is_dropped_and_counted() -> None:
    """A PUBACK "rejected: congestion" for a QoS 2 PUBLISH: received and refused, so
    it is counted, not resent, and the next message goes out."""
    h = SnHarness(retry_interval=5)
    mqtt, dev = qos2_subscriber(h)
    mqtt.publish("cmd/a", b"1", qos=2)
    mqtt.publish("cmd/a", b"2", qos=2)
    first = registered_publish(dev)
    dev.send(PubAck(first.topic_id, first.msg_id, ReturnCode.CONGESTION))
    second = dev.expect(Publish)
    assert (second.data, second.dup) == (b"2", False)
    dev.send(PubRec(second.msg_id))
    assert dev.expect(PubRel) == PubRel(second.msg_id)
    dev.send(PubComp(second.msg_id))
    h.advance(60)
    dev.nothing()
    assert h.gateway.stats.publish_refused == 1
    assert h.gateway.stats.retransmissions == 0


def test_a_qos2_delivery_answered_invalid_topic_id_is_registered_again_and_resent() -> None:
    """The device lost its registration (it restarted): REGISTER again, then the same
    message as QoS 2 with the new id."""
    h = SnHarness(retry_interval=5)
    mqtt, dev = qos2_subscriber(h)
    mqtt.publish("cmd/a", b"v", qos=2)
    first = registered_publish(dev)
    dev.send(PubAck(first.topic_id, first.msg_id, ReturnCode.INVALID_TOPIC_ID))
    again = registered_publish(dev)
    assert (again.data, again.qos) == (b"v", 2)
    assert h.gateway.stats.publish_refused == 0


# ---------------------------------------------------------------------- PUBREC repeated


def test_a_repeated_pubrec_is_answered_with_pubrel_again_and_restarts_the_retries() -> None:
    """Waiting for PUBCOMP, a PUBREC again (our PUBREL was lost): PUBREL again, and the
    count of resends starts over, so the device is not lost for it."""
    h = SnHarness(retry_interval=5, max_retries=1)
    mqtt, dev = qos2_subscriber(h)
    mqtt.publish("cmd/a", b"v", qos=2)
    pub = registered_publish(dev)
    dev.send(PubRec(pub.msg_id))
    assert dev.expect(PubRel) == PubRel(pub.msg_id)
    h.advance(5)  # the one resend max_retries allows
    assert dev.expect(PubRel) == PubRel(pub.msg_id)
    dev.send(PubRec(pub.msg_id))
    assert dev.expect(PubRel) == PubRel(pub.msg_id)
    h.advance(5)  # counted from zero again: one more resend, not lost
    assert dev.expect(PubRel) == PubRel(pub.msg_id)
    assert h.gateway.stats.clients_lost == 0
    dev.send(PubComp(pub.msg_id))
    h.advance(60)
    dev.nothing()
    assert h.gateway.by_id["dev1"].inflight is None


# ---------------------------------------------------------------------- answers with no row


@pytest.mark.parametrize(
    "answer",
    ["pubrec", "pubcomp", "regack", "puback of another id"],
)
def test_an_answer_for_no_step_in_flight_is_ignored(answer: str) -> None:
    """A QoS 1 PUBLISH in flight: a PUBREC, a PUBCOMP or a REGACK for it, or a PUBACK
    for another message id, moves nothing -- the PUBLISH is still resent."""
    h = SnHarness(retry_interval=5)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    tid = dev.subscribe("inbox", qos=1).topic_id
    mqtt.publish("inbox", b"m", qos=1)
    pub = dev.expect(Publish)
    if answer == "pubrec":
        dev.send(PubRec(pub.msg_id))
    elif answer == "pubcomp":
        dev.send(PubComp(pub.msg_id))
    elif answer == "regack":
        dev.send(RegAck(tid, pub.msg_id))
    else:
        dev.send(PubAck(tid, pub.msg_id + 1))
    dev.nothing()
    h.advance(5)
    again = dev.expect(Publish)
    assert (again.msg_id, again.dup) == (pub.msg_id, True)
    dev.ack(again)
    h.advance(60)
    dev.nothing()


# ---------------------------------------------------------------------- the error path


def test_a_message_without_a_connection_is_answered_disconnect_and_counted() -> None:
    h = SnHarness()
    dev = h.device()
    dev.send(PubRel(7))
    assert dev.expect(Disconnect) == Disconnect()
    dev.send(PingReq("dev1"))
    assert dev.expect(Disconnect) == Disconnect()
    assert h.gateway.stats.not_connected == 2


@pytest.mark.parametrize("when", ["at its WILLTOPIC", "at its CONNACK"])
def test_a_connect_refused_for_its_will_leaves_nothing_behind(when: str) -> None:
    """The refusal ends that client's connection attempt: CONNACK "not supported", and
    no client, no broker session, nothing at its address; it is counted once. A will
    topic that is no topic name is refused at once; one the device may not write
    (under ``$SYS``) when its CONNACK is due."""
    h = SnHarness()
    dev = h.device()
    dev.send(Connect("d1", 60, True, True))
    dev.expect(WillTopicReq)
    if when == "at its WILLTOPIC":
        dev.send(WillTopic("bad/+/will", 0, False))
    else:
        dev.send(WillTopic("$SYS/broker/uptime", 0, False))
        dev.expect(WillMsgReq)
        dev.send(WillMsg(b"gone"))
    assert dev.expect(ConnAck) == ConnAck(ReturnCode.NOT_SUPPORTED)
    dev.nothing()
    gw = h.gateway
    assert "d1" not in gw.by_id
    assert gw.by_key == {}
    assert "d1" not in h.broker.sessions
    assert gw.stats.clients_refused == 1
    dev.send(PingReq())
    assert dev.expect(Disconnect) == Disconnect()
    assert dev.connect("d1").return_code == ReturnCode.ACCEPTED
