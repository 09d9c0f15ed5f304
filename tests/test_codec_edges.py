"""Edges of the MQTT codec: the exact words of every refusal, and the boundary bytes.

``tests/test_codec_vectors.py`` pins the reason code of each malformed packet; this
module pins the *message* the codec gives with it, because the broker writes that
message into its refusal log line and, for an MQTT 5.0 client, into the Reason String
of the DISCONNECT or CONNACK that ends the connection. A wrong or empty message leaves
an operator (or a device developer) without the one clue to what their client did
wrong. The second half covers the boundary bytes the vectors miss: two-byte values
with a non-zero high byte, a field that ends exactly at the end of its packet, flag
bits next to each other, and the hot-path helpers' edge cases.

Every vector is written by hand as hex from the layouts in the MQTT 3.1.1 and 5.0
OASIS standards, never produced by our encoder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from gateway.mqtt import (
    EMPTY,
    MQTT_5,
    MQTT_31,
    MQTT_311,
    NEED_DATA,
    Auth,
    BadProtocolName,
    ConnAck,
    Connect,
    Disconnect,
    Framer,
    MalformedPacket,
    MQTTError,
    PacketReader,
    PacketTooLarge,
    PacketType,
    PingReq,
    Properties,
    ProtocolError,
    Publish,
    ReasonCode,
    Subscribe,
    SubscriptionRequest,
    TopicNameInvalid,
    Unsubscribe,
    UnsupportedProtocolVersion,
    encode,
)
from gateway.mqtt.fastpath import encode_ack, peek_publish, publish_template, template_size
from gateway.mqtt.wire import VARINT_MAX, encode_string, encode_varint
from tests.support.harness import Harness

V31 = MQTT_31
V311 = MQTT_311
V5 = MQTT_5
MQTT_NAME = "00 04 4d 51 54 54"  # protocol name "MQTT" (3.1.2.1)
MQISDP_NAME = "00 06 4d 51 49 73 64 70"  # protocol name "MQIsdp" (MQTT 3.1)


def h(text: str) -> bytes:
    """Bytes from hex written with spaces between fields."""
    return bytes.fromhex(text)


def read_one(data: bytes, version: int) -> object:
    """The one packet in ``data``, through the framer and the codec."""
    reader = PacketReader(version=version)
    reader.receive_data(data)
    return reader.next_packet()


@dataclass(frozen=True)
class Refusal:
    id: str
    version: int
    data: bytes
    error: type[MQTTError]
    #: The exact text the broker logs and puts in the Reason String.
    message: str
    #: The normative statement (or section) the packet breaks.
    rule: str


REFUSALS = [
    # --- CONNECT
    Refusal(
        "connect-cut-inside-variable-header",
        V311,
        h("10 09" + MQTT_NAME + "04 02 00"),  # the keep alive has one byte of two
        MalformedPacket,
        "CONNECT ends inside its variable header",
        "3.1.1 §3.1.2 (flags, then a Two Byte keep alive)",
    ),
    Refusal(
        "connect-variable-header-ends-at-packet-end",
        V311,
        h("10 0a" + MQTT_NAME + "04 02 00 3c"),  # whole header, no client identifier
        MalformedPacket,
        "length prefix runs past the end of the packet",
        "MQTT-3.1.3-3 (the Client Identifier MUST be present)",
    ),
    Refusal(
        "connect-reserved-flag",
        V311,
        h("10 0c" + MQTT_NAME + "04 03 00 3c 00 00"),
        MalformedPacket,
        "CONNECT reserved flag is set",
        "MQTT-3.1.2-3",
    ),
    Refusal(
        "connect-ends-before-protocol-level",
        V311,
        h("10 06" + MQTT_NAME),
        MalformedPacket,
        "CONNECT ends before the protocol level",
        "3.1.1 §3.1.2.2 (the Protocol Level byte follows the name)",
    ),
    Refusal(
        "connect-mqisdp-level-4",
        V311,
        h("10 0e" + MQISDP_NAME + "04 02 00 3c 00 00"),
        UnsupportedProtocolVersion,
        "MQIsdp protocol level 4 is not 3",
        "MQTT 3.1 §3.1 (MQIsdp is level 3)",
    ),
    Refusal(
        "connect-protocol-name-mqtx",
        V311,
        h("10 0c 00 04 4d 51 54 58 04 02 00 3c 00 00"),
        BadProtocolName,
        "protocol name 'MQTX' is not MQTT",
        "MQTT-3.1.2-1",
    ),
    Refusal(
        "connect-will-qos-3",
        V311,
        h("10 11" + MQTT_NAME + "04 1e 00 3c 00 00 00 01 77 00 00"),
        MalformedPacket,
        "will QoS is 3",
        "MQTT-3.1.2-14 (3.1.1)",
    ),
    Refusal(
        "connect-will-qos-without-will",
        V311,
        h("10 0c" + MQTT_NAME + "04 0a 00 3c 00 00"),
        MalformedPacket,
        "will QoS or retain set without a will",
        "MQTT-3.1.2-13 (3.1.1)",
    ),
    Refusal(
        "connect-will-retain-without-will",
        V311,
        h("10 0c" + MQTT_NAME + "04 22 00 3c 00 00"),
        MalformedPacket,
        "will QoS or retain set without a will",
        "MQTT-3.1.2-15 (3.1.1)",
    ),
    Refusal(
        "connect-password-without-username-311",
        V311,
        h("10 0e" + MQTT_NAME + "04 42 00 3c 00 00 00 00"),
        MalformedPacket,
        "password flag set without user name flag",
        "MQTT-3.1.2-22",
    ),
    Refusal(
        "connect-authentication-data-without-method",
        V5,
        h("10 11" + MQTT_NAME + "05 02 00 3c 04 16 00 01 61 00 00"),
        ProtocolError,
        "authentication data without an authentication method",
        "5.0 §3.1.2.11.10 (data without a method is a Protocol Error)",
    ),
    Refusal(
        "connect-will-topic-wildcard",
        V311,
        h("10 13" + MQTT_NAME + "04 06 00 3c 00 00 00 03 61 2f 2b 00 00"),
        TopicNameInvalid,
        "will topic 'a/+' is not a valid topic name",
        "MQTT-3.1.3-11 (the Will Topic is a topic name), MQTT-3.3.2-2",
    ),
    Refusal(
        "connect-will-topic-hash",
        V311,
        h("10 13" + MQTT_NAME + "04 06 00 3c 00 00 00 03 61 2f 23 00 00"),
        TopicNameInvalid,
        "will topic 'a/#' is not a valid topic name",
        "MQTT-3.1.3-11, MQTT-3.3.2-2",
    ),
    Refusal(
        "connect-will-topic-empty",
        V311,
        h("10 10" + MQTT_NAME + "04 06 00 3c 00 00 00 00 00 00"),
        TopicNameInvalid,
        "will topic '' is not a valid topic name",
        "MQTT-4.7.3-1",
    ),
    Refusal(
        "connect-trailing-byte",
        V311,
        h("10 0d" + MQTT_NAME + "04 02 00 3c 00 00 ff"),
        MalformedPacket,
        "1 unexpected bytes at the end of CONNECT",
        "3.1.1 §3.1.3 (the payload ends with the last field its flags announce)",
    ),
    # --- fixed header (framer and packet type)
    Refusal(
        "remaining-length-overlong",
        V311,
        h("30 80 00"),
        MalformedPacket,
        "remaining length not in its minimal encoding",
        "MQTT-1.5.5-1",
    ),
    Refusal(
        "remaining-length-five-bytes",
        V311,
        h("30 80 80 80 80 01"),
        MalformedPacket,
        "remaining length longer than four bytes",
        "3.1.1 §2.2.3 (at most four bytes)",
    ),
    Refusal(
        "reserved-packet-type-0",
        V311,
        h("00 00"),
        MalformedPacket,
        "reserved packet type 0",
        "3.1.1 §2.2.1 table 2.1",
    ),
    Refusal(
        "auth-on-311",
        V311,
        h("f0 00"),
        MalformedPacket,
        "reserved packet type 15",
        "3.1.1 §2.2.1 (type 15 reserved)",
    ),
    Refusal(
        "subscribe-flags-0000",
        V311,
        h("80 06 00 01 00 01 61 00"),
        MalformedPacket,
        "invalid fixed header flags 0x0 for packet type 8",
        "MQTT-3.8.1-1",
    ),
    Refusal(
        "subscribe-dup-flag-311",
        V311,
        h("8a 06 00 01 00 01 61 00"),  # MQTT 3.1 allowed DUP here, 3.1.1 does not
        MalformedPacket,
        "invalid fixed header flags 0xa for packet type 8",
        "MQTT-3.8.1-1",
    ),
    Refusal(
        "puback-flags-0010",
        V5,
        h("42 02 00 01"),
        MalformedPacket,
        "invalid fixed header flags 0x2 for packet type 4",
        "MQTT-2.1.3-1 (5.0)",
    ),
    # --- UTF-8 strings (MQTT 5.0 section 1.5.4)
    Refusal(
        "string-runs-past-end",
        V311,
        h("30 03 00 05 61"),
        MalformedPacket,
        "UTF-8 string runs past the end of the packet",
        "5.0 §1.5.4, §4.13",
    ),
    Refusal(
        "string-invalid-utf8-says-where",
        V311,
        h("30 04 00 02 61 ff"),  # the bad byte is the packet body's fourth (offset 3)
        MalformedPacket,
        "invalid UTF-8 at byte 3",
        "MQTT-1.5.4-1 (5.0); MQTT-1.5.3-1 (3.1.1)",
    ),
    Refusal(
        "string-contains-nul",
        V311,
        h("30 04 00 02 61 00"),
        MalformedPacket,
        "UTF-8 string contains U+0000",
        "MQTT-1.5.4-2 (5.0); MQTT-1.5.3-2 (3.1.1)",
    ),
    # --- CONNACK
    Refusal(
        "connack-one-byte",
        V311,
        h("20 01 00"),
        MalformedPacket,
        "CONNACK shorter than two bytes",
        "3.1.1 §3.2.1 (remaining length 2)",
    ),
    Refusal(
        "connack-reserved-flags",
        V5,
        h("20 03 02 00 00"),
        MalformedPacket,
        "CONNACK reserved flags set",
        "MQTT-3.2.2-1",
    ),
    Refusal(
        "connack-v5-reason-code-not-for-connack",
        V5,
        h("20 03 00 01 00"),  # 0x01 (granted QoS 1) is a SUBACK code
        MalformedPacket,
        "invalid CONNACK reason code 0x01",
        "5.0 §3.2.2.2",
    ),
    Refusal(
        "connack-v5-trailing-byte",
        V5,
        h("20 04 00 00 00 ff"),
        MalformedPacket,
        "1 unexpected bytes at the end of CONNACK",
        "5.0 §3.2.2.3 (the properties end the packet)",
    ),
    Refusal(
        "connack-311-return-code-6",
        V311,
        h("20 02 00 06"),
        MalformedPacket,
        "invalid CONNACK return code 6",
        "3.1.1 §3.2.2.3 (6-255 are reserved)",
    ),
    Refusal(
        "connack-311-trailing-byte",
        V311,
        h("20 03 00 00 00"),
        MalformedPacket,
        "1 unexpected bytes at the end of CONNACK",
        "3.1.1 §3.2.1 (remaining length 2)",
    ),
    # --- PUBLISH
    Refusal(
        "publish-qos-3",
        V311,
        h("36 03 00 01 74"),
        MalformedPacket,
        "PUBLISH QoS is 3",
        "MQTT-3.3.1-4",
    ),
    Refusal(
        "publish-dup-on-qos-0",
        V311,
        h("38 03 00 01 74"),
        MalformedPacket,
        "PUBLISH DUP set on QoS 0",
        "MQTT-3.3.1-2",
    ),
    Refusal(
        "publish-qos-1-packet-id-0",
        V311,
        h("32 05 00 01 74 00 00"),
        ProtocolError,
        "PUBLISH with QoS > 0 has packet identifier 0",
        "MQTT-2.3.1-1 (3.1.1); MQTT-2.2.1-3 (5.0)",
    ),
    Refusal(
        "publish-wildcard-topic",
        V311,
        h("30 05 00 03 61 2f 2b"),  # "a/+"
        TopicNameInvalid,
        "PUBLISH topic 'a/+' contains a wildcard",
        "MQTT-3.3.2-2",
    ),
    Refusal(
        "publish-empty-topic-311",
        V311,
        h("30 02 00 00"),
        TopicNameInvalid,
        "PUBLISH topic is empty",
        "MQTT-4.7.3-1",
    ),
    # --- SUBSCRIBE / SUBACK
    Refusal(
        "subscribe-packet-id-0",
        V311,
        h("82 06 00 00 00 01 61 00"),
        ProtocolError,
        "SUBSCRIBE has packet identifier 0",
        "MQTT-2.3.1-1",
    ),
    Refusal(
        "subscribe-packet-id-cut",
        V311,
        h("82 01 00"),
        MalformedPacket,
        "two-byte integer runs past the end of the packet",
        "3.1.1 §3.8.2 (a Two Byte packet identifier)",
    ),
    Refusal(
        "subscribe-filter-ends-at-packet-end",
        V311,
        h("82 05 00 01 00 01 61"),  # the filter "a" is the last byte: no options byte
        MalformedPacket,
        "SUBSCRIBE topic filter without subscription options",
        "MQTT-3.8.3-1 (each filter is followed by its options byte)",
    ),
    Refusal(
        "subscribe-maximum-qos-3-v5",
        V5,
        h("82 07 00 01 00 00 01 61 03"),
        ProtocolError,
        "SUBSCRIBE maximum QoS is 3",
        "5.0 §3.8.3.1 (a Maximum QoS of 3 is a Protocol Error)",
    ),
    Refusal(
        "subscribe-requested-qos-3-311",
        V311,
        h("82 06 00 01 00 01 61 03"),
        MalformedPacket,
        "SUBSCRIBE requested QoS is 3",
        "MQTT-3.8.3-4 (3.1.1)",
    ),
    Refusal(
        "subscribe-options-reserved-bits-v5",
        V5,
        h("82 07 00 01 00 00 01 61 80"),
        MalformedPacket,
        "SUBSCRIBE options reserved bits set",
        "MQTT-3.8.3-5 (5.0)",
    ),
    Refusal(
        "subscribe-retain-handling-3",
        V5,
        h("82 07 00 01 00 00 01 61 30"),
        ProtocolError,
        "SUBSCRIBE retain handling is 3",
        "5.0 §3.8.3.1 (Retain Handling 3 is a Protocol Error)",
    ),
    Refusal(
        "subscribe-reserved-bits-311",
        V311,
        h("82 06 00 01 00 01 61 10"),
        MalformedPacket,
        "SUBSCRIBE reserved bits set",
        "MQTT-3.8.3-4 (3.1.1)",
    ),
    Refusal(
        "subscribe-without-filters",
        V311,
        h("82 02 00 01"),
        ProtocolError,
        "SUBSCRIBE without topic filters",
        "MQTT-3.8.3-3 (3.1.1)",
    ),
    Refusal(
        "suback-without-codes",
        V311,
        h("90 02 00 01"),
        ProtocolError,
        "SUBACK without return codes",
        "3.1.1 §3.9.3 (one return code per filter)",
    ),
    Refusal(
        "suback-reserved-code",
        V311,
        h("90 03 00 01 03"),
        MalformedPacket,
        "invalid SUBACK reason code 0x03",
        "MQTT-3.9.3-2",
    ),
    # --- UNSUBSCRIBE / UNSUBACK
    Refusal(
        "unsubscribe-packet-id-0",
        V311,
        h("a2 05 00 00 00 01 61"),
        ProtocolError,
        "UNSUBSCRIBE has packet identifier 0",
        "MQTT-2.3.1-1",
    ),
    Refusal(
        "unsubscribe-without-filters",
        V311,
        h("a2 02 00 01"),
        ProtocolError,
        "UNSUBSCRIBE without topic filters",
        "MQTT-3.10.3-2",
    ),
    Refusal(
        "unsuback-311-trailing-byte",
        V311,
        h("b0 03 00 01 00"),
        MalformedPacket,
        "1 unexpected bytes at the end of UNSUBACK",
        "3.1.1 §3.11.1 (remaining length 2)",
    ),
    Refusal(
        "unsuback-v5-without-codes",
        V5,
        h("b0 03 00 01 00"),
        ProtocolError,
        "UNSUBACK without reason codes",
        "5.0 §3.11.3 (one reason code per filter)",
    ),
    Refusal(
        "unsuback-v5-code-not-for-unsuback",
        V5,
        h("b0 04 00 01 00 01"),
        MalformedPacket,
        "invalid UNSUBACK reason code 0x01",
        "5.0 §3.11.3",
    ),
    # --- PINGREQ, PINGRESP, DISCONNECT, AUTH
    Refusal(
        "pingreq-trailing-byte",
        V311,
        h("c0 01 00"),
        MalformedPacket,
        "1 unexpected bytes at the end of PINGREQ",
        "3.1.1 §3.12 (no variable header, no payload)",
    ),
    Refusal(
        "pingresp-trailing-byte",
        V311,
        h("d0 01 00"),
        MalformedPacket,
        "1 unexpected bytes at the end of PINGRESP",
        "3.1.1 §3.13 (no variable header, no payload)",
    ),
    Refusal(
        "disconnect-311-trailing-byte",
        V311,
        h("e0 01 00"),
        MalformedPacket,
        "1 unexpected bytes at the end of DISCONNECT",
        "3.1.1 §3.14 (no variable header, no payload)",
    ),
    Refusal(
        "disconnect-v5-invalid-reason-code",
        V5,
        h("e0 01 05"),
        MalformedPacket,
        "invalid DISCONNECT reason code 0x05",
        "5.0 §3.14.2.1",
    ),
    Refusal(
        "disconnect-v5-bytes-after-properties",
        V5,
        h("e0 04 00 00 ff ff"),
        MalformedPacket,
        "2 unexpected bytes at the end of DISCONNECT",
        "5.0 §3.14.3 (DISCONNECT has no payload)",
    ),
    Refusal(
        "auth-invalid-reason-code",
        V5,
        h("f0 01 05"),
        MalformedPacket,
        "invalid AUTH reason code 0x05",
        "5.0 §3.15.2.1",
    ),
    # --- properties (MQTT 5.0 section 2.2.2)
    Refusal(
        "property-length-past-packet-end",
        V5,
        h("30 05 00 01 74 05 01"),
        MalformedPacket,
        "property length runs past the end of the packet",
        "5.0 §2.2.2.1",
    ),
    Refusal(
        "property-length-varint-cut",
        V5,
        h("30 04 00 01 74 80"),  # a continuation bit, then the packet ends
        MalformedPacket,
        "variable byte integer runs past the end of the packet",
        "5.0 §1.5.5",
    ),
    Refusal(
        "property-unknown-identifier",
        V5,
        h("30 06 00 01 74 02 05 00"),
        MalformedPacket,
        "unknown property identifier 0x05",
        "5.0 §2.2.2.2",
    ),
    Refusal(
        "property-not-allowed-in-publish",
        V5,
        h("30 09 00 01 74 05 11 00 00 00 0a"),
        MalformedPacket,
        "property SESSION_EXPIRY_INTERVAL is not allowed in PUBLISH",
        "5.0 §2.2.2.2",
    ),
    Refusal(
        # The block ends after the identifier of a one-byte property; the payload
        # follows. Its first byte must not be read as the property's value.
        "property-byte-value-past-block",
        V5,
        h("30 06 00 01 74 01 01 78"),
        MalformedPacket,
        "property value runs past the property block",
        "5.0 §2.2.2.1 (the Property Length bounds the properties)",
    ),
    Refusal(
        "property-two-byte-value-past-block",
        V5,
        h("30 08 00 01 74 02 23 00 01 78"),
        MalformedPacket,
        "property value runs past the property block",
        "5.0 §2.2.2.1",
    ),
    Refusal(
        "property-four-byte-value-past-block",
        V5,
        h("30 0a 00 01 74 03 02 00 00 00 00 78"),
        MalformedPacket,
        "property value runs past the property block",
        "5.0 §2.2.2.1",
    ),
    Refusal(
        "property-payload-format-indicator-2",
        V5,
        h("30 06 00 01 74 02 01 02"),
        ProtocolError,
        "property PAYLOAD_FORMAT_INDICATOR must be 0 or 1, got 2",
        "5.0 §3.3.2.3.2",
    ),
    Refusal(
        "property-subscription-identifier-0",
        V5,
        h("82 09 00 01 02 0b 00 00 01 61 00"),
        ProtocolError,
        "property SUBSCRIPTION_IDENTIFIER must not be 0",
        "5.0 §3.8.2.1.2",
    ),
    Refusal(
        "property-subscription-identifier-twice",
        V5,
        h("82 0b 00 01 04 0b 01 0b 02 00 01 61 00"),
        ProtocolError,
        "subscription identifier included more than once",
        "5.0 §3.8.2.1.2",
    ),
    Refusal(
        "property-duplicated",
        V5,
        h("30 0e 00 01 74 0a 02 00 00 00 01 02 00 00 00 02"),
        ProtocolError,
        "property MESSAGE_EXPIRY_INTERVAL included more than once",
        "5.0 §3.3.2.3.3",
    ),
    Refusal(
        "varint-not-minimal",
        V5,
        h("82 0a 00 01 03 0b 81 00 00 01 61 00"),  # 1 spelled in two bytes
        MalformedPacket,
        "variable byte integer not in its minimal encoding",
        "MQTT-1.5.5-1",
    ),
    Refusal(
        # The fifth byte ends the integer: a reader allowing five would accept 2**28.
        "varint-five-bytes",
        V5,
        h("82 0d 00 01 06 0b 80 80 80 80 01 00 01 61 00"),
        MalformedPacket,
        "variable byte integer longer than four bytes",
        "5.0 §1.5.5 (at most four bytes)",
    ),
]


@pytest.mark.parametrize("bad", [pytest.param(b, id=b.id) for b in REFUSALS])
def test_refusal_names_what_is_wrong(bad: Refusal) -> None:
    """The refusal log and a v5 Reason String would misname what the client sent."""
    with pytest.raises(MQTTError) as caught:
        read_one(bad.data, bad.version)
    assert type(caught.value) is bad.error
    assert caught.value.message == bad.message


def test_refusal_ids_are_unique() -> None:
    """Two vectors with one id would hide one of them from ``-k`` selection."""
    ids = [b.id for b in REFUSALS]
    assert len(ids) == len(set(ids))


def test_the_refusal_text_reaches_the_client_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A v5 client and the operator's log would lose the codec's reason for a close."""
    caplog.set_level(logging.WARNING, logger="ledge.broker")
    h5 = Harness()
    v5 = h5.client(peer="10.0.0.5:1000")
    v5.connect("five")
    v5.send_raw(h("82 07 00 01 00 00 01 61 30"))  # Retain Handling 3 (5.0 §3.8.3.1)
    gone = v5.expect(Disconnect)
    assert gone.reason_code == ReasonCode.PROTOCOL_ERROR
    assert gone.properties.reason_string == "SUBSCRIBE retain handling is 3"
    assert v5.closed
    v3 = h5.client(MQTT_311, peer="10.0.0.3:1000")
    v3.connect("three")
    v3.send_raw(h("36 03 00 01 74"))  # PUBLISH QoS 3 (MQTT-3.3.1-4)
    assert v3.take() == []
    assert v3.closed
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("closing")]
    assert lines == [
        "closing 'five' (10.0.0.5:1000): SUBSCRIBE retain handling is 3 (protocol error)",
        "closing 'three' (10.0.0.3:1000): PUBLISH QoS is 3 (malformed packet)",
    ]
    assert h5.broker.stats.protocol_errors == 2


