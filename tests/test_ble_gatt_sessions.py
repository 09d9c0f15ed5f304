"""GATT sessions in the test's own process: ``drivers.ble.gatt.GattDevice`` with the real
bleak connecting to the mock BlueZ (tests/fakes/fake_bluez.py) on the private bus.

tests/test_ble.py runs the same devices through a gateway; here a planted bug (a mutant)
is judged: what a session reads, subscribes to and waits for, in which order the
gateway is told, the backoff between failed sessions, a command written on the open link
or in a session of its own. The pauses between sessions are recorded, not waited for:
``GattDevice`` sees an ``asyncio`` whose ``sleep`` notes the seconds and yields once."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from bleak import BleakClient
from bleak.exc import BleakError

from drivers.ble import gatt
from drivers.ble.gatt import GattDevice, error_reason
from tests.support.bluez import FakeBlueZ
from tests.support.wait import async_wait_for

ADDRESS = "D0:00:00:00:00:21"
BATTERY = "00002a19-0000-1000-8000-00805f9b34fb"
TEMPERATURE = "00002a6e-0000-1000-8000-00805f9b34fb"
NUS = "6e400001-b5a3-f393-e0a9-e50e24dcca9e"
NUS_RX = "6e400002-b5a3-f393-e0a9-e50e24dcca9e"
NUS_TX = "6e400003-b5a3-f393-e0a9-e50e24dcca9e"
T = TypeVar("T")


@dataclass(frozen=True)
class Char:
    uuid: str
    mode: str
    fields: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Settings:
    name: str = "pico"
    address: str | None = ADDRESS
    characteristics: tuple[Char, ...] = (Char(BATTERY, "read"), Char(NUS_TX, "notify"))
    poll_interval: float = 60.0
    keep_connected: bool = False
    command_uuid: str | None = NUS_RX
    command_response: bool = True


@dataclass
class Told:
    """Everything the device told the gateway, in order."""

    events: list[tuple[Any, ...]] = field(default_factory=list)

    def value(self, char: Any, data: bytes) -> None:
        self.events.append(("value", char.uuid, data))

    def state(self, connected: bool) -> None:
        self.events.append(("state", connected))

    def error(self, reason: str, text: str) -> None:
        self.events.append(("error", reason, text))


class Paused:
    """``asyncio`` as ``GattDevice`` sees it: ``sleep`` records its seconds and yields."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(0.01)


@dataclass
class Peripheral:
    device: str
    battery: str
    rx: str
    tx: str


@pytest.fixture
def pico(bluez: FakeBlueZ) -> Peripheral:
    """A peripheral in range: a battery level and a temperature to read, a UART to
    notify and write."""
    dev = bluez.add_device(ADDRESS, "pico-sensor", rssi=-50, uuids=[NUS])
    bluez.beacon(dev, 50)
    bas = bluez.add_service(dev, 0x000A, "0000180f-0000-1000-8000-00805f9b34fb")
    battery = bluez.add_characteristic(bas, 0x000B, BATTERY, ["read"], b"\x5a")
    ess = bluez.add_service(dev, 0x000D, "0000181a-0000-1000-8000-00805f9b34fb")
    bluez.add_characteristic(ess, 0x000E, TEMPERATURE, ["read"], temperature(2155))
    nus = bluez.add_service(dev, 0x0010, NUS)
    rx = bluez.add_characteristic(nus, 0x0011, NUS_RX, ["write"])
    tx = bluez.add_characteristic(nus, 0x0013, NUS_TX, ["notify"])
    return Peripheral(dev, battery, rx, tx)


@pytest.fixture
def paused(monkeypatch: pytest.MonkeyPatch) -> Iterator[Paused]:
    clock = Paused()
    monkeypatch.setattr(gatt, "asyncio", clock)
    monkeypatch.setattr("drivers.ble.gatt.random.uniform", lambda low, high: 1.0)  # no jitter
    yield clock


def device(told: Told, settings: Settings | None = None, timeout: float = 5.0) -> GattDevice:
    return GattDevice(
        settings or Settings(), "hci0", asyncio.Semaphore(1), timeout, (1.0, 8.0),
        told.value, told.state, told.error,
    )  # fmt: skip


def run(story: Callable[[], Coroutine[object, object, T]]) -> T:
    return asyncio.run(story())


async def stopped(d: GattDevice, task: asyncio.Task[None]) -> None:
    d.stop()
    await asyncio.wait_for(task, 10)


def temperature(centi: int) -> bytes:
    return struct.pack("<h", centi)


