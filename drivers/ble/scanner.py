"""BLE scanning transport: bleak's ``BleakScanner`` on one adapter, plus a D-Bus watch on
BlueZ itself. Thin: adverts go to a callback untouched; decisions live elsewhere.

``scanning = "auto"`` scans actively when a configured device needs it (its values come
in scan responses, which passive scanning never asks for: Govee); otherwise it asks
BlueZ whether the adapter offers passive scanning (the
``org.bluez.AdvertisementMonitorManager1`` interface with ``or_patterns``). It logs
which mode it chose and why. If the chosen mode cannot start, the other is tried and
the log says so: the scanner is never left stopped without a line saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from bleak import BleakScanner
from bleak.args.bluez import BlueZScannerArgs, OrPattern
from bleak.assigned_numbers import AdvertisementDataType
from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData
from bleak.exc import BleakError
from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

log = logging.getLogger("ledge.ble")

BLUEZ = "org.bluez"
ADAPTER_IFACE = "org.bluez.Adapter1"
MONITOR_MANAGER_IFACE = "org.bluez.AdvertisementMonitorManager1"
OBJECT_MANAGER_IFACE = "org.freedesktop.DBus.ObjectManager"
PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"

#: Errors a scanner start or stop can end in when BlueZ or the adapter misbehaves.
SCAN_ERRORS = (BleakError, OSError, EOFError, TimeoutError, AssertionError, KeyError)

AdvertCallback = Callable[[BLEDevice, AdvertisementData], None]


class BlueZ:
    """Our own connection to the system bus: BlueZ's presence, the adapter's
    interfaces and power."""

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self.path = f"/org/bluez/{adapter}"
        self.bus: MessageBus | None = None
        self.on_bluez: Callable[[bool], None] = lambda present: None
        self.on_adapter: Callable[[bool], None] = lambda present: None

    async def connect(self) -> None:
        if self.bus is not None and self.bus.connected:
            return
        bus = MessageBus(bus_type=BusType.SYSTEM)
        await bus.connect()
        bus.add_message_handler(self._signal)
        for rule in (
            f"type='signal',interface='org.freedesktop.DBus',member='NameOwnerChanged',"
            f"arg0='{BLUEZ}'",
            f"type='signal',interface='{OBJECT_MANAGER_IFACE}',member='InterfacesAdded',"
            "arg0path='/org/bluez/'",
            f"type='signal',interface='{OBJECT_MANAGER_IFACE}',member='InterfacesRemoved',"
            "arg0path='/org/bluez/'",
        ):
            await self._call(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                             "org.freedesktop.DBus", "AddMatch", "s", [rule])  # fmt: skip
        self.bus = bus

    def close(self) -> None:
        if self.bus is not None:
            self.bus.disconnect()
            self.bus = None

    def _signal(self, msg: Message) -> bool:
        if msg.message_type != MessageType.SIGNAL:
            return False
        if msg.member == "NameOwnerChanged" and msg.body and msg.body[0] == BLUEZ:
            self.on_bluez(bool(msg.body[2]))
        elif msg.member == "InterfacesAdded" and msg.body[0] == self.path:
            if ADAPTER_IFACE in msg.body[1]:
                self.on_adapter(True)
        elif (
            msg.member == "InterfacesRemoved"
            and msg.body[0] == self.path
            and ADAPTER_IFACE in msg.body[1]
        ):
            self.on_adapter(False)
        return False

    @staticmethod
    async def _call(
        bus: MessageBus,
        destination: str,
        path: str,
        interface: str,
        member: str,
        signature: str = "",
        body: list[Any] | None = None,
    ) -> Any:
        reply = await bus.call(
            Message(
                destination=destination,
                path=path,
                interface=interface,
                member=member,
                signature=signature,
                body=body or [],
            )
        )
        assert reply is not None
        if reply.message_type == MessageType.ERROR:
            raise BleakError(f"{member}: {reply.error_name}: {reply.body[0] if reply.body else ''}")
        return reply.body

    async def adapter_interfaces(self) -> dict[str, dict[str, Any]] | None:
        """The adapter's interfaces and properties; None when it does not exist."""
        await self.connect()
        assert self.bus is not None
        body = await self._call(self.bus, BLUEZ, "/", OBJECT_MANAGER_IFACE, "GetManagedObjects")
        found: dict[str, dict[str, Any]] | None = body[0].get(self.path)
        return found

    async def passive_support(self) -> tuple[bool, str]:
        """Whether passive scanning can work here, and why (for the log)."""
        interfaces = await self.adapter_interfaces()
        if interfaces is None:
            raise BleakError(f"adapter {self.adapter} not found")
        manager = interfaces.get(MONITOR_MANAGER_IFACE)
        if manager is None:
            return False, (
                "BlueZ offers no AdvertisementMonitorManager1 on this adapter "
                "(passive scanning needs BlueZ >= 5.56 with --experimental and Linux >= 5.10)"
            )
        types = manager.get("SupportedMonitorTypes")
        values = types.value if isinstance(types, Variant) else types
        if values is not None and "or_patterns" not in list(values):
            return False, "the adapter's advertisement monitor does not support or_patterns"
        return True, "BlueZ offers AdvertisementMonitorManager1 with or_patterns on this adapter"

    async def set_powered(self, on: bool) -> None:
        await self.connect()
        assert self.bus is not None
        await self._call(
            self.bus,
            BLUEZ,
            self.path,
            PROPERTIES_IFACE,
            "Set",
            "ssv",
            [ADAPTER_IFACE, "Powered", Variant("b", on)],
        )