# --------------------------------------------------------------------------- CONNECT


def test_keep_alive_is_read_big_endian_with_both_bytes() -> None:
    """3.1.2.10: a Keep Alive over 255 s (Two Byte Integer) would time the client out wrongly."""
    for raw, seconds in (("12 34", 0x1234), ("ff ff", 65_535), ("01 00", 256)):
        packet = read_one(h("10 0e" + MQTT_NAME + "04 02" + raw + "00 02 69 64"), V311)
        assert packet == Connect("id", V311, True, seconds)


def test_mqisdp_at_the_wrong_level_reports_the_level() -> None:
    """A client naming MQIsdp at level 4 would be answered without the level it sent."""
    with pytest.raises(UnsupportedProtocolVersion) as caught:
        read_one(h("10 0e" + MQISDP_NAME + "04 02 00 3c 00 00"), V311)
    assert caught.value.level == 4
    assert caught.value.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


def test_mqtt_31_may_mark_a_resent_subscribe_as_dup() -> None:
    """MQTT 3.1 clients re-sending a SUBSCRIBE with DUP would be disconnected."""
    assert read_one(h("8a 06 00 01 00 01 61 00"), V31) == Subscribe(1, (SubscriptionRequest("a"),))


def test_mqtt_31_connect_flag_bit_0_is_ignored_not_a_will_or_clean_session() -> None:
    """MQTT 3.1 leaves flag bit 0 unused: setting it must not mean clean session, will or retain."""
    packet = read_one(h("10 0f" + MQISDP_NAME + "03 01 00 3c 00 01 61"), V311)
    assert packet == Connect(
        "a", V31, clean_start=False, keep_alive=60, protocol_name="MQIsdp", will=None
    )
    clean = read_one(h("10 0f" + MQISDP_NAME + "03 03 00 3c 00 01 61"), V311)
    assert isinstance(clean, Connect)
    assert clean.clean_start is True
    assert clean.will is None


