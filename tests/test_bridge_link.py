"""The cloud bridge's link in the test's own process: a Ledge gateway bridges to another
Ledge gateway standing in for the cloud, both in this process on loopback, the link
through aiomqtt (paho) as in production.

tests/test_bridge.py tells these stories against Debian's Mosquitto as the cloud, with
``ledge run`` in a process of its own; here the link's code runs where ``make mutate``
can judge it: what goes up and in which order, what comes down, what waits while the
cloud is away and goes up when it is back, the states and counts on the way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from drivers.envelope import GATEWAY_PROPERTY, SEQUENCE_PROPERTY
from gateway.app.config import parse_config
from gateway.app.root import Gateway
from gateway.bridge.link import Bridge
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.mqtt.properties import Properties
from tests.support.wait import async_wait_for

CLOUD = '[gateway]\nid = "cloud"\n[[listeners]]\nname = "mqtt"\nhost = "127.0.0.1"\nport = {port}\n'


def edge(port: int, protocol: str = "5.0", extra: str = "") -> str:
    return (
        '[gateway]\nid = "gw1"\n[[listeners]]\nname = "mqtt"\nhost = "127.0.0.1"\nport = 0\n'
        f'[[bridges]]\nname = "up"\naddress = "127.0.0.1:{port}"\nprotocol = "{protocol}"\n'
        "reconnect_min = 0.05\nreconnect_max = 0.2\n"
        '[[bridges.rules]]\nfilter = "sensors/#"\nremote_prefix = "fleet/gw1/"\nqos = 1\n'
        '[[bridges.rules]]\nfilter = "commands/#"\ndirection = "in"\n'
        'local_prefix = "cloud/"\nremote_prefix = "fleet/gw1/"\nqos = 1\n' + extra
    )


@dataclass
class Inbox:
    """A local subscriber's sink: what arrived, in order."""

    got: list[tuple[str, bytes, int, bool]] = field(default_factory=list)

    def __call__(self, msg: Message, qos: int, retain: bool, _ids: tuple[int, ...]) -> None:
        self.got.append((msg.topic, bytes(msg.payload), qos, retain))

    def topics(self) -> list[str]:
        return [t for t, *_ in self.got]


async def started(text: str) -> Gateway:
    gw = Gateway(parse_config(text).to_runtime())
    await gw.start()
    return gw


def port_of(gw: Gateway) -> int:
    assert gw.server is not None
    return int(gw.server.listeners[0].sockets[0].getsockname()[1])


def subscriber(gw: Gateway, name: str, topic_filter: str) -> Inbox:
    inbox = Inbox()
    assert gw.broker is not None
    LocalClient(gw.broker, name, inbox).subscribe(topic_filter, 1, 0.0)
    return inbox


