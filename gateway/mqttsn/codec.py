"""MQTT-SN 1.2 bytes <-> messages. Sans-IO: no sockets, no clock, no asyncio.

``decode(data)`` reads one whole message, as a UDP datagram or a UART frame carries
it; ``read_message(buffer, start)`` reads one from a stream (``NEED_DATA`` while it is
incomplete, so every proper prefix of a message reads as ``NEED_DATA``); ``encode``
writes any message, both directions. Errors are ``MalformedMessage`` with the byte
offset of the problem, so logs can name it. Section numbers refer to the MQTT-SN 1.2
specification (see ``gateway.mqttsn.packets``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from gateway.mqttsn.packets import (
    CLEAN_SESSION,
    DUP,
    MAX_LENGTH,
    QOS_OF_BITS,
    QOS_SHIFT,
    RETAIN,
    TOPIC_ID_TYPE,
    WILL,
    Advertise,
    ConnAck,
    Connect,
    Disconnect,
    Encapsulated,
    GwInfo,
    MsgType,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    SearchGw,
    SubAck,
    Subscribe,
    TopicIdType,
    UnsubAck,
    Unsubscribe,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
    WillTopicUpd,
)


class MalformedMessage(ValueError):
    """The bytes are not an MQTT-SN message; ``offset`` is where the problem is."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} (at byte {offset})")
        self.reason = reason
        self.offset = offset


class MessageTooLarge(MalformedMessage):
    """The Length field exceeds the configured limit (cut off before buffering)."""


class NeedData:
    """Sentinel: the buffer holds no complete message yet."""

    _instance: NeedData | None = None

    def __new__(cls) -> NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"

    def __bool__(self) -> bool:
        return False


NEED_DATA: Final = NeedData()


# ============================================================================ decoding


def header(buffer: bytes | bytearray, start: int = 0) -> tuple[int, int] | NeedData:
    """``(length, header_size)`` of the message at ``start`` (section 5.2.1): one octet,
    or 0x01 followed by two octets for longer messages."""
    available = len(buffer) - start
    if available < 1:
        return NEED_DATA
    first = buffer[start]
    if first == 0x01:
        if available < 3:
            return NEED_DATA
        length = (buffer[start + 1] << 8) | buffer[start + 2]
        if length < 4:
            raise MalformedMessage(f"3-octet Length {length} is shorter than its header", start)
        return length, 3
    if first == 0x00:
        raise MalformedMessage("Length 0", start)
    return first, 1


def read_message(
    buffer: bytes | bytearray, start: int = 0, max_size: int = MAX_LENGTH
) -> tuple[Packet, int] | NeedData:
    """The message at ``start`` and the offset after it, or ``NEED_DATA``.

    A Length beyond ``max_size`` is refused as soon as the Length field is read.
    A forwarder-encapsulated message (section 5.5) spans its header and the message it
    carries.
    """
    head = header(buffer, start)
    if isinstance(head, NeedData):
        return NEED_DATA
    length, size = head
    if length > max_size:
        raise MessageTooLarge(f"Length {length} exceeds the limit of {max_size}", start)
    end = start + length
    if size == 1 and len(buffer) > start + 1 and buffer[start + 1] == MsgType.ENCAPSULATED:
        if len(buffer) < end:
            return NEED_DATA
        inner = read_message(buffer, end, max_size)
        if isinstance(inner, NeedData):
            return NEED_DATA
        return decode(bytes(buffer[start : inner[1]]), max_size), inner[1]
    if len(buffer) < end:
        return NEED_DATA
    return decode(bytes(buffer[start:end]), max_size), end


def decode(data: bytes, max_size: int = MAX_LENGTH) -> Packet:
    """One whole message (a datagram or a frame): its Length must match ``len(data)``."""
    head = header(data)
    if isinstance(head, NeedData):
        if not data:
            raise MalformedMessage("empty message", 0)
        raise MalformedMessage("message ends inside its Length field", len(data))
    length, size = head
    if length > max_size:
        raise MessageTooLarge(f"Length {length} exceeds the limit of {max_size}", 0)
    if len(data) <= size:
        raise MalformedMessage(f"message of {len(data)} octets has no MsgType", len(data))
    msg_type = data[size]
    if msg_type == MsgType.ENCAPSULATED:
        return _decode_encapsulated(data, length, size, max_size)
    if length > len(data):
        raise MalformedMessage(
            f"Length {length} but the message has only {len(data)} octets", len(data)
        )
    if length < len(data):
        raise MalformedMessage(
            f"{len(data) - length} octets after the end of the message (Length {length})", length
        )
    reader = _READERS.get(msg_type)
    if reader is None:
        raise MalformedMessage(f"reserved MsgType 0x{msg_type:02x}", size)
    return reader(data, size + 1)


