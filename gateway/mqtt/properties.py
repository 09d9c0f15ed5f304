"""MQTT 5.0 properties (section 2.2.2): identifiers, types, where each may appear.

``Properties`` is one frozen value type for every packet; fields a packet does
not carry stay ``None`` (or empty). The codec validates that each identifier is
allowed in the packet it arrived in and appears at most once where the
specification says so.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import IntEnum
from typing import Any, Final

from gateway.mqtt.errors import MalformedPacket, ProtocolError
from gateway.mqtt.wire import (
    Buffer,
    encode_binary,
    encode_string,
    encode_varint,
    read_binary,
    read_string,
    read_varint,
)


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class Where(IntEnum):
    """Which packet a property block belongs to (packet types plus the will)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    DISCONNECT = 14
    AUTH = 15
    WILL = 99


# Data types (section 1.5).
BYTE, TWO, FOUR, VARINT, STRING, BINARY, PAIR = range(7)

_ACKS = (Where.PUBACK, Where.PUBREC, Where.PUBREL, Where.PUBCOMP)
_ALL = frozenset(Where)

#: identifier -> (attribute name, data type, packets it may appear in)
SPEC: Final[dict[int, tuple[str, int, frozenset[Where]]]] = {
    0x01: ("payload_format_indicator", BYTE, frozenset({Where.PUBLISH, Where.WILL})),
    0x02: ("message_expiry_interval", FOUR, frozenset({Where.PUBLISH, Where.WILL})),
    0x03: ("content_type", STRING, frozenset({Where.PUBLISH, Where.WILL})),
    0x08: ("response_topic", STRING, frozenset({Where.PUBLISH, Where.WILL})),
    0x09: ("correlation_data", BINARY, frozenset({Where.PUBLISH, Where.WILL})),
    0x0B: ("subscription_identifiers", VARINT, frozenset({Where.PUBLISH, Where.SUBSCRIBE})),
    0x11: (
        "session_expiry_interval",
        FOUR,
        frozenset({Where.CONNECT, Where.CONNACK, Where.DISCONNECT}),
    ),
    0x12: ("assigned_client_identifier", STRING, frozenset({Where.CONNACK})),
    0x13: ("server_keep_alive", TWO, frozenset({Where.CONNACK})),
    0x15: (
        "authentication_method",
        STRING,
        frozenset({Where.CONNECT, Where.CONNACK, Where.AUTH}),
    ),
    0x16: (
        "authentication_data",
        BINARY,
        frozenset({Where.CONNECT, Where.CONNACK, Where.AUTH}),
    ),
    0x17: ("request_problem_information", BYTE, frozenset({Where.CONNECT})),
    0x18: ("will_delay_interval", FOUR, frozenset({Where.WILL})),
    0x19: ("request_response_information", BYTE, frozenset({Where.CONNECT})),
    0x1A: ("response_information", STRING, frozenset({Where.CONNACK})),
    0x1C: ("server_reference", STRING, frozenset({Where.CONNACK, Where.DISCONNECT})),
    0x1F: (
        "reason_string",
        STRING,
        frozenset(
            {
                Where.CONNACK,
                *_ACKS,
                Where.SUBACK,
                Where.UNSUBACK,
                Where.DISCONNECT,
                Where.AUTH,
            }
        ),
    ),
    0x21: ("receive_maximum", TWO, frozenset({Where.CONNECT, Where.CONNACK})),
    0x22: ("topic_alias_maximum", TWO, frozenset({Where.CONNECT, Where.CONNACK})),
    0x23: ("topic_alias", TWO, frozenset({Where.PUBLISH})),
    0x24: ("maximum_qos", BYTE, frozenset({Where.CONNACK})),
    0x25: ("retain_available", BYTE, frozenset({Where.CONNACK})),
    0x26: ("user_properties", PAIR, _ALL),
    0x27: ("maximum_packet_size", FOUR, frozenset({Where.CONNECT, Where.CONNACK})),
    0x28: ("wildcard_subscription_available", BYTE, frozenset({Where.CONNACK})),
    0x29: ("subscription_identifiers_available", BYTE, frozenset({Where.CONNACK})),
    0x2A: ("shared_subscription_available", BYTE, frozenset({Where.CONNACK})),
}

_ID_OF: Final[dict[str, int]] = {name: pid for pid, (name, _t, _w) in SPEC.items()}

#: Properties whose value must be 0 or 1.
_BOOLEAN_BYTES = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
#: Properties for which 0 is a protocol error.
_NON_ZERO = frozenset({0x0B, 0x21, 0x27})


@dataclass(frozen=True, slots=True)
class Properties:
    """The properties of one packet (every field optional)."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifiers_available: int | None = None
    shared_subscription_available: int | None = None

    def set_fields(self) -> dict[str, Any]:
        """The fields that carry a value, by name."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != ():
                out[f.name] = value
        return out

    def with_(self, **changes: Any) -> Properties:
        return replace(self, **changes)

    def __bool__(self) -> bool:
        return self is not EMPTY and bool(self.set_fields())

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.set_fields().items())
        return f"Properties({shown})"


EMPTY: Final = Properties()

#: Encoded form of an empty property block.
EMPTY_ENCODED: Final = b"\x00"

_FIELD_ORDER: Final[tuple[tuple[int, str, int], ...]] = tuple(
    (pid, name, kind) for pid, (name, kind, _w) in sorted(SPEC.items())
)


