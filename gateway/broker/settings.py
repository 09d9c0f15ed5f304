"""Broker limits and switches: plain data handed to the core by the app layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gateway.mqtt.reason_codes import ReasonCode

#: Session Expiry Interval meaning "never expires" (MQTT 5.0 section 3.1.2.11.2).
NEVER_EXPIRES: Final = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Every bound the core enforces, with the defaults the example config documents."""

    max_connections: int = 1024
    max_packet_size: int = 1_048_576
    max_keepalive: int = 60
    connect_timeout: float = 10.0
    receive_maximum: int = 100
    max_inflight: int = 100
    max_queued_messages: int = 1000
    max_queued_bytes: int = 8 * 1024 * 1024
    queue_qos0_offline: bool = False
    topic_alias_maximum: int = 10
    retain_available: bool = True
    max_retained_messages: int = 10_000
    max_retained_bytes: int = 64 * 1024 * 1024
    wildcard_subscriptions: bool = True
    shared_subscriptions: bool = True
    subscription_identifiers: bool = True
    max_subscriptions_per_client: int = 4096
    max_session_expiry_interval: int = NEVER_EXPIRES
    persistent_session_expiry: int = NEVER_EXPIRES
    allow_zero_length_client_id: bool = True
    assigned_client_id_prefix: str = "ledge-"
    deny_subscriptions: tuple[str, ...] = ()
    deny_subscription_reason: int = ReasonCode.UNSPECIFIED_ERROR
    sys_interval: float = 10.0
    response_information_prefix: str = "response/"
    max_outbound_bytes: int = 1024 * 1024
    slow_consumer_timeout: float = 60.0
    route_cache_size: int = 4096
    #: Failed-login slowdown (see gateway.broker.logins); 0 switches it off.
    failed_login_delay: float = 1.0
    failed_login_delay_max: float = 30.0
