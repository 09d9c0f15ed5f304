"""The options every listener of the shell shares, as plain data: TLS (the MQTT
listeners' ``[[listeners]]`` and the HTTP listener's ``[http]`` settings extend it).

Declared with ``option`` like every other option (``gateway.broker.settings``). Apart
from ``gateway.net.tls`` (imported only when a TLS listener is configured), so that
the default gateway carries nothing of TLS but this class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.broker.settings import option


@dataclass(frozen=True, slots=True)
class TLSOptions:
    """What a listener serving TLS is configured with (mosquitto's option names). The
    files are read again on every reload, so a renewed certificate serves new
    connections."""

    certfile: str | None = option(None, reload=True)
    keyfile: str | None = option(None, reload=True)
    #: With it, client certificates are verified (required with require_certificate).
    cafile: str | None = option(None, reload=True)
    require_certificate: bool = option(False, reload=True)
    #: The minimum accepted.
    tls_version: Literal["tlsv1.2", "tlsv1.3"] = option("tlsv1.2", reload=True)
