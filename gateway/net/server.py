"""The asyncio shell: listeners as ``asyncio.Protocol``s around the pure broker core.

This is the only place sockets live. Each received chunk goes straight into the
core; output the core produced is written once per loop iteration per
connection (write coalescing); the core's next deadline arms one loop timer.
Transport flow control (``pause_writing``) is reported to the core, which then
applies its slow-consumer policy instead of growing buffers.

TLS and WebSocket listeners (``gateway.net.tls``, ``gateway.net.websocket``, imported
only when configured) put their handshake in front of the same ``MQTTProtocol``.
Password checks the core hands out run here, in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast

from gateway.broker.core import Broker
from gateway.broker.state import Connection, State
from gateway.net.endpoint import LINGER_SECONDS, Endpoint

if TYPE_CHECKING:
    from gateway.broker.state import LoginAttempt
    from gateway.net.settings import TLSOptions

log = logging.getLogger("ledge.net")

#: Listener types: MQTT over TCP, over TLS, over WebSockets, over WebSockets over TLS.
KINDS: Final = ("tcp", "tls", "websocket", "websocket-tls")

#: Password checks waiting for the worker threads; more are refused (server busy).
MAX_PENDING_CHECKS: Final = 64


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    host: str
    port: int
    name: str = ""
    kind: str = "tcp"
    #: The HTTP path of a WebSocket listener.
    path: str = "/mqtt"
    tls: TLSOptions | None = None

    @property
    def label(self) -> str:
        return self.name or f"{self.host}:{self.port}"


class MQTTProtocol(asyncio.Protocol):
    """One TCP connection: bytes to the core, the core's bytes back out."""

    __slots__ = ("_linger", "_stash", "conn", "listener", "server", "transport")

    def __init__(self, server: Server, listener: str) -> None:
        self.server = server
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.conn: Connection | None = None
        self._linger: asyncio.TimerHandle | None = None
        #: Input read while reads are paused, for the resume (see ``data_received``).
        self._stash: bytes | None = None

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
        identity = None
        peercert = transport.get_extra_info("peercert")
        if peercert:  # a TLS client certificate, verified against the listener's CA
            from gateway.net.tls import common_name

            identity = common_name(peercert)
        conn = server.broker.open_connection(peer_text, self.listener, server.loop.time(), identity)
        if conn is None:
            transport.abort()  # beyond the pool and its refusal slots
            return
        conn.handle = self
        self.conn = conn
        server.protocols.add(self)
        if server.reading_paused:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            return
        server = self.server
        if server.reading_paused:
            # pause_reading() in connection_made does not stop the first read on every
            # event loop: keep what slipped through (one read) until reads resume.
            self._stash = data if self._stash is None else self._stash + data
            if self.transport is not None:
                self.transport.pause_reading()
            return
        server.broker.data_received(conn, data, server.loop.time())

    def resume(self) -> None:
        """Reads resume: what was kept goes in first."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        stash, self._stash = self._stash, None
        if stash is not None and self.conn is not None:
            self.server.broker.data_received(self.conn, stash, self.server.loop.time())
        transport.resume_reading()

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
        if not server.protocols:
            server.all_closed.set()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.server.broker.set_writable(self.conn, False, self.server.loop.time())

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.server.broker.set_writable(self.conn, True, self.server.loop.time())


class Server:
    """Owns the listeners and drives the core's output and timers: the core calls
    ``after_event`` (its wake-up hook) whenever an event it handled is over."""

    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        broker.wake = self.after_event
        self.loop = loop
        self._flushing = False
        self.listeners: list[asyncio.Server] = []
        self.protocols: set[MQTTProtocol] = set()
        self.all_closed = asyncio.Event()
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        #: Called after every event the core handled (the app seals store batches here).
        self.after_core: Callable[[], None] | None = None
        self.reading_paused = False
        self.endpoints: dict[str, Endpoint] = {}
        self._executor: Executor | None = None
        self._checking = 0

    async def listen(self, spec: ListenerSpec) -> list[tuple[str, int]]:
        """Start a listener; returns the bound addresses (port 0 picks a free port)."""
        label = spec.label
        context = None
        if spec.tls is not None:
            from gateway.net.tls import server_context

            context = server_context(spec.tls)
        endpoint = self.endpoints[label] = Endpoint(
            label, spec.kind, spec.path, context, self.broker, self.loop
        )
        factory: Callable[[], asyncio.Protocol]
        if spec.kind in ("websocket", "websocket-tls"):
            from gateway.net.websocket import WebSocketProtocol

            def factory() -> asyncio.Protocol:
                return WebSocketProtocol(endpoint, MQTTProtocol(self, label))
        else:

            def factory() -> asyncio.Protocol:
                return MQTTProtocol(self, label)

        accept = factory
        if spec.kind in ("tls", "websocket-tls"):
            from gateway.net.tls import TLSProtocol

            def accept() -> asyncio.Protocol:
                return TLSProtocol(endpoint, factory())

        server = await self.loop.create_server(
            accept, spec.host, spec.port, reuse_address=True, backlog=1024
        )
        self.listeners.append(server)
        bound = [sock.getsockname()[:2] for sock in server.sockets]
        scheme = {"tcp": "mqtt", "tls": "mqtts", "websocket": "ws", "websocket-tls": "wss"}
        for host, port in bound:
            log.info("listening on %s:%d (%s)", host, port, scheme[spec.kind])
        self.after_event()  # the core's timers ($SYS) were set before the loop ran
        return bound

    def update_listener(self, spec: ListenerSpec) -> None:
        """New connection-time settings for a running listener (a reload): its TLS
        context (certificates read again) and WebSocket path."""
        endpoint = self.endpoints[spec.label]
        if spec.tls is not None:
            from gateway.net.tls import server_context

            endpoint.context = server_context(spec.tls)
        endpoint.path = spec.path

    # ------------------------------------------------------------------ password checks

    def verify(self, attempt: LoginAttempt) -> None:
        """The core's verifier: run a password check in a worker thread (the hash is
        slow on purpose) and hand the outcome back on the loop."""
        if self._checking >= MAX_PENDING_CHECKS:
            self.broker.password_checked(attempt, None, self.loop.time())
            return
        if self._executor is None:
            import os
            from concurrent.futures import ThreadPoolExecutor

            # pbkdf2_hmac releases the GIL: two threads use two cores of a Pi.
            workers = min(2, os.cpu_count() or 1)
            self._executor = ThreadPoolExecutor(workers, thread_name_prefix="ledge-login")
        self._checking += 1
        future = self.loop.run_in_executor(self._executor, attempt.check.run)
        future.add_done_callback(lambda f: self._checked(attempt, f))

    def _checked(self, attempt: LoginAttempt, future: asyncio.Future[bool]) -> None:
        self._checking -= 1
        ok: bool | None = None
        if not future.cancelled() and future.exception() is None:
            ok = future.result()
        self.broker.password_checked(attempt, ok, self.loop.time())

    def after_event(self) -> None:
        """The core's wake-up hook: write what the core produced -- at once when a lot
        is waiting, else at the end of this loop iteration -- and arm the timer for the
        core's next deadline."""
        if self.after_core is not None:
            self.after_core()
        broker = self.broker
        if broker.urgent and not self._flushing:
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

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Write every dirty connection's output in one call; close those closing."""
        broker = self.broker
        sent = 0
        # A write may pause the transport (pause_writing -> the core -> after_event):
        # that must not start a second flush inside this one.
        self._flushing = True
        try:
            sent = self._write_dirty()
        finally:
            self._flushing = False
        broker.stats.bytes_sent += sent

    def _write_dirty(self) -> int:
        sent = 0
        for conn in self.broker.take_dirty():
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
        return sent

    def pause_reading(self, paused: bool) -> None:
        """Stop (or restart) reading from every client: back-pressure from the store."""
        if paused == self.reading_paused:
            return
        self.reading_paused = paused
        for proto in list(self.protocols):
            transport = proto.transport
            if transport is None or transport.is_closing():
                continue
            if paused:
                transport.pause_reading()
            else:
                proto.resume()
                if self.reading_paused:
                    return  # what a stash brought in put the store behind again

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
        for endpoint in self.endpoints.values():
            for transport in list(endpoint.pending):
                transport.abort()
        for server in self.listeners:
            await server.wait_closed()
        if self._timer is not None:
            self._timer.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