class Scanner:
    """bleak's scanner on one adapter, in the mode configured (or found)."""

    def __init__(
        self,
        adapter: str,
        scanning: str,
        patterns: list[tuple[int, int, bytes]],
        on_advert: AdvertCallback,
        needs_active: str = "",
    ) -> None:
        self.adapter = adapter
        self.scanning = scanning
        self.patterns = patterns
        #: Why the configured devices need active scanning ("": they do not).
        self.needs_active = needs_active
        self.on_advert = on_advert
        self.bluez = BlueZ(adapter)
        self.scanner: BleakScanner | None = None
        self.mode = ""  # the mode in use: "passive" or "active"
        self.running = False
        self._lock = asyncio.Lock()

    async def _choose(self) -> tuple[str, str]:
        if self.scanning != "auto":
            return self.scanning, "configured"
        if self.needs_active:
            return "active", self.needs_active
        try:
            passive, why = await self.bluez.passive_support()
        except SCAN_ERRORS as exc:
            return "active", f"cannot ask BlueZ about passive scanning ({exc})"
        return ("passive" if passive else "active"), why

    def _make(self, mode: str) -> BleakScanner:
        args: BlueZScannerArgs = {"adapter": self.adapter}
        if mode == "passive":
            args["or_patterns"] = [
                OrPattern(start, AdvertisementDataType(kind), data)
                for start, kind, data in self.patterns
            ]
        return BleakScanner(self.on_advert, scanning_mode=mode, bluez=args)  # type: ignore[arg-type]

    async def start(self) -> None:
        """Start scanning; raises (BleakError and others) when neither mode starts."""
        async with self._lock:
            await self._start()

    async def _start(self) -> None:
        mode, why = await self._choose()
        if mode == "passive" and not self.patterns:
            mode, why = "active", "no configured format has a passive-scanning pattern"
        try:
            scanner = self._make(mode)
            await scanner.start()
        except SCAN_ERRORS as first:
            other = "active" if mode == "passive" else "passive"
            if other == "passive" and (self.scanning == "active" or not self.patterns):
                raise
            log.warning(
                "ble %s: %s scanning did not start (%s); trying %s scanning",
                self.adapter,
                mode,
                first,
                other,
            )
            scanner = self._make(other)
            await scanner.start()  # raises: the caller counts and retries
            why = f"{mode} scanning failed to start: {first}"
            mode = other
        self.scanner = scanner
        if mode != self.mode:
            log.info("ble %s: %s scanning (%s)", self.adapter, mode, why)
        self.mode = mode
        self.running = True

    async def _stop(self) -> None:
        scanner, self.scanner = self.scanner, None
        self.running = False
        if scanner is not None:
            with contextlib.suppress(*SCAN_ERRORS):
                await scanner.stop()

    async def stop(self) -> None:
        async with self._lock:
            await self._stop()

    async def restart(self) -> None:
        """Stop (ignoring errors: BlueZ may be gone) and start again."""
        async with self._lock:
            await self._stop()
            await self._start()

    async def power_cycle(self) -> None:
        """Adapter Powered off, then on, then scanning again."""
        async with self._lock:
            await self._stop()
            await self.bluez.set_powered(False)
            await self.bluez.set_powered(True)
            await self._start()

    def close(self) -> None:
        self.bluez.close()