# --------------------------------------------------------------------------- acks, codes


def test_connack_311_return_codes_stop_at_5() -> None:
    """3.1.1 §3.2.2.3: a bridge would misread the last return code, 5, as malformed."""
    assert read_one(h("20 02 00 05"), V311) == ConnAck(False, 5)


def test_unsubscribe_with_packet_identifier_1_is_accepted() -> None:
    """MQTT-2.3.1-1 forbids only 0: a client numbering from 1 would get no UNSUBACK."""
    assert read_one(h("a2 05 00 01 00 01 61"), V311) == Unsubscribe(1, ("a",))


# --------------------------------------------------------------------------- properties


def test_two_byte_properties_are_read_big_endian_with_both_bytes() -> None:
    """5.0 §1.5.2: a Topic Alias or Receive Maximum over 255 would be read as another value."""
    publish = read_one(h("30 08 00 01 74 03 23 01 02 78"), V5)
    assert publish == Publish("t", b"x", properties=Properties(topic_alias=0x0102))
    connect = read_one(h("10 10" + MQTT_NAME + "05 02 00 3c 03 21 01 00 00 00"), V5)
    assert isinstance(connect, Connect)
    assert connect.properties.receive_maximum == 256


def test_a_four_byte_varint_at_the_maximum_is_accepted() -> None:
    """5.0 §1.5.5: the largest Subscription Identifier, 268,435,455, would be refused."""
    packet = read_one(h("82 0c 00 01 05 0b ff ff ff 7f 00 01 61 00"), V5)
    assert packet == Subscribe(
        1,
        (SubscriptionRequest("a"),),
        Properties(subscription_identifiers=(268_435_455,)),
    )


