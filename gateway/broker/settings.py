"""Broker limits and switches: plain data handed to the core by the app layer.

Every config option of Ledge is declared once, as a field of a settings dataclass made
with ``option``: its default, whether SIGHUP applies it, and its bounds. The config
validator (``gateway.app.config``) builds its pydantic models from these fields, so the
default the gateway runs with, the one ``ledge check-config`` accepts and the one
``ledge.example.toml`` shows are one value (a test holds the example to it).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any, Final, Literal

from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.wire import VARINT_MAX

#: Session Expiry Interval meaning "never expires" (MQTT 5.0 section 3.1.2.11.2).
NEVER_EXPIRES: Final = 0xFFFF_FFFF

# Upper bounds: every numeric option has one, and it is one the code can take (a test
# runs the gateway with each option at its maximum).
#: Counts and byte sizes kept in memory or handed to the transport (a C int).
INT31: Final = 2**31 - 1
#: Durations in seconds (timers, intervals, timeouts): one day.
DAY: Final = 86_400.0
#: Connection slots are allocated at start-up (about 4 KiB each).
MAX_SLOTS: Final = 16_384


def option(
    default: Any = MISSING,
    *,
    reload: bool = False,
    factory: Any = None,
    internal: bool = False,
    section: str = "",
    **bounds: Any,
) -> Any:
    """A config option as a dataclass field.

    ``reload``: SIGHUP applies it. ``bounds``: what the validator enforces (pydantic's
    ``ge``, ``gt``, ``le``, ``min_length``, ``max_length``). ``internal``: a knob the
    config file does not offer. ``section``: the TOML table it is written in, when
    that is not the dataclass's own (the failed-login delays sit in ``[auth]``).
    No default: the option is required.
    """
    # Only what differs from the usual (no reload, in the file, in its own table, no
    # bounds) is kept: the gateway process holds every option's field for its life.
    metadata = {
        key: value
        for key, value in (
            ("reload", reload),
            ("internal", internal),
            ("section", section),
            ("bounds", bounds),
        )
        if value
    }
    if factory is not None:
        return field(default_factory=factory, metadata=metadata or None)
    return field(default=default, metadata=metadata or None)


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Every bound the core enforces (``[broker]``), with its default."""

    max_connections: int = option(1024, ge=1, le=MAX_SLOTS)
    #: Connections that have not finished CONNECT (and login) hold at most this share of
    #: the pool, and at most ``max_connecting_per_address`` from one address (an IPv6
    #: /64); beyond either the oldest of them is closed (``core.open_connection``).
    connecting_share: float = option(0.25, reload=True, gt=0, le=1)
    max_connecting_per_address: int = option(32, reload=True, ge=1, le=MAX_SLOTS)
    #: A connection younger than this is not evicted for either budget while the pool
    #: has a free slot (a burst of clients is accepted before any CONNECT is read);
    #: at this age the budgets are enforced again, oldest first.
    connecting_grace: float = option(1.0, reload=True, ge=0, le=DAY)
    max_packet_size: int = option(1_048_576, ge=20, le=VARINT_MAX + 5)
    max_keepalive: int = option(60, reload=True, ge=0, le=65535)
    connect_timeout: float = option(10.0, reload=True, gt=0, le=DAY)
    receive_maximum: int = option(100, ge=1, le=65535)
    max_inflight: int = option(100, reload=True, ge=1, le=65535)
    max_queued_messages: int = option(1000, reload=True, ge=0, le=INT31)
    max_queued_bytes: int = option(8 * 1024 * 1024, reload=True, ge=0, le=INT31)
    queue_qos0_offline: bool = option(False, reload=True)
    topic_alias_maximum: int = option(10, ge=0, le=65535)
    retain_available: bool = option(True)
    max_retained_messages: int = option(10_000, ge=0, le=INT31)
    max_retained_bytes: int = option(64 * 1024 * 1024, ge=0, le=INT31)
    wildcard_subscriptions: bool = option(True)
    shared_subscriptions: bool = option(True)
    subscription_identifiers: bool = option(True)
    max_subscriptions_per_client: int = option(4096, reload=True, ge=1, le=INT31)
    max_session_expiry_interval: int = option(NEVER_EXPIRES, reload=True, ge=0, le=NEVER_EXPIRES)
    persistent_session_expiry: int = option(NEVER_EXPIRES, reload=True, ge=0, le=NEVER_EXPIRES)
    allow_zero_length_client_id: bool = option(True, reload=True)
    #: MQTT 3.1 limits a client identifier to 23 characters (3.1 section 3.1);
    #: Mosquitto accepts longer ones (65535 does the same).
    mqtt31_max_client_id: int = option(23, reload=True, ge=1, le=65535)
    assigned_client_id_prefix: str = option("ledge-", reload=True)
    deny_subscriptions: tuple[str, ...] = option((), reload=True)
    deny_subscription_reason: Literal["unspecified_error", "not_authorized"] = option(
        "unspecified_error", reload=True
    )
    #: A SUBSCRIBE under which the ACL lets nothing be read: refused (SUBACK 0x87, 3.1.1
    #: 0x80) or, Mosquitto's way, granted with deliveries filtered by the ACL.
    acl_denied_subscribe: Literal["refuse", "grant"] = option("refuse", reload=True)
    sys_interval: float = option(10.0, ge=0, le=DAY)
    response_information_prefix: str = option("response/", reload=True)
    max_outbound_bytes: int = option(1024 * 1024, ge=1024, le=INT31)
    slow_consumer_timeout: float = option(60.0, reload=True, ge=0, le=DAY)
    route_cache_size: int = option(4096, internal=True)
    #: Failed-login slowdown (see gateway.broker.logins); 0 switches it off.
    failed_login_delay: float = option(1.0, reload=True, section="auth", ge=0, le=DAY)
    failed_login_delay_max: float = option(30.0, reload=True, section="auth", ge=0, le=DAY)

    @property
    def max_connecting(self) -> int:
        """Pool slots connections may hold before their CONNACK (at least one)."""
        return max(1, int(self.max_connections * self.connecting_share))

    @property
    def deny_subscription_code(self) -> ReasonCode:
        """The SUBACK code for a filter in ``deny_subscriptions``."""
        if self.deny_subscription_reason == "not_authorized":
            return ReasonCode.NOT_AUTHORIZED
        return ReasonCode.UNSPECIFIED_ERROR
