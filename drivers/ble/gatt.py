"""GATT devices: connect, read or subscribe, disconnect; reconnect with backoff.

Thin glue around bleak's ``BleakClient``. Connections are bounded by a semaphore
shared by every GATT device (``gatt_concurrency``, one by default: a Pi's radio
handles one connection attempt well, several badly). Each session has a deadline.

Per device, a session is: connect, read the ``read`` characteristics, subscribe to
the ``notify`` ones and wait (up to the timeout) until each has sent one value,
disconnect; then wait ``poll_interval``. With ``keep_connected`` the device stays
connected (holding its slot), reads repeat every ``poll_interval`` and notifications
flow until the link drops; then it reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from bleak import BleakClient
from bleak.backends.device import BLEDevice
from bleak.exc import BleakError

from drivers.parsers.ble.gatt import FieldSpec

log = logging.getLogger("ledge.ble.gatt")

GATT_ERRORS = (BleakError, TimeoutError, EOFError, OSError, AssertionError, KeyError)


class Characteristic(Protocol):
    """A characteristic to read or subscribe to, and the values in its bytes (the
    gateway's ``[[ble.characteristics]]``)."""

    @property
    def uuid(self) -> str: ...
    @property
    def mode(self) -> str: ...  # "read" (every poll) or "notify"
    @property
    def fields(self) -> Sequence[FieldSpec]: ...


class GattSettings(Protocol):
    """What a GATT device's config says (the gateway's ``[[ble]]`` device)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str | None: ...
    @property
    def characteristics(self) -> Sequence[Characteristic]: ...
    @property
    def poll_interval(self) -> float: ...
    @property
    def keep_connected(self) -> bool: ...
    @property
    def command_uuid(self) -> str | None: ...
    @property
    def command_response(self) -> bool: ...


#: on_value(characteristic, value bytes); on_state(connected); on_error(reason, text)
OnValue = Callable[[Characteristic, bytes], None]
OnState = Callable[[bool], None]
OnError = Callable[[str, str], None]


def error_reason(exc: BaseException) -> str:
    """A short code for counting: timeout, not_found, gatt_error, link_lost."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    text = str(exc).lower()
    if "not found" in text:
        return "not_found"
    if "disconnect" in text or "not connected" in text:
        return "link_lost"
    return "gatt_error"


class GattDevice:
    """One device reached over GATT."""

    def __init__(
        self,
        settings: GattSettings,
        adapter: str,
        slots: asyncio.Semaphore,
        timeout: float,
        reconnect: tuple[float, float],
        on_value: OnValue,
        on_state: OnState,
        on_error: OnError,
    ) -> None:
        self.settings = settings
        self.adapter = adapter
        self.slots = slots
        self.timeout = timeout
        self.reconnect_min, self.reconnect_max = reconnect
        self.on_value = on_value
        self.on_state = on_state
        self.on_error = on_error
        #: The last advert's device object (saves a scan when connecting).
        self.ble_device: BLEDevice | None = None
        self.client: BleakClient | None = None
        self.connected = False
        self.sessions = 0
        self._lost: asyncio.Event | None = None
        self._stopping = False

    @property
    def name(self) -> str:
        return self.settings.name

    async def run(self) -> None:
        """Sessions until stopped; never raises for device trouble."""
        delay = self.reconnect_min
        while not self._stopping:
            try:
                await self._session()
            except GATT_ERRORS as exc:
                if self._stopping:
                    break
                self.on_error(error_reason(exc), str(exc) or type(exc).__name__)
                pause = delay * random.uniform(0.8, 1.2)  # backoff with jitter
                delay = min(delay * 2, self.reconnect_max)
                await asyncio.sleep(pause)
                continue
            delay = self.reconnect_min
            if not self.settings.keep_connected:
                await asyncio.sleep(self.settings.poll_interval)

    def _target(self) -> BLEDevice | str:
        if self.ble_device is not None:
            return self.ble_device
        return self.settings.address or ""  # the config requires one for GATT

    async def _connect(self) -> BleakClient:
        lost = self._lost = asyncio.Event()
        client = BleakClient(
            self._target(),
            disconnected_callback=lambda c: lost.set(),
            timeout=self.timeout,
            bluez={"adapter": self.adapter},
        )
        async with asyncio.timeout(self.timeout):
            await client.connect()
        self.client = client
        self.connected = True
        self.sessions += 1
        self.on_state(True)
        return client

    async def _disconnect(self, client: BleakClient) -> None:
        self.client = None
        if self.connected:
            self.connected = False
            self.on_state(False)
        with contextlib.suppress(*GATT_ERRORS):
            async with asyncio.timeout(self.timeout):
                await client.disconnect()

    async def _session(self) -> None:
        s = self.settings
        reads = [c for c in s.characteristics if c.mode == "read"]
        notifies = [c for c in s.characteristics if c.mode == "notify"]
        async with self.slots:
            client = await self._connect()
            try:
                heard = {c.uuid: asyncio.Event() for c in notifies}
                for char in notifies:
                    await client.start_notify(char.uuid, self._notified(char, heard[char.uuid]))
                await self._read(client, reads)
                assert self._lost is not None
                if s.keep_connected:
                    await self._stay(client, reads)
                elif notifies:
                    async with asyncio.timeout(self.timeout):
                        for event in heard.values():
                            await event.wait()
            finally:
                await self._disconnect(client)

    async def _read(self, client: BleakClient, reads: list[Characteristic]) -> None:
        for char in reads:
            async with asyncio.timeout(self.timeout):
                data = await client.read_gatt_char(char.uuid)
            self.on_value(char, bytes(data))

    async def _stay(self, client: BleakClient, reads: list[Characteristic]) -> None:
        """Connected until the link drops: reads every poll interval, notifications flow."""
        lost = self._lost
        assert lost is not None
        while not lost.is_set() and not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_interval):
                    await lost.wait()
            if not lost.is_set() and reads:
                await self._read(client, reads)
        if not self._stopping:
            raise BleakError("disconnected: the link was lost")

    def _notified(
        self, char: Characteristic, event: asyncio.Event
    ) -> Callable[[Any, bytearray], None]:
        def handler(_sender: Any, data: bytearray) -> None:
            event.set()
            self.on_value(char, bytes(data))

        return handler

    async def write(self, data: bytes) -> int:
        """Write a command to ``command_uuid``: on the open connection, or in a session of
        its own. Raises OSError with the reason."""
        uuid = self.settings.command_uuid
        if uuid is None:
            raise OSError(f"{self.name}: no command_uuid configured")
        try:
            client = self.client
            if client is not None and client.is_connected:
                async with asyncio.timeout(self.timeout):
                    await client.write_gatt_char(
                        uuid, data, response=self.settings.command_response
                    )
                return len(data)
            async with self.slots:
                client = await self._connect()
                try:
                    async with asyncio.timeout(self.timeout):
                        await client.write_gatt_char(
                            uuid, data, response=self.settings.command_response
                        )
                finally:
                    await self._disconnect(client)
        except GATT_ERRORS as exc:
            raise OSError(
                f"{self.name}: {error_reason(exc)}: {exc or type(exc).__name__}"
            ) from None
        return len(data)

    def stop(self) -> None:
        self._stopping = True
        if self._lost is not None:
            self._lost.set()
