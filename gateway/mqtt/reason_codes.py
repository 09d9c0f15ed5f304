"""Reason codes (MQTT 5.0 section 2.4) and MQTT 3.1.1 CONNACK return codes."""

from __future__ import annotations

from enum import IntEnum


class ReasonCode(IntEnum):
    """MQTT 5.0 reason codes, named as in the specification (table 2-6)."""

    SUCCESS = 0x00  # also NORMAL_DISCONNECTION and GRANTED_QOS_0
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

    @property
    def is_error(self) -> bool:
        return self.value >= 0x80


NORMAL_DISCONNECTION = ReasonCode.SUCCESS


class ConnackCode311(IntEnum):
    """MQTT 3.1.1 CONNACK return codes (section 3.2.2.3)."""

    ACCEPTED = 0x00
    UNACCEPTABLE_PROTOCOL_VERSION = 0x01
    IDENTIFIER_REJECTED = 0x02
    SERVER_UNAVAILABLE = 0x03
    BAD_USER_NAME_OR_PASSWORD = 0x04
    NOT_AUTHORIZED = 0x05


#: How a v5 CONNACK refusal is expressed to a 3.1.1 client.
CONNACK_311_FOR: dict[int, ConnackCode311] = {
    ReasonCode.SUCCESS: ConnackCode311.ACCEPTED,
    ReasonCode.UNSUPPORTED_PROTOCOL_VERSION: ConnackCode311.UNACCEPTABLE_PROTOCOL_VERSION,
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: ConnackCode311.IDENTIFIER_REJECTED,
    ReasonCode.BAD_USER_NAME_OR_PASSWORD: ConnackCode311.BAD_USER_NAME_OR_PASSWORD,
    ReasonCode.NOT_AUTHORIZED: ConnackCode311.NOT_AUTHORIZED,
    ReasonCode.BANNED: ConnackCode311.NOT_AUTHORIZED,
    ReasonCode.BAD_AUTHENTICATION_METHOD: ConnackCode311.NOT_AUTHORIZED,
    ReasonCode.SERVER_UNAVAILABLE: ConnackCode311.SERVER_UNAVAILABLE,
    ReasonCode.SERVER_BUSY: ConnackCode311.SERVER_UNAVAILABLE,
    ReasonCode.SERVER_SHUTTING_DOWN: ConnackCode311.SERVER_UNAVAILABLE,
    ReasonCode.QUOTA_EXCEEDED: ConnackCode311.SERVER_UNAVAILABLE,
    ReasonCode.CONNECTION_RATE_EXCEEDED: ConnackCode311.SERVER_UNAVAILABLE,
    ReasonCode.USE_ANOTHER_SERVER: ConnackCode311.SERVER_UNAVAILABLE,
    ReasonCode.SERVER_MOVED: ConnackCode311.SERVER_UNAVAILABLE,
}


def connack_311(code: int) -> int:
    """The 3.1.1 return code that carries the meaning of v5 ``code``."""
    mapped = CONNACK_311_FOR.get(code)
    if mapped is not None:
        return int(mapped)
    return int(ConnackCode311.SERVER_UNAVAILABLE)


def describe(code: int) -> str:
    """Human-readable name of a reason code, for logs and reason strings."""
    try:
        return ReasonCode(code).name.lower().replace("_", " ")
    except ValueError:
        return f"reason code 0x{code:02x}"
