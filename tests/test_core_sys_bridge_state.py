"""``$SYS`` is the broker's, but for one topic per client: a bridge's state.

A Mosquitto bridge (``notifications true``, its default) publishes ``1`` retained on
``$SYS/broker/connection/<its client id>/state`` when it connects and sets its will
there to ``0``. A client may write that topic -- PUBLISH and will -- under its own
client id only; every other ``$SYS`` topic stays refused: MQTT 5.0 PUBACK 0x87 or
CONNACK 0x87, MQTT 3.1.1 a PUBACK and nothing routed or CONNACK 5. The pure core on a
fake clock, MQTT clients and MQTT-SN devices (``broker.proxy``) alike; over sockets
with the real Mosquitto in ``test_mosquitto_bridge_in``.
"""

from __future__ import annotations

import logging

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.broker.publish_policy import sys_write_refused
from gateway.mqtt import MQTT_5, MQTT_311, PubAck, Publish, Will
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqttsn.packets import PubAck as SnPubAck
from gateway.mqttsn.packets import ReturnCode
from tests.support.harness import FakeClient, Harness
from tests.support.mqttsn import SnHarness


def state(client_id: str) -> str:
    return f"$SYS/broker/connection/{client_id}/state"


def watcher(h: Harness) -> FakeClient:
    w = h.client(MQTT_311)
    w.connect("watcher")
    w.subscribe("$SYS/broker/connection/#", 1)
    return w


def received(w: FakeClient) -> list[tuple[str, bytes, bool]]:
    out = []
    for p in w.take():
        assert isinstance(p, Publish), p
        out.append((p.topic, p.payload, p.retain))
        if p.qos:
            w.ack(p)
    return out


@pytest.mark.parametrize(
    ("topic", "client_id", "refused"),
    [
        (state("bridge1"), "bridge1", False),
        (state("vm.toledge"), "vm.toledge", False),
        (state("other"), "bridge1", True),
        (state("bridge1") + "/x", "bridge1", True),
        ("$SYS/broker/connection/bridge1", "bridge1", True),
        ("$SYS/broker/connection/bridge1/status", "bridge1", True),
        ("$SYS/broker/uptime", "bridge1", True),
        ("$SYSTEM/broker/connection/bridge1/state", "bridge1", True),
        (state("a/b"), "a/b", True),  # not one level: Mosquitto's "+" would not match
        ("sensors/t", "bridge1", False),
    ],
)
def test_which_topics_a_client_may_write(topic: str, client_id: str, refused: bool) -> None:
    assert sys_write_refused(topic, client_id) is refused


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311], ids=["v5", "v311"])
def test_a_client_publishes_its_own_state_retained(version: int) -> None:
    h = Harness()
    w = watcher(h)
    bridge = h.client(version)
    bridge.connect("bridge1")
    bridge.send(Publish(state("bridge1"), b"1", 1, True, packet_id=1))
    assert bridge.expect(PubAck) == PubAck(1, ReasonCode.SUCCESS)
    assert received(w) == [(state("bridge1"), b"1", False)]
    late = h.client(MQTT_311)
    late.connect("late")
    late.subscribe("$SYS/broker/connection/+/state", 1)
    assert received(late) == [(state("bridge1"), b"1", True)]
    assert h.broker.stats.publish_denied == 0


@pytest.mark.parametrize(
    ("version", "code"), [(MQTT_5, ReasonCode.NOT_AUTHORIZED), (MQTT_311, 0)], ids=["v5", "v311"]
)
@pytest.mark.parametrize(
    "topic", [state("other"), "$SYS/broker/uptime", "$SYS/broker/connection/bridge1"]
)
def test_any_other_sys_topic_is_refused(version: int, code: int, topic: str) -> None:
    h = Harness()
    w = watcher(h)
    w.subscribe("$SYS/broker/uptime", 1)
    bridge = h.client(version)
    bridge.connect("bridge1")
    bridge.send(Publish(topic, b"1", 1, True, packet_id=1))
    assert bridge.expect(PubAck) == PubAck(1, code)
    assert not bridge.closed
    assert received(w) == []
    assert h.broker.stats.publish_denied == 1


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311], ids=["v5", "v311"])
def test_a_will_on_its_own_state_is_accepted_and_published_when_the_link_is_lost(
    version: int,
) -> None:
    h = Harness()
    w = watcher(h)
    bridge = h.client(version)
    ack = bridge.connect("bridge1", will=Will(state("bridge1"), b"0", 1, True))
    assert ack.reason_code == ReasonCode.SUCCESS
    bridge.drop()
    assert received(w) == [(state("bridge1"), b"0", False)]
    late = h.client(MQTT_311)
    late.connect("late")
    late.subscribe(state("bridge1"), 1)
    assert received(late) == [(state("bridge1"), b"0", True)]


