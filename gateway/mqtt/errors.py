"""Codec errors. Each carries the reason code it is reported with on the wire.

Raise anywhere in the codec; the broker translates the error into a DISCONNECT
(MQTT 5.0) or a closed connection (MQTT 3.1.1) in one place.
"""

from __future__ import annotations

from gateway.mqtt.reason_codes import ReasonCode


class MQTTError(Exception):
    """Base of every error the codec raises for bad input."""

    reason_code: ReasonCode = ReasonCode.UNSPECIFIED_ERROR
    #: The protocol version of the packet, when known (a CONNECT may fail before it is).
    protocol_version: int | None = None

    def __init__(self, message: str, reason_code: ReasonCode | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class MalformedPacket(MQTTError):
    """The bytes do not form a packet (MQTT 5.0 section 4.13.1)."""

    reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolError(MQTTError):
    """A well-formed packet that breaks a rule of the protocol."""

    reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(MQTTError):
    """The announced packet exceeds the maximum packet size; cut off before buffering."""

    reason_code = ReasonCode.PACKET_TOO_LARGE


class TopicNameInvalid(MQTTError):
    """A PUBLISH topic name that breaks the topic rules (wildcards, U+0000, empty)."""

    reason_code = ReasonCode.TOPIC_NAME_INVALID


class UnsupportedProtocolVersion(MQTTError):
    """CONNECT with the right protocol name but a level this server does not speak."""

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION

    def __init__(self, message: str, level: int) -> None:
        super().__init__(message)
        self.level = level


class BadProtocolName(MQTTError):
    """CONNECT whose protocol name is not ``MQTT`` (MQTT-3.1.2-1): close without CONNACK."""

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