def test_properties_truthiness_set_fields_and_repr() -> None:
    """Empty properties would be encoded as set, and log lines would show the wrong ones."""
    assert not EMPTY
    assert not Properties()
    assert Properties(reason_string="")
    assert Properties(topic_alias=0, user_properties=()).set_fields() == {"topic_alias": 0}
    assert Properties().set_fields() == {}
    shown = Properties(reason_string="why", user_properties=(("k", "v"),))
    assert repr(shown) == "Properties(reason_string='why', user_properties=(('k', 'v'),))"
    assert repr(Properties()) == "Properties()"


def test_connack_properties_are_written_in_mosquitto_order() -> None:
    """CONNACKs would stop matching Mosquitto's byte for byte (or repeat a property)."""
    ack = ConnAck(
        False,
        0,
        Properties(
            receive_maximum=10,
            topic_alias_maximum=5,
            session_expiry_interval=30,
            retain_available=0,
            reason_string="ok",
        ),
    )
    wire = h(
        "20 15 00 00 12"
        "22 00 05"  # topic alias maximum 5
        "25 00"  # retain available 0
        "21 00 0a"  # receive maximum 10
        "11 00 00 00 1e"  # session expiry interval 30
        "1f 00 02 6f 6b"  # reason string "ok"
    )
    assert encode(ack, V5) == wire
    assert read_one(wire, V5) == ack


