"""Serial sensors end to end: pseudo-terminals stand in for devices; ``ledge run`` opens
them with the real pyserial; a real MQTT client watches what comes out.

The device path in the config is a symlink (like /dev/serial/by-id/...); unplugging
closes the pty's master side, replugging makes a new pty and moves the symlink.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import select
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import serial

import drivers.serial
from gateway.app.config import parse_config
from gateway.broker.core import Broker
from gateway.broker.settings import BrokerSettings
from gateway.sensors.hub import SensorHub
from tests.support.clients import REPLY_DEADLINE, Paho, Received
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
        """The device goes, and its link with it (as udev removes it): a link left behind
        would name a pty number the next ``openpty`` anywhere on the machine may take."""
        os.close(self.master)
        self.master = -1
        self.link.unlink(missing_ok=True)

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


async def until(changed: asyncio.Event, done: Callable[[], bool]) -> None:
    """Wait until ``done``, checked again at each change (5 s at most for each)."""
    while not done():
        changed.clear()
        await asyncio.wait_for(changed.wait(), 5)


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
        # Status, 6 from GGA, 5 from RMC: wait for the ones asserted, not for a count
        # (a status seen twice, retained then live, would end a count early).
        wanted = {f"ledge/gw1/serial/gps/{q}" for q in ("latitude", "satellites", "altitude")}
        wanted |= {"ledge/gw1/serial/gps/time", "ledge/gw1/serial/gps/status"}
        wait_for(
            lambda: wanted <= set(by_topic(list(sub.messages))), REPLY_DEADLINE, "GPS readings"
        )
        msgs = by_topic(list(sub.messages))
        assert json.loads(msgs["ledge/gw1/serial/gps/latitude"][0])["value"] == 48.1173
        assert json.loads(msgs["ledge/gw1/serial/gps/satellites"][0])["value"] == 8
        assert json.loads(msgs["ledge/gw1/serial/gps/altitude"][0])["unit"] == "m"
        assert (
            json.loads(msgs["ledge/gw1/serial/gps/time"][0])["value"] == "1994-03-23T12:35:19+00:00"
        )
        assert msgs["ledge/gw1/serial/gps/status"][-1] == b"online"
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


def test_a_device_absent_at_start_is_offline_until_its_port_opens(
    tmp_path: Path, device: FakeDevice
) -> None:
    """Broken, the status would say online (retained) before the port was ever open."""
    device.unplug()
    config = tmp_path / "ledge.toml"
    config.write_text(
        f'[gateway]\nid = "gw1"\n[[serial]]\npath = "{device.link}"\nname = "env"\n'
        'protocol = "jsonl"\n'
    )
    proc = LedgeProcess(config=config).start()
    try:
        sub = Paho(proc.port, "watch").connect()
        sub.subscribe("ledge/gw1/serial/env/status", 0)

        def statuses() -> list[bytes]:
            return [m.payload for m in sub.messages]

        wait_for(statuses, 10, "the status, retained")
        assert set(statuses()) == {b"offline"}, statuses()
        device.plug()
        proc.wait_log("env: connected at", 10)
        wait_for(lambda: statuses()[-1] == b"online", 10, "online once open")
        assert statuses()[0] == b"offline" and statuses().count(b"online") == 1, statuses()
        sub.disconnect()
    finally:
        assert proc.stop() == 0


def test_unplug_and_replug_are_survived_three_times_in_a_row(
    tmp_path: Path, device: FakeDevice
) -> None:
    proc = start(tmp_path, device, 'name = "env"\nprotocol = "jsonl"')
    try:
        sub = Paho(proc.port, "watch").connect()
        sub.subscribe("ledge/gw1/serial/env/#", 0)

        def values() -> list[int]:
            return [json.loads(m.payload)["value"] for m in sub.messages if m.topic.endswith("/t")]

        def last_status() -> bytes:
            return [m.payload for m in sub.messages if m.topic.endswith("/status")][-1]

        device.send(b'{"t": 0}\n')
        wait_for(lambda: values() == [0], 5, "first reading")
        for n in (1, 2, 3):
            device.unplug()

            def unplugged(n: int = n) -> bool:
                return proc.log.count("env: disconnected from") == n

            def replugged(n: int = n) -> bool:
                return proc.log.count("env: connected at") == n + 1

            def read(n: int = n) -> bool:
                return values() == list(range(n + 1))

            wait_for(unplugged, 5, "unplugged")
            wait_for(lambda: last_status() == b"offline", 5, "status offline")
            device.plug()
            wait_for(replugged, 10, "replugged")
            device.send(b'{"t": %d}\n' % n)
            wait_for(read, 5, f"reading after replug {n}")
            assert last_status() == b"online"
        assert proc.log.count("env: disconnected") == 3  # one line per state change
        sub.disconnect()
    finally:
        assert proc.stop() == 0


class Recorded(serial.Serial):
    """The real pyserial port, remembering what it was opened with."""

    opened: list[tuple[int, int, str, float]] = []

    def open(self) -> None:
        super().open()
        Recorded.opened.append((self.baudrate, self.bytesize, self.parity, self.stopbits))


PYSERIAL_PARITY = {"none": "N", "even": "E", "odd": "O", "mark": "M", "space": "S"}


@pytest.mark.parametrize("parity", sorted(PYSERIAL_PARITY))
@pytest.mark.parametrize("bytesize", [5, 6, 7, 8])
@pytest.mark.parametrize("stopbits", [1, 1.5, 2])
def test_every_line_setting_reaches_pyserial_as_configured(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parity: str,
    bytesize: int,
    stopbits: float,
) -> None:
    """From the config file through the sensor to pyserial opening a real pty: the
    port is opened at the configured baud rate, byte size, parity and stop bits. (A
    pty takes the settings and, on Linux, keeps 8 bits without parity whatever they
    were, so what pyserial was asked is what can be checked here.)"""
    Recorded.opened = []
    monkeypatch.setattr(serial, "Serial", Recorded)
    master, slave = os.openpty()
    text = (
        '[gateway]\nid = "gw1"\n[[serial]]\nname = "line"\n'
        f'path = "{os.ttyname(slave)}"\nbaudrate = 57600\nbytesize = {bytesize}\n'
        f'parity = "{parity}"\nstopbits = {stopbits}\n'
    )
    settings = parse_config(text).to_runtime().sensors
    hub = SensorHub(Broker(BrokerSettings()), settings, lambda: 0.0)
    port = hub.sensors["line"].port

    async def open_once() -> None:
        opened = asyncio.Event()
        port.on_state = lambda up: opened.set()
        task = asyncio.create_task(port.run())
        await asyncio.wait_for(opened.wait(), 5)
        port.stop()
        await asyncio.wait_for(task, 5)

    try:
        asyncio.run(open_once())
    finally:
        os.close(master)
        os.close(slave)
    assert Recorded.opened == [(57600, bytesize, PYSERIAL_PARITY[parity], stopbits)]


def test_problem_lines_are_logged_ten_a_minute_and_the_rest_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Garbage on a line: the first ten problems of a minute are logged with their
    offsets, the others counted and said in one line when the minute is over."""
    text = '[gateway]\nid = "gw1"\n[[serial]]\nname = "line"\npath = "/dev/null"\n'
    now = [100.0]
    settings = parse_config(text).to_runtime().sensors
    hub = SensorHub(Broker(BrokerSettings()), settings, lambda: now[0])
    sensor = hub.sensors["line"]
    caplog.set_level(logging.WARNING, "gateway.sensors.hub")

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records]

    sensor._data(b"not a reading\n" * 25)
    assert len(logged()) == 10
    assert logged()[9].startswith("line: skipped unreadable line at byte offset 126 ")
    assert sensor.stats.bad_lines == 25
    now[0] += 59.9
    sensor._data(b"still not\n")
    assert len(logged()) == 10  # the same minute
    now[0] += 0.2
    sensor._data(b"nor this\n")
    assert logged()[10] == "line: 16 more problem lines in the last minute were not logged"
    assert len(logged()) == 12  # and the new minute's first problem
    assert "byte offset 360" in logged()[11]