def _decode_encapsulated(data: bytes, length: int, size: int, max_size: int) -> Encapsulated:
    """Section 5.5: Length (1 octet, up to the end of the Wireless Node Id), 0xFE, Ctrl,
    Wireless Node Id, then the MQTT-SN message."""
    if size != 1:
        raise MalformedMessage("an encapsulation header has a 1-octet Length", 0)
    if length < 3:
        raise MalformedMessage(f"encapsulation Length {length} is shorter than 3", 0)
    if length >= len(data):
        raise MalformedMessage("encapsulation carries no message", len(data))
    ctrl = data[2]
    if ctrl & 0xFC:
        raise MalformedMessage(f"reserved Ctrl bits set (0x{ctrl:02x})", 2)
    try:
        packet = decode(data[length:], max_size)
    except MalformedMessage as exc:
        raise type(exc)(exc.reason, exc.offset + length) from None
    if isinstance(packet, Encapsulated):
        raise MalformedMessage("an encapsulated message inside an encapsulation", length)
    return Encapsulated(data[3:length], packet, ctrl & 0x03)


def _exact(data: bytes, start: int, size: int, what: str) -> None:
    if len(data) - start != size:
        raise MalformedMessage(
            f"{what} has {len(data) - start} octets after its MsgType, not {size}", start
        )


def _at_least(data: bytes, start: int, size: int, what: str) -> None:
    if len(data) - start < size:
        raise MalformedMessage(
            f"{what} has {len(data) - start} octets after its MsgType, fewer than {size}",
            len(data),
        )


def _u16(data: bytes, at: int) -> int:
    return (data[at] << 8) | data[at + 1]


def _text(data: bytes, start: int, what: str) -> str:
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"{what} is not UTF-8", start + exc.start) from None


def _qos(flags: int) -> int:
    return QOS_OF_BITS[(flags >> QOS_SHIFT) & 0x03]


def _advertise(data: bytes, at: int) -> Advertise:
    _exact(data, at, 3, "ADVERTISE")
    return Advertise(data[at], _u16(data, at + 1))


def _searchgw(data: bytes, at: int) -> SearchGw:
    _exact(data, at, 1, "SEARCHGW")
    return SearchGw(data[at])


def _gwinfo(data: bytes, at: int) -> GwInfo:
    _at_least(data, at, 1, "GWINFO")
    return GwInfo(data[at], data[at + 1 :])


def _connect(data: bytes, at: int) -> Connect:
    _at_least(data, at, 4, "CONNECT")
    flags = data[at]
    return Connect(
        client_id=_text(data, at + 4, "ClientId"),
        duration=_u16(data, at + 2),
        clean_session=bool(flags & CLEAN_SESSION),
        will=bool(flags & WILL),
        protocol_id=data[at + 1],
    )


def _connack(data: bytes, at: int) -> ConnAck:
    _exact(data, at, 1, "CONNACK")
    return ConnAck(data[at])


def _empty(kind: type[WillTopicReq | WillMsgReq | PingResp]) -> Callable[[bytes, int], Packet]:
    def read(data: bytes, at: int) -> Packet:
        _exact(data, at, 0, kind.__name__.upper())
        return kind()

    return read


def _will_topic(
    kind: type[WillTopic | WillTopicUpd],
) -> Callable[[bytes, int], WillTopic | WillTopicUpd]:
    def read(data: bytes, at: int) -> WillTopic | WillTopicUpd:
        if len(data) <= at + 1:
            # The empty form deletes the Will (sections 5.4.7, 5.4.22); flags without a
            # topic mean the same.
            return kind()
        flags = data[at]
        qos = _qos(flags)
        if qos < 0:
            raise MalformedMessage("Will QoS -1", at)
        return kind(_text(data, at + 1, "WillTopic"), qos, bool(flags & RETAIN))

    return read


def _will_msg(data: bytes, at: int) -> WillMsg:
    return WillMsg(data[at:])


def _will_msg_upd(data: bytes, at: int) -> WillMsgUpd:
    return WillMsgUpd(data[at:])


def _register(data: bytes, at: int) -> Register:
    _at_least(data, at, 4, "REGISTER")
    return Register(_u16(data, at), _u16(data, at + 2), _text(data, at + 4, "TopicName"))


def _regack(data: bytes, at: int) -> RegAck:
    _exact(data, at, 5, "REGACK")
    return RegAck(_u16(data, at), _u16(data, at + 2), data[at + 4])


def _publish(data: bytes, at: int) -> Publish:
    _at_least(data, at, 5, "PUBLISH")
    flags = data[at]
    return Publish(
        topic_id=_u16(data, at + 1),
        msg_id=_u16(data, at + 3),
        data=data[at + 5 :],
        qos=QOS_OF_BITS[(flags >> QOS_SHIFT) & 0x03],
        retain=bool(flags & RETAIN),
        dup=bool(flags & DUP),
        topic_id_type=flags & TOPIC_ID_TYPE,
    )


def _puback(data: bytes, at: int) -> PubAck:
    _exact(data, at, 5, "PUBACK")
    return PubAck(_u16(data, at), _u16(data, at + 2), data[at + 4])


