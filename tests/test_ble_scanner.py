"""The BLE scanner in this process: the real bleak against the mock BlueZ on the private
system bus (tests/fakes/fake_bluez.py), driven by ``drivers.ble.scanner`` directly.

tests/test_ble.py tells the same stories through a running gateway; these run the
scanner's code in the test's own process, where a planted bug (a mutant) is judged: the
mode chosen and the reason said, the fallback from one mode to the other, the adverts
handed over untouched, the adapter's power cycle and BlueZ's comings and goings."""

from __future__ import annotations

import asyncio
import logging
import re
import struct
from collections.abc import Callable, Coroutine, Iterator
from typing import TypeVar

import pytest
from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData
from bleak.exc import BleakError

from drivers.ble.scanner import BlueZ, Scanner
from drivers.parsers.ble import FORMATS, bthome, passive_patterns
from tests.support.bluez import BTHOME, FakeBlueZ
from tests.support.wait import async_wait_for

ADDRESS = "A4:C1:38:00:00:21"
HCI0 = "/org/bluez/hci0"
MONITOR_MANAGER = "org.bluez.AdvertisementMonitorManager1"
T = TypeVar("T")


def temperature(centi: int, packet: int = 1) -> bytes:
    return bthome.encode([(0x02, struct.pack("<h", centi))], packet_id=packet)


class Heard:
    """The scanner's callback: every advert as (address, BTHome service data)."""

    def __init__(self) -> None:
        self.adverts: list[tuple[str, bytes | None]] = []

    def __call__(self, device: BLEDevice, advert: AdvertisementData) -> None:
        self.adverts.append((device.address, advert.service_data.get(BTHOME)))


def scanner(scanning: str = "auto", *, patterns: bool = True, needs_active: str = "") -> Scanner:
    formats = [FORMATS["bthome"]] if patterns else []
    return Scanner("hci0", scanning, passive_patterns(formats), Heard(), needs_active)


def heard(s: Scanner) -> Heard:
    assert isinstance(s.on_advert, Heard)
    return s.on_advert


def run(story: Callable[[], Coroutine[object, object, T]]) -> T:
    return asyncio.run(story())


async def started(s: Scanner) -> None:
    """Started, then stopped and closed (in one event loop, as bleak needs)."""
    try:
        await s.start()
        assert s.running
        await s.stop()
    finally:
        s.close()


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    caplog.set_level(logging.INFO, logger="ledge.ble")
    yield lambda: [r.getMessage() for r in caplog.records if r.name == "ledge.ble"]


async def hears(bluez: FakeBlueZ, s: Scanner, centi: int) -> None:
    """A device advertises until the scanner hands its advert over, untouched."""
    payload = temperature(centi)
    path = bluez.add_device(ADDRESS, svc={BTHOME: payload})

    def arrived() -> bool:
        if (ADDRESS, payload) in heard(s).adverts:
            return True
        bluez.advertise(path, svc={BTHOME: payload})
        return False

    await async_wait_for(arrived, 10, f"the advert of {centi}")


