"""The bridge's one adapter over aiomqtt's private callbacks (``HookedClient``): the
aiomqtt internals it relies on are pinned here, and each path it adds runs against a
real Mosquitto (or a loopback socket that hangs up before CONNACK)."""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import paho.mqtt.client as mqtt
import pytest

from gateway.bridge.aiomqtt_client import PRIVATE_ATTRIBUTES, PRIVATE_METHODS, HookedClient
from tests.support.procs import MosquittoProcess

#: paho 2.x callback parameters, as aiomqtt's private methods take them.
SIGNATURES = {
    "_on_connect": ["client", "userdata", "flags", "reason_code", "properties"],
    "_on_disconnect": ["client", "userdata", "flags", "reason_code", "properties"],
    "_on_publish": ["client", "userdata", "mid", "reason_code", "properties"],
    "_on_socket_register_write": ["client", "userdata", "sock"],
}


@pytest.mark.parametrize("name", PRIVATE_METHODS)
def test_aiomqtt_still_has_the_private_callbacks_the_adapter_overrides(name: str) -> None:
    method = getattr(aiomqtt.Client, name)
    params = list(inspect.signature(method).parameters)[1:]
    assert params == SIGNATURES[name], f"aiomqtt {aiomqtt.__version__} changed {name}"


def test_aiomqtt_wires_paho_to_the_overrides_and_has_the_attributes_read() -> None:
    async def build() -> HookedClient:
        return HookedClient(
            on_ack=lambda mid, code: None, last_error=lambda: None, hostname="127.0.0.1"
        )

    client = asyncio.run(build())
    for name in PRIVATE_ATTRIBUTES:
        assert hasattr(client, name), f"aiomqtt {aiomqtt.__version__} has no {name}"
    paho = client.paho
    assert isinstance(paho, mqtt.Client)
    # paho calls the overrides (aiomqtt registers bound methods of self).
    assert paho.on_connect == client._on_connect
    assert paho.on_disconnect == client._on_disconnect
    assert paho.on_publish == client._on_publish
    assert paho.on_socket_register_write == client._on_socket_register_write


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoProcess]:
    proc = MosquittoProcess(tmp_path, "max_inflight_messages 5\n").start()
    try:
        yield proc
    finally:
        proc.stop()


def test_receive_maximum_and_every_acknowledgement_with_its_code(
    mosquitto: MosquittoProcess,
) -> None:
    acks: list[tuple[int, int]] = []

    async def run() -> tuple[int, list[int]]:
        all_in = asyncio.Event()

        def on_ack(mid: int, code: int) -> None:
            acks.append((mid, code))
            if len(acks) == 3:
                all_in.set()

        async with HookedClient(
            on_ack=on_ack,
            last_error=lambda: None,
            hostname="127.0.0.1",
            port=mosquitto.port,
            identifier="adapter",
            protocol=aiomqtt.ProtocolVersion.V5,
        ) as client:
            mids = [client.paho.publish("t", b"%d" % qos, qos).mid for qos in (0, 1, 2)]
            async with asyncio.timeout(10):
                await all_in.wait()
            return client.receive_maximum, mids

    receive_maximum, mids = asyncio.run(run())
    assert receive_maximum == 5  # Mosquitto's max_inflight_messages, from the CONNACK
    # QoS 0: written; QoS 1: PUBACK 0x10 (no subscribers); QoS 2: PUBCOMP's code.
    assert sorted(acks) == sorted(zip(mids, [0, 0x10, 0], strict=True))


def test_a_connection_lost_before_connack_fails_the_attempt_with_the_reason() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def hang_up() -> None:
        conn, _ = listener.accept()
        conn.recv(1024)  # the CONNECT
        conn.close()

    server = threading.Thread(target=hang_up, daemon=True)
    server.start()

    async def run() -> None:
        client = HookedClient(
            on_ack=lambda mid, code: None,
            last_error=lambda: "the peer hung up",
            hostname="127.0.0.1",
            port=port,
            timeout=30,  # without the adapter: this long, then "timed out"
        )
        async with client:
            pass

    try:
        with pytest.raises(aiomqtt.MqttError) as raised:
            asyncio.run(run())
        assert "connection closed before CONNACK: the peer hung up" in str(raised.value)
    finally:
        server.join(5)
        listener.close()
