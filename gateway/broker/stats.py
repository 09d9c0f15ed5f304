"""Broker counters and the ``$SYS`` topics built from them (mosquitto's names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class Stats:
    """Monotonic counters; every drop the broker makes is counted here by reason."""

    messages_received: int = 0
    messages_sent: int = 0
    publish_received: int = 0
    publish_sent: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    connections_total: int = 0
    connections_refused: int = 0
    #: Connections closed before their CONNACK to admit a newer one: the connecting
    #: share (or the whole pool) was full, or their address had its most connecting.
    evicted_connecting_full: int = 0
    evicted_address_full: int = 0
    clients_maximum: int = 0
    dropped_slow_consumer: int = 0
    dropped_queue_full: int = 0
    dropped_offline_qos0: int = 0
    dropped_expired: int = 0
    dropped_too_large: int = 0
    publish_denied: int = 0
    protocol_errors: int = 0

    def drops(self) -> int:
        """Every drop, whatever the reason (``$SYS .../publish/messages/dropped``, the
        sum of ``ledge_messages_dropped_total``)."""
        return (
            self.dropped_slow_consumer
            + self.dropped_queue_full
            + self.dropped_expired
            + self.dropped_too_large
            + self.dropped_offline_qos0
        )


@dataclass(slots=True)
class LoadAverage:
    """Per-minute rates smoothed over 1, 5 and 15 minutes (mosquitto's ``load`` topics)."""

    last_value: int = 0
    last_time: float | None = None
    rates: dict[int, float] = field(default_factory=lambda: {1: 0.0, 5: 0.0, 15: 0.0})

    def update(self, value: int, now: float) -> None:
        if self.last_time is None:
            self.last_time = now
            self.last_value = value
            return
        elapsed = now - self.last_time
        if elapsed <= 0:
            return
        per_minute = (value - self.last_value) * 60.0 / elapsed
        for minutes in self.rates:
            decay = math.exp(-elapsed / (60.0 * minutes))
            self.rates[minutes] = self.rates[minutes] * decay + per_minute * (1.0 - decay)
        self.last_time = now
        self.last_value = value