def test_a_session_reads_subscribes_waits_for_a_notification_and_disconnects(
    bluez: FakeBlueZ, pico: Peripheral, paused: Paused
) -> None:
    told = Told()
    d = device(told)

    async def story() -> None:
        task = asyncio.create_task(d.run())
        await async_wait_for(lambda: len(told.events) == 2, 10, "the battery read")
        assert "StartNotify" in bluez.calls(pico.tx)  # subscribed before reading
        assert d.connected and d.client is not None
        bluez.notify(pico.tx, temperature(2155))
        await async_wait_for(lambda: paused.slept, 10, "the session's end")
        assert not d.connected and d.client is None
        await stopped(d, task)

    run(story)
    assert told.events == [
        ("state", True),
        ("value", BATTERY, b"\x5a"),
        ("value", NUS_TX, temperature(2155)),
        ("state", False),
    ]
    assert paused.slept == [60.0]  # then the poll interval
    assert d.sessions == 1
    assert bluez.calls(pico.device).count("Connect") == 1
    assert bluez.calls(pico.device)[-1] == "Disconnect"


def test_a_notification_that_never_comes_ends_the_session_as_a_timeout(
    bluez: FakeBlueZ, pico: Peripheral, paused: Paused
) -> None:
    told = Told()
    d = device(told, timeout=1.5)

    async def story() -> None:
        task = asyncio.create_task(d.run())
        await async_wait_for(lambda: paused.slept, 15, "the failed session's end")
        await stopped(d, task)

    run(story)
    assert told.events[:3] == [("state", True), ("value", BATTERY, b"\x5a"), ("state", False)]
    assert told.events[3] == ("error", "timeout", "TimeoutError")
    assert paused.slept[0] == 1.0  # reconnect_min, no poll interval after a failure


FAILS_FIVE_TIMES = """
self.tries = getattr(self, "tries", 0) + 1
if self.tries <= 5 or self.tries == 7:
    raise dbus.exceptions.DBusException("injected", name="org.bluez.Error.Failed")
self.UpdateProperties("org.bluez.Device1", {"Connected": dbus.Boolean(True)})
self.UpdateProperties("org.bluez.Device1", {"ServicesResolved": dbus.Boolean(True)})
"""


def test_failed_sessions_back_off_doubling_to_the_maximum_then_start_again_from_the_minimum(
    bluez: FakeBlueZ, pico: Peripheral, paused: Paused
) -> None:
    # Connect fails five times, then connects as the fake's own Connect does, then
    # fails once more.
    mock = bluez.dbus.Interface(
        bluez.bus.get_object("org.bluez", pico.device), "org.freedesktop.DBus.Mock"
    )
    mock.AddMethod("org.bluez.Device1", "Connect", "", "", FAILS_FIVE_TIMES)
    told = Told()
    d = device(told, Settings(characteristics=(Char(BATTERY, "read"),)))

    async def story() -> None:
        task = asyncio.create_task(d.run())
        await async_wait_for(lambda: len(paused.slept) >= 7, 60, "the seventh session's end")
        await stopped(d, task)

    run(story)
    assert paused.slept[:7] == [1.0, 2.0, 4.0, 8.0, 8.0, 60.0, 1.0]
    assert [e[:2] for e in told.events[:5]] == [("error", "gatt_error")] * 5
    assert "injected" in told.events[0][2]
    assert told.events[5:9] == [
        ("state", True), ("value", BATTERY, b"\x5a"), ("state", False), told.events[0]
    ]  # fmt: skip