# --------------------------------------------------------------------------- encoding


def test_publish_flags_dup_and_retain_are_separate_bits() -> None:
    """§3.3.1: a re-sent message would go out retained, or a retained one marked DUP."""
    assert encode(Publish("t", b"", 1, False, True, 5), V311) == h("3a 05 00 01 74 00 05")
    assert encode(Publish("t", b"", 1, True, False, 5), V311) == h("33 05 00 01 74 00 05")
    assert encode(Publish("t", b"", 2, True, True, 5), V311) == h("3d 05 00 01 74 00 05")


def test_subscription_options_bits_are_separate() -> None:
    """5.0 §3.8.3.1: No Local or Retain As Published would raise a QoS 0 subscription's QoS."""
    sub = Subscribe(
        1,
        (
            SubscriptionRequest("a", 0, no_local=True),
            SubscriptionRequest("b", 0, retain_as_published=True),
            SubscriptionRequest("c", 2, True, True, 2),
        ),
    )
    wire = h(
        "82 0f 00 01 00"  # packet identifier 1, no properties
        "00 01 61 04"  # "a", No Local
        "00 01 62 08"  # "b", Retain As Published
        "00 01 63 2e"  # "c", QoS 2, both, Retain Handling 2
    )
    assert encode(sub, V5) == wire
    assert read_one(wire, V5) == sub


