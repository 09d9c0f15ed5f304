"""aiomqtt and Debian's mosquitto_pub / mosquitto_sub against ``ledge run``."""

from __future__ import annotations

import asyncio
import select
import shutil
import subprocess

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.procs import LedgeProcess


def test_aiomqtt_publish_subscribe_qos_and_retained(shared_ledge: LedgeProcess) -> None:
    async def scenario() -> list[tuple[str, bytes, int, bool]]:
        got: list[tuple[str, bytes, int, bool]] = []
        async with (
            aiomqtt.Client("127.0.0.1", shared_ledge.port, identifier="aio-sub") as sub,
            aiomqtt.Client("127.0.0.1", shared_ledge.port, identifier="aio-pub") as pub,
        ):
            await pub.publish("aio/retained", b"kept", qos=1, retain=True)
            await sub.subscribe("aio/#", qos=2)
            for qos in range(3):
                await pub.publish("aio/live", b"q%d" % qos, qos=qos)
            async with asyncio.timeout(5):
                async for message in sub.messages:
                    payload = message.payload
                    assert isinstance(payload, bytes)
                    got.append((str(message.topic), payload, message.qos, message.retain))
                    if len(got) == 4:
                        break
        return got

    got = asyncio.run(scenario())
    assert got[0] == ("aio/retained", b"kept", 1, True)
    assert sorted(got[1:]) == [
        ("aio/live", b"q0", 0, False),
        ("aio/live", b"q1", 1, False),
        ("aio/live", b"q2", 2, False),
    ]


def test_aiomqtt_v5_persistent_session(shared_ledge: LedgeProcess) -> None:
    async def scenario() -> list[bytes]:
        port = shared_ledge.port
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 600

        def persistent() -> aiomqtt.Client:
            return aiomqtt.Client(
                "127.0.0.1",
                port,
                identifier="aio-persist",
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=False,
                properties=props,
            )

        async with persistent() as c:
            await c.subscribe("aio5/queue", qos=1)
        async with aiomqtt.Client(
            "127.0.0.1", port, identifier="aio-pub5", protocol=aiomqtt.ProtocolVersion.V5
        ) as pub:
            for i in range(5):
                await pub.publish("aio5/queue", b"%d" % i, qos=1)
        got: list[bytes] = []
        async with persistent() as c:
            async with asyncio.timeout(5):
                async for message in c.messages:
                    assert isinstance(message.payload, bytes)
                    got.append(message.payload)
                    if len(got) == 5:
                        break
        return got

    assert asyncio.run(scenario()) == [b"0", b"1", b"2", b"3", b"4"]


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_pub_and_sub(shared_ledge: LedgeProcess, version: str) -> None:
    if shutil.which("mosquitto_sub") is None:
        pytest.fail("mosquitto-clients not installed: run scripts/setup --test")
    port = str(shared_ledge.port)
    topic = f"cli/{version}"
    subprocess.run(
        [
            "mosquitto_pub",
            "-p",
            port,
            "-V",
            version,
            "-t",
            f"{topic}/ret",
            "-m",
            "retained",
            "-r",
            "-q",
            "1",
        ],
        check=True,
        timeout=10,
    )
    sub = subprocess.Popen(
        [
            "mosquitto_sub",
            "-p",
            port,
            "-V",
            version,
            "-t",
            f"{topic}/#",
            "-v",
            "-q",
            "2",
            "-C",
            "4",
            "-W",
            "10",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # The retained message arrives once the subscription is in place: wait for it.
        assert sub.stdout is not None
        ready, _, _ = select.select([sub.stdout], [], [], 10)
        assert ready, "mosquitto_sub printed nothing"
        first = sub.stdout.readline().rstrip("\n")
        for qos in ("0", "1", "2"):
            subprocess.run(
                [
                    "mosquitto_pub",
                    "-p",
                    port,
                    "-V",
                    version,
                    "-t",
                    f"{topic}/live",
                    "-m",
                    f"q{qos}",
                    "-q",
                    qos,
                ],
                check=True,
                timeout=10,
            )
        out, _ = sub.communicate(timeout=15)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.communicate()
    assert first == f"{topic}/ret retained"
    assert sorted(out.splitlines()) == [f"{topic}/live q0", f"{topic}/live q1", f"{topic}/live q2"]
