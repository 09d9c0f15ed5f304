"""What the bridge's client (``HookedClient``) makes of each paho callback, in the test's
own process: the remote's Receive Maximum, a connection lost before CONNACK, a disconnect
after it, every publish acknowledgement with its reason code, and a socket registered
for writing (also one closed meanwhile). ``test_bridge_aiomqtt.py`` drives the same
paths against a real Mosquitto."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from gateway.bridge.aiomqtt_client import HookedClient
from tests.support.wait import async_wait_for

FLAGS = mqtt.ConnectFlags(session_present=False)
DISCONNECT_FLAGS = mqtt.DisconnectFlags(is_disconnect_packet_from_server=True)


class Hooked:
    """A client and what it reported."""

    def __init__(self, last_error: str | None = None) -> None:
        self.acks: list[tuple[int, int]] = []
        self.client = HookedClient(
            on_ack=lambda mid, code: self.acks.append((mid, code)),
            last_error=lambda: last_error,
            hostname="127.0.0.1",
        )

    def connack(self, reason: str = "Success", properties: Properties | None = None) -> None:
        code = ReasonCode(PacketTypes.CONNACK, reason)
        self.client._on_connect(self.client.paho, None, FLAGS, code, properties)


def run(story: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(story(), 10))


def test_the_remotes_receive_maximum_comes_from_its_connack() -> None:
    async def story() -> None:
        props = Properties(PacketTypes.CONNACK)
        props.ReceiveMaximum = 20
        told = Hooked()
        told.connack(properties=props)
        assert told.client.receive_maximum == 20
        assert told.client._connected.done() and told.client._connected.exception() is None
        silent = Hooked()  # no Receive Maximum sent: the protocol's 65535
        silent.connack(properties=Properties(PacketTypes.CONNACK))
        assert silent.client.receive_maximum == 65_535
        bare = Hooked()
        bare.connack()
        assert bare.client.receive_maximum == 65_535

    run(story)


def test_a_refused_connack_fails_the_attempt_with_its_reason() -> None:
    async def story() -> None:
        refused = Hooked()
        refused.connack("Not authorized")
        error = refused.client._connected.exception()
        assert isinstance(error, MqttConnectError)
        assert error.rc == ReasonCode(PacketTypes.CONNACK, "Not authorized")

    run(story)


@pytest.mark.parametrize(
    ("last_error", "why"),
    [
        ("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca", "[SSL: TLSV1_ALERT_UNKNOWN_CA]"),
        (None, "Unspecified error"),  # no socket error logged: paho's reason code
    ],
)
def test_a_connection_lost_before_connack_fails_the_attempt_at_once_saying_why(
    last_error: str | None, why: str
) -> None:
    async def story() -> None:
        lost = Hooked(last_error)
        code = ReasonCode(PacketTypes.DISCONNECT, "Unspecified error")
        lost.client._on_disconnect(lost.client.paho, None, DISCONNECT_FLAGS, code, None)
        error = lost.client._connected.exception()
        assert isinstance(error, aiomqtt.MqttError)
        assert str(error).startswith(f"connection closed before CONNACK: {why}"), str(error)
        assert not lost.client._disconnected.done()  # (nothing was connected to end)

    run(story)


@pytest.mark.parametrize(("reason", "clean"), [(0, True), (7, False)])
def test_a_disconnect_after_connack_ends_the_connection_as_aiomqtt_does(
    reason: int, clean: bool
) -> None:
    async def story() -> None:
        hooked = Hooked("not used once connected")
        hooked.connack()
        hooked.client._on_disconnect(hooked.client.paho, None, DISCONNECT_FLAGS, reason, None)
        ended = hooked.client._disconnected
        assert ended.done()
        if clean:
            assert ended.exception() is None
        else:
            error = ended.exception()
            assert isinstance(error, aiomqtt.MqttCodeError) and error.rc == reason

    run(story)


def test_every_publish_acknowledgement_reaches_the_bridge_with_its_reason_code() -> None:
    async def story() -> None:
        hooked = Hooked()
        waiting = asyncio.Event()
        hooked.client._pending_publishes[7] = waiting  # a publish() awaiting mid 7
        refused = ReasonCode(PacketTypes.PUBACK, "Not authorized")
        hooked.client._on_publish(hooked.client.paho, None, 7, refused, None)
        assert waiting.is_set()
        hooked.client._on_publish(hooked.client.paho, None, 8, 0x10, None)  # (as an int)
        hooked.client._on_publish(hooked.client.paho, None, 9, None, None)  # QoS 0, written
        accepted = ReasonCode(PacketTypes.PUBACK, "Success")
        hooked.client._on_publish(hooked.client.paho, None, 10, accepted, None)
        assert hooked.acks == [(7, 0x87), (8, 0x10), (9, 0), (10, 0)]

    run(story)


class _Paho:
    """paho's side of a registered write: ``loop_write`` as it behaves."""

    def __init__(self, fails: BaseException | None = None) -> None:
        self.writes = 0
        self.fails = fails

    def loop_write(self) -> None:
        self.writes += 1
        if self.fails is not None:
            raise self.fails


def _loop_errors() -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    return errors


def test_a_socket_registered_for_writing_is_written_when_it_can_be() -> None:
    async def story() -> None:
        errors = _loop_errors()
        hooked = Hooked()
        paho = _Paho()
        ours, theirs = socket.socketpair()
        with ours, theirs:
            hooked.client._on_socket_register_write(paho, None, ours)
            await async_wait_for(lambda: paho.writes > 0, 5, "the socket was never written")
            asyncio.get_running_loop().remove_writer(ours.fileno())
        assert not hooked.client._disconnected.done() and errors == []

    run(story)


def test_a_write_that_fails_ends_the_connection_with_its_error() -> None:
    async def story() -> None:
        errors = _loop_errors()
        hooked = Hooked()
        broken = ConnectionResetError(104, "Connection reset by peer")
        paho = _Paho(broken)
        ours, theirs = socket.socketpair()
        with ours, theirs:
            hooked.client._on_socket_register_write(paho, None, ours)
            await async_wait_for(
                hooked.client._disconnected.done, 5, "the failed write went unseen"
            )
            asyncio.get_running_loop().remove_writer(ours.fileno())
        assert hooked.client._disconnected.exception() is broken
        assert errors == []

    run(story)


def test_a_socket_closed_before_its_write_is_watched_is_no_error() -> None:
    """paho may close the socket between registering it and the loop watching it (the
    registration comes from paho's thread): nothing is watched, nothing is logged."""

    async def story() -> None:
        errors = _loop_errors()
        hooked = Hooked()
        paho = _Paho()
        ours, theirs = socket.socketpair()
        hooked.client._on_socket_register_write(paho, None, ours)
        ours.close()  # before the loop's next turn
        theirs.close()
        closed = socket.socket()
        closed.close()  # fileno() -1: not registered at all
        hooked.client._on_socket_register_write(paho, None, closed)
        for _ in range(5):
            await asyncio.sleep(0)  # (turns of the loop, not time)
        assert paho.writes == 0 and errors == []

    run(story)