def test_disconnect_and_auth_leave_out_empty_properties_however_built() -> None:
    """5.0 §3.14.2.1: a fresh empty Properties() would add bytes to DISCONNECT or AUTH."""
    assert encode(Disconnect(0, Properties()), V5) == h("e0 00")
    assert encode(Disconnect(0x8E, Properties()), V5) == h("e0 01 8e")
    assert encode(Auth(0x18, Properties()), V5) == h("f0 01 18")
    assert encode(Disconnect(0x8E, Properties(reason_string="x")), V5) == h(
        "e0 06 8e 04 1f 00 01 78"
    )


def test_auth_cannot_be_encoded_for_mqtt_311() -> None:
    """AUTH exists only in 5.0 (§3.15): a 3.1.1 caller would get no clear error."""
    with pytest.raises(ValueError, match=r"^AUTH exists only in MQTT 5\.0$"):
        encode(Auth(), V311)


def test_packet_too_large_names_both_sizes() -> None:
    """The oversized-packet refusal would not say the packet's size and the limit (§4.13)."""
    reader = PacketReader(max_packet_size=10, version=V311)
    reader.receive_data(h("30 0a 00 03 61 2f 62 68 65 6c 6c 6f"))  # 12 bytes in all
    with pytest.raises(PacketTooLarge) as caught:
        reader.next_packet()
    assert caught.value.message == "packet of 12 bytes exceeds the maximum packet size 10"


