"""A fake BlueZ for BLE tests: python-dbusmock on a private system bus, driven by the
real bleak inside Ledge (see tests/fakes/fake_bluez.py for why it is a fake: this
machine has no Bluetooth in its kernel, so bluetoothd cannot run).

Fixtures: ``system_bus`` (one private dbus-daemon per session; it sets
DBUS_SYSTEM_BUS_ADDRESS, which bleak and every ``ledge run`` started afterwards use)
and ``bluez`` (a fresh fake bluetoothd with adapter hci0 per test).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.wait import wait_for

TEMPLATE = str(Path(__file__).resolve().parents[1] / "fakes" / "fake_bluez.py")
BTHOME = "0000fcd2-0000-1000-8000-00805f9b34fb"


class FakeBlueZ:
    """Typed front for the fake_bluez.py template (which runs in the mock process)."""

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        import dbus

        self.dbus = dbus
        self.parameters = parameters
        self.bus = dbus.bus.BusConnection(os.environ["DBUS_SYSTEM_BUS_ADDRESS"])
        self.mock: Any = None
        self.spawn()

    def spawn(self, adapter: str | None = "hci0") -> None:
        from dbusmock.testcase import SpawnedMock

        # stdout to DEVNULL: the mock logs every call and would block on a full pipe.
        self.mock = SpawnedMock.spawn_with_template(
            TEMPLATE, self.parameters, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.ctl = self.dbus.Interface(self.mock.obj, "org.bluez.Mock")
        if adapter:
            self.add_adapter(adapter)

    def kill(self) -> None:
        """bluetoothd crashes: SIGKILL, so it says nothing on its way out."""
        proc = self.mock.process
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not self.owned(), 5, "org.bluez to leave the bus")

    def owned(self) -> bool:
        return bool(self.bus.name_has_owner("org.bluez"))

    def terminate(self) -> None:
        if self.mock is not None and self.mock.process.poll() is None:
            self.mock.terminate()

    def _adv(
        self, mfr: dict[int, bytes] | None, svc: dict[str, bytes] | None, uuids: list[str] | None
    ) -> tuple[Any, Any, Any]:
        d = self.dbus
        return (
            d.Dictionary(
                {d.UInt16(k): d.ByteArray(v) for k, v in (mfr or {}).items()}, signature="qay"
            ),
            d.Dictionary({k: d.ByteArray(v) for k, v in (svc or {}).items()}, signature="say"),
            d.Array(uuids or [], signature="s"),
        )

    def add_adapter(self, name: str = "hci0") -> str:
        return str(self.ctl.AddAdapter(name, "ledge-test"))

    def remove_adapter(self, name: str = "hci0") -> None:
        """The adapter is unplugged: BlueZ drops it and its devices."""
        self.ctl.RemoveAdapterWithDevices(name)

    def add_device(
        self,
        address: str,
        name: str = "",
        rssi: int = -60,
        mfr: dict[int, bytes] | None = None,
        svc: dict[str, bytes] | None = None,
        uuids: list[str] | None = None,
        adapter: str = "hci0",
    ) -> str:
        return str(self.ctl.AddLEDevice(adapter, address, name, rssi, *self._adv(mfr, svc, uuids)))

    def advertise(
        self,
        path: str,
        rssi: int = -60,
        mfr: dict[int, bytes] | None = None,
        svc: dict[str, bytes] | None = None,
        uuids: list[str] | None = None,
    ) -> None:
        self.ctl.Advertise(path, rssi, *self._adv(mfr, svc, uuids))

    def burst(self, paths: list[str], uuid: str, payloads: list[bytes]) -> None:
        d = self.dbus
        self.ctl.AdvertiseBurst(
            d.Array(paths, signature="o"),
            uuid,
            d.Array([d.ByteArray(p) for p in payloads], signature="ay"),
        )

    def start_traffic(self, paths: list[str], per_second: float, seconds: float) -> None:
        d = self.dbus
        self.ctl.StartTraffic(
            d.Array(paths, signature="o"), d.Double(per_second), d.Double(seconds)
        )

    def traffic_count(self) -> int:
        return int(self.ctl.TrafficCount())

    def beacon(self, path: str, interval_ms: int = 50) -> None:
        self.ctl.SetBeacon(path, self.dbus.UInt32(interval_ms))

    def add_service(self, device_path: str, handle: int, uuid: str) -> str:
        return str(self.ctl.AddGattService(device_path, self.dbus.UInt16(handle), uuid))

    def add_characteristic(
        self, service_path: str, handle: int, uuid: str, flags: list[str], value: bytes = b""
    ) -> str:
        d = self.dbus
        return str(
            self.ctl.AddGattCharacteristic(
                service_path,
                d.UInt16(handle),
                uuid,
                d.Array(flags, signature="s"),
                d.ByteArray(value),
            )
        )

    def notify(self, char_path: str, value: bytes) -> None:
        self.ctl.Notify(char_path, self.dbus.ByteArray(value))

    def writes(self, char_path: str) -> list[bytes]:
        return [bytes(w) for w in self.ctl.GetWrites(char_path)]

    def drop_connection(self, device_path: str) -> None:
        self.ctl.DropConnection(device_path)

    def property(self, path: str, interface: str, name: str) -> Any:
        obj = self.bus.get_object("org.bluez", path)
        return self.dbus.Interface(obj, "org.freedesktop.DBus.Properties").Get(interface, name)

    def calls(self, path: str) -> list[str]:
        """Methods the code under test called on a mock object, oldest first."""
        obj = self.bus.get_object("org.bluez", path)
        return [str(c[1]) for c in self.dbus.Interface(obj, "org.freedesktop.DBus.Mock").GetCalls()]

    @contextlib.contextmanager
    def watch_properties(self, path: str) -> Iterator[Callable[[], str]]:
        """What ``dbus-monitor`` sees of PropertiesChanged on ``path`` (property sets the
        code under test makes, which dbusmock does not put in its call log)."""
        rule = (
            "type='signal',interface='org.freedesktop.DBus.Properties',"
            f"member='PropertiesChanged',path='{path}'"
        )
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(
                ["dbus-monitor", "--address", os.environ["DBUS_SYSTEM_BUS_ADDRESS"], rule],
                stdout=out,
                stderr=subprocess.DEVNULL,
                text=True,
            )

            def seen() -> str:
                out.seek(0)
                return out.read()

            try:
                wait_for(
                    lambda: "NameAcquired" in seen() or "NameLost" in seen(), 5, "dbus-monitor"
                )
                yield seen
            finally:
                proc.terminate()
                proc.wait(5)

    def fail_method(
        self, path: str, interface: str, method: str, in_sig: str, out_sig: str, error: str
    ) -> None:
        """Make one method of one object fail with a BlueZ error name."""
        obj = self.bus.get_object("org.bluez", path)
        self.dbus.Interface(obj, "org.freedesktop.DBus.Mock").AddMethod(
            interface, method, in_sig, out_sig,
            f'raise dbus.exceptions.DBusException("injected", name="{error}")',
        )  # fmt: skip


@pytest.fixture(scope="session")
def system_bus() -> Iterator[object]:
    """A private dbus-daemon for the whole session; exports DBUS_SYSTEM_BUS_ADDRESS."""
    try:
        from dbusmock.testcase import BusType, PrivateDBus
    except ImportError:
        pytest.fail("python-dbusmock is not installed: run scripts/setup --test")
    with PrivateDBus(BusType.SYSTEM) as bus:
        yield bus


@pytest.fixture
def bluez(system_bus: object) -> Iterator[FakeBlueZ]:
    """A fresh fake bluetoothd with adapter hci0 (passive scanning available)."""
    fake = FakeBlueZ()
    yield fake
    fake.terminate()


@pytest.fixture
def bluez_active_only(system_bus: object) -> Iterator[FakeBlueZ]:
    """A fake bluetoothd without AdvertisementMonitorManager1 (no passive scanning)."""
    fake = FakeBlueZ({"enable_monitor_api": False})
    yield fake
    fake.terminate()