@pytest.mark.parametrize(
    ("version", "code"),
    [(MQTT_5, ReasonCode.NOT_AUTHORIZED), (MQTT_311, 5)],
    ids=["v5", "v311"],
)
@pytest.mark.parametrize("topic", [state("other"), "$SYS/broker/uptime"])
def test_a_will_on_any_other_sys_topic_refuses_the_connect(
    version: int, code: int, topic: str
) -> None:
    h = Harness()
    c = h.client(version)
    ack = c.connect("bridge1", will=Will(topic, b"0", 1, True))
    assert ack.reason_code == code
    assert c.closed


def test_the_acl_still_decides_for_the_own_state_topic() -> None:
    """As in Mosquitto: the exception lifts the ``$SYS`` rule, not the ACL. Its
    example ACL's line ``pattern write $SYS/broker/connection/%c/state`` grants it."""
    h = Harness()
    h.broker.acl = parse_acl_file("topic readwrite sensors/#\n")
    bridge = h.client(MQTT_5)
    ack = bridge.connect("bridge1", will=Will(state("bridge1"), b"0", 1, True))
    assert ack.reason_code == ReasonCode.NOT_AUTHORIZED
    h.broker.acl = parse_acl_file(
        "topic readwrite sensors/#\npattern write $SYS/broker/connection/%c/state\n"
    )
    bridge = h.client(MQTT_5)
    ack = bridge.connect("bridge1", will=Will(state("bridge1"), b"0", 1, True))
    assert ack.reason_code == ReasonCode.SUCCESS
    bridge.send(Publish(state("bridge1"), b"1", 1, True, packet_id=1))
    assert bridge.expect(PubAck).reason_code < 0x80
    bridge.send(Publish(state("bridge2"), b"1", 1, True, packet_id=2))
    assert bridge.expect(PubAck).reason_code == ReasonCode.NOT_AUTHORIZED


# ------------------------------------------------------------------ MQTT-SN devices


def test_a_device_may_publish_its_own_state_and_nothing_else_under_sys() -> None:
    """``broker.proxy`` applies the same rule to the firmware bridge's devices."""
    h = SnHarness()
    w = watcher(h)
    dev = h.device()
    dev.connect("dev1")
    own = dev.register(state("dev1")).topic_id
    other = dev.register(state("dev2")).topic_id
    msg_id = dev.publish(own, b"1", qos=1, retain=True)
    assert dev.expect(SnPubAck) == SnPubAck(own, msg_id, ReturnCode.ACCEPTED)
    msg_id = dev.publish(other, b"1", qos=1, retain=True)
    assert dev.expect(SnPubAck) == SnPubAck(other, msg_id, ReturnCode.NOT_SUPPORTED)
    assert received(w) == [(state("dev1"), b"1", False)]


def test_a_device_will_is_published_on_its_own_state_only() -> None:
    """``ProxyClient.publish_will``, as the firmware bridge calls it when a device is
    lost (the gateway's own CONNECT check decides which wills it takes)."""
    h = SnHarness()
    w = watcher(h)
    dev = h.device()
    dev.connect("dev1")
    client = h.gateway.by_id["dev1"]
    assert client.proxy is not None
    client.proxy.publish_will(state("dev2"), b"0", 1, True, h.now)
    assert received(w) == []
    assert h.broker.stats.publish_denied == 1
    client.proxy.publish_will(state("dev1"), b"0", 1, True, h.now)
    assert received(w) == [(state("dev1"), b"0", False)]


def test_a_client_repeating_a_refused_sys_publish_costs_one_log_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every refusal is counted; its log line goes through the refusal limiter."""
    h = Harness()
    c = h.client(MQTT_5)
    c.connect("noisy")
    caplog.set_level(logging.INFO, logger="ledge.broker")
    for _ in range(50):
        c.send(Publish("$SYS/broker/uptime", b"x", 0))
    h.advance(61)
    c.send(Publish("$SYS/broker/uptime", b"x", 0))
    lines = [r.getMessage() for r in caplog.records if "$SYS is read-only" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "49 more from 127.0.0.1 in the last 60 s not logged" in lines[1]
    assert h.broker.stats.publish_denied == 51