def test_the_size_bound_applies_to_each_packet_not_to_its_offset() -> None:
    """A packet of the maximum size after another in one read would be refused (§4.13)."""
    first = h("30 0a 00 03 61 2f 62 68 65 6c 6c 6f")  # 12 bytes
    reader = PacketReader(max_packet_size=12, version=V311)
    reader.receive_data(first + first)
    assert reader.next_packet() == reader.next_packet() == Publish("a/b", b"hello")
    assert reader.next_packet() is NEED_DATA
    small = PacketReader(max_packet_size=10, version=V311)
    small.receive_data(h("c0 00") + first)  # PINGREQ, then the 12-byte PUBLISH
    assert small.next_packet() == PingReq()
    with pytest.raises(PacketTooLarge) as caught:
        small.next_packet()
    assert caught.value.message == "packet of 12 bytes exceeds the maximum packet size 10"


def test_framer_counts_buffered_bytes_from_zero() -> None:
    """The broker bounds pending input by ``buffered``: a fresh or reset framer holds 0."""
    framer = Framer()
    assert framer.buffered == 0
    framer.feed(h("30 05 00"))
    assert framer.buffered == 3
    framer.reset()
    assert framer.buffered == 0
    assert framer.next_frame() is NEED_DATA


def test_framer_reads_straight_from_a_chunk_when_nothing_is_pending() -> None:
    """The hot path would copy every received chunk once the previous one was consumed."""
    framer = Framer()
    framer.feed(h("c0 00"))
    assert framer.next_frame() == (0xC0, b"")
    chunk = h("d0 00")
    framer.feed(chunk)
    assert framer.buffer is chunk
    assert framer.next_frame() == (0xD0, b"")