def test_the_reconnect_backoff_starts_again_after_a_successful_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Absent, the device is tried again after 0.5, 1, 2, 4 ... s (up to
    reconnect_max); once it was open, the next absence starts again at 0.5 s."""
    waits: list[float] = []
    real_sleep = asyncio.sleep
    changed: list[asyncio.Event] = []

    async def recorded_sleep(delay: float, result: Any = None) -> Any:
        waits.append(round(delay, 6))
        changed[0].set()
        return await real_sleep(0)

    # The driver's waits and jitter (asyncio's and random's, for this test only).
    monkeypatch.setattr("drivers.serial.asyncio.sleep", recorded_sleep)
    monkeypatch.setattr("drivers.serial.random.uniform", lambda a, b: 1.0)
    device = FakeDevice(tmp_path / "by-id")
    device.unplug()

    port = drivers.serial.SerialPort(
        "line",
        drivers.serial.PortSettings(str(device.link), reconnect_min=0.5, reconnect_max=4.0),
        lambda data: None,
        lambda up: changed[0].set(),
    )

    before_open: list[int] = []

    async def scenario() -> None:
        changed.append(asyncio.Event())
        task = asyncio.create_task(port.run())
        await until(changed[0], lambda: len(waits) >= 5)
        device.plug()  # present again: opened at the next try
        await until(changed[0], lambda: port.connected)
        before_open.append(len(waits))
        device.unplug()
        await until(changed[0], lambda: len(waits) >= before_open[0] + 3)
        port.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert waits[:5] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert set(waits[5 : before_open[0]]) <= {4.0}  # tries before the open saw it
    assert waits[before_open[0] :][:3] == [0.5, 1.0, 2.0]
    device.close()


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


def test_a_port_in_process_hands_on_every_byte_and_says_each_change_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SerialPort`` itself over a pty: every chunk reaches ``on_data`` and is counted;
    the port is opened non-blocking and exclusively; an unplug is said once (state,
    flag and a line naming the port, its path and why); the absent device is logged once
    however many tries it takes, and each try waits its backoff within the jitter."""
    device = FakeDevice(tmp_path / "by-id")
    chunks: list[bytes] = []
    states: list[bool] = []
    waits: list[float] = []
    spreads: list[tuple[float, float]] = []
    changed = asyncio.Event()
    real_sleep = asyncio.sleep
    settings = drivers.serial.PortSettings(str(device.link), reconnect_min=0.5)

    def on_data(data: bytes) -> None:
        chunks.append(data)
        changed.set()

    def on_state(up: bool) -> None:
        states.append(up)
        changed.set()

    port = drivers.serial.SerialPort("line", settings, on_data, on_state)
    assert (port.name, port.connected, port.port, port.bytes_read) == ("line", False, None, 0)

    async def recorded_sleep(delay: float, result: Any = None) -> Any:
        waits.append(round(delay, 6))
        changed.set()
        return await real_sleep(0)

    def jitter(low: float, high: float) -> float:
        spreads.append((low, high))
        return high  # the longest wait the jitter allows

    async def scenario() -> None:
        task = asyncio.create_task(port.run())
        await until(changed, lambda: states == [True])
        assert port.connected and port.port is not None
        assert port.port.timeout == 0 and port.port.write_timeout == 0
        with pytest.raises(serial.SerialException):  # opened exclusively
            serial.Serial(str(device.link), exclusive=True)
        device.send(b"abc")
        await until(changed, lambda: chunks == [b"abc"])
        device.send(b"defg\n")
        await until(changed, lambda: b"".join(chunks) == b"abcdefg\n")
        assert port.bytes_read == 8
        assert port.write(b"ping") == 4 and device.receive(4) == b"ping"
        caplog.clear()
        # (the driver's waits and jitter: asyncio's and random's, for the rest of it)
        monkeypatch.setattr("drivers.serial.asyncio.sleep", recorded_sleep)
        monkeypatch.setattr("drivers.serial.random.uniform", jitter)
        device.unplug()
        await until(changed, lambda: len(waits) >= 4)
        assert states == [True, False] and not port.connected and port.port is None
        with pytest.raises(OSError, match="line is not connected"):
            port.write(b"x")
        port.stop()
        await asyncio.wait_for(task, 5)

    with caplog.at_level("INFO", logger="ledge.drivers.serial"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records]
    # (a pty's closed master reads as pyserial's "readiness to read but no data")
    assert lines[0].startswith(f"line: disconnected from {device.link} (read failed: "), lines
    assert "device disconnected" in lines[0]
    absent = [line for line in lines if "cannot open" in line]
    assert len(absent) == 1, lines  # four tries, one line
    assert absent[0].startswith(f"line: cannot open {device.link} (No such file or directory)")
    assert absent[0].endswith("retrying with backoff up to 30 s")
    assert waits[:4] == [0.6, 1.2, 2.4, 4.8]  # 0.5, 1, 2, 4 s, each at most a fifth longer
    assert set(spreads) == {(0.8, 1.2)}
    device.close()


