"""Bridge settings as plain data: what the gateway process receives after validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from gateway.broker.settings import DAY, INT31, NEVER_EXPIRES, option
from gateway.store.settings import MAX_STORE_BYTES

#: Outbox policies when it is full.
DROP_OLDEST: Final = "drop-oldest"
DROP_NEWEST: Final = "drop-newest"
REFUSE: Final = "refuse"


@dataclass(frozen=True, slots=True)
class TlsSettings:
    enabled: bool = option(False, reload=True)
    #: CA bundle to verify the remote with; None: the operating system's trust store.
    ca_file: str | None = option(None, reload=True)
    #: Client certificate and key for mutual TLS (AWS IoT Core, Azure IoT Hub).
    cert_file: str | None = option(None, reload=True)
    key_file: str | None = option(None, reload=True)
    #: Skip verifying the remote's host name (never in production).
    insecure: bool = option(False, reload=True)


@dataclass(frozen=True, slots=True)
class RuleSettings:
    """One SubTree branch mirrored across the bridge.

    ``filter`` is relative: locally it is ``local_prefix + filter``, remotely
    ``remote_prefix + filter`` (so prefixes add, replace or strip a leading part).
    """

    filter: str = option(reload=True, min_length=1)
    direction: Literal["out", "in", "both"] = option("out", reload=True)
    #: The highest QoS used across the bridge (a cap).
    qos: int = option(1, reload=True, ge=0, le=2)
    local_prefix: str = option("", reload=True)
    remote_prefix: str = option("", reload=True)
    retain: Literal["keep", "strip"] = option("keep", reload=True)

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
    max_bytes: int = option(64 * 1024 * 1024, reload=True, ge=1024, le=MAX_STORE_BYTES)
    max_messages: int = option(500_000, reload=True, ge=1, le=INT31)
    when_full: Literal["drop-oldest", "drop-newest", "refuse"] = option(DROP_OLDEST, reload=True)
    #: Outbox bytes kept in memory; the rest waits on disk (with a data_dir) and is read
    #: back in pages as the uplink drains it.
    memory_bytes: int = option(4 * 1024 * 1024, reload=True, ge=64 * 1024, le=INT31)


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    name: str = option(reload=True, min_length=1)
    #: The remote brokers, tried in turn: made from the file's ``address`` and
    #: ``addresses`` (``host[:port]``) by the validator.
    addresses: tuple[tuple[str, int], ...] = option(internal=True)
    rules: tuple[RuleSettings, ...] = option(reload=True, min_length=1)
    #: "5.0" or "3.1.1".
    protocol: Literal["5.0", "3.1.1"] = option("5.0", reload=True)
    #: Empty: ledge-<gateway>-<name>.
    client_id: str = option("", reload=True, max_length=65535)
    username: str | None = option(None, reload=True)
    password: str | None = option(None, reload=True)
    tls: TlsSettings = option(reload=True, factory=TlsSettings)
    keepalive: int = option(60, reload=True, ge=0, le=65535)
    clean_start: bool = option(False, reload=True)
    session_expiry: int = option(3600, reload=True, ge=0, le=NEVER_EXPIRES)
    outbox: OutboxSettings = option(reload=True, factory=OutboxSettings)
    #: "outbox" (QoS 0 is kept like the rest) or "bypass" (sent only while connected).
    qos0: Literal["outbox", "bypass"] = option("outbox", reload=True)
    #: QoS 1/2 messages unacknowledged upstream at once (also capped by the remote's
    #: Receive Maximum).
    max_inflight: int = option(100, reload=True, ge=1, le=65535)
    #: Messages per second upstream; 0: as fast as the remote takes them.
    rate_limit: float = option(0.0, reload=True, ge=0, le=1_000_000.0)
    #: Wrap payloads in a JSON envelope carrying gateway id and sequence number (for
    #: MQTT 3.1.1 remotes, which have no user properties).
    envelope: bool = option(False, reload=True)
    reconnect_min: float = option(1.0, reload=True, gt=0, le=DAY)
    reconnect_max: float = option(60.0, reload=True, gt=0, le=DAY)
    connect_timeout: float = option(10.0, reload=True, gt=0, le=DAY)

    @property
    def version(self) -> int:
        """The protocol level: 5 (MQTT 5.0) or 4 (MQTT 3.1.1)."""
        return 5 if self.protocol == "5.0" else 4
