"""The asyncio shell: listeners as ``asyncio.Protocol``s around the pure broker core.

This is the only place sockets live. Each received chunk goes straight into the
core; output the core produced is written once per loop iteration per
connection (write coalescing); the core's next deadline arms one loop timer.
Transport flow control (``pause_writing``) is reported to the core, which then
applies its slow-consumer policy instead of growing buffers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from gateway.broker.connection import Connection, State
from gateway.broker.core import Broker

log = logging.getLogger("ledge.net")


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    host: str
    port: int
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or f"{self.host}:{self.port}"


#: After the broker's last packet on a connection (a DISCONNECT, a refusing CONNACK),
#: how long the write side stays shut while input is read and discarded before the
#: socket closes. Closing with unread input makes the kernel send RST, which can
#: destroy that last packet before the client reads it ("lingering close").
LINGER_SECONDS = 2.0


class MQTTProtocol(asyncio.Protocol):
    """One TCP connection: bytes to the core, the core's bytes back out."""

    __slots__ = ("_linger", "conn", "listener", "server", "transport")

    def __init__(self, server: Server, listener: str) -> None:
        self.server = server
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.conn: Connection | None = None
        self._linger: asyncio.TimerHandle | None = None

    def finish(self) -> None:
        """Our side is done: shut the write side, drain input briefly, then close."""
        transport = self.transport
        if transport is None or self._linger is not None:
            return
        if transport.can_write_eof():
            transport.write_eof()
            # If the peer never reads, its data will not flush: give up after the linger.
            self._linger = self.server.loop.call_later(LINGER_SECONDS, transport.abort)
        else:
            transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        server = self.server
        peer = transport.get_extra_info("peername")
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        limit = server.broker.settings.max_outbound_bytes
        transport.set_write_buffer_limits(high=limit, low=limit // 4)
        conn = server.broker.open_connection(peer_text, self.listener, server.loop.time())
        if conn is None:
            transport.abort()  # beyond the pool and its refusal slots
            return
        conn.handle = self
        self.conn = conn
        server.protocols.add(self)
        if server.reading_paused:
            transport.pause_reading()
        server.after_event()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            return
        server = self.server
        server.broker.data_received(conn, data, server.loop.time())
        server.after_event()

    def eof_received(self) -> bool:
        return False  # the peer is done: close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        server = self.server
        server.protocols.discard(self)
        conn = self.conn
        self.conn = None
        if conn is not None:
            server.broker.connection_lost(conn, server.loop.time())
        self.transport = None
        server.after_event()
        if not server.protocols:
            server.all_closed.set()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.server.broker.set_writable(self.conn, False, self.server.loop.time())

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.server.broker.set_writable(self.conn, True, self.server.loop.time())
            self.server.after_event()


class Server:
    """Owns the listeners and drives the core's output and timers."""

    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.listeners: list[asyncio.Server] = []
        self.protocols: set[MQTTProtocol] = set()
        self.all_closed = asyncio.Event()
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        #: Called after every event the core handled (the app seals store batches here).
        self.after_core: Callable[[], None] | None = None
        self.reading_paused = False

    async def listen(self, spec: ListenerSpec) -> list[tuple[str, int]]:
        """Start a TCP listener; returns the bound addresses (port 0 picks a free port)."""
        server = await self.loop.create_server(
            lambda: MQTTProtocol(self, spec.label),
            spec.host,
            spec.port,
            reuse_address=True,
            backlog=1024,
        )
        self.listeners.append(server)
        bound = [sock.getsockname()[:2] for sock in server.sockets]
        for host, port in bound:
            log.info("listening on %s:%d (mqtt)", host, port)
        self.after_event()
        return bound

    def after_event(self) -> None:
        """Write what the core produced -- at once when a lot is waiting, else at the end
        of this loop iteration -- and arm the timer for the core's next deadline."""
        if self.after_core is not None:
            self.after_core()
        broker = self.broker
        if broker.urgent:
            self.flush()
        elif broker.dirty and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._scheduled_flush)
        deadline = self.broker.next_deadline()
        if deadline is not None and (self._timer is None or deadline < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.broker.tick(self.loop.time())
        self.after_event()

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Write every dirty connection's output in one call; close those closing."""
        broker = self.broker
        sent = 0
        for conn in broker.take_dirty():
            chunks = conn.take_output()
            proto = conn.handle
            transport = proto.transport if isinstance(proto, MQTTProtocol) else None
            if transport is None or transport.is_closing():
                continue
            if chunks:
                if len(chunks) == 1:
                    transport.write(chunks[0])
                    sent += len(chunks[0])
                else:
                    data = b"".join(chunks)
                    transport.write(data)
                    sent += len(data)
            if conn.state is State.CLOSING and isinstance(proto, MQTTProtocol):
                if conn.abort:
                    transport.abort()
                else:
                    proto.finish()
        broker.stats.bytes_sent += sent

    def pause_reading(self, paused: bool) -> None:
        """Stop (or restart) reading from every client: back-pressure from the store."""
        if paused == self.reading_paused:
            return
        self.reading_paused = paused
        for proto in self.protocols:
            transport = proto.transport
            if transport is not None and not transport.is_closing():
                if paused:
                    transport.pause_reading()
                else:
                    transport.resume_reading()

    async def close(self, grace: float = 5.0) -> None:
        """Stop listening, tell clients, and wait (bounded) for connections to close."""
        for server in self.listeners:
            server.close()
        self.broker.shutdown(self.loop.time())
        self.flush()
        if self.protocols:
            self.all_closed.clear()
            try:
                await asyncio.wait_for(self.all_closed.wait(), grace)
            except TimeoutError:
                for proto in list(self.protocols):
                    if proto.transport is not None:
                        proto.transport.abort()
        for server in self.listeners:
            await server.wait_closed()
        if self._timer is not None:
            self._timer.cancel()
