"""TLS listeners: the server context, and the handshake as a bounded, timed step that
comes before any MQTT.

TLS runs in ``TLSProtocol`` over ``ssl.SSLObject`` and memory BIOs: a connection is
admitted to its handshake only while fewer than ``MAX_PENDING_HANDSHAKES`` are (the
rest are closed at once), the handshake must finish within ``connect_timeout``, and
only then does the connection get a slot in the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.net.server import linger_close

if TYPE_CHECKING:
    from gateway.net.server import Endpoint, Server

log = logging.getLogger("ledge.net")


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """What a TLS listener is configured with (mosquitto's option names)."""

    certfile: str
    keyfile: str
    cafile: str | None = None
    require_certificate: bool = False
    tls_version: str = "tlsv1.2"  # the minimum accepted


def server_context(settings: TLSSettings) -> ssl.SSLContext:
    """A server context: TLS 1.2 or newer, the certificate chain, and client
    certificates verified against ``cafile`` (required or optional)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if settings.tls_version == "tlsv1.3" else ssl.TLSVersion.TLSv1_2
    )
    # Client-initiated renegotiation only costs the server CPU.
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    context.load_cert_chain(settings.certfile, settings.keyfile)
    if settings.cafile is not None:
        context.load_verify_locations(settings.cafile)
        context.verify_mode = (
            ssl.CERT_REQUIRED if settings.require_certificate else ssl.CERT_OPTIONAL
        )
    return context


def common_name(peercert: Any) -> str | None:
    """The CN of a verified peer certificate (``SSLObject.getpeercert()``), or None."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class TLSProtocol(asyncio.Protocol):
    """One connection on a TLS listener: the handshake (bounded, timed), then records
    decrypted for an inner protocol (``MQTTProtocol`` or ``WebSocketProtocol``), which
    sees a ``TLSTransport``. TLS runs over memory BIOs, so every byte the socket
    delivers goes through it, whichever event loop runs."""

    def __init__(self, server: Server, endpoint: Endpoint, inner: asyncio.Protocol) -> None:
        self.server = server
        self.endpoint = endpoint
        self.inner = inner
        self.raw: asyncio.Transport | None = None
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls: ssl.SSLObject | None = None
        self.open = False
        self.closing = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw: asyncio.Transport = transport  # type: ignore[assignment]
        self.raw = raw
        if not self.endpoint.admit(raw, self.server):
            return
        context = self.endpoint.context
        assert context is not None
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self._timer = self.server.loop.call_later(
            self.server.broker.settings.connect_timeout, self._too_slow
        )

    def _too_slow(self) -> None:
        self._timer = None
        if self.raw is not None and not self.open:
            self._failed(TimeoutError("not completed in time"))

    def _failed(self, exc: BaseException) -> None:
        self.endpoint.failed_handshake(self.raw.get_extra_info("peername"), exc)  # type: ignore[union-attr]
        self._flush()  # the alert, if any
        self.closing = True
        assert self.raw is not None
        self.raw.abort()

    def _flush(self) -> None:
        data = self.outgoing.read()
        if data and self.raw is not None and not self.raw.is_closing():
            self.raw.write(data)

    def data_received(self, data: bytes) -> None:
        tls = self.tls
        if tls is None or (self.closing and not self.open):
            return
        self.incoming.write(data)
        if not self.open:
            try:
                tls.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                return
            except (ssl.SSLError, ValueError) as exc:
                self._failed(exc)
                return
            self._flush()
            self.open = True
            assert self.raw is not None
            self.endpoint.admitted(self.raw)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.inner.connection_made(TLSTransport(self, self.raw))
        self._read()

    def _read(self) -> None:
        tls = self.tls
        assert tls is not None
        inner = self.inner
        while not self.closing:
            try:
                chunk = tls.read(65_536)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the client's close_notify: it is done
                self.close()
                break
            except ssl.SSLError as exc:
                log.info("%s: TLS error from %s: %s", self.endpoint.label, self._peer(), exc)
                self.closing = True
                assert self.raw is not None
                self.raw.abort()
                break
            if not chunk:
                break
            inner.data_received(chunk)
        self._flush()  # session tickets, key updates

    def _peer(self) -> str:
        peer = self.raw.get_extra_info("peername") if self.raw is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        tls = self.tls
        if tls is None or self.closing:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[tls.write(view) :]
        except ssl.SSLError as exc:
            log.info("%s: TLS error writing to %s: %s", self.endpoint.label, self._peer(), exc)
            self.closing = True
            assert self.raw is not None
            self.raw.abort()
            return
        self._flush()

    def close(self) -> None:
        """Send close_notify, then end the TCP connection (lingering, as for plain TCP)."""
        raw = self.raw
        if raw is None or self.closing:
            return
        self.closing = True
        if self.tls is not None and self.open:
            with contextlib.suppress(ssl.SSLError):  # the peer's close_notify is not awaited
                self.tls.unwrap()
            self._flush()
        linger_close(raw, self.server.loop)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.open:
            self.inner.connection_lost(exc)
        elif self.raw is not None:
            self.endpoint.admitted(self.raw)

    def pause_writing(self) -> None:
        if self.open:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.open:
            self.inner.resume_writing()


class TLSTransport(asyncio.Transport):
    """What the inner protocol sees: writes are encrypted onto the real transport."""

    def __init__(self, tls: TLSProtocol, raw: asyncio.Transport) -> None:
        super().__init__()
        self._tls = tls
        self._raw = raw

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._tls.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._tls.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self._tls.close()

    def abort(self) -> None:
        self._tls.closing = True
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._tls.closing or self._raw.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        tls = self._tls.tls
        if name == "peercert":
            return tls.getpeercert() if tls is not None else default
        if name == "ssl_object":
            return tls
        if name == "cipher":
            return tls.cipher() if tls is not None else default
        return self._raw.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()