def publisher(gw: Gateway) -> Callable[..., int]:
    assert gw.broker is not None
    client = LocalClient(gw.broker, "sensor")
    loop = asyncio.get_running_loop()

    def publish(topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> int:
        return client.publish(topic, payload, loop.time(), qos=qos, retain=retain)

    return publish


def bridge_of(gw: Gateway) -> Bridge:
    [bridge] = gw.bridges
    return bridge


def run(story: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(story())


@pytest.mark.parametrize("protocol", ["5.0", "3.1.1"])
def test_messages_go_up_mapped_in_order_and_are_acknowledged(protocol: str) -> None:
    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        up = subscriber(cloud, "watch", "fleet/#")
        gw = await started(edge(port_of(cloud), protocol))
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            publish = publisher(gw)
            for i in range(20):
                publish(f"sensors/t{i % 3}", str(i).encode())
            publish("elsewhere/x", b"not bridged")
            publish("sensors/last", b"marker")
            await async_wait_for(lambda: len(up.got) >= 21, 10, "twenty-one messages up")
            assert [(t, p) for t, p, _, _ in up.got] == [
                *((f"fleet/gw1/sensors/t{i % 3}", str(i).encode()) for i in range(20)),
                ("fleet/gw1/sensors/last", b"marker"),
            ]  # and nothing from outside the rules
            assert {(qos, retain) for _, _, qos, retain in up.got} == {(1, False)}
            await async_wait_for(lambda: bridge.outbox.count == 0, 5, "all acknowledged")
            assert (bridge.outbox.stats.sent, bridge.outbox.stats.acknowledged) == (21, 21)
            assert bridge.inflight == 0
            assert bridge.stats.connects == 1
        finally:
            await gw.close()
            await cloud.close()

    run(story)


@pytest.mark.parametrize("protocol", ["5.0", "3.1.1"])
def test_the_cloud_sends_commands_down_under_the_local_prefix(protocol: str) -> None:
    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        gw = await started(edge(port_of(cloud), protocol))
        down = subscriber(gw, "device", "cloud/#")
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            await subscribed(cloud, "fleet/gw1/commands/#")
            assert cloud.broker is not None
            sessions = cloud.broker.sessions
            # to its inbound rule only: what it sends up is not asked back down
            assert list(sessions["ledge-gw1-up"].subscriptions) == ["fleet/gw1/commands/#"]
            publish = publisher(cloud)
            publish("fleet/gw1/commands/valve", b"open")
            publish("fleet/gw2/commands/valve", b"not ours")
            publish("fleet/gw1/commands/last", b"marker")
            await async_wait_for(lambda: len(down.got) >= 2, 10, "the commands down")
            assert down.got == [
                ("cloud/commands/valve", b"open", 1, False),
                ("cloud/commands/last", b"marker", 1, False),
            ]  # not another gateway's
            assert bridge.stats.received == 2
        finally:
            await gw.close()
            await cloud.close()

    run(story)


def test_messages_wait_while_the_cloud_is_away_and_go_up_in_order_when_it_is_back() -> None:
    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        port = port_of(cloud)
        gw = await started(edge(port))
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            await cloud.close()
            await async_wait_for(lambda: bridge.state != "connected", 10, "the link lost")
            publish = publisher(gw)
            for i in range(30):
                publish("sensors/t", str(i).encode())
            assert bridge.outbox.count == 30
            assert bridge.last_error != ""
            cloud = await started(CLOUD.format(port=port))
            up = subscriber(cloud, "watch", "fleet/gw1/sensors/#")
            await async_wait_for(lambda: len(up.got) >= 30, 15, "the backlog up")
            assert [p for _, p, _, _ in up.got] == [str(i).encode() for i in range(30)]
            assert bridge.stats.connects == 2
            await async_wait_for(lambda: bridge.outbox.count == 0, 5, "all acknowledged")
        finally:
            await gw.close()
            await cloud.close()

    run(story)


def test_a_command_is_stamped_coming_in_and_one_marked_by_this_gateway_is_a_loop() -> None:
    """A message entering the bridged world is marked with this gateway's id and a
    sequence number; one that already carries this gateway's mark went round a loop and
    is dropped, counted."""

    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        gw = await started(edge(port_of(cloud)))
        marks: list[tuple[tuple[str, str], ...]] = []
        assert gw.broker is not None
        LocalClient(
            gw.broker, "device", lambda msg, *_: marks.append(msg.properties.user_properties)
        ).subscribe("cloud/#", 1, 0.0)
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            await subscribed(cloud, "fleet/gw1/commands/#")
            assert cloud.broker is not None
            sender = LocalClient(cloud.broker, "operator")
            now = asyncio.get_running_loop().time()
            looped = Properties().with_(
                user_properties=((GATEWAY_PROPERTY, "gw1"), (SEQUENCE_PROPERTY, "7"))
            )
            sender.publish("fleet/gw1/commands/a", b"1", now, qos=1, properties=looped)
            sender.publish("fleet/gw1/commands/b", b"2", now, qos=1)
            await async_wait_for(lambda: marks, 10, "the new command down")
            await async_wait_for(lambda: bridge.stats.loops == 1, 10, "the loop counted")
            [(gateway, sequence)] = [
                (dict(m)[GATEWAY_PROPERTY], dict(m)[SEQUENCE_PROPERTY]) for m in marks
            ]
            assert gateway == "gw1" and int(sequence) > 0
            assert bridge.stats.received == 1
        finally:
            await gw.close()
            await cloud.close()

    run(story)


def test_over_mqtt_311_what_the_bridge_sent_coming_back_is_an_echo() -> None:
    """MQTT 3.1.1 has no No Local: a rule both ways gets back what it sent, which is
    dropped and counted; the same topic from another client of the cloud comes down."""
    both = '[[bridges.rules]]\nfilter = "shared/#"\ndirection = "both"\nqos = 1\n'

    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        gw = await started(edge(port_of(cloud), "3.1.1", both))
        down = subscriber(gw, "device", "shared/#")
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            await subscribed(cloud, "shared/#")
            publisher(gw)("shared/x", b"from the edge")
            await async_wait_for(lambda: bridge.stats.echoes == 1, 10, "the echo dropped")
            assert cloud.broker is not None
            LocalClient(cloud.broker, "other").publish(
                "shared/x", b"from the cloud", asyncio.get_running_loop().time(), qos=1
            )
            await async_wait_for(lambda: len(down.got) >= 2, 10, "the cloud's message")
            assert [p for _, p, _, _ in down.got] == [b"from the edge", b"from the cloud"]
            assert bridge.stats.received == 1
        finally:
            await gw.close()
            await cloud.close()

    run(story)


def test_the_window_of_messages_in_flight_is_the_clouds_receive_maximum() -> None:
    async def story() -> None:
        cloud = await started(CLOUD.format(port=0) + "[broker]\nreceive_maximum = 3\n")
        gw = await started(edge(port_of(cloud)))
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            assert (bridge.remote_receive_maximum, bridge.window) == (3, 3)
            up = Inbox()
            seen: list[int] = []  # the bridge's messages in flight as each one arrives

            def arriving(msg: Message, qos: int, retain: bool, ids: tuple[int, ...]) -> None:
                # The cloud hands a message to its subscribers before it acknowledges
                # it: here it is still in flight at the bridge, so at least 1.
                seen.append(bridge.inflight)
                up(msg, qos, retain, ids)

            assert cloud.broker is not None
            LocalClient(cloud.broker, "watch", arriving).subscribe("fleet/#", 1, 0.0)
            publish = publisher(gw)
            for i in range(50):
                publish("sensors/t", str(i).encode())
            await async_wait_for(lambda: len(up.got) >= 50, 15, "fifty messages up")
            assert len(seen) == 50
            assert min(seen) >= 1
            assert max(seen) <= 3
            assert [p for _, p, _, _ in up.got] == [str(i).encode() for i in range(50)]
        finally:
            await gw.close()
            await cloud.close()

    run(story)


async def subscribed(cloud: Gateway, topic_filter: str) -> None:
    """Until the bridge's subscription is in place at the cloud."""
    assert cloud.broker is not None
    sessions = cloud.broker.sessions
    await async_wait_for(
        lambda: topic_filter in getattr(sessions.get("ledge-gw1-up"), "subscriptions", {}),
        10,
        f"the bridge subscribed to {topic_filter} at the cloud",
    )