def test_each_backoff_pause_is_the_delay_give_or_take_a_fifth(
    bluez: FakeBlueZ, pico: Peripheral, paused: Paused, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pause after a failed session is the backoff delay jittered by at most a fifth
    either way (devices failing together do not all retry at the same instant): at the
    jitter's top 1.2 times the delay, at its bottom 0.8 times. Jittered the wrong way, a
    gateway would hammer a failing device or leave a working one unread for longer."""
    bluez.fail_method(pico.device, "org.bluez.Device1", "Connect", "", "", "org.bluez.Error.Failed")
    spreads: list[tuple[float, float]] = []
    for end, expected in ((1, [1.2, 2.4, 4.8]), (0, [0.8, 1.6, 3.2])):

        def jitter(low: float, high: float, end: int = end) -> float:
            spreads.append((low, high))
            return (low, high)[end]

        monkeypatch.setattr("drivers.ble.gatt.random.uniform", jitter)
        paused.slept.clear()
        told = Told()
        d = device(told, Settings(characteristics=(Char(BATTERY, "read"),)))

        async def story(d: GattDevice = d) -> None:
            task = asyncio.create_task(d.run())
            await async_wait_for(lambda: len(paused.slept) >= 3, 15, "three failed sessions")
            await stopped(d, task)

        run(story)
        assert [round(s, 6) for s in paused.slept[:3]] == expected  # delays 1, 2, 4 s
        assert [e[:2] for e in told.events[:3]] == [("error", "gatt_error")] * 3
    assert set(spreads) == {(0.8, 1.2)}


class Recorded(BleakClient):
    """bleak's real client, remembering the timeout it was made with."""

    timeouts: list[float] = []

    def __init__(self, *args: Any, timeout: float = 30.0, **kwargs: Any) -> None:
        Recorded.timeouts.append(timeout)
        super().__init__(*args, timeout=timeout, **kwargs)


def test_the_configured_timeout_is_bleaks_connect_timeout_too(
    bluez: FakeBlueZ, pico: Peripheral, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bleak gives up a connection (and the scan for a device known by its address only)
    after its own timeout, 30 s unless told: a gateway configured with a longer
    ``gatt_timeout`` for a slow device must get that long from bleak, not 30 s."""
    Recorded.timeouts = []
    monkeypatch.setattr(gatt, "BleakClient", Recorded)
    told = Told()
    d = device(told, timeout=45.0)

    async def story() -> None:
        assert await d.write(b"\x01") == 1

    run(story)
    assert Recorded.timeouts == [45.0]
    assert told.events == [("state", True), ("state", False)]
    assert bluez.writes(pico.rx) == [b"\x01"]


def test_kept_connected_it_reads_every_poll_interval_and_reconnects_when_the_link_drops(
    bluez: FakeBlueZ, pico: Peripheral, paused: Paused
) -> None:
    told = Told()
    d = device(
        told,
        Settings(poll_interval=0.3, keep_connected=True,
                 characteristics=(Char(TEMPERATURE, "read"), Char(NUS_TX, "notify"))),
    )  # fmt: skip

    def reads() -> int:
        return told.events.count(("value", TEMPERATURE, temperature(2155)))

    async def story() -> None:
        task = asyncio.create_task(d.run())
        await async_wait_for(lambda: reads() >= 3, 10, "three reads on one link")
        assert d.sessions == 1 and paused.slept == []  # no poll sleep while connected
        bluez.notify(pico.tx, temperature(-500))
        await async_wait_for(
            lambda: ("value", NUS_TX, temperature(-500)) in told.events, 5, "a notification"
        )
        bluez.drop_connection(pico.device)
        await async_wait_for(lambda: d.sessions == 2, 15, "connected again")
        await stopped(d, task)

    run(story)
    lost = told.events.index(("error", "link_lost", "disconnected: the link was lost"))
    assert told.events[lost - 1] == ("state", False)
    assert told.events[lost + 1] == ("state", True)
    assert paused.slept == [1.0]  # the backoff after the loss; no poll sleep, even stopping
    assert told.events[-1] == ("state", False)  # stopped: disconnected, no error
    assert [e for e in told.events if e[0] == "error"] == [told.events[lost]]


def test_a_command_goes_over_the_open_link(
    bluez: FakeBlueZ, pico: Peripheral, paused: Paused
) -> None:
    told = Told()
    d = device(told, Settings(keep_connected=True, characteristics=(Char(BATTERY, "read"),)))

    async def story() -> None:
        task = asyncio.create_task(d.run())
        await async_wait_for(lambda: d.connected, 10, "connected")
        assert await d.write(b"led on") == 6
        await stopped(d, task)

    run(story)
    assert bluez.writes(pico.rx) == [b"led on"]
    assert bluez.calls(pico.device).count("Connect") == 1  # no session of its own


def test_a_command_to_a_device_not_connected_opens_a_session_of_its_own(
    bluez: FakeBlueZ, pico: Peripheral
) -> None:
    told = Told()
    d = device(told)

    async def story() -> None:
        assert await d.write(b"\x01\x02") == 2

    run(story)
    assert bluez.writes(pico.rx) == [b"\x01\x02"]
    assert told.events == [("state", True), ("state", False)]
    assert not d.connected and d.client is None and d.sessions == 1


def test_a_command_that_cannot_be_written_raises_with_the_device_and_reason(
    bluez: FakeBlueZ, pico: Peripheral
) -> None:
    told = Told()
    no_command = device(told, Settings(command_uuid=None))
    with pytest.raises(OSError, match=r"^pico: no command_uuid configured$"):
        run(lambda: no_command.write(b"x"))
    bluez.fail_method(
        pico.rx, "org.bluez.GattCharacteristic1", "WriteValue", "aya{sv}", "",
        "org.bluez.Error.NotPermitted",
    )  # fmt: skip
    d = device(told)
    with pytest.raises(OSError, match=r"^pico: gatt_error: .*injected"):
        run(lambda: d.write(b"x"))
    assert told.events == [("state", True), ("state", False)]  # disconnected all the same


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (TimeoutError(), "timeout"),
        (BleakError("Device with address D0:00:00:00:00:21 was not found."), "not_found"),
        (BleakError("disconnected: the link was lost"), "link_lost"),
        (BleakError("Not connected"), "link_lost"),
        (BleakError("[org.bluez.Error.Failed] Operation failed"), "gatt_error"),
    ],
)
def test_each_error_is_counted_under_its_reason(exc: BaseException, reason: str) -> None:
    assert error_reason(exc) == reason
