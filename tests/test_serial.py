"""Serial sensors end to end: pseudo-terminals stand in for devices; ``ledge run`` opens
them with the real pyserial; a real MQTT client watches what comes out.

The device path in the config is a symlink (like /dev/serial/by-id/...); unplugging
closes the pty's master side, replugging makes a new pty and moves the symlink.
"""

from __future__ import annotations

import json
import os
import select
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import Paho, Received
from tests.support.procs import LedgeProcess
from tests.support.wait import wait_for
from tests.test_drivers import temperature_discovery


class FakeDevice:
    """The far end of a serial line: a pty master, reachable through a stable symlink."""

    def __init__(self, link: Path) -> None:
        self.link = link
        self.master = -1
        self.plug()

    def plug(self) -> None:
        master, slave = os.openpty()
        name = os.ttyname(slave)
        os.close(slave)  # the gateway opens the slave by its path
        tmp = self.link.with_suffix(".new")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(name)
        os.replace(tmp, self.link)  # atomically, as udev would
        self.master = master

    def unplug(self) -> None:
        os.close(self.master)
        self.master = -1

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def receive(self, size: int, timeout: float = 5.0) -> bytes:
        got = b""
        while len(got) < size:
            ready, _, _ = select.select([self.master], [], [], timeout)
            assert ready, f"device received only {got!r}"
            got += os.read(self.master, size - len(got))
        return got

    def close(self) -> None:
        if self.master >= 0:
            os.close(self.master)


@pytest.fixture
def device(tmp_path: Path) -> Iterator[FakeDevice]:
    d = FakeDevice(tmp_path / "serial-by-id-usb-sensor")
    yield d
    d.close()


def start(tmp_path: Path, device: FakeDevice, serial_table: str, extra: str = "") -> LedgeProcess:
    config = tmp_path / "ledge.toml"
    config.write_text(
        f'[gateway]\nid = "gw1"\n{extra}\n[[serial]]\npath = "{device.link}"\n{serial_table}\n'
    )
    proc = LedgeProcess(config=config).start()
    proc.wait_log("connected at")
    return proc


