"""A layer between the socket and the MQTT protocol (TLS, WebSocket); imported only
when such a listener is configured.

``Layer`` admits a connection to its opening step (the TLS handshake, the WebSocket
upgrade) through the endpoint's bound, gives that step ``connect_timeout`` to finish,
and then presents the connection to its inner protocol as a ``LayerTransport``. What a
layer does to the bytes is its own: ``data_received`` on the way in, ``write`` and
``end`` on the way out.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.net.endpoint import Endpoint


class Layer(asyncio.Protocol):
    """The part every layer shares: admission, the opening deadline, handing over."""

    def __init__(self, endpoint: Endpoint, inner: asyncio.Protocol) -> None:
        self.endpoint = endpoint
        self.loop = endpoint.loop
        self.inner = inner
        self.raw: asyncio.Transport | None = None
        self.open = False
        self.closing = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw: asyncio.Transport = transport  # type: ignore[assignment]
        self.raw = raw
        if not self.endpoint.admit(raw):
            return
        self.start()
        self._timer = self.loop.call_later(
            self.endpoint.broker.settings.connect_timeout, self._too_slow
        )

    def start(self) -> None:
        """Prepare the opening step once the connection is admitted."""

    def timed_out(self) -> None:
        """The opening step did not finish within ``connect_timeout``."""
        raise NotImplementedError

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` of the inner protocol."""
        raise NotImplementedError

    def end(self) -> None:
        """Close the way the layer closes normally."""
        raise NotImplementedError

    def transport(self, raw: asyncio.Transport) -> LayerTransport:
        return LayerTransport(self, raw)

    def _too_slow(self) -> None:
        self._timer = None
        if self.raw is not None and not self.open:
            self.timed_out()

    def opened(self) -> None:
        """The opening step is done: the connection leaves admission for the inner protocol."""
        raw = self.raw
        assert raw is not None
        self.open = True
        self.endpoint.admitted(raw)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.inner.connection_made(self.transport(raw))

    def _peer(self) -> str:
        peer = self.raw.get_extra_info("peername") if self.raw is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

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


class LayerTransport(asyncio.Transport):
    """What the inner protocol sees: writes go through the layer onto the real transport."""

    def __init__(self, layer: Layer, raw: asyncio.Transport) -> None:
        super().__init__()
        self._layer = layer
        self._raw = raw

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._layer.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._layer.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self._layer.end()

    def abort(self) -> None:
        self._layer.closing = True
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._layer.closing or self._raw.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
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
