"""Byte vectors for the codec's hot-path functions (``gateway.mqtt.fastpath``).

The vectors are written by hand as hex from the packet layouts in the MQTT 3.1.1 and
5.0 standards. Each is checked the h11 way: whole, byte by byte (every proper prefix
reads as ``NEED_DATA``) and followed by trailing data; and against the general codec,
so the fast functions can never drift from ``encode``/``decode``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    NEED_DATA,
    Framer,
    MQTTError,
    NeedData,
    Packet,
    PacketReader,
    PacketType,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    decode,
    encode,
)
from gateway.mqtt.fastpath import (
    encode_ack,
    encode_packet_id,
    peek_publish,
    publish_template,
    template_size,
)
from gateway.mqtt.properties import properties_body, property_block, user_property


def h(text: str) -> bytes:
    return bytes.fromhex(text)


@dataclass(frozen=True)
class Built:
    id: str
    version: int
    data: bytes
    packet: Packet
    section: str


ACKS = [
    Built("puback-311", MQTT_311, h("40 02 00 07"), PubAck(7), "3.1.1 3.4"),
    Built("pubrec-311", MQTT_311, h("50 02 01 00"), PubRec(256), "3.1.1 3.5"),
    Built("pubrel-311", MQTT_311, h("62 02 ff ff"), PubRel(65535), "3.1.1 3.6, MQTT-3.6.1-1"),
    Built("pubcomp-311", MQTT_311, h("70 02 00 01"), PubComp(1), "3.1.1 3.7"),
    Built("puback-5-success", MQTT_5, h("40 02 00 07"), PubAck(7), "5.0 3.4.2.1"),
    Built("puback-5-no-match", MQTT_5, h("40 03 00 07 10"), PubAck(7, 0x10), "5.0 3.4.2.1"),
    Built("puback-5-not-authorized", MQTT_5, h("40 03 00 09 87"), PubAck(9, 0x87), "5.0 3.4.2.1"),
    Built("pubrec-5-quota", MQTT_5, h("50 03 00 02 97"), PubRec(2, 0x97), "5.0 3.5.2.1"),
    Built("pubrel-5-not-found", MQTT_5, h("62 03 00 03 92"), PubRel(3, 0x92), "5.0 3.6.2.1"),
    Built("pubcomp-5-not-found", MQTT_5, h("70 03 00 04 92"), PubComp(4, 0x92), "5.0 3.7.2.1"),
]

_KIND: dict[type, PacketType] = {
    PubAck: PacketType.PUBACK,
    PubRec: PacketType.PUBREC,
    PubRel: PacketType.PUBREL,
    PubComp: PacketType.PUBCOMP,
}


def ack_bytes(packet: Packet, version: int) -> bytes:
    assert isinstance(packet, PubAck | PubRec | PubRel | PubComp)
    return encode_ack(_KIND[type(packet)], packet.packet_id, packet.reason_code, version)


#: (head, tail) templates, with the packet identifier filled in as a sender would.
TEMPLATES: list[tuple[Built, dict[str, object]]] = [
    (
        Built(
            "publish-311-qos0",
            MQTT_311,
            h("30 06 00 01 61 68 69 21"),
            Publish("a", b"hi!"),
            "3.1.1 3.3",
        ),
        {"qos": 0, "retain": False, "topic": b"a", "payload": b"hi!"},
    ),
    (
        Built(
            "publish-311-qos1-retain-dup",
            MQTT_311,
            h("3b 08 00 03 61 2f 62 12 34 78"),
            Publish("a/b", b"x", 1, True, True, 0x1234),
            "3.1.1 3.3.1, 3.3.2",
        ),
        {"qos": 1, "retain": True, "topic": b"a/b", "payload": b"x", "dup": True, "pid": 0x1234},
    ),
    (
        Built(
            "publish-5-qos2-properties",
            MQTT_5,
            # topic "t", pid 5, properties: content type "c" (03), then the per-delivery
            # Message Expiry Interval 60 (02), Topic Alias 2 (23), Subscription
            # Identifier 200 (0b, varint c8 01).
            h("34 16 00 01 74 00 05 0f 03 00 01 63 02 00 00 00 3c 23 00 02 0b c8 01 70"),
            Publish(
                "t",
                b"p",
                2,
                packet_id=5,
                properties=Properties(
                    content_type="c",
                    message_expiry_interval=60,
                    topic_alias=2,
                    subscription_identifiers=(200,),
                ),
            ),
            "5.0 3.3.2.3",
        ),
        {
            "qos": 2,
            "retain": False,
            "topic": b"t",
            "payload": b"p",
            "properties": properties_body(Properties(content_type="c")),
            "expiry": 60,
            "alias": 2,
            "sub_ids": (200,),
            "pid": 5,
        },
    ),
    (
        Built(
            "publish-5-known-alias-no-topic",
            MQTT_5,
            h("30 08 00 00 03 23 00 01 6f 6b"),
            Publish("", b"ok", properties=Properties(topic_alias=1)),
            "5.0 3.3.2.3.4, MQTT-3.3.2-7",
        ),
        {"qos": 0, "retain": False, "topic": b"", "payload": b"ok", "alias": 1},
    ),
]


def built_from_template(args: dict[str, object], version: int) -> bytes:
    kwargs = {k: v for k, v in args.items() if k in ("dup", "expiry", "alias", "sub_ids")}
    head, tail = publish_template(
        version,
        args["qos"],  # type: ignore[arg-type]
        args["retain"],  # type: ignore[arg-type]
        args["topic"],  # type: ignore[arg-type]
        args["payload"],  # type: ignore[arg-type]
        args.get("properties", b""),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
    if not args["qos"]:
        assert tail == b""
        return head
    packet = head + encode_packet_id(args["pid"]) + tail  # type: ignore[arg-type]
    assert template_size((head, tail), args["qos"]) == len(packet)  # type: ignore[arg-type]
    return packet


BUILT = [(b, lambda b=b: ack_bytes(b.packet, b.version)) for b in ACKS] + [
    (b, lambda b=b, a=a: built_from_template(a, b.version)) for b, a in TEMPLATES
]


def params() -> list[object]:
    return [pytest.param(b, make, id=b.id) for b, make in BUILT]


@pytest.mark.parametrize(("vector", "make"), params())
def test_built_bytes_are_the_vector_whole(vector: Built, make: object) -> None:
    assert make() == vector.data  # type: ignore[operator]
    reader = PacketReader(version=vector.version)
    reader.receive_data(vector.data)
    assert reader.next_packet() == vector.packet
    assert reader.next_packet() is NEED_DATA


@pytest.mark.parametrize(("vector", "make"), params())
def test_built_bytes_byte_by_byte_need_data_until_the_last(vector: Built, make: object) -> None:
    data = make()  # type: ignore[operator]
    reader = PacketReader(version=vector.version)
    for byte in data[:-1]:
        reader.receive_data(bytes((byte,)))
        assert reader.next_packet() is NEED_DATA
    reader.receive_data(data[-1:])
    assert reader.next_packet() == vector.packet


@pytest.mark.parametrize(("vector", "make"), params())
def test_built_bytes_followed_by_trailing_data(vector: Built, make: object) -> None:
    reader = PacketReader(version=vector.version)
    reader.receive_data(make() + h("c0 00 e0"))  # type: ignore[operator]  # PINGREQ, part of a DISCONNECT
    assert reader.next_packet() == vector.packet
    assert type(reader.next_packet()).__name__ == "PingReq"
    assert reader.next_packet() is NEED_DATA


@pytest.mark.parametrize("vector", [pytest.param(b, id=b.id) for b in ACKS])
def test_ack_is_what_the_general_encoder_writes(vector: Built) -> None:
    assert ack_bytes(vector.packet, vector.version) == encode(vector.packet, vector.version)


def test_ack_reason_code_is_left_out_on_311() -> None:
    """MQTT 3.1.1 acknowledgements have no reason code: a refusal cannot be spelled."""
    assert encode_ack(PacketType.PUBACK, 7, 0x87, MQTT_311) == h("40 02 00 07")


# ------------------------------------------------------------------------------ peek

#: A plain PUBLISH: (version, bytes, expected (topic, qos, packet id, payload)).
PLAIN = [
    ("311-qos0", MQTT_311, h("30 06 00 01 61 68 69 21"), ("a", 0, 0, b"hi!")),
    ("311-qos1", MQTT_311, h("32 08 00 03 61 2f 62 00 0a 78"), ("a/b", 1, 10, b"x")),
    ("311-empty-payload", MQTT_311, h("30 03 00 01 61"), ("a", 0, 0, b"")),
    ("311-dollar-topic", MQTT_311, h("30 05 00 02 24 78 21"), ("$x", 0, 0, b"!")),
    ("5-qos0", MQTT_5, h("30 05 00 01 61 00 21"), ("a", 0, 0, b"!")),
    ("5-qos1-utf8", MQTT_5, h("32 09 00 02 c3 a9 00 01 00 6f 6b"), ("é", 1, 1, b"ok")),
]

#: Not plain: the general decoder reads these (and reports what is wrong, if anything).
NOT_PLAIN = [
    ("retain", MQTT_311, h("31 04 00 01 61 21")),
    ("dup-qos1", MQTT_311, h("3a 06 00 01 61 00 01 21")),
    ("qos2", MQTT_311, h("34 06 00 01 61 00 01 21")),
    ("properties", MQTT_5, h("30 07 00 01 61 02 01 01 21")),
    ("5-no-property-length", MQTT_5, h("30 03 00 01 61")),
    ("wildcard-plus", MQTT_311, h("30 04 00 02 61 2b")),
    ("wildcard-hash", MQTT_311, h("30 03 00 01 23")),
    ("nul-in-topic", MQTT_311, h("30 04 00 02 61 00")),
    ("empty-topic", MQTT_5, h("30 04 00 00 00 21")),
    ("packet-id-0", MQTT_311, h("32 05 00 01 61 00 00")),
    ("bad-utf8", MQTT_311, h("30 04 00 02 c3 28")),
    ("topic-past-end", MQTT_311, h("30 04 00 09 61 62")),
    ("short", MQTT_311, h("30 02 00 01")),
    ("pid-past-end", MQTT_311, h("32 04 00 01 61 00")),
]


def framed(data: bytes, lead: bytes = b"", trailing: bytes = b"") -> tuple[int, bytes, int, int]:
    """(first byte, buffer, body start, end) as the framer hands them to the fast path."""
    framer = Framer()
    framer.feed(lead + data + trailing)
    if lead:
        skipped = framer.next_span()
        assert not isinstance(skipped, NeedData)
    span = framer.next_span()
    assert not isinstance(span, NeedData), "not a whole packet"
    first, _frame_start, start, end = span
    return first, bytes(framer.buffer), start, end


@pytest.mark.parametrize(
    ("version", "data", "want"), [pytest.param(*p[1:], id=p[0]) for p in PLAIN]
)
def test_peek_reads_a_plain_publish_whole(
    version: int, data: bytes, want: tuple[object, ...]
) -> None:
    first, buf, start, end = framed(data)
    peeked = peek_publish(first, buf, start, end, version)
    assert peeked is not None
    topic, qos, pid, payload_start = peeked
    assert (topic, qos, pid, buf[payload_start:end]) == want
    packet = decode(first, buf[start:end], version)
    assert isinstance(packet, Publish)
    assert (packet.topic, packet.qos, packet.packet_id, packet.payload) == want


@pytest.mark.parametrize(
    ("version", "data", "want"), [pytest.param(*p[1:], id=p[0]) for p in PLAIN]
)
def test_peek_inside_a_buffer_with_data_before_and_after(
    version: int, data: bytes, want: tuple[object, ...]
) -> None:
    """The span is what counts: a PINGREQ before and part of a PUBLISH after change nothing."""
    first, buf, start, end = framed(data, lead=h("c0 00"), trailing=h("30 7f 00"))
    peeked = peek_publish(first, buf, start, end, version)
    assert peeked is not None
    assert (*peeked[:3], buf[peeked[3] : end]) == want


@pytest.mark.parametrize(
    ("version", "data", "want"), [pytest.param(*p[1:], id=p[0]) for p in PLAIN]
)
def test_peek_byte_by_byte_is_never_asked_before_the_last_byte(
    version: int, data: bytes, want: tuple[object, ...]
) -> None:
    framer = Framer()
    for byte in data[:-1]:
        framer.feed(bytes((byte,)))
        assert framer.next_span() is NEED_DATA
    framer.feed(data[-1:])
    span = framer.next_span()
    assert not isinstance(span, NeedData)
    first, _fs, start, end = span
    peeked = peek_publish(first, framer.buffer, start, end, version)
    assert peeked is not None and peeked[:3] == want[:3]


@pytest.mark.parametrize(("version", "data"), [pytest.param(*p[1:], id=p[0]) for p in NOT_PLAIN])
def test_peek_leaves_anything_else_to_the_general_decoder(version: int, data: bytes) -> None:
    first, buf, start, end = framed(data, trailing=h("c0 00"))
    assert peek_publish(first, buf, start, end, version) is None


@given(
    st.sampled_from([MQTT_311, MQTT_5]),
    st.text(
        st.characters(blacklist_characters="+#\x00", blacklist_categories=["Cs"]),
        min_size=1,
        max_size=8,
    ),
    st.binary(max_size=20),
    st.integers(0, 1),
    st.integers(1, 65535),
)
def test_peek_agrees_with_decode(
    version: int, topic: str, payload: bytes, qos: int, pid: int
) -> None:
    data = encode(Publish(topic, payload, qos, packet_id=pid if qos else 0), version)
    first, buf, start, end = framed(data, trailing=b"\x00")
    peeked = peek_publish(first, buf, start, end, version)
    assert peeked is not None
    packet = decode(first, buf[start:end], version)
    assert isinstance(packet, Publish)
    assert (peeked[0], peeked[1], peeked[2], buf[peeked[3] : end]) == (
        packet.topic,
        packet.qos,
        packet.packet_id,
        packet.payload,
    )


@given(
    st.sampled_from([MQTT_311, MQTT_5]),
    st.integers(0, 2),
    st.booleans(),
    st.text(st.characters(blacklist_characters="+#\x00", blacklist_categories=["Cs"]), max_size=8),
    st.binary(max_size=20),
    st.integers(1, 65535),
)
def test_template_is_what_the_general_encoder_writes(
    version: int, qos: int, retain: bool, topic: str, payload: bytes, pid: int
) -> None:
    if not topic and version == MQTT_311:
        topic = "t"
    head, tail = publish_template(version, qos, retain, topic.encode(), payload)
    packet = Publish(topic, payload, qos, retain, False, pid if qos else 0)
    built = head + encode_packet_id(pid) + tail if qos else head
    assert built == encode(packet, version)


def test_user_properties_make_a_property_block() -> None:
    """MQTT 5.0 3.3.2.3.7: identifier 0x26, then a UTF-8 string pair; the block is
    prefixed by its length as a variable byte integer."""
    block = property_block(user_property("g", "gw") + user_property("s", "12"))
    assert block == h("10 26 00 01 67 00 02 67 77 26 00 01 73 00 02 31 32")
    assert block == encode_properties_of(user_properties=(("g", "gw"), ("s", "12")))
    assert property_block(b"") == h("00")


def encode_properties_of(**values: object) -> bytes:
    from gateway.mqtt.properties import encode_properties

    return encode_properties(Properties(**values))  # type: ignore[arg-type]


def test_peek_never_reads_what_decode_refuses() -> None:
    """Every NOT_PLAIN vector the codec refuses is refused for a reason the general
    path reports; none of them is peeked."""
    refused = 0
    for _name, version, data in NOT_PLAIN:
        first, buf, start, end = framed(data)
        try:
            decode(first, buf[start:end], version)
        except MQTTError:
            refused += 1
        assert peek_publish(first, buf, start, end, version) is None
    assert refused >= 8
