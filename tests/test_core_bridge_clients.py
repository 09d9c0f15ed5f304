"""A client that connects as a bridge: the protocol level's top bit (0x83, 0x84).

Mosquitto's bridges set it by default (``try_private true``) to ask to be served as a
bridge. Ledge serves them as Mosquitto does: the bridge's MQTT 3.1/3.1.1 subscriptions
get No Local (what it publishes does not come back to it, so a ``both`` topic does
not loop) and Retain As Published (a retained message crosses as retained). Without
the bit the same client is an ordinary one. The pure core on a fake clock; over
sockets with Debian's Mosquitto in ``test_mosquitto_bridge_in``.
"""

from __future__ import annotations

import pytest

from gateway.mqtt import MQTT_31, MQTT_311, ConnAck, Connect, PubAck, Publish
from tests.support.harness import FakeClient, Harness


def connect(h: Harness, client_id: str, *, bridge: bool, version: int = MQTT_311) -> FakeClient:
    c = h.client(version)
    name = "MQIsdp" if version == MQTT_31 else "MQTT"
    c.send(Connect(client_id, version, protocol_name=name, bridge=bridge))
    ack = c.expect(ConnAck)
    assert ack.reason_code == 0, ack
    return c


def publishes(c: FakeClient) -> list[tuple[str, bytes, bool]]:
    out = []
    for p in c.take():
        if isinstance(p, PubAck):
            continue
        assert isinstance(p, Publish), p
        out.append((p.topic, p.payload, p.retain))
        if p.qos:
            c.ack(p)
    return out


@pytest.mark.parametrize("version", [MQTT_311, MQTT_31], ids=["v311", "v31"])
@pytest.mark.parametrize("bridge", [True, False], ids=["bridge", "client"])
def test_a_bridge_does_not_get_its_own_messages_back(version: int, bridge: bool) -> None:
    h = Harness()
    b = connect(h, "bridge1", bridge=bridge, version=version)
    b.subscribe("both/#", 1)
    other = connect(h, "other", bridge=False)
    b.send(Publish("both/mine", b"1", 1, packet_id=b.pid()))
    other.send(Publish("both/theirs", b"2", 1, packet_id=other.pid()))
    expected = [("both/theirs", b"2", False)]
    if not bridge:
        expected.insert(0, ("both/mine", b"1", False))
    assert publishes(b) == expected


@pytest.mark.parametrize("bridge", [True, False], ids=["bridge", "client"])
def test_a_retained_message_reaches_a_bridge_as_retained(bridge: bool) -> None:
    """MQTT-3.3.1-12: without Retain As Published a live message loses its flag."""
    h = Harness()
    b = connect(h, "bridge1", bridge=bridge)
    b.subscribe("status/#", 1)
    other = connect(h, "other", bridge=False)
    other.send(Publish("status/gw", b"online", 1, True, packet_id=other.pid()))
    assert publishes(b) == [("status/gw", b"online", bridge)]
