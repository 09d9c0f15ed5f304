"""The HTTP listener: a small, bounded, read-only HTTP/1.1 server (``[http]``).

It serves what the app hands it (``/metrics``, ``/api/status``, the status page) and
nothing else: no files, so no path can reach the file system. Requests are parsed by
h11 (sans-IO, the shape of our MQTT codec) under an ``asyncio.Protocol``; with a
certificate configured, the connection runs through the same ``TLSProtocol`` as the
MQTT listeners. Every resource is bounded, each bound with its answer:

- connections: at most ``max_connections`` at once, a share of them for connections
  without a complete request, a few per address; a newcomer beyond a budget gets the
  slot of the oldest connection waiting for a request, which is closed
  (``gateway.net.http_admission``); when every connection is being answered, 503;
- request head (request line and headers): at most ``max_header_bytes``, else 431;
- time: the head must arrive within ``request_timeout`` of its first byte (slowloris:
  408, closed), an idle keep-alive connection is closed after ``keepalive_timeout``,
  and after ``max_requests`` requests a connection is closed;
- methods: GET and HEAD (405 otherwise), no request body (413), origin-form targets
  only (400); unknown paths 404;
- authentication (optional): a mosquitto-format password file (Basic; the hash is
  checked in a worker thread, failures slow down per address as for MQTT logins, 429
  while an address waits) or a bearer token; 401 otherwise.

This module is imported only when ``[http]`` is enabled.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Final, cast

import h11

from gateway.broker.auth import PasswordAuthenticator, PasswordCheck
from gateway.broker.logins import LoginThrottle, address_key
from gateway.broker.ratelog import RateLimitedLog
from gateway.net.endpoint import MAX_PENDING_HANDSHAKES, Endpoint, linger_close
from gateway.net.http_admission import (
    ADDRESS_FULL,
    LISTENER_FULL,
    REASONS,
    Admission,
    Budgets,
    Eviction,
)

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from gateway.net.http_settings import HTTPSettings
    from gateway.net.server import Server

log = logging.getLogger("ledge.http")

#: Password checks waiting for the worker thread; more are answered 503.
MAX_PENDING_CHECKS: Final = 8
#: Verified credentials remembered (a hash of the header, never the password), and for
#: how long: a scraper with Basic authentication costs one slow hash per minute, not
#: one per scrape. Policy: least recently used forgotten.
CREDENTIAL_CACHE: Final = 16
CREDENTIAL_TTL: Final = 60.0
#: Output a client may leave unread before the server stops reading its requests.
WRITE_HIGH: Final = 256 * 1024
#: A bearer token shorter than this is refused (it would be guessable).
MIN_TOKEN_LENGTH: Final = 16
#: How a HEAD request starts.
_HEAD: Final = b"HEAD "


def read_token(path: Path) -> str:
    """The bearer token in ``path``: its first line, without surrounding blanks."""
    lines = path.read_text(encoding="utf-8").strip().splitlines()
    return lines[0].strip() if lines else ""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


#: The application: a request path (no query) -> a response, or None for 404.
Handler = Callable[[str], Response | None]


@dataclass(slots=True)
class HTTPStats:
    """What the listener counts (read by the metrics collector)."""

    accepted: int = 0
    #: Every connection being answered (of the listener, or of the newcomer's
    #: address), or over the TLS handshake bound.
    refused: int = 0
    #: Connections closed to make room for a newcomer, by reason (``REASONS``).
    evicted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    timeouts: int = 0  # slow or unfinished request heads
    auth_failures: int = 0
    #: Responses by status code (a handful of codes, so bounded).
    responses: dict[int, int] = field(default_factory=dict)


class Credentials:
    """Who may read: users of a password file (Basic) and/or one bearer token."""

    def __init__(
        self, users: PasswordAuthenticator | None = None, token: str | None = None
    ) -> None:
        self.users = users
        self._token = None if token is None else hashlib.sha256(token.encode()).digest()
        self._salt = os.urandom(16)
        self._verified: OrderedDict[bytes, float] = OrderedDict()

    @property
    def required(self) -> bool:
        return self.users is not None or self._token is not None

    def challenge(self) -> str:
        schemes = []
        if self.users is not None:
            schemes.append('Basic realm="ledge", charset="UTF-8"')
        if self._token is not None:
            schemes.append('Bearer realm="ledge"')
        return ", ".join(schemes)

    def key(self, header: bytes) -> bytes:
        return hashlib.sha256(self._salt + header).digest()

    def token_ok(self, header: bytes) -> bool | None:
        """True/False for a bearer token; None when the header is not one."""
        scheme, _, value = header.partition(b" ")
        if scheme.lower() != b"bearer" or self._token is None:
            return None
        return hmac.compare_digest(hashlib.sha256(value.strip()).digest(), self._token)

    def basic(self, header: bytes) -> PasswordCheck | None:
        """The password check for a Basic header (None: not a usable Basic header)."""
        scheme, _, value = header.partition(b" ")
        if scheme.lower() != b"basic" or self.users is None:
            return None
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(b":")
        if not sep:
            return None
        verdict = self.users.check("", user.decode("utf-8", "replace"), password)
        return verdict if isinstance(verdict, PasswordCheck) else None

    def remembered(self, key: bytes, now: float) -> bool:
        until = self._verified.get(key)
        if until is None or until < now:
            return False
        self._verified.move_to_end(key)
        return True

    def remember(self, key: bytes, now: float) -> None:
        self._verified[key] = now + CREDENTIAL_TTL
        self._verified.move_to_end(key)
        while len(self._verified) > CREDENTIAL_CACHE:
            self._verified.popitem(last=False)


class HTTPEndpoint(Endpoint):
    """The TLS handshake bound of an HTTPS listener (counted here, not as MQTT refusals)."""

    __slots__ = ("stats",)

    def __init__(self, server: HTTPServer) -> None:
        from gateway.net.tls import server_context

        shell = server.shell
        super().__init__(
            "http", "tls", "/", server_context(server.settings), shell.broker, shell.loop
        )
        self.stats = server.stats

    def admit(self, transport: asyncio.Transport) -> bool:
        if len(self.pending) >= MAX_PENDING_HANDSHAKES:
            self.stats.refused += 1
            transport.abort()
            return False
        self.pending.add(transport)
        return True


class _Door:
    """The listening socket's protocol factory: it makes each new connection for the
    ``HTTPServer`` that owns the socket now (a reload that keeps the address hands the
    socket to the new server: no moment without a listener, no connection refused)."""

    __slots__ = ("server",)

    def __init__(self, server: HTTPServer) -> None:
        self.server = server

    def __call__(self) -> asyncio.Protocol:
        return self.server.protocol()


class HTTPServer:
    """One HTTP listener and its connections.

    ``previous``: the listener this one replaces (a reload changed ``[http]``). The
    counters and the failed-login slowdown carry on from it, and on the same host
    and port its listening socket is taken over when this one listens."""

    def __init__(
        self,
        shell: Server,
        settings: HTTPSettings,
        handler: Handler,
        credentials: Credentials | None = None,
        previous: HTTPServer | None = None,
    ) -> None:
        self.shell = shell
        self.loop = shell.loop
        self.settings = settings
        self.handler = handler
        self.credentials = credentials or Credentials()
        self.stats: HTTPStats = previous.stats if previous is not None else HTTPStats()
        self.throttle: LoginThrottle = (
            previous.throttle if previous is not None else LoginThrottle(1024)
        )
        self.previous = previous
        #: Every connection with a transport: those in a slot, and those closing.
        self.protocols: set[HTTPProtocol] = set()
        self.admission: Admission[HTTPProtocol] = Admission(
            Budgets(
                settings.max_connections,
                settings.unfinished_share,
                settings.max_connections_per_address,
                settings.unfinished_grace,
            )
        )
        #: Connections that had their answer and linger to close (``linger_close``):
        #: they hold no slot; at most ``max_connections`` (policy: oldest aborted).
        self.lingering: OrderedDict[HTTPProtocol, None] = OrderedDict()
        #: Lines about refused and evicted connections, at a bounded rate per address.
        self.refusals = RateLimitedLog(log)
        self.addresses: list[tuple[str, int]] = []
        self._listener: asyncio.Server | None = None
        self._door: _Door | None = None
        self._endpoint: HTTPEndpoint | None = None
        self._executor: Executor | None = None
        self._checking = 0

    def protocol(self) -> asyncio.Protocol:
        """A new connection's protocol (through TLS for HTTPS)."""
        if self._endpoint is not None:
            from gateway.net.tls import TLSProtocol

            return TLSProtocol(self._endpoint, HTTPProtocol(self))
        return HTTPProtocol(self)

    async def listen(self) -> list[tuple[str, int]]:
        """Open the listener (OSError: it cannot, e.g. the port is taken; a TLS file
        that does not load fails here too, before anything is opened). On the host and
        port of ``previous`` its socket is taken over instead; it then owns none and
        its ``close`` closes only its connections."""
        s = self.settings
        if s.https:
            self._endpoint = HTTPEndpoint(self)
        previous = self.previous
        if (
            previous is not None
            and previous._door is not None
            and (previous.settings.host, previous.settings.port) == (s.host, s.port)
        ):
            self._listener, self._door = previous._listener, previous._door
            previous._listener = previous._door = None
            self._door.server = self
        else:
            door = _Door(self)
            self._listener = await self.loop.create_server(
                door, s.host, s.port, reuse_address=True, backlog=64
            )
            self._door = door
        self.previous = None  # only the counters are kept from it
        assert self._listener is not None
        self.addresses = [sock.getsockname()[:2] for sock in self._listener.sockets]
        scheme = "https" if s.https else "http"
        for host, port in self.addresses:
            log.info("listening on %s:%d (%s)", host, port, scheme)
        if not self.credentials.required and s.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning(
                "http: %s:%d serves metrics and status without authentication "
                "(set http.password_file or http.token_file)",
                s.host,
                s.port,
            )
        return self.addresses

    async def close(self) -> None:
        self._door = None
        if self._listener is not None:
            self._listener.close()
        for proto in list(self.protocols):
            proto.abort()
        if self._endpoint is not None:
            for transport in list(self._endpoint.pending):
                transport.abort()
        if self._listener is not None:
            await self._listener.wait_closed()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def update_tls(self, settings: HTTPSettings) -> None:
        """New TLS options for an HTTPS listener (a reload): the files are read again,
        so a renewed certificate serves the connections that come next."""
        from gateway.net.tls import server_context

        assert self._endpoint is not None
        self._endpoint.context = server_context(settings)
        self.settings = settings

    def count(self, status: int) -> None:
        self.stats.responses[status] = self.stats.responses.get(status, 0) + 1

    # ------------------------------------------------------------------ slots

    def admit(self, proto: HTTPProtocol) -> bool:
        """A slot for a new connection, closing others as the budgets say (counted,
        logged at a bounded rate); False: refused."""
        now = self.loop.time()
        verdict = self.admission.admit(proto, proto.address, now)
        for eviction in verdict.evicted:
            self._evicted(eviction, proto.address, now)
        if verdict.refused is None:
            self.protocols.add(proto)
            self.stats.accepted += 1
            return True
        self.stats.refused += 1
        s = self.settings
        why = (
            f"its {s.max_connections_per_address} connections "
            "(http.max_connections_per_address) are all being answered"
            if verdict.refused == ADDRESS_FULL
            else f"all {s.max_connections} connections (http.max_connections) are being answered"
        )
        self.refusals(
            now,
            proto.address,
            "http: refusing a connection from %s with 503: %s (%d refused so far)",
            proto.address,
            why,
            self.stats.refused,
        )
        return False

    def _evicted(self, eviction: Eviction[HTTPProtocol], newcomer: str, now: float) -> None:
        stats, s = self.stats, self.settings
        stats.evicted[eviction.reason] += 1
        slot = eviction.slot
        if eviction.reason == ADDRESS_FULL:
            why = (
                f"{slot.address} has {s.max_connections_per_address} connections "
                "(http.max_connections_per_address)"
            )
        elif eviction.reason == LISTENER_FULL:
            why = f"all {s.max_connections} connections (http.max_connections) are taken"
        else:
            why = (
                f"{self.admission.unfinished + 1} connections without a complete request "
                f"hold {self.admission.budgets.max_unfinished} of {s.max_connections} "
                "slots (http.unfinished_share)"
            )
        self.refusals(
            now,
            slot.address,
            "http: closing a connection from %s, %s for %.1f s (open %.1f s), to admit "
            "%s: %s (%d closed so far)",
            slot.address,
            slot.phase.value,
            now - slot.since,
            now - slot.opened,
            newcomer,
            why,
            sum(stats.evicted.values()),
        )
        eviction.key.evict()

    def release(self, proto: HTTPProtocol) -> None:
        """``proto`` is closing: its slot is free; it lingers (bounded) until closed."""
        self.admission.leave(proto)
        if proto.transport is None:
            return
        self.lingering[proto] = None
        while len(self.lingering) > self.settings.max_connections:
            oldest, _ = self.lingering.popitem(last=False)
            oldest.abort()

    def lost(self, proto: HTTPProtocol) -> None:
        """``proto``'s transport is gone."""
        self.admission.leave(proto)
        self.lingering.pop(proto, None)
        self.protocols.discard(proto)

    # ------------------------------------------------------------------ authentication

    def authorize(self, proto: HTTPProtocol, header: bytes | None) -> Verdict:
        """``OK``, ``WAIT`` (a password check runs; ``proto`` hears back), or the refusal
        to answer with. Wrong credentials slow their address down as failed MQTT logins
        do: while its delay runs, it gets 429 without a check."""
        creds = self.credentials
        if not creds.required:
            return OK
        if header is None:
            return Refusal(401, (("www-authenticate", creds.challenge()),), keep=True)
        now = self.loop.time()
        record, _evicted = self.throttle.record(proto.address, now)
        if now < record.until:
            return Refusal(429, (("retry-after", str(max(1, int(record.until - now + 0.999)))),))
        token = creds.token_ok(header)
        if token:
            return OK
        key = creds.key(header)
        if creds.remembered(key, now):
            return OK
        check = creds.basic(header) if token is None else None
        if check is None:
            return self._failed(proto, now)
        if self._checking >= MAX_PENDING_CHECKS:
            return Refusal(503, (("retry-after", "1"),))
        self._checking += 1
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ledge-http-login")
        future = self.loop.run_in_executor(self._executor, check.run)
        future.add_done_callback(lambda f: self._checked(proto, key, f))
        return WAIT

    def _checked(self, proto: HTTPProtocol, key: bytes, future: asyncio.Future[bool]) -> None:
        self._checking -= 1
        now = self.loop.time()
        ok = not future.cancelled() and future.exception() is None and future.result()
        if ok:
            record = self.throttle.get(proto.address)
            if record is not None:
                self.throttle.succeeded(record)
            self.credentials.remember(key, now)
            proto.decided(OK)
        else:
            proto.decided(self._failed(proto, now))

    def _failed(self, proto: HTTPProtocol, now: float) -> Refusal:
        self.stats.auth_failures += 1
        record, _evicted = self.throttle.record(proto.address, now)
        settings = self.shell.broker.settings
        self.throttle.failed(
            record, now, settings.failed_login_delay, settings.failed_login_delay_max
        )
        return Refusal(401, (("www-authenticate", self.credentials.challenge()),), keep=True)


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    headers: tuple[tuple[str, str], ...] = ()
    #: The connection may carry on (the client can try again on it).
    keep: bool = False


