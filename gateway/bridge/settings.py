"""Bridge settings as plain data: what the gateway process receives after validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

#: Outbox policies when it is full.
DROP_OLDEST: Final = "drop-oldest"
DROP_NEWEST: Final = "drop-newest"
REFUSE: Final = "refuse"


@dataclass(frozen=True, slots=True)
class TlsSettings:
    enabled: bool = False
    #: CA bundle to verify the remote with; None: the operating system's trust store.
    ca_file: str | None = None
    #: Client certificate and key for mutual TLS (AWS IoT Core, Azure IoT Hub).
    cert_file: str | None = None
    key_file: str | None = None
    #: Skip verifying the remote's host name (never in production).
    insecure: bool = False


@dataclass(frozen=True, slots=True)
class RuleSettings:
    """One SubTree branch mirrored across the bridge.

    ``filter`` is relative: locally it is ``local_prefix + filter``, remotely
    ``remote_prefix + filter`` (so prefixes add, replace or strip a leading part).
    """

    filter: str
    direction: str = "out"  # "out", "in" or "both"
    qos: int = 1  # cap
    local_prefix: str = ""
    remote_prefix: str = ""
    retain: str = "keep"  # "keep" or "strip"

    @property
    def outbound(self) -> bool:
        return self.direction in ("out", "both")

    @property
    def inbound(self) -> bool:
        return self.direction in ("in", "both")

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.filter

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.filter


@dataclass(frozen=True, slots=True)
class OutboxSettings:
    max_bytes: int = 64 * 1024 * 1024
    max_messages: int = 500_000
    when_full: str = DROP_OLDEST
    #: Outbox bytes kept in memory; the rest waits on disk (with a data_dir) and is read
    #: back in pages as the uplink drains it.
    memory_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    name: str
    addresses: tuple[tuple[str, int], ...]
    rules: tuple[RuleSettings, ...]
    protocol: int = 5  # 4 (MQTT 3.1.1) or 5
    client_id: str = ""  # empty: ledge-<gateway>-<name>
    username: str | None = None
    password: str | None = None
    tls: TlsSettings = field(default_factory=TlsSettings)
    keepalive: int = 60
    clean_start: bool = False
    session_expiry: int = 3600
    outbox: OutboxSettings = field(default_factory=OutboxSettings)
    #: "outbox" (QoS 0 is kept like the rest) or "bypass" (sent only while connected).
    qos0: str = "outbox"
    #: QoS 1/2 messages unacknowledged upstream at once (also capped by the remote's
    #: Receive Maximum).
    max_inflight: int = 100
    #: Messages per second upstream; 0: as fast as the remote takes them.
    rate_limit: float = 0.0
    #: Wrap payloads in a JSON envelope carrying gateway id and sequence number (for
    #: MQTT 3.1.1 remotes, which have no user properties).
    envelope: bool = False
    reconnect_min: float = 1.0
    reconnect_max: float = 60.0
    connect_timeout: float = 10.0
