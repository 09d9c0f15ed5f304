"""The firmware bridge's transports: UDP sockets and serial lines around the pure gateway.

Each configured ``[[mqttsn.udp]]`` is a datagram endpoint (IPv4 or IPv6 by its host),
each ``[[mqttsn.serial]]`` a pyserial port (``drivers.serial``, reopened with backoff
when unplugged) read through the COBS deframer. Whatever arrives goes to the gateway
logic (``gateway.mqttsn``) with the loop's time; what it answers is sent at the
end of the loop iteration; its next deadline arms one loop timer. Imported only when
``[mqttsn]`` has a transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import TYPE_CHECKING, Any, cast

from gateway.mqttsn.gateway import Gateway
from gateway.mqttsn.settings import MqttSnSerialSettings, MqttSnSettings, UdpSettings
from gateway.mqttsn.state import BROADCAST, Address, TransportPolicy
from gateway.mqttsn.uart import Deframer, FrameError, encode_frame

if TYPE_CHECKING:
    from drivers.serial import SerialPort
    from gateway.broker.acl import Acl
    from gateway.net.server import Server

log = logging.getLogger("ledge.mqttsn")

#: Kernel receive buffer asked for each UDP socket (bytes).
RECEIVE_BUFFER = 4 * 1024 * 1024


class UdpEndpoint(asyncio.DatagramProtocol):
    """One UDP socket of the firmware bridge."""

    def __init__(self, shell: MqttSnShell, settings: UdpSettings) -> None:
        self.shell = shell
        self.settings = settings
        self.label = settings.label
        self.transport: asyncio.DatagramTransport | None = None
        self.broadcast: list[tuple[str, int]] = []
        self.send_errors = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return
        if sock.family == socket.AF_INET and self.settings.broadcast:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        # A burst from many devices must not overflow the kernel's queue (each datagram
        # costs about 1 KiB of it): ask for RECEIVE_BUFFER, beyond net.core.rmem_max
        # when allowed (root), else as much as the system gives.
        force = getattr(socket, "SO_RCVBUFFORCE", None)
        try:
            if force is None:
                raise PermissionError
            sock.setsockopt(socket.SOL_SOCKET, force, RECEIVE_BUFFER)
        except PermissionError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.shell.received(self.label, addr, data)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable from a device that went away, and the like.
        log.debug("%s: %s", self.label, exc)

    def send(self, address: Address, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        targets: list[Any] = self.broadcast if address == BROADCAST else [address]
        for target in targets:
            try:
                transport.sendto(data, target)
            except OSError as exc:  # pragma: no cover - depends on the network
                self.send_errors += 1
                if self.send_errors & (self.send_errors - 1) == 0:
                    log.warning("%s: cannot send to %s: %s", self.label, target, exc)


class SerialEndpoint:
    """One serial line carrying COBS frames (firmware-bridge/UART.md)."""

    def __init__(self, shell: MqttSnShell, settings: MqttSnSerialSettings) -> None:
        from drivers.serial import PortSettings, SerialPort

        self.shell = shell
        self.settings = settings
        self.label = settings.label
        self.deframer = Deframer(shell.settings.max_message_size)
        self.port: SerialPort = SerialPort(
            settings.name,
            PortSettings(settings.path, settings.baudrate),
            self._data,
            self._state,
        )
        self.dropped = 0

    def _data(self, data: bytes) -> None:
        for item in self.deframer.feed(data):
            if isinstance(item, FrameError):
                self.shell.malformed(self.label, self.settings.path, item.reason, item.offset)
            else:
                self.shell.received(self.label, self.settings.path, item)

    def _state(self, connected: bool) -> None:
        self.deframer.reset()

    def send(self, address: Address, data: bytes) -> None:
        frame = encode_frame(data)
        try:
            written = self.port.write(frame)
        except OSError:
            written = 0
        if written < len(frame):
            # Not connected, or the line is not taking data: a frame cut short would
            # corrupt the next one, so the receiver is resynchronised with a delimiter.
            self.dropped += 1
            if written:
                with contextlib.suppress(OSError):
                    self.port.write(b"\x00")
            if self.dropped & (self.dropped - 1) == 0:
                log.warning(
                    "%s: frame not sent (device absent or not reading; %d so far)",
                    self.label,
                    self.dropped,
                )


class MqttSnShell:
    """The firmware bridge in the running gateway."""

    def __init__(self, server: Server, settings: MqttSnSettings, acl: Acl | None = None) -> None:
        self.server = server
        self.loop = server.loop
        self.settings = settings
        policies = [
            TransportPolicy(u.label, frozenset(u.allow_client_ids), bool(u.broadcast))
            for u in settings.udp
        ] + [TransportPolicy(s.label, frozenset(s.allow_client_ids), True) for s in settings.serial]
        self.gateway = Gateway(
            server.broker, settings, policies, acl=acl, now=self.loop.time(), kick=self._kick
        )
        server.broker.sys_sources.append(self.gateway.sys_values)
        self.endpoints: dict[str, UdpEndpoint | SerialEndpoint] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    async def start(self) -> list[tuple[str, int]]:
        """Open every transport; returns the bound UDP addresses (port 0: any free one).
        OSError when a socket cannot be bound."""
        bound: list[tuple[str, int]] = []
        for udp in self.settings.udp:
            endpoint = UdpEndpoint(self, udp)
            family = socket.AF_INET6 if ":" in udp.host else socket.AF_INET
            await self.loop.create_datagram_endpoint(
                lambda e=endpoint: e,  # type: ignore[misc]
                local_addr=(udp.host, udp.port),
                family=family,
            )
            assert endpoint.transport is not None
            host, port = endpoint.transport.get_extra_info("sockname")[:2]
            endpoint.broadcast = [_target(text, port) for text in udp.broadcast]
            self.endpoints[udp.label] = endpoint
            bound.append((host, port))
            log.info("listening on %s:%d (mqtt-sn over udp)", host, port)
        for serial in self.settings.serial:
            endpoint_s = SerialEndpoint(self, serial)
            self.endpoints[serial.label] = endpoint_s
            task = self.loop.create_task(endpoint_s.port.run(), name=f"mqttsn {serial.name}")
            self._tasks.append(task)
            log.info("mqtt-sn over serial on %s (%d baud)", serial.path, serial.baudrate)
        self._arm()
        return bound

    # ------------------------------------------------------------------ events

    def received(self, transport: str, address: Address, data: bytes) -> None:
        # One event of the core: whatever the datagram causes for MQTT clients is
        # written once it is handled (the core wakes the server when it ends).
        broker = self.server.broker
        with broker.event:
            self.gateway.received(transport, address, data, self.loop.time())
        self._arm()

    def malformed(self, transport: str, address: Address, reason: str, offset: int) -> None:
        self.gateway.malformed(transport, address, reason, offset, self.loop.time())

    def committed(self, upto: int) -> None:
        """The store committed batches up to ``upto``: held acknowledgements may go."""
        self.gateway.committed(upto)

    def _kick(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        endpoints = self.endpoints
        for transport, address, data in self.gateway.take_output():
            endpoint = endpoints.get(transport)
            if endpoint is not None:
                endpoint.send(address, data)
        self._arm()

    def _arm(self) -> None:
        deadline = self.gateway.next_deadline()
        if deadline is not None and (self._timer is None or deadline < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        broker = self.server.broker
        with broker.event:
            self.gateway.tick(self.loop.time())
        self._arm()

    # ------------------------------------------------------------------ stop

    async def close(self) -> None:
        self.gateway.shutdown(self.loop.time())
        self._flush()
        if self._timer is not None:
            self._timer.cancel()
        for endpoint in self.endpoints.values():
            if isinstance(endpoint, UdpEndpoint):
                if endpoint.transport is not None:
                    endpoint.transport.close()
            else:
                endpoint.port.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _target(text: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6]:port`` -> an address to send to."""
    host, sep, port_text = text.rpartition(":")
    if not sep or "]" in port_text or (host.count(":") and not host.startswith("[")):
        return text.strip("[]"), default_port
    return host.strip("[]"), int(port_text)
