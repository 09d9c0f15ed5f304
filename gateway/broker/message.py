"""An application message held by the broker: stored once, shared by every session.

Encoding for delivery is cached on the message per distinct (protocol version,
QoS, retain, topic alias) so fan-out to many subscribers encodes once and shares
the bytes; the 2-byte packet identifier is the only per-recipient part.
"""

from __future__ import annotations

from typing import Final

from gateway.mqtt.fastpath import publish_template
from gateway.mqtt.packets import MQTT_5
from gateway.mqtt.properties import EMPTY, Properties, properties_body

#: Forwarded properties never carry these; the server sets them per delivery.
_PER_DELIVERY: Final = {
    "topic_alias": None,
    "subscription_identifiers": (),
    "message_expiry_interval": None,
}


class Message:
    """One PUBLISH as accepted by the broker."""

    __slots__ = (
        "_cache",
        "_props_body",
        "_topic_bytes",
        "created",
        "expires_at",
        "expiry_interval",
        "origin",
        "payload",
        "properties",
        "qos",
        "raw",
        "raw_version",
        "refs",
        "retain",
        "store_id",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties = EMPTY,
        *,
        expiry_interval: int | None = None,
        origin: str | None = None,
        created: float = 0.0,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        if properties is not EMPTY and (
            properties.topic_alias is not None
            or properties.subscription_identifiers
            or properties.message_expiry_interval is not None
        ):
            properties = properties.with_(**_PER_DELIVERY)
            if not properties:
                properties = EMPTY
        self.properties = properties
        #: Message Expiry Interval as published (seconds), counted from ``created``.
        self.expiry_interval = expiry_interval
        self.expires_at = None if expiry_interval is None else created + expiry_interval
        self.origin = origin
        self.created = created
        #: The received QoS 0 PUBLISH frame, when it is byte for byte what a subscriber
        #: of protocol ``raw_version`` gets (no retain, no properties): forwarded as is.
        self.raw: bytes | None = None
        self.raw_version = 0
        #: Row id in the store and the number of stored queue entries using it.
        self.store_id = 0
        self.refs = 0
        self._topic_bytes: bytes | None = None
        self._props_body: bytes | None = None
        self._cache: dict[tuple[int, int, bool, int, bool], tuple[bytes, bytes]] | None = None

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, payload={self.payload[:32]!r}, qos={self.qos}, "
            f"retain={self.retain})"
        )

    @property
    def size(self) -> int:
        """Bytes this message costs a queue: topic plus payload."""
        return len(self.topic) + len(self.payload)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now > self.expires_at

    def expiry_remaining(self, now: float) -> int | None:
        """Seconds left for the Message Expiry Interval sent onward (MQTT-3.3.2-6)."""
        if self.expiry_interval is None:
            return None
        # Whole seconds waited, so a message forwarded at once keeps its interval.
        return max(0, self.expiry_interval - int(now - self.created))

    def topic_bytes(self) -> bytes:
        tb = self._topic_bytes
        if tb is None:
            tb = self._topic_bytes = self.topic.encode("utf-8")
        return tb

    def _properties_body(self) -> bytes:
        body = self._props_body
        if body is None:
            body = self._props_body = properties_body(self.properties)
        return body

    def encode(
        self,
        version: int,
        qos: int,
        retain: bool,
        *,
        dup: bool = False,
        sub_ids: tuple[int, ...] = (),
        expiry: int | None = None,
        alias: int = 0,
        send_topic: bool = True,
    ) -> tuple[bytes, bytes]:
        """``(head, tail)``: the packet is ``head + packet_id + tail`` (QoS 0: ``head`` alone).

        Encodings without per-recipient parts are cached and shared.
        """
        cacheable = not sub_ids and expiry is None and not dup
        key = (version, qos, retain, alias, send_topic)
        if cacheable:
            cache = self._cache
            if cache is None:
                cache = self._cache = {}
            else:
                hit = cache.get(key)
                if hit is not None:
                    return hit
        parts = publish_template(
            version,
            qos,
            retain,
            self.topic_bytes() if send_topic else b"",
            self.payload,
            self._properties_body() if version == MQTT_5 else b"",
            dup=dup,
            expiry=expiry,
            alias=alias,
            sub_ids=sub_ids,
        )
        if cacheable:
            assert self._cache is not None
            self._cache[key] = parts
        return parts
