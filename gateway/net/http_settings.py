"""Settings of the HTTP listener (``[http]``), as plain data: what the gateway runs with.

Apart from ``gateway.net.http`` (imported only when the listener is enabled) so that the
settings cost the default gateway nothing but this class.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HTTPSettings:
    """The HTTP listener of metrics and the status page (``[http]``; off by default)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9883
    #: With certfile and keyfile: HTTPS, with the MQTT listeners' TLS options.
    certfile: str | None = None
    keyfile: str | None = None
    cafile: str | None = None
    require_certificate: bool = False
    tls_version: str = "tlsv1.2"
    #: Who may read: users of a mosquitto-format password file, a bearer token.
    password_file: str | None = None
    token_file: str | None = None
    max_connections: int = 16
    max_header_bytes: int = 8192
    request_timeout: float = 10.0
    keepalive_timeout: float = 5.0
    max_requests: int = 100
