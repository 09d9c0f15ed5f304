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
from typing import Any

from gateway.net.endpoint import Endpoint, linger_close
from gateway.net.layer import Layer, LayerTransport

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


class TLSProtocol(Layer):
    """One connection on a TLS listener: the handshake (bounded, timed), then records
    decrypted for an inner protocol (``MQTTProtocol`` or ``WebSocketProtocol``), which
    sees a ``TLSTransport``. TLS runs over memory BIOs, so every byte the socket
    delivers goes through it, whichever event loop runs."""

    def __init__(self, endpoint: Endpoint, inner: asyncio.Protocol) -> None:
        super().__init__(endpoint, inner)
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls: ssl.SSLObject | None = None

    def start(self) -> None:
        context = self.endpoint.context
        assert context is not None
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)

    def timed_out(self) -> None:
        self._failed(TimeoutError("not completed in time"))

    def transport(self, raw: asyncio.Transport) -> LayerTransport:
        return TLSTransport(self, raw)

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
            self.opened()
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
                self.end()
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

    def end(self) -> None:
        """Send close_notify, then end the TCP connection (lingering, as for plain TCP)."""
        raw = self.raw
        if raw is None or self.closing:
            return
        self.closing = True
        if self.tls is not None and self.open:
            with contextlib.suppress(ssl.SSLError):  # the peer's close_notify is not awaited
                self.tls.unwrap()
            self._flush()
        linger_close(raw, self.loop)


class TLSTransport(LayerTransport):
    """What the inner protocol sees: writes are encrypted onto the real transport."""

    _layer: TLSProtocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        tls = self._layer.tls
        if name == "peercert":
            return tls.getpeercert() if tls is not None else default
        if name == "ssl_object":
            return tls
        if name == "cipher":
            return tls.cipher() if tls is not None else default
        return self._raw.get_extra_info(name, default)