def test_auto_scans_passively_where_bluez_offers_or_patterns_and_hands_adverts_over(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    s = scanner()

    async def story() -> None:
        await s.start()
        assert (s.mode, s.running) == ("passive", True)
        await hears(bluez, s, 2150)
        await s.stop()
        s.close()
        assert not s.running

    run(story)
    assert lines() == [
        "ble hci0: passive scanning (BlueZ offers AdvertisementMonitorManager1 with "
        "or_patterns on this adapter)"
    ]
    calls = bluez.calls(HCI0)
    assert "RegisterMonitor" in calls and "StartDiscovery" not in calls


def test_configured_active_scanning_starts_discovery(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    s = scanner("active")

    async def story() -> None:
        await s.start()
        assert (s.mode, s.running) == ("active", True)
        await hears(bluez, s, -1250)
        await s.stop()
        s.close()

    run(story)
    assert lines() == ["ble hci0: active scanning (configured)"]
    calls = bluez.calls(HCI0)
    assert "StartDiscovery" in calls and "RegisterMonitor" not in calls


def test_auto_scans_actively_when_a_configured_device_needs_scan_responses(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    why = "govee1 sends values in scan responses, which passive scanning never asks for"
    s = scanner(needs_active=why)
    run(lambda: started(s))
    assert s.mode == "active"
    assert lines() == [f"ble hci0: active scanning ({why})"]


def test_auto_without_a_passive_pattern_scans_actively(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    s = scanner(patterns=False)
    run(lambda: started(s))
    assert s.mode == "active"
    assert lines() == [
        "ble hci0: active scanning (no configured format has a passive-scanning pattern)"
    ]


def test_auto_scans_actively_where_bluez_has_no_advertisement_monitor(
    bluez_active_only: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    s = scanner()

    async def story() -> None:
        await s.start()
        await hears(bluez_active_only, s, 1900)
        await s.stop()
        s.close()

    run(story)
    assert s.mode == "active"
    assert lines() == [
        "ble hci0: active scanning (BlueZ offers no AdvertisementMonitorManager1 on this "
        "adapter (passive scanning needs BlueZ >= 5.56 with --experimental and Linux >= 5.10))"
    ]


def test_passive_scanning_that_does_not_start_falls_back_to_active_and_says_why(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    bluez.fail_method(HCI0, MONITOR_MANAGER, "RegisterMonitor", "o", "", "org.bluez.Error.Failed")
    s = scanner()

    async def story() -> None:
        await s.start()
        await hears(bluez, s, 2000)
        await s.stop()
        s.close()

    run(story)
    assert s.mode == "active"
    said = lines()
    assert len(said) == 2, said
    assert re.fullmatch(
        r"ble hci0: passive scanning did not start \(.*injected.*\); trying active scanning",
        said[0],
    ), said[0]
    assert re.fullmatch(
        r"ble hci0: active scanning \(passive scanning failed to start: .*injected.*\)", said[1]
    ), said[1]


def test_configured_active_scanning_that_does_not_start_raises_and_is_not_running(
    bluez: FakeBlueZ,
) -> None:
    bluez.fail_method(
        HCI0, "org.bluez.Adapter1", "StartDiscovery", "", "", "org.bluez.Error.Failed"
    )
    s = scanner("active")
    with pytest.raises(BleakError):
        run(lambda: started(s))
    assert not s.running and s.scanner is None
    assert "RegisterMonitor" not in bluez.calls(HCI0)  # no passive try: active was asked


def test_a_scanner_that_never_started_is_in_no_mode(bluez: FakeBlueZ) -> None:
    """The adapter's status (``mode``, beside its state) names the scanning mode in use:
    before the first start, and after a start that failed in every mode, there is none,
    rather than a mode the radio is not in."""
    bluez.fail_method(
        HCI0, "org.bluez.Adapter1", "StartDiscovery", "", "", "org.bluez.Error.Failed"
    )
    s = scanner("active")
    assert (s.mode, s.running) == ("", False)
    with pytest.raises(BleakError):
        run(lambda: started(s))
    assert (s.mode, s.running) == ("", False)


def test_a_power_cycle_turns_the_adapter_off_and_on_and_scans_again(bluez: FakeBlueZ) -> None:
    s = scanner()

    async def story() -> None:
        await s.start()
        await s.power_cycle()
        assert (s.mode, s.running) == ("passive", True)
        await hears(bluez, s, 1500)
        await s.stop()
        s.close()

    with bluez.watch_properties(HCI0) as seen:
        run(story)
        powered = re.findall(r'string "Powered"\s+variant\s+boolean (\w+)', seen())
    assert powered[:2] == ["false", "true"]
    assert bluez.property(HCI0, "org.bluez.Adapter1", "Powered")
    assert bluez.calls(HCI0).count("RegisterMonitor") == 2  # the start, after the cycle


def test_a_restart_scans_again(bluez: FakeBlueZ) -> None:
    s = scanner("active")

    async def story() -> None:
        await s.start()
        first = s.scanner
        await s.restart()
        assert s.running and s.scanner is not None and s.scanner is not first
        await hears(bluez, s, 1700)
        await s.stop()
        s.close()

    run(story)
    assert bluez.calls(HCI0).count("StartDiscovery") == 2


def test_bluez_and_the_adapter_leaving_and_coming_back_are_each_told(bluez: FakeBlueZ) -> None:
    watch = BlueZ("hci0")
    told: list[tuple[str, bool]] = []
    watch.on_bluez = lambda present: told.append(("bluez", present))
    watch.on_adapter = lambda present: told.append(("adapter", present))

    async def story() -> None:
        await watch.connect()
        await watch.connect()  # connected already: the same connection
        steps: list[tuple[Callable[[], object], tuple[str, bool]]] = [
            (bluez.remove_adapter, ("adapter", False)),
            (bluez.add_adapter, ("adapter", True)),
            (bluez.kill, ("bluez", False)),
            (lambda: bluez.spawn(adapter=None), ("bluez", True)),
        ]
        for act, expected in steps:
            act()
            await async_wait_for(lambda e=expected: e in told, 5, f"{expected}")  # type: ignore[misc]
        assert await watch.adapter_interfaces() is None  # BlueZ back, its adapter not yet
        with pytest.raises(BleakError, match="adapter hci0 not found"):
            await watch.passive_support()
        bluez.add_adapter()
        await async_wait_for(lambda: told.count(("adapter", True)) == 2, 5, "the adapter again")
        interfaces = await watch.adapter_interfaces()
        assert interfaces is not None and "org.bluez.Adapter1" in interfaces
        watch.close()

    run(story)
    assert told == [
        ("adapter", False), ("adapter", True), ("bluez", False), ("bluez", True),
        ("adapter", True),
    ]  # fmt: skip


def test_another_adapter_coming_and_going_is_not_told(bluez: FakeBlueZ) -> None:
    watch = BlueZ("hci0")
    told: list[bool] = []
    watch.on_adapter = told.append

    async def story() -> None:
        await watch.connect()
        bluez.add_adapter("hci1")
        bluez.remove_adapter("hci1")
        bluez.remove_adapter("hci0")  # a marker: this one is told
        await async_wait_for(lambda: told, 5, "hci0 removed")
        watch.close()

    run(story)
    assert told == [False]


def test_configured_passive_scanning_is_used_as_configured(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    s = scanner("passive")
    run(lambda: started(s))
    assert s.mode == "passive"
    assert lines() == ["ble hci0: passive scanning (configured)"]
    assert "StartDiscovery" not in bluez.calls(HCI0)


def test_an_adapter_monitor_without_or_patterns_means_active_scanning(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    mock = bluez.dbus.Interface(
        bluez.bus.get_object("org.bluez", HCI0), "org.freedesktop.DBus.Mock"
    )
    mock.UpdateProperties(
        MONITOR_MANAGER, {"SupportedMonitorTypes": bluez.dbus.Array(["other"], signature="s")}
    )
    s = scanner()
    run(lambda: started(s))
    assert s.mode == "active"
    assert lines() == [
        "ble hci0: active scanning (the adapter's advertisement monitor does not support "
        "or_patterns)"
    ]


def test_active_scanning_that_does_not_start_is_not_tried_passively_without_a_pattern(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    """``auto`` with no format that has a passive pattern: nothing to fall back to, the
    error raised is active scanning's."""
    bluez.fail_method(
        HCI0, "org.bluez.Adapter1", "StartDiscovery", "", "", "org.bluez.Error.Failed"
    )
    s = scanner(patterns=False)
    with pytest.raises(BleakError, match="injected"):
        run(lambda: started(s))
    assert not s.running
    assert "RegisterMonitor" not in bluez.calls(HCI0)
    assert lines() == []


def test_active_scanning_needed_but_not_starting_falls_back_to_passive(
    bluez: FakeBlueZ, lines: Callable[[], list[str]]
) -> None:
    bluez.fail_method(
        HCI0, "org.bluez.Adapter1", "StartDiscovery", "", "", "org.bluez.Error.Failed"
    )
    s = scanner(needs_active="govee1 needs it")
    run(lambda: started(s))
    assert s.mode == "passive"
    assert lines()[0].startswith("ble hci0: active scanning did not start (")
    assert lines()[1].startswith("ble hci0: passive scanning (active scanning failed to start: ")


def test_a_restart_stops_the_scan_before_starting_it_again(bluez: FakeBlueZ) -> None:
    s = scanner("active")

    async def story() -> None:
        await s.start()
        await s.restart()
        await s.stop()
        s.close()

    run(story)
    discovery = [c for c in bluez.calls(HCI0) if c in ("StartDiscovery", "StopDiscovery")]
    assert discovery == ["StartDiscovery", "StopDiscovery", "StartDiscovery", "StopDiscovery"]


def test_the_watch_connects_again_after_its_bus_connection_closed(bluez: FakeBlueZ) -> None:
    watch = BlueZ("hci0")
    told: list[bool] = []
    watch.on_adapter = told.append

    async def story() -> None:
        await watch.connect()
        first = watch.bus
        assert first is not None
        first.disconnect()
        await first.wait_for_disconnect()
        await watch.connect()
        assert watch.bus is not first and watch.bus is not None and watch.bus.connected
        bluez.remove_adapter()
        await async_wait_for(lambda: told, 5, "the adapter's removal")
        watch.close()

    run(story)
    assert told == [False]


def test_interfaces_added_to_the_adapter_other_than_adapter1_are_not_its_return(
    bluez: FakeBlueZ,
) -> None:
    import dbus
    import dbus.lowlevel

    watch = BlueZ("hci0")
    told: list[bool] = []
    watch.on_adapter = told.append

    def added(interface: str) -> None:
        msg = dbus.lowlevel.SignalMessage(
            "/", "org.freedesktop.DBus.ObjectManager", "InterfacesAdded"
        )
        msg.append(dbus.ObjectPath(HCI0), {interface: {}}, signature="oa{sa{sv}}")
        bluez.bus.send_message(msg)

    async def story() -> None:
        await watch.connect()
        added("org.bluez.Media1")
        added("org.bluez.Adapter1")  # a marker: this one is told
        await async_wait_for(lambda: told, 5, "Adapter1 added")
        watch.close()

    run(story)
    assert told == [True]


def test_a_refused_call_to_bluez_says_which_call_what_error_and_why(bluez: FakeBlueZ) -> None:
    bluez.fail_method(
        HCI0, "org.freedesktop.DBus.Properties", "Set", "ssv", "", "org.bluez.Error.Busy"
    )
    watch = BlueZ("hci0")

    async def story() -> None:
        try:
            with pytest.raises(BleakError) as refused:
                await watch.set_powered(False)
        finally:
            watch.close()
        assert str(refused.value) == "Set: org.bluez.Error.Busy: injected"

    run(story)


def test_auto_without_the_adapter_says_it_could_not_ask_about_passive_scanning(
    bluez: FakeBlueZ,
) -> None:
    bluez.remove_adapter()
    s = scanner()

    async def story() -> None:
        try:
            assert await s._choose() == (
                "active",
                "cannot ask BlueZ about passive scanning (adapter hci0 not found)",
            )
        finally:
            s.close()

    run(story)
