"""MQTT-SN 1.2 messages as frozen slotted dataclasses, named as in the specification.

Section numbers refer to "MQTT For Sensor Networks (MQTT-SN) Protocol Specification
Version 1.2" (Stanford-Clark, Truong; November 14, 2013). Wire values are ``IntEnum``s.
A QoS is -1, 0, 1 or 2 (section 5.3.4: the flag value 0b11 is QoS -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final


class MsgType(IntEnum):
    """Section 5.2.2, Table 3 (0x03, 0x11, 0x19, 0x1E-0xFD and 0xFF are reserved)."""

    ADVERTISE = 0x00
    SEARCHGW = 0x01
    GWINFO = 0x02
    CONNECT = 0x04
    CONNACK = 0x05
    WILLTOPICREQ = 0x06
    WILLTOPIC = 0x07
    WILLMSGREQ = 0x08
    WILLMSG = 0x09
    REGISTER = 0x0A
    REGACK = 0x0B
    PUBLISH = 0x0C
    PUBACK = 0x0D
    PUBCOMP = 0x0E
    PUBREC = 0x0F
    PUBREL = 0x10
    SUBSCRIBE = 0x12
    SUBACK = 0x13
    UNSUBSCRIBE = 0x14
    UNSUBACK = 0x15
    PINGREQ = 0x16
    PINGRESP = 0x17
    DISCONNECT = 0x18
    WILLTOPICUPD = 0x1A
    WILLTOPICRESP = 0x1B
    WILLMSGUPD = 0x1C
    WILLMSGRESP = 0x1D
    ENCAPSULATED = 0xFE


class ReturnCode(IntEnum):
    """Section 5.3.10, Table 5 (0x04-0xFF are reserved)."""

    ACCEPTED = 0x00
    CONGESTION = 0x01
    INVALID_TOPIC_ID = 0x02
    NOT_SUPPORTED = 0x03


class TopicIdType(IntEnum):
    """Section 5.3.4, flags bits 1-0."""

    NORMAL = 0b00  # a topic id registered with REGISTER (or assigned by SUBACK)
    PREDEFINED = 0b01  # a topic id both sides know in advance
    SHORT = 0b10  # a two-character topic name carried in the topic id field
    RESERVED = 0b11


#: Topic ids 0x0000 and 0xFFFF are reserved (section 5.3.11).
RESERVED_TOPIC_IDS: Final = frozenset({0x0000, 0xFFFF})

#: The only protocol id of MQTT-SN 1.2 (section 5.3.8).
PROTOCOL_ID: Final = 0x01


@dataclass(frozen=True, slots=True)
class Advertise:
    """5.4.1: broadcast by a gateway; ``duration`` is the seconds until the next one."""

    gw_id: int
    duration: int


@dataclass(frozen=True, slots=True)
class SearchGw:
    """5.4.2: a client looking for a gateway, broadcast ``radius`` hops."""

    radius: int = 0


@dataclass(frozen=True, slots=True)
class GwInfo:
    """5.4.3: the answer to SEARCHGW; ``gw_address`` only when a client answers."""

    gw_id: int
    gw_address: bytes = b""


@dataclass(frozen=True, slots=True)
class Connect:
    """5.4.4. ``duration`` is the keep-alive in seconds."""

    client_id: str
    duration: int
    clean_session: bool = True
    will: bool = False
    protocol_id: int = PROTOCOL_ID


@dataclass(frozen=True, slots=True)
class ConnAck:
    """5.4.5."""

    return_code: int = ReturnCode.ACCEPTED


@dataclass(frozen=True, slots=True)
class WillTopicReq:
    """5.4.6."""


@dataclass(frozen=True, slots=True)
class WillTopic:
    """5.4.7. An empty WILLTOPIC (``topic == ""``, two octets on the wire) deletes the
    stored Will topic and Will message."""

    topic: str = ""
    qos: int = 0
    retain: bool = False


@dataclass(frozen=True, slots=True)
class WillMsgReq:
    """5.4.8."""


@dataclass(frozen=True, slots=True)
class WillMsg:
    """5.4.9."""

    message: bytes


@dataclass(frozen=True, slots=True)
class Register:
    """5.4.10. From a client ``topic_id`` is 0x0000; from a gateway it is the id that
    the gateway will use for ``topic_name``."""

    topic_id: int
    msg_id: int
    topic_name: str


@dataclass(frozen=True, slots=True)
class RegAck:
    """5.4.11."""

    topic_id: int
    msg_id: int
    return_code: int = ReturnCode.ACCEPTED


@dataclass(frozen=True, slots=True)
class Publish:
    """5.4.12. For a short topic name ``topic_id`` holds its two characters big-endian."""

    topic_id: int
    msg_id: int
    data: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    topic_id_type: int = TopicIdType.NORMAL


@dataclass(frozen=True, slots=True)
class PubAck:
    """5.4.13."""

    topic_id: int
    msg_id: int
    return_code: int = ReturnCode.ACCEPTED


@dataclass(frozen=True, slots=True)
class PubRec:
    """5.4.14."""

    msg_id: int


@dataclass(frozen=True, slots=True)
class PubRel:
    """5.4.14."""

    msg_id: int


@dataclass(frozen=True, slots=True)
class PubComp:
    """5.4.14."""

    msg_id: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    """5.4.15. ``topic`` is a topic name or filter (normal, short) or an id (predefined)."""

    msg_id: int
    topic: str | int
    qos: int = 0
    topic_id_type: int = TopicIdType.NORMAL
    dup: bool = False


@dataclass(frozen=True, slots=True)
class SubAck:
    """5.4.16. ``qos`` is the granted QoS."""

    topic_id: int
    msg_id: int
    return_code: int = ReturnCode.ACCEPTED
    qos: int = 0


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """5.4.17."""

    msg_id: int
    topic: str | int
    topic_id_type: int = TopicIdType.NORMAL


@dataclass(frozen=True, slots=True)
class UnsubAck:
    """5.4.18."""

    msg_id: int


@dataclass(frozen=True, slots=True)
class PingReq:
    """5.4.19. A sleeping client names itself (``client_id``) to wake up."""

    client_id: str = ""


@dataclass(frozen=True, slots=True)
class PingResp:
    """5.4.20."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """5.4.21. A client sending a ``duration`` goes to sleep for that many seconds."""

    duration: int | None = None


@dataclass(frozen=True, slots=True)
class WillTopicUpd:
    """5.4.22. An empty one (``topic == ""``) deletes the Will topic and message."""

    topic: str = ""
    qos: int = 0
    retain: bool = False


@dataclass(frozen=True, slots=True)
class WillTopicResp:
    """5.4.23."""

    return_code: int = ReturnCode.ACCEPTED


@dataclass(frozen=True, slots=True)
class WillMsgUpd:
    """5.4.24."""

    message: bytes


@dataclass(frozen=True, slots=True)
class WillMsgResp:
    """5.4.25."""

    return_code: int = ReturnCode.ACCEPTED


@dataclass(frozen=True, slots=True)
class Encapsulated:
    """5.5: a message relayed by a forwarder for the wireless node ``node_id``.
    ``radius`` is the broadcast radius (Ctrl bits 1-0)."""

    node_id: bytes
    packet: Packet
    radius: int = 0


Packet = (
    Advertise
    | SearchGw
    | GwInfo
    | Connect
    | ConnAck
    | WillTopicReq
    | WillTopic
    | WillMsgReq
    | WillMsg
    | Register
    | RegAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | WillTopicUpd
    | WillTopicResp
    | WillMsgUpd
    | WillMsgResp
    | Encapsulated
)


def short_topic(topic_id: int) -> str:
    """The two-character name a short topic id stands for (section 6.7); ValueError
    when its two octets are not UTF-8."""
    try:
        return topic_id.to_bytes(2, "big").decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"short topic id 0x{topic_id:04x} is not a UTF-8 name") from None


def short_topic_id(name: str) -> int:
    """The topic id of a two-character short topic name."""
    raw = name.encode("utf-8")
    if len(raw) != 2:
        raise ValueError(f"a short topic name has exactly two octets, not {name!r}")
    return int.from_bytes(raw, "big")


# ============================================================================ wire

#: The largest message the 3-octet Length field can describe (section 5.2.1).
MAX_LENGTH: Final = 0xFFFF

# Flags (section 5.3.4, Table 4).
DUP: Final = 0x80
RETAIN: Final = 0x10
WILL: Final = 0x08
CLEAN_SESSION: Final = 0x04
TOPIC_ID_TYPE: Final = 0x03
QOS_SHIFT: Final = 5
#: Flag bits 6-5 -> QoS; 0b11 is QoS -1 ("publish without connection", section 6.8).
QOS_OF_BITS: Final = (0, 1, 2, -1)