_real_sleep = asyncio.sleep


async def _yield_only(delay: float, result: Any = None) -> Any:
    """The driver's backoff, not waited for: the loop turns once."""
    return await _real_sleep(0, result)


def test_a_write_to_a_device_gone_away_says_write_failed_once_with_the_systems_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command written as the device goes away: pyserial reports EIO as "write failed:
    [Errno 5] ...". The error (the command's result and its log line) names the port,
    says the write failed once, not twice, and ends with the system's reason; the port
    is closed with that reason and the unplug told once."""
    device = FakeDevice(tmp_path / "by-id")
    states: list[bool] = []
    changed = asyncio.Event()

    def on_state(up: bool) -> None:
        states.append(up)
        changed.set()

    port = drivers.serial.SerialPort(
        "line", drivers.serial.PortSettings(str(device.link)), lambda data: None, on_state
    )
    failures: list[str] = []

    async def scenario() -> None:
        task = asyncio.create_task(port.run())
        await until(changed, lambda: states == [True])
        monkeypatch.setattr("drivers.serial.asyncio.sleep", _yield_only)
        device.unplug()  # the write comes before the event loop sees the hang-up
        with pytest.raises(OSError) as failed:
            port.write(b"ON 3\n")
        failures.append(str(failed.value))
        await until(changed, lambda: states == [True, False])
        assert port.port is None and not port.connected
        port.stop()
        await asyncio.wait_for(task, 5)

    with caplog.at_level("WARNING", logger="ledge.drivers.serial"):
        asyncio.run(scenario())
    [message] = failures
    assert message.startswith("line: write failed: ") and message.count("failed") == 1, message
    assert message.endswith("Input/output error"), message
    [closed] = [r.getMessage() for r in caplog.records if "disconnected from" in r.getMessage()]
    assert closed == f"line: disconnected from {device.link} ({message.removeprefix('line: ')})"
    device.close()


def test_a_device_not_taking_data_fails_the_write_at_once_and_stays_connected(
    tmp_path: Path,
) -> None:
    """A device that reads nothing more (flow control held, its buffer full) is not
    gone: writes take what fits, then fail at once with the port's name and why, and
    the port stays open for the readings still coming. Broken (pyserial's own write
    with no write timeout), the first write into a full buffer never returned, and the
    gateway's event loop, broker included, stopped with it."""
    device = FakeDevice(tmp_path / "by-id")
    states: list[bool] = []
    chunks: list[bytes] = []
    changed = asyncio.Event()

    def on_state(up: bool) -> None:
        states.append(up)
        changed.set()

    def on_data(data: bytes) -> None:
        chunks.append(data)
        changed.set()

    port = drivers.serial.SerialPort(
        "line", drivers.serial.PortSettings(str(device.link)), on_data, on_state
    )

    async def scenario() -> None:
        task = asyncio.create_task(port.run())
        await until(changed, lambda: states == [True])
        command = b"X" * 999 + b"\n"
        taken = 0
        with pytest.raises(OSError, match=r"^line: the device is not taking data$"):
            for _ in range(10_000):  # a pty holds a few kilobytes: full long before
                written = port.write(command)
                assert 0 < written <= len(command)
                taken += written
        assert taken >= len(command), "not even one command went out"
        assert port.connected and port.port is not None
        assert device.receive(len(command)) == command  # what was taken is there, whole
        device.send(b"t=1\n")
        await until(changed, lambda: chunks == [b"t=1\n"])
        port.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert states == [True, False]  # closed by the stop only
    device.close()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        # pyserial wraps the system's error in its own text when a read fails
        (serial.SerialException("read failed: [Errno 5] Input/output error"), "Input/output error"),
        (OSError(errno.ENOENT, "No such file or directory: '/dev/x'"), "No such file or directory"),
        (
            serial.SerialException("device reports readiness to read but returned no data"),
            "device reports readiness to read but returned no data",
        ),
    ],
)
def test_the_reason_in_a_disconnect_line_is_the_systems_words_once(
    error: BaseException, reason: str
) -> None:
    """Broken, the log would say "read failed: read failed: [Errno 5] ..." after an
    unplugged USB adapter, or lose pyserial's own words."""
    assert drivers.serial._reason(error) == reason
