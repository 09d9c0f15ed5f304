"""MQTT control packets as small frozen values, named as in the specification."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from gateway.mqtt.properties import EMPTY, Properties

#: MQTT 3.1 (protocol name "MQIsdp", level 3): legacy clients, served by the 3.1.1 rules
#: with the differences 3.1 defines (client identifier, CONNACK, SUBACK).
MQTT_31: Final = 3
MQTT_311: Final = 4
MQTT_5: Final = 5


class PacketType(IntEnum):
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
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    protocol_version: int = MQTT_311
    clean_start: bool = True
    keep_alive: int = 60
    will: Will | None = None
    username: str | None = None
    password: bytes | None = field(default=None, repr=False)  # never in a log line
    properties: Properties = EMPTY
    protocol_name: str = "MQTT"
    #: The protocol level's top bit (0x83, 0x84): a Mosquitto bridge's "try_private",
    #: asking to be served as a bridge (MQTT 3.1 and 3.1.1 only).
    bridge: bool = False


@dataclass(frozen=True, slots=True)
class ConnAck:
    session_present: bool = False
    reason_code: int = 0
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class SubscriptionRequest:
    """One topic filter of a SUBSCRIBE with its subscription options."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[SubscriptionRequest, ...]
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class UnsubAck:
    """UNSUBACK; ``reason_codes`` is empty on MQTT 3.1.1, which carries none."""

    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class PingReq:
    pass


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = EMPTY


Packet = (
    Connect
    | ConnAck
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
    | Auth
)

PACKET_TYPE: Final[dict[type, PacketType]] = {
    Connect: PacketType.CONNECT,
    ConnAck: PacketType.CONNACK,
    Publish: PacketType.PUBLISH,
    PubAck: PacketType.PUBACK,
    PubRec: PacketType.PUBREC,
    PubRel: PacketType.PUBREL,
    PubComp: PacketType.PUBCOMP,
    Subscribe: PacketType.SUBSCRIBE,
    SubAck: PacketType.SUBACK,
    Unsubscribe: PacketType.UNSUBSCRIBE,
    UnsubAck: PacketType.UNSUBACK,
    PingReq: PacketType.PINGREQ,
    PingResp: PacketType.PINGRESP,
    Disconnect: PacketType.DISCONNECT,
    Auth: PacketType.AUTH,
}