def _order(names: tuple[str, ...]) -> tuple[tuple[int, str, int], ...]:
    """Field order with ``names`` first, the rest by identifier."""
    first = tuple((_ID_OF[n], n, SPEC[_ID_OF[n]][1]) for n in names)
    return first + tuple(f for f in _FIELD_ORDER if f[1] not in names)


#: CONNACK properties in the order Mosquitto writes them. The specification leaves the
#: order free (MQTT 5.0 section 2.2.2.2); with Mosquitto's, captures of Mosquitto's
#: CONNACKs (and its byte-exact test suite) match Ledge's byte for byte.
CONNACK_ORDER: Final = _order(
    (
        "topic_alias_maximum",
        "assigned_client_identifier",
        "server_keep_alive",
        "authentication_method",
        "authentication_data",
        "retain_available",
        "maximum_packet_size",
        "receive_maximum",
        "maximum_qos",
    )
)


def encode_properties(
    props: Properties, order: tuple[tuple[int, str, int], ...] = _FIELD_ORDER
) -> bytes:
    """The property block: length (variable byte integer) then the properties, in
    ``order`` (identifier order unless a packet has its own)."""
    if props is EMPTY:
        return EMPTY_ENCODED
    out = bytearray()
    for pid, name, kind in order:
        value = getattr(props, name)
        if value is None or value == ():
            continue
        if kind == PAIR:
            for key, val in value:
                out.append(pid)
                out += encode_string(key)
                out += encode_string(val)
        elif kind == VARINT:
            for ident in value:
                out.append(pid)
                out += encode_varint(ident)
        else:
            out.append(pid)
            if kind == BYTE:
                out.append(value)
            elif kind == TWO:
                out += value.to_bytes(2, "big")
            elif kind == FOUR:
                out += value.to_bytes(4, "big")
            elif kind == STRING:
                out += encode_string(value)
            else:
                out += encode_binary(value)
    return encode_varint(len(out)) + bytes(out)


def properties_body(props: Properties) -> bytes:
    """The encoded properties without their length: what a template appends to."""
    if props is EMPTY:
        return b""
    encoded = encode_properties(props)
    _length, start = read_varint(encoded, 0, len(encoded))
    return encoded[start:]


def property_block(body: bytes) -> bytes:
    """A property block from encoded properties: their length, then themselves."""
    return encode_varint(len(body)) + body


def user_property(key: str, value: str) -> bytes:
    """One encoded User Property (MQTT 5.0 section 3.3.2.3.7), for ``property_block``."""
    return _USER_PROPERTY + encode_string(key) + encode_string(value)


_USER_PROPERTY: Final = bytes((PropertyId.USER_PROPERTY,))


def decode_properties(buf: Buffer, pos: int, end: int, where: Where) -> tuple[Properties, int]:
    """Read a property block at ``pos``; returns the properties and the new position."""
    length, pos = read_varint(buf, pos, end)
    if length == 0:
        return EMPTY, pos
    stop = pos + length
    if stop > end:
        raise MalformedPacket("property length runs past the end of the packet")
    values: dict[str, Any] = {}
    user: list[tuple[str, str]] = []
    sub_ids: list[int] = []
    while pos < stop:
        pid = buf[pos]
        pos += 1
        spec = SPEC.get(pid)
        if spec is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02x}")
        name, kind, allowed = spec
        if where not in allowed:
            raise MalformedPacket(f"property {PropertyId(pid).name} is not allowed in {where.name}")
        value: Any
        if kind == BYTE:
            if pos >= stop:
                raise MalformedPacket("property value runs past the property block")
            value = buf[pos]
            pos += 1
        elif kind == TWO:
            if pos + 2 > stop:
                raise MalformedPacket("property value runs past the property block")
            value = (buf[pos] << 8) | buf[pos + 1]
            pos += 2
        elif kind == FOUR:
            if pos + 4 > stop:
                raise MalformedPacket("property value runs past the property block")
            value = int.from_bytes(buf[pos : pos + 4], "big")
            pos += 4
        elif kind == VARINT:
            value, pos = read_varint(buf, pos, stop)
        elif kind == STRING:
            value, pos = read_string(buf, pos, stop)
        elif kind == BINARY:
            value, pos = read_binary(buf, pos, stop)
        else:
            key, pos = read_string(buf, pos, stop)
            val, pos = read_string(buf, pos, stop)
            user.append((key, val))
            continue
        if pid in _BOOLEAN_BYTES and value > 1:
            raise ProtocolError(f"property {PropertyId(pid).name} must be 0 or 1, got {value}")
        if pid in _NON_ZERO and value == 0:
            raise ProtocolError(f"property {PropertyId(pid).name} must not be 0")
        if kind == VARINT:
            if sub_ids and where is not Where.PUBLISH:
                raise ProtocolError("subscription identifier included more than once")
            sub_ids.append(value)
            continue
        if name in values:
            raise ProtocolError(f"property {PropertyId(pid).name} included more than once")
        values[name] = value
    if pos != stop:
        raise MalformedPacket("property block length does not match its contents")
    if user:
        values["user_properties"] = tuple(user)
    if sub_ids:
        values["subscription_identifiers"] = tuple(sub_ids)
    return Properties(**values), pos


def property_id(name: str) -> int:
    return _ID_OF[name]