def _msg_id_only(
    kind: type[PubRec | PubRel | PubComp | UnsubAck],
) -> Callable[[bytes, int], Packet]:
    def read(data: bytes, at: int) -> Packet:
        _exact(data, at, 2, kind.__name__.upper())
        return kind(_u16(data, at))

    return read


def _topic_field(data: bytes, at: int, id_type: int, what: str) -> str | int:
    """SUBSCRIBE / UNSUBSCRIBE: a topic name (normal), two characters (short) or a
    topic id (predefined), section 5.4.15."""
    if id_type == TopicIdType.PREDEFINED:
        _exact(data, at, 2, f"{what} with a predefined topic id")
        return _u16(data, at)
    if id_type == TopicIdType.SHORT:
        _exact(data, at, 2, f"{what} with a short topic name")
    elif id_type == TopicIdType.RESERVED:
        raise MalformedMessage(f"{what} with the reserved TopicIdType 0b11", at - 3)
    return _text(data, at, "TopicName")


def _subscribe(data: bytes, at: int) -> Subscribe:
    _at_least(data, at, 3, "SUBSCRIBE")
    flags = data[at]
    id_type = flags & TOPIC_ID_TYPE
    return Subscribe(
        msg_id=_u16(data, at + 1),
        topic=_topic_field(data, at + 3, id_type, "SUBSCRIBE"),
        qos=_qos(flags),
        topic_id_type=id_type,
        dup=bool(flags & DUP),
    )


def _suback(data: bytes, at: int) -> SubAck:
    _exact(data, at, 6, "SUBACK")
    return SubAck(_u16(data, at + 1), _u16(data, at + 3), data[at + 5], _qos(data[at]))


def _unsubscribe(data: bytes, at: int) -> Unsubscribe:
    _at_least(data, at, 3, "UNSUBSCRIBE")
    id_type = data[at] & TOPIC_ID_TYPE
    return Unsubscribe(
        _u16(data, at + 1), _topic_field(data, at + 3, id_type, "UNSUBSCRIBE"), id_type
    )


def _pingreq(data: bytes, at: int) -> PingReq:
    return PingReq(_text(data, at, "ClientId"))


def _disconnect(data: bytes, at: int) -> Disconnect:
    if len(data) == at:
        return Disconnect()
    _exact(data, at, 2, "DISCONNECT")
    return Disconnect(_u16(data, at))


def _return_code(
    kind: type[WillTopicResp | WillMsgResp],
) -> Callable[[bytes, int], Packet]:
    def read(data: bytes, at: int) -> Packet:
        _exact(data, at, 1, kind.__name__.upper())
        return kind(data[at])

    return read


_READERS: Final[dict[int, Callable[[bytes, int], Packet]]] = {
    MsgType.ADVERTISE: _advertise,
    MsgType.SEARCHGW: _searchgw,
    MsgType.GWINFO: _gwinfo,
    MsgType.CONNECT: _connect,
    MsgType.CONNACK: _connack,
    MsgType.WILLTOPICREQ: _empty(WillTopicReq),
    MsgType.WILLTOPIC: _will_topic(WillTopic),
    MsgType.WILLMSGREQ: _empty(WillMsgReq),
    MsgType.WILLMSG: _will_msg,
    MsgType.REGISTER: _register,
    MsgType.REGACK: _regack,
    MsgType.PUBLISH: _publish,
    MsgType.PUBACK: _puback,
    MsgType.PUBCOMP: _msg_id_only(PubComp),
    MsgType.PUBREC: _msg_id_only(PubRec),
    MsgType.PUBREL: _msg_id_only(PubRel),
    MsgType.SUBSCRIBE: _subscribe,
    MsgType.SUBACK: _suback,
    MsgType.UNSUBSCRIBE: _unsubscribe,
    MsgType.UNSUBACK: _msg_id_only(UnsubAck),
    MsgType.PINGREQ: _pingreq,
    MsgType.PINGRESP: _empty(PingResp),
    MsgType.DISCONNECT: _disconnect,
    MsgType.WILLTOPICUPD: _will_topic(WillTopicUpd),
    MsgType.WILLTOPICRESP: _return_code(WillTopicResp),
    MsgType.WILLMSGUPD: _will_msg_upd,
    MsgType.WILLMSGRESP: _return_code(WillMsgResp),
}


def peek_publish(data: bytes) -> tuple[int, int, int, bytes] | None:
    """``(flags, topic_id, msg_id, data)`` when ``data`` is exactly one PUBLISH with a
    1-octet Length (the datagram fast path), else None: ``decode`` then reads it and
    names any problem. What it returns is what ``decode`` would (a differential test
    holds the two together)."""
    n = len(data)
    if n < 7 or data[0] != n or data[1] != MsgType.PUBLISH:
        return None
    return data[2], (data[3] << 8) | data[4], (data[5] << 8) | data[6], data[7:]


def flags_qos(flags: int) -> int:
    """The QoS in a Flags octet (0b11 is -1)."""
    return QOS_OF_BITS[(flags >> QOS_SHIFT) & 0x03]
