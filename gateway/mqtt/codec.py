"""Encode and decode every MQTT 3.1.1 and 5.0 control packet. Sans-IO, no state.

``decode(first_byte, body, version)`` turns one framed packet into a packet value;
``encode(packet, version)`` turns a packet value into bytes. Bad input raises an
``MQTTError`` subclass whose ``reason_code`` is the code to report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from gateway.mqtt.errors import (
    BadProtocolName,
    MalformedPacket,
    MQTTError,
    ProtocolError,
    TopicNameInvalid,
    UnsupportedProtocolVersion,
)
from gateway.mqtt.fastpath import encode_ack
from gateway.mqtt.packets import (
    MQTT_5,
    MQTT_31,
    MQTT_311,
    PACKET_TYPE,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
)
from gateway.mqtt.properties import (
    CONNACK_ORDER,
    EMPTY,
    EMPTY_ENCODED,
    Properties,
    Where,
    decode_properties,
    encode_properties,
)
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.wire import (
    Buffer,
    encode_binary,
    encode_string,
    encode_varint,
    read_binary,
    read_string,
    read_u16,
)

SUPPORTED_VERSIONS: Final = (MQTT_311, MQTT_5)
#: A protocol level with the top bit set: a bridge (Mosquitto's try_private), for the
#: levels that have no subscription options of their own.
_BRIDGE_BIT: Final = 0x80
_BRIDGE_LEVELS: Final = frozenset({_BRIDGE_BIT | MQTT_31, _BRIDGE_BIT | MQTT_311})

# Reason codes each packet may carry (MQTT 5.0 sections 3.4.2.1 ... 3.15.2.1).
_PUB_RESPONSE_CODES: Final = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
_PUB_RELEASE_CODES: Final = frozenset({0x00, 0x92})
_SUBACK_CODES: Final = frozenset(
    {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}
)
_UNSUBACK_CODES: Final = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
_AUTH_CODES: Final = frozenset({0x00, 0x18, 0x19})
_DISCONNECT_CODES: Final = frozenset(
    {
        0x00,
        0x04,
        0x80,
        0x81,
        0x82,
        0x83,
        0x87,
        0x89,
        0x8B,
        0x8D,
        0x8E,
        0x8F,
        0x90,
        0x93,
        0x94,
        0x95,
        0x96,
        0x97,
        0x98,
        0x99,
        0x9A,
        0x9B,
        0x9C,
        0x9D,
        0x9E,
        0x9F,
        0xA0,
        0xA1,
        0xA2,
    }
)
_CONNACK_CODES: Final = frozenset(
    {
        0x00,
        0x80,
        0x81,
        0x82,
        0x83,
        0x84,
        0x85,
        0x86,
        0x87,
        0x88,
        0x89,
        0x8A,
        0x8C,
        0x90,
        0x95,
        0x97,
        0x99,
        0x9A,
        0x9B,
        0x9C,
        0x9D,
        0x9F,
    }
)

#: Fixed-header flags every packet type but PUBLISH must carry (MQTT-2.2.2-1, -2).
_REQUIRED_FLAGS: Final = {
    PacketType.PUBREL: 0x02,
    PacketType.SUBSCRIBE: 0x02,
    PacketType.UNSUBSCRIBE: 0x02,
}


# --------------------------------------------------------------------------- decode


def decode(first_byte: int, body: Buffer, version: int) -> Packet:
    """One packet from its first byte and its body (everything after the length)."""
    kind = first_byte >> 4
    flags = first_byte & 0x0F
    if kind == PacketType.PUBLISH:
        return _decode_publish(flags, body, version)
    if kind == 0 or (kind == PacketType.AUTH and version != MQTT_5):
        raise MalformedPacket(f"reserved packet type {kind}")
    required = _REQUIRED_FLAGS.get(kind, 0)  # type: ignore[call-overload]
    if flags != required and not (version == MQTT_31 and flags == required | 0x08):
        # MQTT 3.1 let a re-sent PUBREL, SUBSCRIBE or UNSUBSCRIBE carry DUP (0x08).
        raise MalformedPacket(f"invalid fixed header flags 0x{flags:x} for packet type {kind}")
    return _DECODERS[kind](body, version)


def _end_check(pos: int, end: int, what: str) -> None:
    if pos != end:
        raise MalformedPacket(f"{end - pos} unexpected bytes at the end of {what}")


def _decode_connect(body: Buffer, version: int) -> Connect:
    end = len(body)
    name, pos = read_string(body, 0, end)
    if pos >= end:
        raise MalformedPacket("CONNECT ends before the protocol level")
    level = body[pos]
    pos += 1
    bridge = level in _BRIDGE_LEVELS
    if bridge:
        level &= ~_BRIDGE_BIT
    if name == "MQIsdp":
        # MQTT 3.1: protocol name MQIsdp, level 3 (MQTT 3.1 section 3.1).
        if level != MQTT_31:
            raise UnsupportedProtocolVersion(f"MQIsdp protocol level {level} is not 3", level)
    elif name != "MQTT":
        raise BadProtocolName(f"protocol name {name!r} is not MQTT")
    elif level not in SUPPORTED_VERSIONS:
        raise UnsupportedProtocolVersion(f"protocol level {level} is not supported", level)
    try:
        return _decode_connect_rest(body, pos, end, level, bridge)
    except MQTTError as exc:
        exc.protocol_version = level
        raise


def _decode_connect_rest(body: Buffer, pos: int, end: int, level: int, bridge: bool) -> Connect:
    if pos + 3 > end:
        raise MalformedPacket("CONNECT ends inside its variable header")
    flags = body[pos]
    keep_alive = (body[pos + 1] << 8) | body[pos + 2]
    pos += 3
    if flags & 0x01 and level != MQTT_31:  # MQTT 3.1 leaves the bit unused, not reserved
        raise MalformedPacket("CONNECT reserved flag is set")  # MQTT-3.1.2-3
    clean_start = bool(flags & 0x02)
    will_flag = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    password_flag = bool(flags & 0x40)
    username_flag = bool(flags & 0x80)
    if will_qos == 3:
        raise MalformedPacket("will QoS is 3")  # MQTT-3.1.2-14
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("will QoS or retain set without a will")  # MQTT-3.1.2-11, -13
    if level != MQTT_5 and password_flag and not username_flag:
        raise MalformedPacket("password flag set without user name flag")  # MQTT-3.1.2-22
    props = EMPTY
    if level == MQTT_5:
        props, pos = decode_properties(body, pos, end, Where.CONNECT)
        if props.authentication_data is not None and props.authentication_method is None:
            raise ProtocolError("authentication data without an authentication method")
    client_id, pos = read_string(body, pos, end)
    will = None
    if will_flag:
        will_props = EMPTY
        if level == MQTT_5:
            will_props, pos = decode_properties(body, pos, end, Where.WILL)
        will_topic, pos = read_string(body, pos, end)
        will_payload, pos = read_binary(body, pos, end)
        if not will_topic or "+" in will_topic or "#" in will_topic:
            raise TopicNameInvalid(f"will topic {will_topic!r} is not a valid topic name")
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = None
    password = None
    if username_flag:
        username, pos = read_string(body, pos, end)
    if password_flag:
        password, pos = read_binary(body, pos, end)
    _end_check(pos, end, "CONNECT")
    return Connect(
        client_id=client_id,
        protocol_version=level,
        clean_start=clean_start,
        keep_alive=keep_alive,
        will=will,
        username=username,
        password=password,
        properties=props,
        protocol_name="MQIsdp" if level == MQTT_31 else "MQTT",
        bridge=bridge,
    )


def _decode_connack(body: Buffer, version: int) -> ConnAck:
    end = len(body)
    if end < 2:
        raise MalformedPacket("CONNACK shorter than two bytes")
    flags, code = body[0], body[1]
    if flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags set")  # MQTT-3.2.2-1
    props = EMPTY
    if version == MQTT_5:
        if code not in _CONNACK_CODES:
            raise MalformedPacket(f"invalid CONNACK reason code 0x{code:02x}")
        props, pos = decode_properties(body, 2, end, Where.CONNACK)
        _end_check(pos, end, "CONNACK")
    else:
        if code > 5:
            raise MalformedPacket(f"invalid CONNACK return code {code}")
        _end_check(2, end, "CONNACK")
    return ConnAck(bool(flags & 0x01), code, props)


def _decode_publish(flags: int, body: Buffer, version: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH QoS is 3")  # MQTT-3.3.1-4
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH DUP set on QoS 0")  # MQTT-3.3.1-2
    end = len(body)
    topic, pos = read_string(body, 0, end)
    packet_id = 0
    if qos:
        packet_id, pos = read_u16(body, pos, end)
        if packet_id == 0:
            raise ProtocolError("PUBLISH with QoS > 0 has packet identifier 0")  # MQTT-2.3.1-1
    props = EMPTY
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, end, Where.PUBLISH)
    if "+" in topic or "#" in topic:
        raise TopicNameInvalid(f"PUBLISH topic {topic!r} contains a wildcard")  # MQTT-3.3.2-2
    if not topic and version != MQTT_5:
        raise TopicNameInvalid("PUBLISH topic is empty")  # MQTT-4.7.3-1
    return Publish(topic, bytes(body[pos:end]), qos, bool(flags & 0x01), dup, packet_id, props)


def _make_ack_decoder(
    cls: type[PubAck] | type[PubRec] | type[PubRel] | type[PubComp],
    codes: frozenset[int],
    where: Where,
) -> Callable[[Buffer, int], Packet]:
    name = cls.__name__.upper()

    def decode_ack(body: Buffer, version: int) -> Packet:
        end = len(body)
        packet_id, pos = read_u16(body, 0, end)
        if packet_id == 0:
            raise ProtocolError(f"{name} has packet identifier 0")
        if version != MQTT_5:
            _end_check(pos, end, name)
            return cls(packet_id)
        if end == 2:
            return cls(packet_id)
        code = body[2]
        if code not in codes:
            raise MalformedPacket(f"invalid {name} reason code 0x{code:02x}")
        props = EMPTY
        if end > 3:
            props, pos = decode_properties(body, 3, end, where)
            _end_check(pos, end, name)
        return cls(packet_id, code, props)

    return decode_ack


def _decode_subscribe(body: Buffer, version: int) -> Subscribe:
    end = len(body)
    packet_id, pos = read_u16(body, 0, end)
    if packet_id == 0:
        raise ProtocolError("SUBSCRIBE has packet identifier 0")  # MQTT-2.3.1-1
    props = EMPTY
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, end, Where.SUBSCRIBE)
    subs: list[SubscriptionRequest] = []
    while pos < end:
        topic_filter, pos = read_string(body, pos, end)
        if pos >= end:
            raise MalformedPacket("SUBSCRIBE topic filter without subscription options")
        options = body[pos]
        pos += 1
        qos = options & 0x03
        if qos == 3:
            if version == MQTT_5:
                # MQTT 5.0 section 3.8.3.1: a Maximum QoS of 3 is a Protocol Error.
                raise ProtocolError("SUBSCRIBE maximum QoS is 3")
            raise MalformedPacket("SUBSCRIBE requested QoS is 3")  # MQTT-3-8.3-4 (3.1.1)
        if version == MQTT_5:
            if options & 0xC0:
                raise MalformedPacket("SUBSCRIBE options reserved bits set")  # MQTT-3.8.3-5
            retain_handling = (options >> 4) & 0x03
            if retain_handling == 3:
                raise ProtocolError("SUBSCRIBE retain handling is 3")
            subs.append(
                SubscriptionRequest(
                    topic_filter,
                    qos,
                    bool(options & 0x04),
                    bool(options & 0x08),
                    retain_handling,
                )
            )
        else:
            if options & 0xFC:
                raise MalformedPacket("SUBSCRIBE reserved bits set")  # MQTT-3-8.3-4
            subs.append(SubscriptionRequest(topic_filter, qos))
    if not subs:
        raise ProtocolError("SUBSCRIBE without topic filters")  # MQTT-3.8.3-3
    return Subscribe(packet_id, tuple(subs), props)


def _decode_suback(body: Buffer, version: int) -> SubAck:
    end = len(body)
    packet_id, pos = read_u16(body, 0, end)
    props = EMPTY
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, end, Where.SUBACK)
        allowed = _SUBACK_CODES
    else:
        allowed = frozenset({0x00, 0x01, 0x02, 0x80})
    codes = tuple(body[pos:end])
    if not codes:
        raise ProtocolError("SUBACK without return codes")
    for code in codes:
        if code not in allowed:
            raise MalformedPacket(f"invalid SUBACK reason code 0x{code:02x}")
    return SubAck(packet_id, codes, props)


def _decode_unsubscribe(body: Buffer, version: int) -> Unsubscribe:
    end = len(body)
    packet_id, pos = read_u16(body, 0, end)
    if packet_id == 0:
        raise ProtocolError("UNSUBSCRIBE has packet identifier 0")  # MQTT-2.3.1-1
    props = EMPTY
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, end, Where.UNSUBSCRIBE)
    filters: list[str] = []
    while pos < end:
        topic_filter, pos = read_string(body, pos, end)
        filters.append(topic_filter)
    if not filters:
        raise ProtocolError("UNSUBSCRIBE without topic filters")  # MQTT-3.10.3-2
    return Unsubscribe(packet_id, tuple(filters), props)


def _decode_unsuback(body: Buffer, version: int) -> UnsubAck:
    end = len(body)
    packet_id, pos = read_u16(body, 0, end)
    if version != MQTT_5:
        _end_check(pos, end, "UNSUBACK")
        return UnsubAck(packet_id)
    props, pos = decode_properties(body, pos, end, Where.UNSUBACK)
    codes = tuple(body[pos:end])
    if not codes:
        raise ProtocolError("UNSUBACK without reason codes")
    for code in codes:
        if code not in _UNSUBACK_CODES:
            raise MalformedPacket(f"invalid UNSUBACK reason code 0x{code:02x}")
    return UnsubAck(packet_id, codes, props)


def _decode_pingreq(body: Buffer, version: int) -> PingReq:
    _end_check(0, len(body), "PINGREQ")
    return PING_REQ


def _decode_pingresp(body: Buffer, version: int) -> PingResp:
    _end_check(0, len(body), "PINGRESP")
    return PING_RESP


def _decode_reason_and_props(
    body: Buffer, version: int, where: Where, codes: frozenset[int]
) -> tuple[int, Properties]:
    end = len(body)
    if version != MQTT_5:
        _end_check(0, end, where.name)
        return 0, EMPTY
    if end == 0:
        return 0, EMPTY
    code = body[0]
    if code not in codes:
        raise MalformedPacket(f"invalid {where.name} reason code 0x{code:02x}")
    if end == 1:
        return code, EMPTY
    props, pos = decode_properties(body, 1, end, where)
    _end_check(pos, end, where.name)
    return code, props


def _decode_disconnect(body: Buffer, version: int) -> Disconnect:
    code, props = _decode_reason_and_props(body, version, Where.DISCONNECT, _DISCONNECT_CODES)
    return Disconnect(code, props)


def _decode_auth(body: Buffer, version: int) -> Auth:
    code, props = _decode_reason_and_props(body, version, Where.AUTH, _AUTH_CODES)
    return Auth(code, props)


PING_REQ: Final = PingReq()
PING_RESP: Final = PingResp()

_DECODERS: Final[dict[int, Callable[[Buffer, int], Packet]]] = {
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBACK: _make_ack_decoder(PubAck, _PUB_RESPONSE_CODES, Where.PUBACK),
    PacketType.PUBREC: _make_ack_decoder(PubRec, _PUB_RESPONSE_CODES, Where.PUBREC),
    PacketType.PUBREL: _make_ack_decoder(PubRel, _PUB_RELEASE_CODES, Where.PUBREL),
    PacketType.PUBCOMP: _make_ack_decoder(PubComp, _PUB_RELEASE_CODES, Where.PUBCOMP),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: _decode_unsuback,
    PacketType.PINGREQ: _decode_pingreq,
    PacketType.PINGRESP: _decode_pingresp,
    PacketType.DISCONNECT: _decode_disconnect,
    PacketType.AUTH: _decode_auth,
}


# --------------------------------------------------------------------------- encode


def frame(first_byte: int, body: bytes) -> bytes:
    """Fixed header plus body."""
    return bytes((first_byte,)) + encode_varint(len(body)) + body


def _props(props: Properties, version: int) -> bytes:
    if version != MQTT_5:
        return b""
    return encode_properties(props)


def encode(packet: Packet, version: int) -> bytes:
    """The bytes of ``packet`` for a peer speaking protocol ``version``."""
    kind = PACKET_TYPE[type(packet)]
    return _ENCODERS[kind](packet, version)


def _encode_connect(p: Connect, version: int) -> bytes:
    level = p.protocol_version
    flags = 0
    if p.clean_start:
        flags |= 0x02
    if p.will is not None:
        flags |= 0x04 | (p.will.qos << 3)
        if p.will.retain:
            flags |= 0x20
    if p.password is not None:
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    body = bytearray(encode_string(p.protocol_name))
    body.append(level | _BRIDGE_BIT if p.bridge else level)
    body.append(flags)
    body += p.keep_alive.to_bytes(2, "big")
    body += _props(p.properties, level)
    body += encode_string(p.client_id)
    if p.will is not None:
        body += _props(p.will.properties, level)
        body += encode_string(p.will.topic)
        body += encode_binary(p.will.payload)
    if p.username is not None:
        body += encode_string(p.username)
    if p.password is not None:
        body += encode_binary(p.password)
    return frame(0x10, bytes(body))


def _encode_connack(p: ConnAck, version: int) -> bytes:
    props = encode_properties(p.properties, CONNACK_ORDER) if version == MQTT_5 else b""
    body = bytes((1 if p.session_present else 0, p.reason_code)) + props
    return frame(0x20, body)


def encode_publish(p: Publish, version: int) -> bytes:
    first = 0x30 | (p.qos << 1)
    if p.dup:
        first |= 0x08
    if p.retain:
        first |= 0x01
    topic = p.topic.encode("utf-8")
    parts = [len(topic).to_bytes(2, "big"), topic]
    if p.qos:
        parts.append(p.packet_id.to_bytes(2, "big"))
    if version == MQTT_5:
        parts.append(encode_properties(p.properties))
    parts.append(p.payload)
    return frame(first, b"".join(parts))


def _make_ack_encoder(kind: PacketType, first_byte: int) -> Callable[[Packet, int], bytes]:
    def encode_pub_ack(p: Packet, version: int) -> bytes:
        assert isinstance(p, (PubAck, PubRec, PubRel, PubComp))
        if version != MQTT_5 or (p.reason_code == 0 and p.properties is EMPTY):
            return encode_ack(kind, p.packet_id, 0, version)
        pid = p.packet_id.to_bytes(2, "big")
        if p.properties is EMPTY or not p.properties:
            return frame(first_byte, pid + bytes((p.reason_code,)))
        return frame(first_byte, pid + bytes((p.reason_code,)) + encode_properties(p.properties))

    return encode_pub_ack


def _encode_subscribe(p: Subscribe, version: int) -> bytes:
    body = bytearray(p.packet_id.to_bytes(2, "big"))
    body += _props(p.properties, version)
    for sub in p.subscriptions:
        body += encode_string(sub.topic_filter)
        options = sub.qos
        if version == MQTT_5:
            if sub.no_local:
                options |= 0x04
            if sub.retain_as_published:
                options |= 0x08
            options |= sub.retain_handling << 4
        body.append(options)
    return frame(0x82, bytes(body))


def _encode_suback(p: SubAck, version: int) -> bytes:
    return frame(
        0x90, p.packet_id.to_bytes(2, "big") + _props(p.properties, version) + bytes(p.reason_codes)
    )


def _encode_unsubscribe(p: Unsubscribe, version: int) -> bytes:
    body = bytearray(p.packet_id.to_bytes(2, "big"))
    body += _props(p.properties, version)
    for topic_filter in p.topic_filters:
        body += encode_string(topic_filter)
    return frame(0xA2, bytes(body))


def _encode_unsuback(p: UnsubAck, version: int) -> bytes:
    pid = p.packet_id.to_bytes(2, "big")
    if version != MQTT_5:
        return frame(0xB0, pid)
    return frame(0xB0, pid + encode_properties(p.properties) + bytes(p.reason_codes))


def _encode_reason_and_props(first_byte: int, code: int, props: Properties, version: int) -> bytes:
    if version != MQTT_5 or (code == 0 and (props is EMPTY or not props)):
        return bytes((first_byte, 0))
    if props is EMPTY or not props:
        return bytes((first_byte, 1, code))
    return frame(first_byte, bytes((code,)) + encode_properties(props))


def _encode_disconnect(p: Disconnect, version: int) -> bytes:
    return _encode_reason_and_props(0xE0, p.reason_code, p.properties, version)


def _encode_auth(p: Auth, version: int) -> bytes:
    if version != MQTT_5:
        raise ValueError("AUTH exists only in MQTT 5.0")
    return _encode_reason_and_props(0xF0, p.reason_code, p.properties, version)


_PINGREQ_BYTES: Final = b"\xc0\x00"
_PINGRESP_BYTES: Final = b"\xd0\x00"

_ENCODERS: Final[dict[int, Callable[..., bytes]]] = {
    PacketType.CONNECT: _encode_connect,
    PacketType.CONNACK: _encode_connack,
    PacketType.PUBLISH: encode_publish,
    PacketType.PUBACK: _make_ack_encoder(PacketType.PUBACK, 0x40),
    PacketType.PUBREC: _make_ack_encoder(PacketType.PUBREC, 0x50),
    PacketType.PUBREL: _make_ack_encoder(PacketType.PUBREL, 0x62),
    PacketType.PUBCOMP: _make_ack_encoder(PacketType.PUBCOMP, 0x70),
    PacketType.SUBSCRIBE: _encode_subscribe,
    PacketType.SUBACK: _encode_suback,
    PacketType.UNSUBSCRIBE: _encode_unsubscribe,
    PacketType.UNSUBACK: _encode_unsuback,
    PacketType.PINGREQ: lambda p, v: _PINGREQ_BYTES,
    PacketType.PINGRESP: lambda p, v: _PINGRESP_BYTES,
    PacketType.DISCONNECT: _encode_disconnect,
    PacketType.AUTH: _encode_auth,
}

__all__ = ["EMPTY_ENCODED", "ReasonCode", "decode", "encode", "encode_publish", "frame"]