def by_topic(messages: list[Received]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for m in messages:
        out.setdefault(m.topic, []).append(m.payload)
    return out


def test_nmea_gps_lines_become_readings(tmp_path: Path, device: FakeDevice) -> None:
    proc = start(tmp_path, device, 'name = "gps"\nprotocol = "nmea"')
    try:
        sub = Paho(proc.port, "watch").connect()
        sub.subscribe("ledge/gw1/serial/gps/#", 0)
        device.send(
            b"$GPGGA,123519,4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,*47\r\n"
            b"$GPRMC,123519,A,4807.038,N,01131.000,E,022.4,084.4,230394,003.1,W*6A\r\n"
        )
        msgs = by_topic(sub.wait_messages(11))  # status + 6 GGA + 5 RMC
        assert json.loads(msgs["ledge/gw1/serial/gps/latitude"][0])["value"] == 48.1173
        assert json.loads(msgs["ledge/gw1/serial/gps/satellites"][0])["value"] == 8
        assert json.loads(msgs["ledge/gw1/serial/gps/altitude"][0])["unit"] == "m"
        assert (
            json.loads(msgs["ledge/gw1/serial/gps/time"][0])["value"] == "1994-03-23T12:35:19+00:00"
        )
        assert msgs["ledge/gw1/serial/gps/status"] == [b"online"]
        sub.disconnect()
    finally:
        assert proc.stop() == 0


def test_garbage_is_logged_with_device_and_offset_and_good_lines_survive(
    tmp_path: Path, device: FakeDevice
) -> None:
    proc = start(
        tmp_path,
        device,
        'name = "env"\nprotocol = "kv"\nmax_line = 64\n'
        'fields = { t = { quantity = "temperature", unit = "°C" } }',
        extra="[broker]\nsys_interval = 0.2\n",
    )
    try:
        sub = Paho(proc.port, "watch").connect()
        sub.subscribe("ledge/gw1/serial/env/temperature", 0)
        device.send(b"t=20.5\n\xff\xfe\x00 noise\n" + b"y" * 100 + b"\nt=21.5\n")
        got = [json.loads(m.payload)["value"] for m in sub.wait_messages(2)]
        assert got == [20.5, 21.5]
        line = proc.wait_log(r"env: skipped unreadable line at byte offset 7")
        assert "column" in line
        proc.wait_log(r"env: skipped 101 bytes at byte offset 17: line longer than 64 bytes")
        # the device's counters are in $SYS
        stats = Paho(proc.port, "stats").connect()
        stats.subscribe("$SYS/broker/sensors/serial/env/#", 0)
        base = "$SYS/broker/sensors/serial/env/"

        def latest() -> dict[str, bytes]:
            return {m.topic.removeprefix(base): m.payload for m in stats.messages}

        wait_for(
            lambda: latest().get("bad lines") == b"1" and latest().get("garbage bytes") == b"101",
            5,
            "device counters in $SYS",
        )
        assert latest()["readings"] == b"2" and latest()["lines"] == b"3"
        assert latest()["connected"] == b"1"
        stats.disconnect()
        sub.disconnect()
    finally:
        assert proc.stop() == 0


def test_unplug_and_replug_are_survived(tmp_path: Path, device: FakeDevice) -> None:
    proc = start(tmp_path, device, 'name = "env"\nprotocol = "jsonl"')
    try:
        sub = Paho(proc.port, "watch").connect()
        sub.subscribe("ledge/gw1/serial/env/#", 0)
        device.send(b'{"t": 1}\n')
        wait_for(lambda: any(m.topic.endswith("/t") for m in sub.messages), 5, "first reading")
        device.unplug()
        proc.wait_log(r"env: disconnected from")
        wait_for(
            lambda: (
                [m.payload for m in sub.messages if m.topic.endswith("/status")][-1] == b"offline"
            ),
            5,
            "status offline",
        )
        device.plug()
        wait_for(lambda: proc.log.count("env: connected at") == 2, 10, "reconnected")
        device.send(b'{"t": 2}\n')
        wait_for(
            lambda: (
                [json.loads(m.payload)["value"] for m in sub.messages if m.topic.endswith("/t")]
                == [1, 2]
            ),
            5,
            "reading after replug",
        )
        statuses = [m.payload for m in sub.messages if m.topic.endswith("/status")]
        assert statuses[-1] == b"online"
        assert proc.log.count("env: disconnected") == 1  # one line per state change
        sub.disconnect()
    finally:
        assert proc.stop() == 0


def test_command_round_trip(tmp_path: Path, device: FakeDevice) -> None:
    proc = start(tmp_path, device, 'name = "relay"\nprotocol = "kv"\ncommands = true')
    try:
        sub = Paho(proc.port, "ctl").connect()
        sub.subscribe("ledge/gw1/serial/relay/command/result", 1)
        sub.publish("ledge/gw1/serial/relay/command", b"ON 3", 1)
        assert device.receive(5) == b"ON 3\n"
        [result] = sub.wait_messages(1)
        assert json.loads(result.payload) == {"ok": True, "bytes": 5}
        device.unplug()
        proc.wait_log(r"relay: disconnected from")
        sub.publish("ledge/gw1/serial/relay/command", b"OFF", 1)
        results = sub.wait_messages(2)
        assert json.loads(results[1].payload)["ok"] is False
        sub.disconnect()
    finally:
        assert proc.stop() == 0


def test_home_assistant_discovery(tmp_path: Path, device: FakeDevice) -> None:
    proc = start(
        tmp_path,
        device,
        'name = "env"\nprotocol = "kv"\nfields = { t = { quantity = "temperature", unit = "°C" } }',
        extra="[homeassistant]\nenabled = true\n",
    )
    try:
        device.send(b"t=20.5\n")
        wait_for(lambda: "connected at" in proc.log, 5, "device")
        ha = Paho(proc.port, "ha").connect()
        ha.subscribe("homeassistant/#", 0)
        ha.subscribe("ledge/gw1/status", 0)
        configs = by_topic(ha.wait_messages(3))
        body = json.loads(configs["homeassistant/sensor/gw1_env/temperature/config"][0])
        assert body == temperature_discovery("env")
        gateway = json.loads(configs["homeassistant/binary_sensor/gw1/status/config"][0])
        assert gateway["state_topic"] == "ledge/gw1/status"
        assert gateway["device"]["identifiers"] == [body["device"]["via_device"]]
        assert configs["ledge/gw1/status"] == [b"online"]
        ha.disconnect()
    finally:
        assert proc.stop() == 0
