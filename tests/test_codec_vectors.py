"""Byte vectors for every MQTT control packet, in MQTT 3.1.1 and MQTT 5.0.

Every vector is written by hand as hex from the layout in the specification (MQTT 3.1.1
OASIS Standard, MQTT 5.0 OASIS Standard; section numbers below), never produced by our
encoder. Each one is checked the h11 way: whole, byte by byte (every proper prefix reads
as ``NEED_DATA``), followed by a second packet, and (where our encoding is the canonical
one) re-encoded to the same bytes.

The second half is a table of malformed vectors, each tied to the reason code the codec
reports and to the normative statement it breaks, so ``grep MQTT-3.8.3`` finds the test.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.mqtt import (
    MQTT_5,
    MQTT_31,
    MQTT_311,
    NEED_DATA,
    Auth,
    BadProtocolName,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    MQTTError,
    Packet,
    PacketReader,
    PacketTooLarge,
    PingReq,
    PingResp,
    Properties,
    ProtocolError,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    TopicNameInvalid,
    UnsubAck,
    Unsubscribe,
    UnsupportedProtocolVersion,
    Will,
    encode,
)
from gateway.mqtt.reason_codes import ReasonCode, describe
from gateway.mqtt.wire import VARINT_MAX, encode_binary, read_binary

V31 = MQTT_31
V311 = MQTT_311
V5 = MQTT_5
NO_LIMIT = VARINT_MAX + 5


def h(text: str) -> bytes:
    """Bytes from hex written with spaces between fields."""
    return bytes.fromhex(text)


MQTT_NAME = "00 04 4d 51 54 54"  # protocol name "MQTT" (3.1.2.1)


@dataclass(frozen=True)
class Vector:
    id: str
    version: int
    data: bytes
    packet: Packet
    #: Where in the specification the layout comes from.
    section: str
    #: Our encoder emits exactly these bytes for ``packet`` (False for the longer
    #: equivalent forms a peer may send, such as a PUBACK with reason code 0x00 spelled out).
    canonical: bool = True


SR = SubscriptionRequest

VECTORS: list[Vector] = [
    # ------------------------------------------------------------------ MQTT 3.1.1
    Vector(
        "v31-connect-mqisdp",
        V31,
        h(
            "10 11"
            "00 06 4d 51 49 73 64 70"  # protocol name "MQIsdp" (MQTT 3.1 §3.1)
            "03"  # protocol version 3
            "02"  # clean session
            "00 3c"  # keep alive 60
            "00 03 6f 6c 64"  # client identifier "old"
        ),
        Connect("old", MQTT_31, protocol_name="MQIsdp"),
        "MQTT 3.1 §3.1",
    ),
    Vector(
        "v311-connect-clean-minimal",
        V311,
        h(
            "10 0e"  # CONNECT, remaining length 14
            "00 04 4d 51 54 54"  # protocol name "MQTT" (3.1.2.1)
            "04"  # protocol level 4 (3.1.2.2)
            "02"  # connect flags: clean session (3.1.2.4)
            "00 3c"  # keep alive 60 (3.1.2.10)
            "00 02 63 31"  # client identifier "c1" (3.1.3.1)
        ),
        Connect("c1", V311, True, 60),
        "3.1.1 §3.1",
    ),
    Vector(
        "v311-connect-will-username-password",
        V311,
        h(
            "10 20"
            "00 04 4d 51 54 54"  # protocol name "MQTT" (3.1.2.1)
            "04"
            "ee"  # user name, password, will retain, will QoS 1, will flag, clean session
            "00 0a"  # keep alive 10
            "00 03 64 65 76"  # client identifier "dev"
            "00 03 77 2f 74"  # will topic "w/t" (3.1.3.2)
            "00 03 62 79 65"  # will message "bye" (3.1.3.3)
            "00 01 75"  # user name "u" (3.1.3.4)
            "00 02 00 ff"  # password 00 ff (3.1.3.5)
        ),
        Connect("dev", V311, True, 10, Will("w/t", b"bye", 1, True), "u", b"\x00\xff"),
        "3.1.1 §3.1.2.3, §3.1.3",
    ),
    Vector(
        "v311-connect-bridge",
        V311,
        h("10 0e" + MQTT_NAME + "84 02 00 3c 00 02 62 31"),  # level 4 with the top bit
        Connect("b1", V311, True, 60, bridge=True),
        "Mosquitto's try_private: level 0x80 | 4",
    ),
    Vector(
        "v31-connect-bridge",
        V31,
        h("10 10 00 06 4d 51 49 73 64 70 83 02 00 3c 00 02 62 31"),  # MQIsdp, 0x80 | 3
        Connect("b1", MQTT_31, protocol_name="MQIsdp", bridge=True),
        "Mosquitto's try_private: level 0x80 | 3",
    ),
    Vector(
        "v311-connect-persistent-session",
        V311,
        h("10 0f" + MQTT_NAME + "04 00 00 00 00 03 61 62 63"),
        Connect("abc", V311, False, 0),
        "3.1.1 §3.1.2.4 (clean session 0), keep alive 0",
    ),
    Vector("v311-connack-accepted", V311, h("20 02 00 00"), ConnAck(), "3.1.1 §3.2"),
    Vector(
        "v311-connack-session-present",
        V311,
        h("20 02 01 00"),
        ConnAck(session_present=True),
        "3.1.1 §3.2.2.2",
    ),
    Vector(
        "v311-connack-not-authorized",
        V311,
        h("20 02 00 05"),
        ConnAck(reason_code=5),
        "3.1.1 §3.2.2.3, table 3.1",
    ),
    Vector(
        "v311-publish-qos0",
        V311,
        h(
            "30 0a"  # PUBLISH, QoS 0, remaining length 10
            "00 03 61 2f 62"  # topic "a/b" (3.3.2.1)
            "68 65 6c 6c 6f"  # payload "hello" (3.3.3)
        ),
        Publish("a/b", b"hello"),
        "3.1.1 §3.3",
    ),
    Vector(
        "v311-publish-qos1-dup-retain",
        V311,
        h(
            "3b 08"  # PUBLISH, DUP, QoS 1, RETAIN (3.3.1)
            "00 03 61 2f 62"  # topic "a/b"
            "00 0a"  # packet identifier 10 (3.3.2.2)
            "78"  # payload "x"
        ),
        Publish("a/b", b"x", qos=1, retain=True, dup=True, packet_id=10),
        "3.1.1 §3.3.1",
    ),
    Vector(
        "v311-publish-qos2-utf8-topic-empty-payload",
        V311,
        h("34 08 00 04 74 2f c3 a9 12 34"),  # topic "t/é", packet identifier 0x1234
        Publish("t/\u00e9", b"", qos=2, packet_id=0x1234),
        "3.1.1 §3.3, §1.5.3 (UTF-8), §3.3.3 (zero-length payload)",
    ),
    Vector(
        "v311-publish-two-byte-remaining-length",
        V311,
        h("30 cb 01 00 01 74" + "41" * 200),  # remaining length 203 = cb 01 (2.2.3)
        Publish("t", b"A" * 200),
        "3.1.1 §2.2.3",
    ),
    Vector("v311-puback", V311, h("40 02 00 0a"), PubAck(10), "3.1.1 §3.4"),
    Vector("v311-pubrec", V311, h("50 02 00 0a"), PubRec(10), "3.1.1 §3.5"),
    Vector("v311-pubrel", V311, h("62 02 00 0a"), PubRel(10), "3.1.1 §3.6 (flags 0010)"),
    Vector("v311-pubcomp", V311, h("70 02 00 0a"), PubComp(10), "3.1.1 §3.7"),
    Vector(
        "v311-subscribe",
        V311,
        h(
            "82 0c"  # SUBSCRIBE, flags 0010 (3.8.1)
            "00 01"  # packet identifier 1
            "00 03 61 2f 2b 01"  # "a/+", requested QoS 1 (3.8.3)
            "00 01 23 02"  # "#", requested QoS 2
        ),
        Subscribe(1, (SR("a/+", 1), SR("#", 2))),
        "3.1.1 §3.8",
    ),
    Vector(
        "v311-suback",
        V311,
        h("90 04 00 01 01 80"),  # granted QoS 1, failure 0x80 (3.9.3)
        SubAck(1, (1, 0x80)),
        "3.1.1 §3.9",
    ),
    Vector(
        "v311-unsubscribe",
        V311,
        h("a2 07 00 02 00 03 61 2f 62"),
        Unsubscribe(2, ("a/b",)),
        "3.1.1 §3.10 (flags 0010)",
    ),
    Vector("v311-unsuback", V311, h("b0 02 00 02"), UnsubAck(2), "3.1.1 §3.11"),
    Vector("v311-pingreq", V311, h("c0 00"), PingReq(), "3.1.1 §3.12"),
    Vector("v311-pingresp", V311, h("d0 00"), PingResp(), "3.1.1 §3.13"),
    Vector("v311-disconnect", V311, h("e0 00"), Disconnect(), "3.1.1 §3.14"),
    # ------------------------------------------------------------------ MQTT 5.0
    Vector(
        "v5-connect-minimal",
        V5,
        h(
            "10 0f"
            "00 04 4d 51 54 54"  # protocol name "MQTT" (3.1.2.1)
            "05"  # protocol version 5 (3.1.2.2)
            "02"  # clean start
            "00 3c"  # keep alive 60
            "00"  # property length 0 (3.1.2.11)
            "00 02 63 31"  # client identifier "c1"
        ),
        Connect("c1", V5, True, 60),
        "5.0 §3.1",
    ),
    Vector(
        "v5-connect-properties-and-will-properties",
        V5,
        h(
            "10 47"  # remaining length 71
            "00 04 4d 51 54 54"  # protocol name "MQTT" (3.1.2.1)
            "05"
            "d6"  # user name, password, will QoS 2, will flag, clean start
            "00 1e"  # keep alive 30
            "0f"  # property length 15
            "11 00 00 0e 10"  # session expiry interval 3600 (3.1.2.11.2)
            "21 00 14"  # receive maximum 20 (3.1.2.11.3)
            "26 00 01 6b 00 01 76"  # user property k=v (3.1.2.11.8)
            "00 02 63 35"  # client identifier "c5"
            "1c"  # will property length 28 (3.1.3.2)
            "01 01"  # payload format indicator 1
            "02 00 00 00 3c"  # message expiry interval 60
            "03 00 04 74 65 78 74"  # content type "text"
            "08 00 01 72"  # response topic "r"
            "09 00 02 01 02"  # correlation data 01 02
            "18 00 00 00 05"  # will delay interval 5
            "00 01 77"  # will topic "w"
            "00 01 78"  # will payload "x"
            "00 01 75"  # user name "u"
            "00 01 70"  # password "p"
        ),
        Connect(
            "c5",
            V5,
            True,
            30,
            Will(
                "w",
                b"x",
                2,
                False,
                Properties(
                    payload_format_indicator=1,
                    message_expiry_interval=60,
                    content_type="text",
                    response_topic="r",
                    correlation_data=b"\x01\x02",
                    will_delay_interval=5,
                ),
            ),
            "u",
            b"p",
            Properties(
                session_expiry_interval=3600, receive_maximum=20, user_properties=(("k", "v"),)
            ),
        ),
        "5.0 §3.1.2.11, §3.1.3.2",
    ),
    Vector(
        "v5-connect-password-without-username-and-auth-method",
        V5,
        h(
            "10 1d"
            "00 04 4d 51 54 54"  # protocol name "MQTT" (3.1.2.1)
            "05"
            "42"  # password flag without user name flag: allowed in 5.0 (3.1.2.9)
            "00 00"  # keep alive 0
            "0c"  # property length 12
            "15 00 05 53 43 52 41 4d"  # authentication method "SCRAM" (3.1.2.11.9)
            "16 00 01 aa"  # authentication data aa (3.1.2.11.10)
            "00 00"  # empty client identifier (3.1.3.1)
            "00 02 73 33"  # password "s3"
        ),
        Connect(
            "",
            V5,
            True,
            0,
            password=b"s3",
            properties=Properties(authentication_method="SCRAM", authentication_data=b"\xaa"),
        ),
        "5.0 §3.1.2.9, §3.1.2.11.9",
    ),
    Vector("v5-connack-minimal", V5, h("20 03 00 00 00"), ConnAck(), "5.0 §3.2"),
    Vector(
        "v5-connack-properties",
        V5,
        h(
            "20 1b"
            "01"  # session present (3.2.2.1.1)
            "00"  # success
            "18"  # property length 24, in Mosquitto's order (the spec leaves it free)
            "22 00 10"  # topic alias maximum 16 (3.2.2.3.8)
            "12 00 06 61 75 74 6f 2d 31"  # assigned client identifier "auto-1" (3.2.2.3.7)
            "25 00"  # retain not available
            "21 00 64"  # receive maximum 100
            "24 01"  # maximum QoS 1
            "1f 00 02 6f 6b"  # reason string "ok" (3.2.2.3.9)
        ),
        ConnAck(
            True,
            0,
            Properties(
                assigned_client_identifier="auto-1",
                reason_string="ok",
                receive_maximum=100,
                topic_alias_maximum=16,
                maximum_qos=1,
                retain_available=0,
            ),
        ),
        "5.0 §3.2.2.3",
    ),
    Vector(
        "v5-connack-not-authorized",
        V5,
        h("20 03 00 87 00"),
        ConnAck(reason_code=ReasonCode.NOT_AUTHORIZED),
        "5.0 §3.2.2.2",
    ),
    Vector(
        "v5-publish-qos0",
        V5,
        h("30 08 00 03 61 2f 62 00 68 69"),  # topic "a/b", no properties, payload "hi"
        Publish("a/b", b"hi"),
        "5.0 §3.3",
    ),
    Vector(
        "v5-publish-qos1-message-properties",
        V5,
        h(
            "33 2b"  # PUBLISH, QoS 1, RETAIN, remaining length 43
            "00 03 73 2f 74"  # topic "s/t"
            "00 07"  # packet identifier 7
            "21"  # property length 33
            "01 01"  # payload format indicator: UTF-8 (3.3.2.3.2)
            "02 00 00 00 78"  # message expiry interval 120 (3.3.2.3.3)
            "03 00 04 6a 73 6f 6e"  # content type "json" (3.3.2.3.9)
            "08 00 03 72 2f 31"  # response topic "r/1" (3.3.2.3.5)
            "09 00 02 ab cd"  # correlation data ab cd (3.3.2.3.6)
            "0b 05"  # subscription identifier 5 (3.3.2.3.8)
            "0b 81 01"  # subscription identifier 129
            "23 00 03"  # topic alias 3 (3.3.2.3.4)
            "7b 7d"  # payload "{}"
        ),
        Publish(
            "s/t",
            b"{}",
            qos=1,
            retain=True,
            packet_id=7,
            properties=Properties(
                payload_format_indicator=1,
                message_expiry_interval=120,
                content_type="json",
                response_topic="r/1",
                correlation_data=b"\xab\xcd",
                subscription_identifiers=(5, 129),
                topic_alias=3,
            ),
        ),
        "5.0 §3.3.2.3",
    ),
    Vector(
        "v5-publish-empty-topic-with-alias",
        V5,
        h("30 06 00 00 03 23 00 01"),  # zero-length topic, topic alias 1
        Publish("", properties=Properties(topic_alias=1)),
        "5.0 §3.3.2.1, §3.3.2.3.4",
    ),
    Vector(
        "v5-publish-qos2-repeated-user-property",
        V5,
        h(
            "34 14"
            "00 01 74"  # topic "t"
            "00 02"  # packet identifier 2
            "0e"  # property length 14
            "26 00 01 61 00 01 62"  # user property a=b
            "26 00 01 61 00 01 63"  # user property a=c: the same name may repeat (3.3.2.3.7)
        ),
        Publish(
            "t",
            qos=2,
            packet_id=2,
            properties=Properties(user_properties=(("a", "b"), ("a", "c"))),
        ),
        "5.0 §3.3.2.3.7",
    ),
    Vector(
        "v5-publish-three-byte-remaining-length",
        V5,
        h("30 80 80 01 00 01 74 00" + "42" * 16_380),  # remaining length 16384 (1.5.5)
        Publish("t", b"B" * 16_380),
        "5.0 §1.5.5, table 1-1",
    ),
    Vector("v5-puback-2-byte", V5, h("40 02 00 0a"), PubAck(10), "5.0 §3.4.2.1"),
    Vector(
        "v5-puback-3-byte-reason-code",
        V5,
        h("40 03 00 0a 10"),
        PubAck(10, ReasonCode.NO_MATCHING_SUBSCRIBERS),
        "5.0 §3.4.2.1 (no property length when remaining length < 4)",
    ),
    Vector(
        "v5-puback-3-byte-success-spelled-out",
        V5,
        h("40 03 00 0a 00"),
        PubAck(10),
        "5.0 §3.4.2.1",
        canonical=False,
    ),
    Vector(
        "v5-puback-empty-property-block",
        V5,
        h("40 04 00 0a 10 00"),
        PubAck(10, ReasonCode.NO_MATCHING_SUBSCRIBERS),
        "5.0 §3.4.2.2",
        canonical=False,
    ),
    Vector(
        "v5-puback-reason-string",
        V5,
        h("40 09 00 0a 97 05 1f 00 02 6e 6f"),  # quota exceeded, reason string "no"
        PubAck(10, ReasonCode.QUOTA_EXCEEDED, Properties(reason_string="no")),
        "5.0 §3.4.2.2.2",
    ),
    Vector("v5-pubrec-2-byte", V5, h("50 02 00 0b"), PubRec(11), "5.0 §3.5.2.1"),
    Vector(
        "v5-pubrec-3-byte-reason-code",
        V5,
        h("50 03 00 0b 80"),
        PubRec(11, ReasonCode.UNSPECIFIED_ERROR),
        "5.0 §3.5.2.1",
    ),
    Vector(
        "v5-pubrec-user-property",
        V5,
        h("50 0b 00 0b 10 07 26 00 01 6b 00 01 76"),
        PubRec(11, ReasonCode.NO_MATCHING_SUBSCRIBERS, Properties(user_properties=(("k", "v"),))),
        "5.0 §3.5.2.2",
    ),
    Vector("v5-pubrel-2-byte", V5, h("62 02 00 0c"), PubRel(12), "5.0 §3.6.2.1"),
    Vector(
        "v5-pubrel-3-byte-not-found",
        V5,
        h("62 03 00 0c 92"),
        PubRel(12, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
        "5.0 §3.6.2.1",
    ),
    Vector(
        "v5-pubrel-success-with-properties",
        V5,
        h("62 0b 00 0c 00 07 26 00 01 61 00 01 62"),
        PubRel(12, 0, Properties(user_properties=(("a", "b"),))),
        "5.0 §3.6.2.2",
    ),
    Vector("v5-pubcomp-2-byte", V5, h("70 02 00 0d"), PubComp(13), "5.0 §3.7.2.1"),
    Vector(
        "v5-pubcomp-3-byte-not-found",
        V5,
        h("70 03 00 0d 92"),
        PubComp(13, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
        "5.0 §3.7.2.1",
    ),
    Vector(
        "v5-pubcomp-reason-string",
        V5,
        h("70 08 00 0d 92 04 1f 00 01 3f"),
        PubComp(13, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, Properties(reason_string="?")),
        "5.0 §3.7.2.2",
    ),
    Vector(
        "v5-subscribe-options-and-subscription-identifier",
        V5,
        h(
            "82 10"
            "00 02"  # packet identifier 2
            "03"  # property length 3
            "0b ac 02"  # subscription identifier 300 (3.8.2.1.2)
            "00 03 61 2f 23"  # "a/#"
            "2d"  # retain handling 2, retain as published, no local, QoS 1 (3.8.3.1)
            "00 01 62"  # "b"
            "10"  # retain handling 1, QoS 0
        ),
        Subscribe(
            2,
            (SR("a/#", 1, True, True, 2), SR("b", 0, False, False, 1)),
            Properties(subscription_identifiers=(300,)),
        ),
        "5.0 §3.8.2, §3.8.3.1",
    ),
    Vector(
        "v5-subscribe-shared",
        V5,
        h("82 10 00 03 00 00 0a 24 73 68 61 72 65 2f 67 2f 74 02"),  # "$share/g/t", QoS 2
        Subscribe(3, (SR("$share/g/t", 2),)),
        "5.0 §3.8.3, §4.8.2",
    ),
    Vector(
        "v5-suback-granted-and-refused",
        V5,
        h("90 06 00 02 00 01 00 9e"),  # granted 1, granted 0, shared not supported
        SubAck(2, (1, 0, ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)),
        "5.0 §3.9.3",
    ),
    Vector(
        "v5-suback-reason-string",
        V5,
        h("90 08 00 02 04 1f 00 01 78 8f"),
        SubAck(2, (ReasonCode.TOPIC_FILTER_INVALID,), Properties(reason_string="x")),
        "5.0 §3.9.2.1.2",
    ),
    Vector(
        "v5-unsubscribe",
        V5,
        h("a2 0d 00 03 00 00 03 61 2f 62 00 03 63 2f 2b"),
        Unsubscribe(3, ("a/b", "c/+")),
        "5.0 §3.10",
    ),
    Vector(
        "v5-unsubscribe-user-property",
        V5,
        h("a2 0d 00 04 07 26 00 01 6b 00 01 76 00 01 78"),
        Unsubscribe(4, ("x",), Properties(user_properties=(("k", "v"),))),
        "5.0 §3.10.2.1.2",
    ),
    Vector(
        "v5-unsuback",
        V5,
        h("b0 05 00 03 00 00 11"),  # success, no subscription existed
        UnsubAck(3, (0, ReasonCode.NO_SUBSCRIPTION_EXISTED)),
        "5.0 §3.11",
    ),
    Vector(
        "v5-unsuback-reason-string",
        V5,
        h("b0 08 00 03 04 1f 00 01 78 87"),
        UnsubAck(3, (ReasonCode.NOT_AUTHORIZED,), Properties(reason_string="x")),
        "5.0 §3.11.2.1.2",
    ),
    Vector("v5-pingreq", V5, h("c0 00"), PingReq(), "5.0 §3.12"),
    Vector("v5-pingresp", V5, h("d0 00"), PingResp(), "5.0 §3.13"),
    Vector(
        "v5-disconnect-normal-short",
        V5,
        h("e0 00"),
        Disconnect(),
        "5.0 §3.14.2.1 (reason code omitted)",
    ),
    Vector(
        "v5-disconnect-with-will",
        V5,
        h("e0 01 04"),
        Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE),
        "5.0 §3.14.2.1 (property length omitted when remaining length < 2)",
    ),
    Vector(
        "v5-disconnect-normal-spelled-out",
        V5,
        h("e0 02 00 00"),
        Disconnect(),
        "5.0 §3.14.2",
        canonical=False,
    ),
    Vector(
        "v5-disconnect-reason-and-properties",
        V5,
        h(
            "e0 11"
            "9c"  # use another server
            "0f"  # property length 15
            "11 00 00 00 00"  # session expiry interval 0 (3.14.2.2.2)
            "1c 00 01 73"  # server reference "s" (3.14.2.2.5)
            "1f 00 03 62 79 65"  # reason string "bye" (3.14.2.2.3)
        ),
        Disconnect(
            ReasonCode.USE_ANOTHER_SERVER,
            Properties(session_expiry_interval=0, server_reference="s", reason_string="bye"),
        ),
        "5.0 §3.14.2.2",
    ),
    Vector("v5-auth-success-short", V5, h("f0 00"), Auth(), "5.0 §3.15.2.1"),
    Vector(
        "v5-auth-continue",
        V5,
        h(
            "f0 0f"
            "18"  # continue authentication
            "0d"  # property length 13
            "15 00 05 53 43 52 41 4d"  # authentication method "SCRAM" (3.15.2.2.2)
            "16 00 02 01 02"  # authentication data 01 02 (3.15.2.2.3)
        ),
        Auth(
            ReasonCode.CONTINUE_AUTHENTICATION,
            Properties(authentication_method="SCRAM", authentication_data=b"\x01\x02"),
        ),
        "5.0 §3.15",
    ),
    Vector(
        "v5-auth-re-authenticate",
        V5,
        h("f0 0a 19 08 15 00 05 53 43 52 41 4d"),
        Auth(ReasonCode.RE_AUTHENTICATE, Properties(authentication_method="SCRAM")),
        "5.0 §3.15.2.1",
    ),
]

CANONICAL = [v for v in VECTORS if v.canonical]

#: A second packet that reads the same in both versions (PUBACK, packet identifier 1).
SECOND = h("40 02 00 01")
SECOND_PACKET = PubAck(1)


def params(vectors: list[Vector]) -> list[object]:
    return [pytest.param(v, id=v.id) for v in vectors]


def test_every_packet_type_has_a_vector_in_each_version() -> None:
    for version in (V311, V5):
        kinds = {type(v.packet) for v in VECTORS if v.version == version}
        expected = {
            Connect,
            ConnAck,
            Publish,
            PubAck,
            PubRec,
            PubRel,
            PubComp,
            Subscribe,
            SubAck,
            Unsubscribe,
            UnsubAck,
            PingReq,
            PingResp,
            Disconnect,
        }
        if version == V5:
            expected.add(Auth)
        assert kinds == expected


@pytest.mark.parametrize("vector", params(VECTORS))
def test_vector_decodes_whole(vector: Vector) -> None:
    reader = PacketReader(version=vector.version)
    reader.receive_data(vector.data)
    assert reader.next_packet() == vector.packet
    assert reader.next_packet() is NEED_DATA
    assert reader.framer.buffered == 0


@pytest.mark.parametrize("vector", params(VECTORS))
def test_vector_byte_by_byte_needs_data_until_the_last_byte(vector: Vector) -> None:
    reader = PacketReader(version=vector.version)
    for i in range(len(vector.data) - 1):
        reader.receive_data(vector.data[i : i + 1])
        assert reader.next_packet() is NEED_DATA, f"after {i + 1} bytes"
    reader.receive_data(vector.data[-1:])
    assert reader.next_packet() == vector.packet
    assert reader.next_packet() is NEED_DATA


@pytest.mark.parametrize("vector", params(VECTORS))
def test_vector_followed_by_a_second_packet(vector: Vector) -> None:
    reader = PacketReader(version=vector.version)
    reader.receive_data(vector.data + SECOND)
    assert reader.next_packet() == vector.packet
    assert reader.next_packet() == SECOND_PACKET
    assert reader.next_packet() is NEED_DATA


@pytest.mark.parametrize("vector", params(VECTORS))
def test_vector_followed_by_part_of_a_second_packet(vector: Vector) -> None:
    reader = PacketReader(version=vector.version)
    reader.receive_data(vector.data + SECOND[:1])
    assert reader.next_packet() == vector.packet
    assert reader.next_packet() is NEED_DATA
    reader.receive_data(SECOND[1:])
    assert reader.next_packet() == SECOND_PACKET


@pytest.mark.parametrize("vector", params(CANONICAL))
def test_vector_encodes_to_the_same_bytes(vector: Vector) -> None:
    assert encode(vector.packet, vector.version) == vector.data


@pytest.mark.parametrize("vector", params([v for v in VECTORS if not v.canonical]))
def test_longer_equivalent_form_reencodes_to_a_shorter_one_with_the_same_value(
    vector: Vector,
) -> None:
    again = encode(vector.packet, vector.version)
    assert len(again) < len(vector.data)
    reader = PacketReader(version=vector.version)
    reader.receive_data(again)
    assert reader.next_packet() == vector.packet


# ====================================================================== malformed


@dataclass(frozen=True)
class Bad:
    id: str
    version: int
    data: bytes
    error: type[MQTTError]
    reason_code: int
    #: The normative statement (or section) the bytes break.
    statement: str
    max_packet_size: int = NO_LIMIT
    #: How many bytes must arrive before the error is raised (default: all of them).
    #: Smaller for errors visible in the fixed header, which must come before the body.
    raises_at: int | None = None


MALFORMED = 0x81
PROTOCOL = 0x82
TOPIC_INVALID = 0x90
TOO_LARGE = 0x95
UNSUPPORTED = 0x84

BAD: list[Bad] = [
    # --- fixed header
    # The fourth length byte carrying a continuation bit announces a fifth: rejected right
    # there, before the fifth length byte or any of the body arrives.
    Bad(
        "remaining-length-five-bytes-311",
        V311,
        h("30 ff ff ff ff 01"),
        MalformedPacket,
        MALFORMED,
        "3.1.1 §2.2.3 (at most four bytes)",
        raises_at=5,
    ),
    Bad(
        "remaining-length-five-bytes-v5",
        V5,
        h("30 80 80 80 80 01"),
        MalformedPacket,
        MALFORMED,
        "5.0 §1.5.5, §2.1.4 (at most four bytes)",
        raises_at=5,
    ),
    Bad(
        "remaining-length-overlong",
        V5,
        h("c0 80 00"),  # PINGREQ with remaining length 0 spelled in two bytes
        MalformedPacket,
        MALFORMED,
        "MQTT-1.5.5-1 (minimum number of bytes)",
    ),
    Bad(
        "packet-too-large-from-header-v5",
        V5,
        h("30 ff 7f"),  # announces 16383 bytes; only the fixed header is sent
        PacketTooLarge,
        TOO_LARGE,
        "5.0 §3.2.2.3.6, §4.13",
        max_packet_size=100,
    ),
    Bad(
        "packet-too-large-from-header-311",
        V311,
        h("30 11"),  # 2 + 17 bytes > 16
        PacketTooLarge,
        TOO_LARGE,
        "5.0 §3.1.2.11.4 (bound applied to 3.1.1 too)",
        max_packet_size=16,
    ),
    Bad(
        "reserved-packet-type-0-311",
        V311,
        h("00 00"),
        MalformedPacket,
        MALFORMED,
        "3.1.1 §2.2.1 table 2.1",
    ),
    Bad(
        "reserved-packet-type-0-v5",
        V5,
        h("00 00"),
        MalformedPacket,
        MALFORMED,
        "5.0 §2.1.2 table 2-1",
    ),
    Bad(
        "auth-on-311",
        V311,
        h("f0 00"),
        MalformedPacket,
        MALFORMED,
        "3.1.1 §2.2.1 (type 15 reserved)",
    ),
    Bad(
        "subscribe-flags-0000",
        V311,
        h("80 06 00 01 00 01 61 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.8.1-1",
    ),
    Bad(
        "pubrel-flags-0000",
        V311,
        h("60 02 00 01"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.6.1-1",
    ),
    Bad(
        "unsubscribe-flags-0000",
        V5,
        h("a0 06 00 01 00 00 01 61"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.10.1-1",
    ),
    Bad(
        "pingreq-flags-0001",
        V311,
        h("c1 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-2.2.2-1, -2 (3.1.1); MQTT-2.1.3-1 (5.0)",
    ),
    Bad(
        "puback-flags-0010",
        V5,
        h("42 02 00 01"),
        MalformedPacket,
        MALFORMED,
        "MQTT-2.1.3-1",
    ),
    # --- PUBLISH
    Bad(
        "publish-qos-3",
        V311,
        h("36 05 00 01 74 00 01"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.3.1-4",
    ),
    Bad(
        "publish-dup-with-qos-0",
        V311,
        h("38 03 00 01 74"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.3.1-2",
    ),
    Bad(
        "publish-qos1-packet-id-0-311",
        V311,
        h("32 05 00 01 74 00 00"),
        ProtocolError,
        PROTOCOL,
        "MQTT-2.3.1-1 (3.1.1)",
    ),
    Bad(
        "publish-qos1-packet-id-0-v5",
        V5,
        h("32 06 00 01 74 00 00 00"),
        ProtocolError,
        PROTOCOL,
        "MQTT-2.2.1-3 (5.0)",
    ),
    Bad(
        "publish-topic-wildcard-plus",
        V311,
        h("30 05 00 03 61 2f 2b"),
        TopicNameInvalid,
        TOPIC_INVALID,
        "MQTT-3.3.2-2",
    ),
    Bad(
        "publish-topic-wildcard-hash",
        V5,
        h("30 04 00 01 23 00"),
        TopicNameInvalid,
        TOPIC_INVALID,
        "MQTT-3.3.2-2",
    ),
    Bad(
        "publish-empty-topic-311",
        V311,
        h("30 02 00 00"),
        TopicNameInvalid,
        TOPIC_INVALID,
        "MQTT-4.7.3-1",
    ),
    Bad(
        "publish-topic-invalid-utf8",
        V311,
        h("30 03 00 01 ff"),
        MalformedPacket,
        MALFORMED,
        "MQTT-1.5.3-1 (3.1.1); MQTT-1.5.4-1 (5.0)",
    ),
    Bad(
        "publish-topic-nul",
        V5,
        h("30 05 00 02 61 00 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-1.5.4-2 (5.0); MQTT-1.5.3-2 (3.1.1)",
    ),
    Bad(
        "publish-topic-utf16-surrogate",
        V311,
        h("30 05 00 03 ed a0 80"),  # U+D800 encoded as if it were a code point
        MalformedPacket,
        MALFORMED,
        "MQTT-1.5.3-1 (3.1.1); MQTT-1.5.4-1 (5.0)",
    ),
    Bad(
        "publish-string-length-past-end",
        V311,
        h("30 03 00 05 61"),  # topic announces 5 bytes, 1 present
        MalformedPacket,
        MALFORMED,
        "3.1.1 §1.5.3; 5.0 §4.13",
    ),
    # --- CONNECT
    Bad(
        "connect-client-id-nul",
        V311,
        h("10 0e" + MQTT_NAME + "04 02 00 3c 00 02 61 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-1.5.3-2 (3.1.1); MQTT-1.5.4-2 (5.0)",
    ),
    Bad(
        "connect-client-id-length-past-end",
        V5,
        h("10 0e" + MQTT_NAME + "05 02 00 3c 00 00 09 61"),
        MalformedPacket,
        MALFORMED,
        "5.0 §1.5.4, §4.13",
    ),
    Bad(
        "connect-reserved-flag",
        V311,
        h("10 0c" + MQTT_NAME + "04 03 00 3c 00 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.1.2-3",
    ),
    Bad(
        "connect-will-qos-3",
        V311,
        h("10 11" + MQTT_NAME + "04 1e 00 3c 00 00 00 01 77 00 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.1.2-14 (3.1.1); MQTT-3.1.2-12 (5.0)",
    ),
    Bad(
        "connect-will-retain-without-will-flag",
        V5,
        h("10 0d" + MQTT_NAME + "05 22 00 3c 00 00 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.1.2-13 (5.0); MQTT-3.1.2-15 (3.1.1)",
    ),
    Bad(
        "connect-will-qos-without-will-flag",
        V311,
        h("10 0c" + MQTT_NAME + "04 0a 00 3c 00 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.1.2-13 (3.1.1); MQTT-3.1.2-11 (5.0)",
    ),
    Bad(
        "connect-311-password-without-username",
        V311,
        h("10 0e" + MQTT_NAME + "04 42 00 3c 00 00 00 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.1.2-22",
    ),
    Bad(
        "connect-bad-protocol-name",
        V311,
        h("10 0c 00 04 4d 51 54 58 04 02 00 3c 00 00"),  # "MQTX"
        BadProtocolName,
        UNSUPPORTED,
        "MQTT-3.1.2-1",
    ),
    Bad(
        "connect-unsupported-level-6",
        V5,
        h("10 0c" + MQTT_NAME + "06 02 00 3c 00 00"),
        UnsupportedProtocolVersion,
        UNSUPPORTED,
        "MQTT-3.1.2-2",
    ),
    Bad(
        "connect-bridge-bit-on-level-5",
        V5,
        h("10 0d" + MQTT_NAME + "85 02 00 3c 00 00 00"),  # 5.0 says bridges by options
        UnsupportedProtocolVersion,
        UNSUPPORTED,
        "MQTT-3.1.2-2",
    ),
    Bad(
        "connect-mqisdp-level-4",
        V311,
        h("10 0e 00 06 4d 51 49 73 64 70 04 02 00 3c 00 00"),  # "MQIsdp" is level 3 only
        UnsupportedProtocolVersion,
        UNSUPPORTED,
        "MQTT 3.1 §3.1",
    ),
    Bad(
        "connect-receive-maximum-0",
        V5,
        h("10 10" + MQTT_NAME + "05 02 00 3c 03 21 00 00 00 00"),
        ProtocolError,
        PROTOCOL,
        "5.0 §3.1.2.11.3",
    ),
    Bad(
        "connect-request-problem-information-2",
        V5,
        h("10 0f" + MQTT_NAME + "05 02 00 3c 02 17 02 00 00"),
        ProtocolError,
        PROTOCOL,
        "5.0 §3.1.2.11.7",
    ),
    # --- SUBSCRIBE / UNSUBSCRIBE
    Bad(
        "subscribe-no-filters-311",
        V311,
        h("82 02 00 01"),
        ProtocolError,
        PROTOCOL,
        "MQTT-3.8.3-3 (3.1.1)",
    ),
    Bad(
        "subscribe-no-filters-v5",
        V5,
        h("82 03 00 01 00"),
        ProtocolError,
        PROTOCOL,
        "MQTT-3.8.3-2 (5.0)",
    ),
    Bad(
        "subscribe-reserved-option-bits-311",
        V311,
        h("82 06 00 01 00 01 61 04"),  # bit 2 is reserved in 3.1.1
        MalformedPacket,
        MALFORMED,
        "MQTT-3-8.3-4",
    ),
    Bad(
        "subscribe-reserved-option-bits-v5",
        V5,
        h("82 07 00 01 00 00 01 61 40"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.8.3-5",
    ),
    Bad(
        "subscribe-retain-handling-3",
        V5,
        h("82 07 00 01 00 00 01 61 30"),
        ProtocolError,
        PROTOCOL,
        "5.0 §3.8.3.1",
    ),
    Bad(
        "subscribe-qos-3-311",
        V311,
        h("82 06 00 01 00 01 61 03"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3-8.3-4",
    ),
    Bad(
        "subscribe-qos-3-v5",
        V5,
        h("82 07 00 01 00 00 01 61 03"),
        ProtocolError,
        PROTOCOL,
        "5.0 §3.8.3.1 (a Maximum QoS of 3 is a Protocol Error)",
    ),
    Bad(
        "subscribe-subscription-identifier-0",
        V5,
        h("82 09 00 01 02 0b 00 00 01 61 00"),
        ProtocolError,
        PROTOCOL,
        "5.0 §3.8.2.1.2",
    ),
    Bad(
        "subscribe-subscription-identifier-twice",
        V5,
        h("82 0b 00 01 04 0b 01 0b 02 00 01 61 00"),
        ProtocolError,
        PROTOCOL,
        "5.0 §3.8.2.1.2",
    ),
    Bad(
        "subscribe-subscription-identifier-overlong",
        V5,
        h("82 0a 00 01 03 0b 81 00 00 01 61 00"),  # 1 spelled in two bytes
        MalformedPacket,
        MALFORMED,
        "MQTT-1.5.5-1",
    ),
    Bad(
        "unsubscribe-no-filters-311",
        V311,
        h("a2 02 00 01"),
        ProtocolError,
        PROTOCOL,
        "MQTT-3.10.3-2",
    ),
    Bad(
        "unsubscribe-no-filters-v5",
        V5,
        h("a2 03 00 01 00"),
        ProtocolError,
        PROTOCOL,
        "MQTT-3.10.3-2",
    ),
    # --- properties
    Bad(
        "property-unknown-identifier",
        V5,
        h("30 06 00 01 74 02 05 00"),  # 0x05 is not a property
        MalformedPacket,
        MALFORMED,
        "5.0 §2.2.2.2",
    ),
    Bad(
        "property-not-allowed-in-packet",
        V5,
        h("30 09 00 01 74 05 11 00 00 00 0a"),  # session expiry interval in PUBLISH
        MalformedPacket,
        MALFORMED,
        "5.0 §2.2.2.2",
    ),
    Bad(
        "property-duplicated",
        V5,
        h("30 0e 00 01 74 0a 02 00 00 00 01 02 00 00 00 02"),  # message expiry twice
        ProtocolError,
        PROTOCOL,
        "5.0 §3.3.2.3.3",
    ),
    Bad(
        "property-length-past-end",
        V5,
        h("40 06 00 01 10 09 1f 00"),
        MalformedPacket,
        MALFORMED,
        "5.0 §2.2.2.1, §4.13",
    ),
    # --- the rest
    Bad(
        "pingreq-trailing-byte",
        V311,
        h("c0 01 00"),
        MalformedPacket,
        MALFORMED,
        "3.1.1 §3.12 (no variable header, no payload)",
    ),
    Bad(
        "puback-invalid-reason-code",
        V5,
        h("40 03 00 01 05"),
        MalformedPacket,
        MALFORMED,
        "5.0 §3.4.2.1",
    ),
    Bad(
        "puback-311-remaining-length-3",
        V311,
        h("40 03 00 01 00"),
        MalformedPacket,
        MALFORMED,
        "3.1.1 §3.4.1 (remaining length 2)",
    ),
    Bad(
        "connack-reserved-flags",
        V5,
        h("20 03 02 00 00"),
        MalformedPacket,
        MALFORMED,
        "MQTT-3.2.2-1",
    ),
    Bad(
        "disconnect-311-with-reason-code",
        V311,
        h("e0 01 00"),
        MalformedPacket,
        MALFORMED,
        "3.1.1 §3.14 (no variable header)",
    ),
    Bad(
        "disconnect-invalid-reason-code",
        V5,
        h("e0 01 05"),
        MalformedPacket,
        MALFORMED,
        "5.0 §3.14.2.1",
    ),
    Bad(
        "auth-invalid-reason-code",
        V5,
        h("f0 01 05"),
        MalformedPacket,
        MALFORMED,
        "5.0 §3.15.2.1",
    ),
]


def bad_params() -> list[object]:
    return [pytest.param(b, id=b.id) for b in BAD]


def test_malformed_ids_are_unique() -> None:
    ids = [b.id for b in BAD] + [v.id for v in VECTORS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("bad", bad_params())
def test_malformed_vector_raises_its_reason_code(bad: Bad) -> None:
    reader = PacketReader(max_packet_size=bad.max_packet_size, version=bad.version)
    reader.receive_data(bad.data)
    with pytest.raises(MQTTError) as caught:
        reader.next_packet()
    assert type(caught.value) is bad.error
    assert caught.value.reason_code == bad.reason_code


@pytest.mark.parametrize("bad", bad_params())
def test_malformed_vector_byte_by_byte_raises_exactly_when_visible(bad: Bad) -> None:
    reader = PacketReader(max_packet_size=bad.max_packet_size, version=bad.version)
    raises_at = bad.raises_at if bad.raises_at is not None else len(bad.data)
    for i in range(raises_at - 1):
        reader.receive_data(bad.data[i : i + 1])
        assert reader.next_packet() is NEED_DATA, f"after {i + 1} bytes"
    reader.receive_data(bad.data[raises_at - 1 : raises_at])
    with pytest.raises(bad.error):
        reader.next_packet()


def test_packet_too_large_is_rejected_before_any_body_byte() -> None:
    """The bound applies to the announced size: the header alone is enough to refuse."""
    reader = PacketReader(max_packet_size=1_000, version=V5)
    reader.receive_data(h("30 ff ff ff 7f"))  # announces VARINT_MAX bytes
    with pytest.raises(PacketTooLarge):
        reader.next_packet()
    assert reader.framer.buffered == 5


def test_packet_of_exactly_the_maximum_size_is_accepted() -> None:
    data = h("30 0a 00 03 61 2f 62 68 65 6c 6c 6f")  # 12 bytes in all
    reader = PacketReader(max_packet_size=12, version=V311)
    reader.receive_data(data)
    assert reader.next_packet() == Publish("a/b", b"hello")
    smaller = PacketReader(max_packet_size=11, version=V311)
    smaller.receive_data(data[:2])
    with pytest.raises(PacketTooLarge):
        smaller.next_packet()


def test_unsupported_protocol_version_carries_the_level() -> None:
    reader = PacketReader(version=V311)
    reader.receive_data(h("10 0c" + MQTT_NAME + "06 02 00 3c 00 00"))
    with pytest.raises(UnsupportedProtocolVersion) as caught:
        reader.next_packet()
    assert caught.value.level == 6
    assert str(caught.value) == "protocol level 6 is not supported"


def test_error_after_the_protocol_level_carries_the_version() -> None:
    """The broker answers a bad v5 CONNECT with a v5 CONNACK, so the level travels along."""
    reader = PacketReader(version=V311)
    reader.receive_data(h("10 10" + MQTT_NAME + "05 02 00 3c 03 21 00 00 00 00"))
    with pytest.raises(ProtocolError) as caught:
        reader.next_packet()
    assert caught.value.protocol_version == V5


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65_535])
def test_binary_data_round_trips_at_its_length_boundaries(size: int) -> None:
    """MQTT-1.5.6: a Two Byte Integer length, big-endian, then that many bytes."""
    value = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    encoded = encode_binary(value)
    assert encoded[:2] == size.to_bytes(2, "big")
    buf = b"\xaa" + encoded + b"\xbb"  # read from inside a larger buffer
    assert read_binary(buf, 1, len(buf) - 1) == (value, len(buf) - 1)


def test_binary_data_past_what_two_bytes_can_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^binary data longer than 65,535 bytes$"):
        encode_binary(b"x" * 65_536)


def test_binary_data_cut_short_is_malformed_and_says_which_part() -> None:
    assert read_binary(b"\x00\x00", 0, 2) == (b"", 2)  # empty, ending exactly at the end
    with pytest.raises(MalformedPacket, match=r"^length prefix runs past the end of the packet$"):
        read_binary(b"\x00\x01\x02", 0, 1)
    with pytest.raises(MalformedPacket, match=r"^binary data runs past the end of the packet$"):
        read_binary(b"\x00\x03ab", 0, 4)


def test_reason_codes_are_described_by_name_or_number() -> None:
    assert describe(0x87) == "not authorized"
    assert describe(0x9E) == "shared subscriptions not supported"
    assert describe(0xFE) == "reason code 0xfe"
