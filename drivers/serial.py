"""Serial transport: a device on a stable path, read without blocking the event loop.

Thin glue around pyserial: open the path (``/dev/serial/by-id/...`` survives
re-enumeration), register its file descriptor with the event loop, hand every
received chunk to ``on_data``; when the device goes away, close, tell
``on_state`` once, and try again with exponential backoff until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import serial

log = logging.getLogger("ledge.drivers.serial")

PARITIES = {
    "none": serial.PARITY_NONE,
    "even": serial.PARITY_EVEN,
    "odd": serial.PARITY_ODD,
    "mark": serial.PARITY_MARK,
    "space": serial.PARITY_SPACE,
}


@dataclass(frozen=True, slots=True)
class PortSettings:
    path: str
    baudrate: int = 9600
    bytesize: int = 8
    parity: str = "none"
    stopbits: float = 1
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0

    @property
    def label(self) -> str:
        return f"{self.baudrate} {self.bytesize}{self.parity[0].upper()}{self.stopbits:g}"


class SerialPort:
    """One serial device, reopened whenever it comes back."""

    def __init__(
        self,
        name: str,
        settings: PortSettings,
        on_data: Callable[[bytes], None],
        on_state: Callable[[bool], None],
    ) -> None:
        self.name = name
        self.settings = settings
        self.on_data = on_data
        self.on_state = on_state
        self.port: Any = None
        self.connected = False
        self._lost: asyncio.Event | None = None
        self._stopping = False
        self.bytes_read = 0

    # ------------------------------------------------------------------ life cycle

    async def run(self) -> None:
        """Keep the device open until ``stop``; never raises for device trouble."""
        loop = asyncio.get_running_loop()
        delay = self.settings.reconnect_min
        absent_logged = False
        while not self._stopping:
            try:
                self._open(loop)
            except (OSError, serial.SerialException) as exc:
                if not absent_logged:
                    log.warning(
                        "%s: cannot open %s (%s); retrying with backoff up to %g s",
                        self.name,
                        self.settings.path,
                        _reason(exc),
                        self.settings.reconnect_max,
                    )
                    absent_logged = True
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))  # backoff, with jitter
                delay = min(delay * 2, self.settings.reconnect_max)
                continue
            absent_logged = False
            delay = self.settings.reconnect_min
            log.info("%s: connected at %s (%s)", self.name, self.settings.path, self.settings.label)
            self.connected = True
            self.on_state(True)
            assert self._lost is not None
            await self._lost.wait()
            self.connected = False
            self.on_state(False)

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        s = self.settings
        port = serial.Serial(
            s.path,
            baudrate=s.baudrate,
            bytesize=s.bytesize,
            parity=PARITIES[s.parity],
            stopbits=s.stopbits,
            timeout=0,
            write_timeout=0,
            exclusive=True,
        )
        self.port = port
        self._lost = asyncio.Event()
        loop.add_reader(port.fileno(), self._readable)

    def _readable(self) -> None:
        port = self.port
        try:
            data = port.read(65536)
        except (OSError, serial.SerialException) as exc:
            self._close(f"read failed: {_reason(exc)}")
            return
        if not data:
            self._close("end of data, unplugged?")
            return
        self.bytes_read += len(data)
        self.on_data(data)

    def _close(self, reason: str) -> None:
        port = self.port
        if port is None:
            return
        self.port = None
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(port.fileno())
        with contextlib.suppress(OSError, serial.SerialException):
            port.close()
        if not self._stopping:
            log.warning("%s: disconnected from %s (%s)", self.name, self.settings.path, reason)
        if self._lost is not None:
            self._lost.set()

    def stop(self) -> None:
        self._stopping = True
        self._close("stopping")

    # ------------------------------------------------------------------ downlink

    def write(self, data: bytes) -> int:
        """Write what the device takes now, without waiting (the event loop must not):
        the bytes written, fewer than given when its buffer fills. Raises OSError when
        it takes none (flow control held, the buffer full) or is not there.

        Not through pyserial's ``write``: with ``write_timeout=0`` it retries a full
        buffer in a loop that never ends, and the whole gateway with it."""
        port = self.port
        if port is None:
            raise OSError(f"{self.name} is not connected")
        try:
            return os.write(port.fileno(), data)  # the port is opened non-blocking
        except BlockingIOError:
            raise OSError(f"{self.name}: the device is not taking data") from None
        except OSError as exc:
            self._close(f"write failed: {_reason(exc)}")
            raise OSError(f"{self.name}: write failed: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    text = str(exc)
    # pyserial's "read failed: [Errno 5] Input/output error": the system's words only
    return text.split("] ", 1)[-1] if "[Errno" in text else text
