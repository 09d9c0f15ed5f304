"""The bytes the broker's and the bridge's hot paths write and read, without packet values.

The general codec (``gateway.mqtt.codec``) turns packet values into bytes and back.
Delivering one message to many subscribers, acknowledging thousands of PUBLISHes a
second, or reading a plain PUBLISH straight out of the receive buffer needs the same
bytes without building a value per packet:

- ``encode_ack(kind, packet_id, reason, version)``: PUBACK, PUBREC, PUBREL and PUBCOMP
  without properties (MQTT 5.0 sections 3.4 - 3.7).
- ``publish_template(...)``: a PUBLISH as ``(head, tail)``; the packet is ``head +
  encode_packet_id(packet_id) + tail``, so one encoding serves every recipient and
  only the two bytes of the packet identifier differ (QoS 0: ``(packet, b"")``).
- ``peek_publish(first, buf, start, end, version)``: the fields of a *plain* PUBLISH
  (QoS 0 or 1, no DUP, no RETAIN, no properties, an ordinary topic name) from a
  framed span of the receive buffer; None sends the packet to the general decoder,
  which reports what is wrong with it.

Every function here gives exactly the bytes (or the fields) the general codec gives
for the same packet; ``tests/test_codec_vectors.py`` and the fuzz target ``fastpath``
hold them together.
"""

from __future__ import annotations

from typing import Final

from gateway.mqtt.packets import MQTT_5, PacketType
from gateway.mqtt.properties import PropertyId
from gateway.mqtt.wire import Buffer, encode_varint

#: Fixed-header flags of a PUBLISH (MQTT 5.0 section 3.3.1).
PUBLISH_TYPE: Final = PacketType.PUBLISH << 4
DUP_FLAG: Final = 0x08
RETAIN_FLAG: Final = 0x01
QOS_MASK: Final = 0x06

#: First byte of each acknowledgement; PUBREL carries the flags 0b0010 (MQTT-3.6.1-1).
_ACK_FIRST: Final = {
    PacketType.PUBACK: 0x40,
    PacketType.PUBREC: 0x50,
    PacketType.PUBREL: 0x62,
    PacketType.PUBCOMP: 0x70,
}

_EXPIRY: Final = bytes((PropertyId.MESSAGE_EXPIRY_INTERVAL,))
_ALIAS: Final = bytes((PropertyId.TOPIC_ALIAS,))
_SUB_ID: Final = bytes((PropertyId.SUBSCRIPTION_IDENTIFIER,))


def encode_packet_id(packet_id: int) -> bytes:
    """The two bytes of a packet identifier (MQTT 5.0 section 2.2.1)."""
    return packet_id.to_bytes(2, "big")


def encode_ack(kind: PacketType, packet_id: int, reason: int = 0, version: int = MQTT_5) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP without properties.

    The reason code is left out when it is 0x00 (MQTT 5.0 section 3.4.2.1) and on
    MQTT 3.1.1, which has none.
    """
    first = _ACK_FIRST[kind]
    if reason == 0 or version != MQTT_5:
        return bytes((first, 2, packet_id >> 8, packet_id & 0xFF))
    return bytes((first, 3, packet_id >> 8, packet_id & 0xFF, reason))


def publish_template(
    version: int,
    qos: int,
    retain: bool,
    topic: bytes,
    payload: bytes,
    properties: bytes = b"",
    *,
    dup: bool = False,
    expiry: int | None = None,
    alias: int = 0,
    sub_ids: tuple[int, ...] = (),
) -> tuple[bytes, bytes]:
    """A PUBLISH as ``(head, tail)``: the packet is ``head + packet id + tail`` for QoS
    1 and 2, and ``head`` alone (``tail`` empty) for QoS 0.

    ``topic`` is the encoded topic name (empty when a known topic alias stands for it,
    MQTT-3.3.2-7); ``properties`` the message's own MQTT 5.0 properties without their
    length (``properties_body``); ``expiry``, ``alias`` and ``sub_ids`` are what the
    server adds per delivery (Message Expiry Interval, Topic Alias, Subscription
    Identifiers). MQTT 3.1.1 has no properties: they are left out.
    """
    first = PUBLISH_TYPE | (qos << 1)
    if retain:
        first |= RETAIN_FLAG
    if dup:
        first |= DUP_FLAG
    if version == MQTT_5:
        props = properties
        if expiry is not None:
            props += _EXPIRY + expiry.to_bytes(4, "big")
        if alias:
            props += _ALIAS + alias.to_bytes(2, "big")
        for ident in sub_ids:
            props += _SUB_ID + encode_varint(ident)
        tail = encode_varint(len(props)) + props + payload
    else:
        tail = payload
    remaining = 2 + len(topic) + (2 if qos else 0) + len(tail)
    head = bytes((first,)) + encode_varint(remaining) + len(topic).to_bytes(2, "big") + topic
    if qos == 0:
        return head + tail, b""
    return head, tail


def template_size(parts: tuple[bytes, bytes], qos: int) -> int:
    """The size of the packet ``parts`` make (with its packet identifier)."""
    return len(parts[0]) + len(parts[1]) + (2 if qos else 0)


def peek_publish(
    first: int, buf: Buffer, start: int, end: int, version: int
) -> tuple[str, int, int, int] | None:
    """``(topic, qos, packet_id, payload_start)`` of the plain PUBLISH whose body is
    ``buf[start:end]``, or None when it is not plain (or not well formed).

    Plain: QoS 0 or 1, neither DUP nor RETAIN, on MQTT 5.0 an empty property block,
    a non-empty topic name of valid UTF-8 without wildcards or U+0000 (MQTT-3.3.2-2,
    MQTT-1.5.4-1, -2), and for QoS 1 a packet identifier other than 0 (MQTT-2.2.1-3).
    """
    qos = (first & QOS_MASK) >> 1
    if qos > 1 or first & (DUP_FLAG | RETAIN_FLAG) or end - start < 3:
        return None
    size = (buf[start] << 8) | buf[start + 1]
    if not size:
        return None
    topic_end = start + 2 + size
    pos = topic_end + 2 if qos else topic_end
    if version == MQTT_5:
        if pos >= end or buf[pos] != 0:
            return None  # properties (or a short packet): the general decoder
        pos += 1  # the property length 0
    if pos > end:
        return None
    packet_id = 0
    if qos:
        packet_id = (buf[topic_end] << 8) | buf[topic_end + 1]
        if not packet_id:
            return None
    try:
        topic = str(buf[start + 2 : topic_end], "utf-8")
    except UnicodeDecodeError:
        return None
    if "+" in topic or "#" in topic or "\x00" in topic:
        return None
    return topic, qos, packet_id, pos


__all__ = [
    "encode_ack",
    "encode_packet_id",
    "peek_publish",
    "publish_template",
    "template_size",
]