def test_a_packet_reader_reads_mqtt_311_until_told_otherwise() -> None:
    """Before CONNECT (and after a reset) 3.1.1 rules apply: no property blocks."""
    reader = PacketReader()
    reader.receive_data(h("30 03 00 01 74"))
    assert reader.next_packet() == Publish("t")
    reader.reset(V5)
    reader.receive_data(h("30 04 00 01 74 00"))
    assert reader.next_packet() == Publish("t")
    reader.receive_data(h("30 04 00 01"))  # half a packet, then the connection is reused
    reader.reset()
    assert reader.framer.buffered == 0
    reader.receive_data(h("30 03 00 01 74"))
    assert reader.next_packet() == Publish("t")


def test_variable_byte_integers_at_each_length_boundary() -> None:
    """5.0 §1.5.5: a length written wrong at a byte boundary would desynchronise the stream."""
    for value, wire in (
        (0, "00"),
        (127, "7f"),
        (128, "80 01"),
        (16_383, "ff 7f"),
        (16_384, "80 80 01"),
        (2_097_151, "ff ff 7f"),
        (2_097_152, "80 80 80 01"),
        (VARINT_MAX, "ff ff ff 7f"),
    ):
        assert encode_varint(value) == h(wire), value
    with pytest.raises(ValueError, match=r"^268435456 does not fit a variable byte integer$"):
        encode_varint(VARINT_MAX + 1)


def test_utf8_strings_are_bounded_by_bytes_not_characters() -> None:
    """5.0 §1.5.4: a 65,535-byte string would be refused, or a longer one fail unexplained."""
    longest = "x" * 65_535
    assert encode_string(longest) == b"\xff\xff" + longest.encode()
    with pytest.raises(ValueError, match=r"^UTF-8 string longer than 65,535 bytes$"):
        encode_string("é" * 32_768)


# --------------------------------------------------------------------------- fast path


def test_fast_acks_carry_both_bytes_of_the_packet_identifier() -> None:
    """5.0 §3.5.2: a fast ack with a reason code would name the wrong packet identifier."""
    assert encode_ack(PacketType.PUBREC, 0x1234, 0x10, V5) == h("50 03 12 34 10")
    assert encode_ack(PacketType.PUBACK, 0xFFFF, 0x80, V5) == h("40 03 ff ff 80")


def test_template_size_is_the_size_of_the_packet_sent() -> None:
    """Maximum Packet Size checks would use a wrong size for QoS 0 deliveries."""
    head, tail = publish_template(V311, 0, False, b"t", b"xyz")
    assert tail == b""
    assert template_size((head, tail), 0) == len(head) == 8
    head1, tail1 = publish_template(V5, 1, False, b"t", b"xyz")
    assert template_size((head1, tail1), 1) == len(head1 + b"\x00\x01" + tail1) == 11


def test_peek_publish_on_a_short_body_at_the_end_of_the_buffer() -> None:
    """A one- or two-byte PUBLISH body last in the buffer would crash the read loop."""
    assert peek_publish(0x30, h("30 01 00"), 2, 3, V311) is None
    assert peek_publish(0x30, h("30 02 00 01"), 2, 4, V311) is None
    assert peek_publish(0x30, h("30 00"), 2, 2, V5) is None


def test_peek_publish_reads_a_topic_longer_than_255_bytes() -> None:
    """§1.5.2: a plain PUBLISH with a topic over 255 bytes would miss the fast path."""
    topic = "a/" + "b" * 298
    data = h("30 b0 02 01 2c") + topic.encode() + b"hi"  # remaining length 304
    assert peek_publish(data[0], data, 3, len(data), V311) == (topic, 0, 0, len(data) - 2)
    assert read_one(data, V311) == Publish(topic, b"hi")


def test_need_data_reads_as_false_and_by_name() -> None:
    """`if not frame` would not stop at NEED_DATA, and failures would not name it."""
    assert bool(NEED_DATA) is False
    assert repr(NEED_DATA) == "NEED_DATA"
