"""A refused PUBLISH counts the same whoever sent it: an MQTT client's and an MQTT-SN
device's (through ``broker.proxy``) each add one to ``publish/messages/received`` and
one to ``publish/messages/denied``, for every kind of refusal the broker makes.
"""

from __future__ import annotations

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.mqtt import MQTT_5, PubAck, Publish
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqttsn.packets import PubAck as SnPubAck
from gateway.mqttsn.packets import ReturnCode
from tests.support.mqttsn import SnHarness

ACL = "pattern readwrite open/%c/#\n"

#: What the broker refuses, and the topic that makes it refuse.
REFUSALS = {
    "sys": "$SYS/broker/uptime",
    "share": "$share/group/t",
    "acl": "closed/t",
    "gate": "open/{cid}/gated",
}


def harness(kind: str) -> SnHarness:
    acl = parse_acl_file(ACL) if kind == "acl" else None
    h = SnHarness(acl=acl)
    h.broker.acl = acl
    if kind == "gate":
        h.broker.publish_gates.append(lambda topic, size: "bridge outbox full")
    return h


def counts(h: SnHarness) -> tuple[int, int]:
    stats = h.broker.stats
    return stats.publish_received, stats.publish_denied


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_a_refused_publish_counts_the_same_from_an_mqtt_client_and_a_device(kind: str) -> None:
    h = harness(kind)
    client = h.client(MQTT_5)
    client.connect("mqtt1")
    before = counts(h)
    client.send(Publish(REFUSALS[kind].format(cid="mqtt1"), b"no", 1, packet_id=7))
    ack = client.expect(PubAck)
    assert ack.reason_code >= 0x80 and ack.reason_code != ReasonCode.NO_MATCHING_SUBSCRIBERS
    mqtt_delta = tuple(a - b for a, b in zip(counts(h), before, strict=True))

    dev = h.device()
    assert dev.connect("sn1").return_code == ReturnCode.ACCEPTED
    topic_id = dev.register(REFUSALS[kind].format(cid="sn1")).topic_id
    before = counts(h)
    msg_id = dev.publish(topic_id, b"no", qos=1)
    sn_ack = dev.expect(SnPubAck)
    assert (sn_ack.msg_id, sn_ack.return_code != ReturnCode.ACCEPTED) == (msg_id, True)
    sn_delta = tuple(a - b for a, b in zip(counts(h), before, strict=True))

    assert mqtt_delta == (1, 1)
    assert sn_delta == mqtt_delta


def test_an_accepted_device_publish_is_counted_once() -> None:
    """The count of a refusal is not paid twice by a message that passes."""
    h = harness("none")
    dev = h.device()
    dev.connect("sn1")
    topic_id = dev.register("open/sn1/t").topic_id
    before = counts(h)
    dev.publish(topic_id, b"yes", qos=1)
    assert dev.expect(SnPubAck).return_code == ReturnCode.ACCEPTED
    assert tuple(a - b for a, b in zip(counts(h), before, strict=True)) == (1, 0)