OK: Final = "ok"
WAIT: Final = "wait"
Verdict = Refusal | str


def _request_start(data: bytes) -> bytes:
    """The first bytes of a request, after the empty lines a client may send before
    it (RFC 9112 2.2; h11 refuses those with 400): enough to tell a HEAD."""
    return data.lstrip(b"\r\n")[: len(_HEAD)]


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


class HTTPProtocol(asyncio.Protocol):
    """One HTTP connection: h11 parses, the server's handler answers, bounds apply."""

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.conn = h11.Connection(
            h11.SERVER, max_incomplete_event_size=server.settings.max_header_bytes
        )
        self.address = ""
        self.requests = 0
        #: A request is being answered (an authentication check runs): input waits.
        self.busy: h11.Request | None = None
        self.closing = False
        self._write_paused = False
        self._timer: asyncio.TimerHandle | None = None
        #: The current request head has started arriving (its time limit runs).
        self._started = False
        #: Its first bytes: a HEAD request that h11 could not read is still answered as
        #: one, without a body.
        self._prefix = b""

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        server = self.server
        peer = transport.get_extra_info("peername")
        self.address = address_key(f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer))
        if not server.admit(self):
            server.protocols.add(self)
            server.count(503)
            transport.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n"
                b"retry-after: 1\r\nconnection: close\r\n\r\n"
            )
            self._close()
            return
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        self._arm(server.settings.request_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.lost(self)
        self._cancel_timer()
        self.transport = None
        self.closing = True

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.transport is not None and self.busy is None and not self.closing:
            self.transport.resume_reading()
            self._process()

    def abort(self) -> None:
        self.closing = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    def evict(self) -> None:
        """Closed to make room for a newcomer (its slot is taken already): nothing to
        say to it, the socket is freed at once."""
        self.abort()

    # ------------------------------------------------------------------ timers

    def _arm(self, seconds: float) -> None:
        self._cancel_timer()
        self._timer = self.server.loop.call_later(seconds, self._timed_out)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.closing or self.busy is not None:
            return
        if self._started or self.conn.their_state is not h11.IDLE:
            # Slowloris: the request head did not arrive in time.
            self.server.stats.timeouts += 1
            self._send_error(408)
        else:
            self._close()  # an idle keep-alive connection

    # ------------------------------------------------------------------ input

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if not self._started and data:
            self._started = True
            self._arm(self.server.settings.request_timeout)
            self.server.admission.request_started(self, self.server.loop.time())
        if len(self._prefix) < len(_HEAD):
            self._prefix = _request_start(self._prefix + data)
        self.conn.receive_data(data)
        if self.busy is None:
            self._process()

    def _process(self) -> None:
        while not self.closing and self.busy is None and not self._write_paused:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._send_error(exc.error_status_hint)  # no request read: see _prefix
                return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:
                self._next_cycle()
                continue
            if isinstance(event, h11.Request):
                self._request(event)
            elif isinstance(event, h11.EndOfMessage):
                # The request is read to its end (h11 reports it after the head, once
                # our answer may already be sent): the keep-alive wait starts now.
                self._next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _request(self, request: h11.Request) -> None:
        self.requests += 1
        self.server.admission.answering(self)
        # h11 bounds only a head that arrives in pieces; one that arrives whole is
        # measured here (request line and header lines, as sent).
        size = len(request.method) + len(request.target) + 12
        size += sum(len(name) + len(value) + 4 for name, value in request.headers)
        if size > self.server.settings.max_header_bytes:
            self._send_error(431, request=request)
            return
        if request.http_version not in (b"1.0", b"1.1"):
            self._send_error(505, request=request)
            return
        method = request.method
        if method not in (b"GET", b"HEAD"):
            self._send_error(405, (("allow", "GET, HEAD"),), request=request)
            return
        if any(
            name == b"transfer-encoding" or (name == b"content-length" and value != b"0")
            for name, value in request.headers
        ):
            self._send_error(413, request=request)  # nothing here takes a body
            return
        if not request.target.startswith(b"/"):
            self._send_error(400, request=request)  # origin-form only (RFC 9112 3.2.1)
            return
        auth = None
        for name, value in request.headers:
            if name == b"authorization":
                auth = value
        self.busy = request
        verdict = self.server.authorize(self, auth)
        if verdict == WAIT:
            self._cancel_timer()
            if self.transport is not None:
                self.transport.pause_reading()
            return
        self._conclude(request, verdict)

    def decided(self, verdict: Verdict) -> None:
        """The password check of the waiting request is done: answer, then read on."""
        request = self.busy
        if request is None or self.closing:
            return
        self._conclude(request, verdict)
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()
            self._process()

    def _conclude(self, request: h11.Request, verdict: Verdict) -> None:
        if isinstance(verdict, Refusal):
            status = verdict.status
            body = f"{status} {_reason(status).decode()}\n".encode()
            self._send(
                Response(status, body, headers=verdict.headers),
                request.method == b"HEAD",
                close=not verdict.keep,
            )
        else:
            self._answer(request)

    def _answer(self, request: h11.Request) -> None:
        path = request.target.split(b"?", 1)[0].decode("ascii", "replace")
        try:
            response = self.server.handler(path)
        except Exception:
            log.exception("http: %s failed", path)
            response = Response(500, b"internal error\n")
        if response is None:
            response = Response(404, b"not found\n")
        self._send(response, request.method == b"HEAD")

    # ------------------------------------------------------------------ output

    def _send(
        self, response: Response, head: bool, close: bool = False, *, read: bool = True
    ) -> None:
        """Answer: ``head`` leaves the body out. ``read`` says h11 read the request; a
        HEAD it did not read is not one to h11, which would frame a body (that many
        bytes after a Content-Length, or a chunked one after an earlier HTTP/1.1
        request on the connection): its answer ends after the head, with the
        connection (RFC 9110 9.3.2: no content, whatever the header fields say)."""
        transport = self.transport
        self.busy = None
        if transport is None or self.closing:
            return
        self.server.count(response.status)
        close = close or self.requests >= self.server.settings.max_requests or not read
        headers = [
            ("content-type", response.content_type),
            ("content-length", str(len(response.body))),
            ("cache-control", "no-store"),
            ("x-content-type-options", "nosniff"),
            *response.headers,
        ]
        if close:
            headers.append(("connection", "close"))
        conn = self.conn
        try:
            data = conn.send(
                h11.Response(
                    status_code=response.status, headers=headers, reason=_reason(response.status)
                )
            )
            if not head and response.body:
                data = (data or b"") + (conn.send(h11.Data(data=response.body)) or b"")
            if read or not head:
                data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            self._close()
            return
        transport.write(data)
        if close or conn.our_state is h11.MUST_CLOSE:
            self._close()
            return
        self._next_cycle()

    def _next_cycle(self) -> None:
        conn = self.conn
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            pending = conn.trailing_data[0]
            self._started = bool(pending)
            self._prefix = _request_start(pending)
            now = self.server.loop.time()
            if self._started:
                self.server.admission.request_started(self, now)
            else:
                self.server.admission.idle(self, now)
            self._arm(
                self.server.settings.request_timeout
                if self._started
                else self.server.settings.keepalive_timeout
            )
        elif conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            self._close()

    def _send_error(
        self,
        status: int,
        headers: tuple[tuple[str, str], ...] = (),
        *,
        request: h11.Request | None = None,
    ) -> None:
        """A request that breaks a rule: answer and close. ``request``: what h11 read
        of it (None: it could not, or the head never finished); a HEAD request gets
        its answer without a body either way."""
        if self.closing or self.transport is None:
            return
        read = request is not None
        head = (request.method if request is not None else self._prefix.rstrip()) == b"HEAD"
        body = f"{status} {_reason(status).decode()}\n".encode()
        self._send(Response(status, body, headers=headers), head, close=True, read=read)
        self._close()

    def _close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self._cancel_timer()
        if self.transport is not None:
            linger_close(self.transport, self.server.loop)
        self.server.release(self)
