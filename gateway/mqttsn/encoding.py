"""MQTT-SN 1.2 messages -> bytes, both directions. Sans-IO.

``encode`` writes any message; ``encode_publish`` and ``encode_ack`` write the two the
gateway sends most without building a message first (the delivery fast path);
``encapsulate`` wraps an encoded message for a wireless node (section 5.5). Reading is
``gateway.mqttsn.codec``'s.
"""

from __future__ import annotations

from gateway.mqttsn.packets import (
    CLEAN_SESSION,
    DUP,
    MAX_LENGTH,
    QOS_SHIFT,
    RETAIN,
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


def frame(msg_type: int, body: bytes) -> bytes:
    """Length + MsgType + body, with the 3-octet Length from 256 octets on."""
    length = len(body) + 2
    if length <= 0xFF:
        return bytes((length, msg_type)) + body
    length += 2
    if length > MAX_LENGTH:
        raise ValueError(f"an MQTT-SN message holds at most {MAX_LENGTH} octets, not {length}")
    return bytes((0x01, length >> 8, length & 0xFF, msg_type)) + body


def qos_bits(qos: int) -> int:
    """Flag bits 6-5 for ``qos`` (-1 is 0b11)."""
    if qos not in (-1, 0, 1, 2):
        raise ValueError(f"QoS {qos} is not -1, 0, 1 or 2")
    return (qos & 0x03) << QOS_SHIFT


def _u16b(value: int) -> bytes:
    return value.to_bytes(2, "big")


def encode_publish(
    topic_id: int,
    msg_id: int,
    data: bytes,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    topic_id_type: int = TopicIdType.NORMAL,
) -> bytes:
    """PUBLISH without building a ``Publish`` first (the delivery fast path)."""
    flags = qos_bits(qos) | topic_id_type | (RETAIN if retain else 0) | (DUP if dup else 0)
    length = len(data) + 7
    if length <= 0xFF:
        return (
            bytes((length, MsgType.PUBLISH, flags, topic_id >> 8, topic_id & 0xFF))
            + _u16b(msg_id)
            + data
        )
    return frame(MsgType.PUBLISH, bytes((flags,)) + _u16b(topic_id) + _u16b(msg_id) + data)


def encode_ack(msg_type: int, topic_id: int, msg_id: int, code: int = 0) -> bytes:
    """PUBACK or REGACK (7 octets) without building the message first."""
    return bytes((7, msg_type, topic_id >> 8, topic_id & 0xFF, msg_id >> 8, msg_id & 0xFF, code))


def encode(packet: Packet) -> bytes:
    """The bytes of ``packet``; ValueError for a value that cannot be encoded."""
    match packet:
        case Publish():
            return encode_publish(
                packet.topic_id,
                packet.msg_id,
                packet.data,
                packet.qos,
                packet.retain,
                packet.dup,
                packet.topic_id_type,
            )
        case PubAck(topic_id, msg_id, code):
            return frame(MsgType.PUBACK, _u16b(topic_id) + _u16b(msg_id) + bytes((code,)))
        case Advertise(gw_id, duration):
            return frame(MsgType.ADVERTISE, bytes((gw_id,)) + _u16b(duration))
        case SearchGw(radius):
            return frame(MsgType.SEARCHGW, bytes((radius,)))
        case GwInfo(gw_id, address):
            return frame(MsgType.GWINFO, bytes((gw_id,)) + address)
        case Connect(client_id, duration, clean, will, protocol_id):
            flags = (CLEAN_SESSION if clean else 0) | (WILL if will else 0)
            return frame(
                MsgType.CONNECT,
                bytes((flags, protocol_id)) + _u16b(duration) + client_id.encode("utf-8"),
            )
        case ConnAck(code):
            return frame(MsgType.CONNACK, bytes((code,)))
        case WillTopicReq():
            return frame(MsgType.WILLTOPICREQ, b"")
        case WillTopic() | WillTopicUpd():
            kind = MsgType.WILLTOPIC if isinstance(packet, WillTopic) else MsgType.WILLTOPICUPD
            if not packet.topic:
                return frame(kind, b"")
            if packet.qos < 0:
                raise ValueError("a Will has QoS 0, 1 or 2")
            flags = qos_bits(packet.qos) | (RETAIN if packet.retain else 0)
            return frame(kind, bytes((flags,)) + packet.topic.encode("utf-8"))
        case WillMsgReq():
            return frame(MsgType.WILLMSGREQ, b"")
        case WillMsg(message):
            return frame(MsgType.WILLMSG, message)
        case Register(topic_id, msg_id, name):
            return frame(MsgType.REGISTER, _u16b(topic_id) + _u16b(msg_id) + name.encode("utf-8"))
        case RegAck(topic_id, msg_id, code):
            return frame(MsgType.REGACK, _u16b(topic_id) + _u16b(msg_id) + bytes((code,)))
        case PubRec(msg_id):
            return frame(MsgType.PUBREC, _u16b(msg_id))
        case PubRel(msg_id):
            return frame(MsgType.PUBREL, _u16b(msg_id))
        case PubComp(msg_id):
            return frame(MsgType.PUBCOMP, _u16b(msg_id))
        case Subscribe(msg_id, topic, qos, id_type, dup):
            flags = qos_bits(qos) | id_type | (DUP if dup else 0)
            return frame(
                MsgType.SUBSCRIBE, bytes((flags,)) + _u16b(msg_id) + _topic_bytes(topic, id_type)
            )
        case SubAck(topic_id, msg_id, code, qos):
            return frame(
                MsgType.SUBACK,
                bytes((qos_bits(qos),)) + _u16b(topic_id) + _u16b(msg_id) + bytes((code,)),
            )
        case Unsubscribe(msg_id, topic, id_type):
            return frame(
                MsgType.UNSUBSCRIBE,
                bytes((id_type,)) + _u16b(msg_id) + _topic_bytes(topic, id_type),
            )
        case UnsubAck(msg_id):
            return frame(MsgType.UNSUBACK, _u16b(msg_id))
        case PingReq(client_id):
            return frame(MsgType.PINGREQ, client_id.encode("utf-8"))
        case PingResp():
            return frame(MsgType.PINGRESP, b"")
        case Disconnect(duration):
            return frame(MsgType.DISCONNECT, b"" if duration is None else _u16b(duration))
        case WillTopicResp(code):
            return frame(MsgType.WILLTOPICRESP, bytes((code,)))
        case WillMsgUpd(message):
            return frame(MsgType.WILLMSGUPD, message)
        case WillMsgResp(code):
            return frame(MsgType.WILLMSGRESP, bytes((code,)))
        case Encapsulated(node_id, inner, radius):
            if isinstance(inner, Encapsulated):
                raise ValueError("an encapsulation cannot carry another encapsulation")
            return encapsulate(node_id, encode(inner), radius)
    raise TypeError(f"not an MQTT-SN message: {packet!r}")


def encapsulate(node_id: bytes, message: bytes, radius: int = 0) -> bytes:
    """Wrap already encoded ``message`` for the wireless node ``node_id`` (section 5.5)."""
    length = 3 + len(node_id)
    if length > 0xFF:
        raise ValueError(f"a Wireless Node Id has at most 252 octets, not {len(node_id)}")
    return bytes((length, MsgType.ENCAPSULATED, radius & 0x03)) + node_id + message


def _topic_bytes(topic: str | int, id_type: int) -> bytes:
    if id_type == TopicIdType.PREDEFINED:
        if not isinstance(topic, int):
            raise ValueError("a predefined topic is a topic id")
        return _u16b(topic)
    if not isinstance(topic, str):
        raise ValueError("a normal or short topic is a name")
    raw = topic.encode("utf-8")
    if id_type == TopicIdType.SHORT and len(raw) != 2:
        raise ValueError(f"a short topic name has two octets, not {topic!r}")
    return raw
