"""The client's Maximum Packet Size at its exact boundary, on every path that sends
(``output.fits``, MQTT-3.1.2-24, -25): a forwarded QoS 0 frame, an encoded QoS 1
PUBLISH, a DISCONNECT's problem details, the CONNACK."""

from __future__ import annotations

import pytest

from gateway.mqtt import MQTT_5, ConnAck, Properties, Publish, encode
from gateway.mqtt.packets import Disconnect
from gateway.mqtt.reason_codes import ReasonCode

from .support.harness import Harness

LIMIT = 64


def _payload_for(size: int, qos: int) -> bytes:
    """A payload whose PUBLISH on topic ``t`` (MQTT 5.0, no properties) is ``size`` bytes."""
    n = size - len(encode(Publish("t", b"", qos, packet_id=qos), MQTT_5))
    payload = b"." * n
    assert len(encode(Publish("t", payload, qos, packet_id=qos), MQTT_5)) == size
    return payload


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize(("size", "sent"), [(LIMIT, True), (LIMIT + 1, False)])
def test_a_publish_at_the_limit_goes_one_byte_more_is_dropped(
    qos: int, size: int, sent: bool
) -> None:
    """QoS 0 from a plain PUBLISH is forwarded byte for byte (the raw path), QoS 1 is
    encoded for the subscriber: the same boundary for both."""
    h = Harness()
    sub = h.client()
    sub.connect("small", maximum_packet_size=LIMIT)
    sub.subscribe("t", qos)
    pub = h.client()
    pub.connect("pub")
    payload = _payload_for(size, qos)
    pub.publish("t", payload, qos)
    got = sub.publishes()
    assert [p.payload for p in got] == ([payload] if sent else [])
    assert h.broker.stats.dropped_too_large == (0 if sent else 1)


@pytest.mark.parametrize(("slack", "with_reason"), [(0, True), (-1, False)])
def test_a_disconnect_keeps_its_reason_string_only_if_it_fits(
    slack: int, with_reason: bool
) -> None:
    why = "CONNACK, SUBACK, UNSUBACK and PINGRESP are sent by servers only"
    full = Disconnect(ReasonCode.PROTOCOL_ERROR, Properties(reason_string=why))
    h = Harness()
    c = h.client()
    c.connect("c", maximum_packet_size=len(encode(full, MQTT_5)) + slack)
    c.send(ConnAck(False, 0))  # servers only: a protocol error
    [disconnect] = c.take()
    assert isinstance(disconnect, Disconnect)
    assert disconnect.reason_code == ReasonCode.PROTOCOL_ERROR
    assert disconnect.properties.reason_string == (why if with_reason else None)


@pytest.mark.parametrize(("slack", "accepted"), [(0, True), (-1, False)])
def test_a_connack_that_would_not_fit_refuses_the_connect(slack: int, accepted: bool) -> None:
    probe = Harness()
    props = probe.client().connect("c", maximum_packet_size=1 << 20).properties
    size = len(encode(ConnAck(True, 0, props), MQTT_5))
    h = Harness()
    ack = h.client().connect("c", maximum_packet_size=size + slack)
    if accepted:
        assert ack.reason_code == 0
    else:
        assert ack.reason_code == ReasonCode.PACKET_TOO_LARGE
        assert "c" not in h.broker.sessions
