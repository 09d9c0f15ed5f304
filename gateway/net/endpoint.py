"""A listener's connection-time settings and its bound on connections still in their
opening step (TLS handshake, WebSocket upgrade), and the lingering close.

Every listener has one (``gateway.net.server``); the layers that put an opening step
in front of MQTT (``gateway.net.layer``, imported only for TLS and WebSocket
listeners) use it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import ssl

    from gateway.broker.core import Broker

log = logging.getLogger("ledge.net")

#: Connections per listener that may be in their TLS handshake or WebSocket upgrade at
#: once; more are closed at once (counted as refused).
MAX_PENDING_HANDSHAKES: Final = 256

#: After the broker's last packet on a connection (a DISCONNECT, a refusing CONNACK),
#: how long the write side stays shut while input is read and discarded before the
#: socket closes. Closing with unread input makes the kernel send RST, which can
#: destroy that last packet before the client reads it ("lingering close").
LINGER_SECONDS = 2.0


def linger_close(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
    """Shut the write side, read and discard for ``LINGER_SECONDS``, then close."""
    if transport.can_write_eof():
        transport.write_eof()
        loop.call_later(LINGER_SECONDS, transport.abort)
    else:
        transport.close()


class Endpoint:
    """A listener's connection-time settings (a reload may replace them) and its
    connections still in a TLS handshake or WebSocket upgrade (bounded)."""

    __slots__ = ("broker", "context", "kind", "label", "loop", "path", "pending", "refused")

    def __init__(
        self,
        label: str,
        kind: str,
        path: str,
        context: ssl.SSLContext | None,
        broker: Broker,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.label = label
        self.kind = kind
        self.path = path
        self.context = context
        self.broker = broker
        self.loop = loop
        self.pending: set[asyncio.Transport] = set()
        self.refused = 0

    def admit(self, transport: asyncio.Transport) -> bool:
        """Take a new connection into its handshake, or close it when too many are."""
        if len(self.pending) >= MAX_PENDING_HANDSHAKES:
            self.broker.stats.connections_refused += 1
            self.refused += 1
            if self.refused & (self.refused - 1) == 0:
                log.warning(
                    "%s: %d connections already in their handshake: closing new ones (%d so far)",
                    self.label,
                    MAX_PENDING_HANDSHAKES,
                    self.refused,
                )
            transport.abort()
            return False
        self.pending.add(transport)
        return True

    def admitted(self, transport: asyncio.Transport) -> None:
        self.pending.discard(transport)

    def failed_handshake(self, peer: Any, exc: BaseException) -> None:
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        log.info("%s: TLS handshake with %s failed: %s", self.label, where, exc or type(exc))
