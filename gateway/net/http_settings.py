"""Settings of the HTTP listener (``[http]``), as plain data: what the gateway runs with.

Apart from ``gateway.net.http`` and imported only when the config has an ``[http]``
table, so that the default gateway carries none of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.broker.settings import DAY, option
from gateway.net.settings import TLSOptions


@dataclass(frozen=True, slots=True)
class HTTPSettings(TLSOptions):
    """The HTTP listener of metrics and the status page (``[http]``; off by default).
    With certfile and keyfile it serves HTTPS. SIGHUP applies every option: the
    listener is made again with them (``Metrics.serve_http``)."""

    enabled: bool = option(False, reload=True)
    host: str = option("127.0.0.1", reload=True)
    port: int = option(9883, reload=True, ge=0, le=65535)
    #: Who may read: users of a mosquitto-format password file, a bearer token.
    password_file: str | None = option(None, reload=True)
    token_file: str | None = option(None, reload=True)
    max_connections: int = option(16, reload=True, ge=1, le=1024)
    #: Connections without a complete request (new, or a request head arriving) hold
    #: at most this share of ``max_connections`` (beyond it the oldest of them is
    #: closed), and one address (an IPv6 /64) at most ``max_connections_per_address``
    #: connections (beyond it, its oldest waiting for a request is closed); see
    #: ``gateway.net.http_admission``.
    unfinished_share: float = option(0.5, reload=True, gt=0, le=1)
    max_connections_per_address: int = option(4, reload=True, ge=1, le=1024)
    #: An unfinished connection younger than this is not closed for the share while a
    #: slot is free (a burst of connections is accepted before any request is read).
    unfinished_grace: float = option(1.0, reload=True, ge=0, le=DAY)
    max_header_bytes: int = option(8192, reload=True, ge=1024, le=65536)
    request_timeout: float = option(10.0, reload=True, gt=0, le=DAY)
    keepalive_timeout: float = option(5.0, reload=True, gt=0, le=DAY)
    max_requests: int = option(100, reload=True, ge=1, le=1_000_000)

    @property
    def https(self) -> bool:
        return self.certfile is not None
