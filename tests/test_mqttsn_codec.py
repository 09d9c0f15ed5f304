"""MQTT-SN 1.2 codec and UART framing: shared byte vectors, malformed vectors, fuzzing.

The vectors live in ``firmware-bridge/vectors/`` and are shared with the MicroPython
client's tests. ``mqttsn.json`` was written by hand as hex from the layouts in the
specification (section numbers given per vector), never produced by our encoder;
``uart.json`` frames were made with the PyPI ``cobs`` package and ``binascii.crc_hqx``.
Every message vector is checked the h11 way: whole, byte by byte (every proper prefix
reads as ``NEED_DATA``), followed by another message, and re-encoded to the same bytes.
"""

from __future__ import annotations

import binascii
import json
from pathlib import Path
from typing import Any

import pytest
from cobs import cobs  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqttsn import packets as p
from gateway.mqttsn.codec import NEED_DATA, MalformedMessage, MessageTooLarge, decode, read_message
from gateway.mqttsn.encoding import encode
from gateway.mqttsn.uart import (
    Deframer,
    FrameError,
    cobs_decode,
    cobs_encode,
    crc16,
    encode_frame,
)

VECTORS = Path(__file__).resolve().parents[1] / "firmware-bridge" / "vectors"
MESSAGES = json.loads((VECTORS / "mqttsn.json").read_text())
UART = json.loads((VECTORS / "uart.json").read_text())

TYPES: dict[str, type[Any]] = {
    "ADVERTISE": p.Advertise,
    "SEARCHGW": p.SearchGw,
    "GWINFO": p.GwInfo,
    "CONNECT": p.Connect,
    "CONNACK": p.ConnAck,
    "WILLTOPICREQ": p.WillTopicReq,
    "WILLTOPIC": p.WillTopic,
    "WILLMSGREQ": p.WillMsgReq,
    "WILLMSG": p.WillMsg,
    "REGISTER": p.Register,
    "REGACK": p.RegAck,
    "PUBLISH": p.Publish,
    "PUBACK": p.PubAck,
    "PUBREC": p.PubRec,
    "PUBREL": p.PubRel,
    "PUBCOMP": p.PubComp,
    "SUBSCRIBE": p.Subscribe,
    "SUBACK": p.SubAck,
    "UNSUBSCRIBE": p.Unsubscribe,
    "UNSUBACK": p.UnsubAck,
    "PINGREQ": p.PingReq,
    "PINGRESP": p.PingResp,
    "DISCONNECT": p.Disconnect,
    "WILLTOPICUPD": p.WillTopicUpd,
    "WILLTOPICRESP": p.WillTopicResp,
    "WILLMSGUPD": p.WillMsgUpd,
    "WILLMSGRESP": p.WillMsgResp,
    "ENCAPSULATED": p.Encapsulated,
}
BYTES_FIELDS = {"data", "message", "gw_address", "node_id"}


def packet_of(type_name: str, fields: dict[str, Any]) -> p.Packet:
    values: dict[str, Any] = {}
    for name, raw in fields.items():
        if name in BYTES_FIELDS:
            values[name] = bytes.fromhex(raw)
        elif name == "packet":
            values[name] = packet_of(raw["type"], raw["fields"])
        else:
            values[name] = raw
    packet: p.Packet = TYPES[type_name](**values)
    return packet


MESSAGE_VECTORS = [pytest.param(v, id=v["name"]) for v in MESSAGES["messages"]]
MALFORMED_VECTORS = [pytest.param(v, id=v["name"]) for v in MESSAGES["malformed"]]


def test_every_message_type_has_a_vector() -> None:
    assert {v["type"] for v in MESSAGES["messages"]} == set(TYPES)


@pytest.mark.parametrize("vector", MESSAGE_VECTORS)
def test_vector_whole(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    expected = packet_of(vector["type"], vector["fields"])
    assert decode(data) == expected
    if vector["canonical"]:
        assert encode(expected) == data


@pytest.mark.parametrize("vector", MESSAGE_VECTORS)
def test_vector_byte_by_byte_and_with_trailing_data(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    expected = packet_of(vector["type"], vector["fields"])
    for n in range(len(data)):
        assert read_message(data[:n]) is NEED_DATA, f"prefix of {n} octets"
    assert read_message(data) == (expected, len(data))
    trailer = bytes.fromhex("0216")  # a PINGREQ after it
    got = read_message(data + trailer)
    assert got == (expected, len(data))
    assert read_message(data + trailer, len(data)) == (p.PingReq(), len(data) + 2)


@pytest.mark.parametrize("vector", MALFORMED_VECTORS)
def test_malformed_vector(vector: dict[str, Any]) -> None:
    with pytest.raises(MalformedMessage) as info:
        decode(bytes.fromhex(vector["hex"]))
    assert vector["reason"] in info.value.reason
    assert info.value.offset == vector["offset"]


def test_a_length_beyond_the_limit_is_refused_from_the_header() -> None:
    header_only = bytes.fromhex("010400")  # Length 1024, nothing of it yet
    with pytest.raises(MessageTooLarge) as info:
        read_message(header_only, 0, max_size=256)
    assert info.value.offset == 0
    with pytest.raises(MessageTooLarge):
        decode(bytes.fromhex("0a040401003c64657631"), max_size=8)


def test_encoder_refuses_what_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        encode(p.Publish(1, 0, b"x" * 70_000))
    with pytest.raises(ValueError):
        encode(p.Publish(1, 0, b"", qos=3))
    with pytest.raises(ValueError):
        encode(p.Subscribe(1, "abc", 0, p.TopicIdType.SHORT))
    with pytest.raises(ValueError):
        encode(p.Encapsulated(b"\x01", p.Encapsulated(b"\x02", p.PingReq())))


def test_short_topic_names() -> None:
    assert p.short_topic(0x7474) == "tt"
    assert p.short_topic_id("tt") == 0x7474
    with pytest.raises(ValueError):
        p.short_topic(0xFFFE)
    with pytest.raises(ValueError):
        p.short_topic_id("abc")


# ---------------------------------------------------------------------- fuzzing

names = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
u16 = st.integers(0, 0xFFFF)
u8 = st.integers(0, 0xFF)
blobs = st.binary(max_size=300)
qos = st.sampled_from([-1, 0, 1, 2])
qos_will = st.sampled_from([0, 1, 2])
id_types = st.sampled_from([0, 1, 2])


@st.composite
def subscribe_like(draw: st.DrawFn, kind: type[Any]) -> p.Packet:
    id_type = draw(id_types)
    if id_type == p.TopicIdType.PREDEFINED:
        topic: str | int = draw(u16)
    elif id_type == p.TopicIdType.SHORT:
        topic = draw(
            st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=2, max_size=2)
        )
    else:
        topic = draw(names)
    if kind is p.Subscribe:
        return p.Subscribe(draw(u16), topic, draw(qos), id_type, draw(st.booleans()))
    return p.Unsubscribe(draw(u16), topic, id_type)


plain = st.one_of(
    st.builds(p.Advertise, u8, u16),
    st.builds(p.SearchGw, u8),
    st.builds(p.GwInfo, u8, blobs),
    st.builds(p.Connect, names, u16, st.booleans(), st.booleans(), u8),
    st.builds(p.ConnAck, u8),
    st.builds(p.WillTopicReq),
    st.builds(p.WillTopic, names, qos_will, st.booleans()).filter(lambda w: bool(w.topic)),
    st.builds(p.WillTopic),
    st.builds(p.WillMsgReq),
    st.builds(p.WillMsg, blobs),
    st.builds(p.Register, u16, u16, names),
    st.builds(p.RegAck, u16, u16, u8),
    st.builds(p.Publish, u16, u16, blobs, qos, st.booleans(), st.booleans(), id_types),
    st.builds(p.PubAck, u16, u16, u8),
    st.builds(p.PubRec, u16),
    st.builds(p.PubRel, u16),
    st.builds(p.PubComp, u16),
    subscribe_like(p.Subscribe),
    st.builds(p.SubAck, u16, u16, u8, qos),
    subscribe_like(p.Unsubscribe),
    st.builds(p.UnsubAck, u16),
    st.builds(p.PingReq, names),
    st.builds(p.PingResp),
    st.builds(p.Disconnect, st.none() | u16),
    st.builds(p.WillTopicUpd, names, qos_will, st.booleans()).filter(lambda w: bool(w.topic)),
    st.builds(p.WillTopicResp, u8),
    st.builds(p.WillMsgUpd, blobs),
    st.builds(p.WillMsgResp, u8),
)
messages = plain | st.builds(
    p.Encapsulated, st.binary(min_size=1, max_size=16), plain, st.integers(0, 3)
)


@given(messages)
def test_every_message_round_trips(packet: p.Packet) -> None:
    data = encode(packet)
    assert decode(data) == packet
    assert read_message(data + b"\x02\x17") == (packet, len(data))


@given(st.binary(max_size=400))
def test_any_bytes_decode_or_raise_malformed(data: bytes) -> None:
    try:
        packet = decode(data)
    except MalformedMessage as exc:
        assert 0 <= exc.offset <= len(data)
        return
    again = encode(packet)  # what we read we can write
    assert decode(again) == packet


@given(st.lists(st.binary(max_size=20), max_size=8), st.binary(max_size=60))
def test_stream_reader_never_raises_anything_else(chunks: list[bytes], tail: bytes) -> None:
    buf = b"".join(chunks) + tail
    pos = 0
    while pos < len(buf):
        try:
            got = read_message(buf, pos)
        except MalformedMessage:
            return
        if got is NEED_DATA:
            return
        assert not isinstance(got, p.NeedData) if hasattr(p, "NeedData") else True
        _, pos = got  # type: ignore[misc]


# ---------------------------------------------------------------------- UART framing


def test_crc_check_value() -> None:
    assert crc16(b"123456789") == 0x29B1 == binascii.crc_hqx(b"123456789", 0xFFFF)


@pytest.mark.parametrize("vector", UART["frames"], ids=lambda v: v["name"])
def test_uart_frame_vectors(vector: dict[str, Any]) -> None:
    message = bytes.fromhex(vector["message"])
    frame = bytes.fromhex(vector["frame"])
    assert encode_frame(message) == frame
    deframer = Deframer(max_message=1024)
    assert deframer.feed(frame) == [message]
    byte_by_byte = [out for i in range(len(frame)) for out in deframer.feed(frame[i : i + 1])]
    assert byte_by_byte == [message]


@pytest.mark.parametrize("vector", UART["streams"], ids=lambda v: v["name"])
def test_uart_streams_resynchronise(vector: dict[str, Any]) -> None:
    stream = bytes.fromhex(vector["stream"])
    expected = [bytes.fromhex(m) for m in vector["messages"]]
    for chunk in (len(stream), 1, 7):
        deframer = Deframer(max_message=vector.get("max_message", 1024))
        out = [
            o for i in range(0, len(stream), chunk) for o in deframer.feed(stream[i : i + chunk])
        ]
        assert [o for o in out if isinstance(o, bytes)] == expected, f"chunks of {chunk}"
        errors = [o for o in out if isinstance(o, FrameError)]
        assert len(errors) == vector["errors"], errors
        assert all(0 <= e.offset < len(stream) for e in errors)


def test_deframer_buffers_at_most_one_frame_past_the_limit() -> None:
    deframer = Deframer(max_message=16)
    out = deframer.feed(b"\x01" * 100_000)
    assert len(out) == 1 and isinstance(out[0], FrameError)
    assert len(deframer._buf) == 0
    assert deframer.feed(b"\x01" * 10 + b"\x00" + encode_frame(b"\x02\x16")) == [b"\x02\x16"]


@given(st.binary(max_size=600))
def test_cobs_matches_the_reference_implementation(data: bytes) -> None:
    assert cobs_encode(data) == cobs.encode(data)
    assert cobs_decode(cobs_encode(data)) == data


@given(st.lists(st.binary(min_size=1, max_size=80), max_size=6), st.binary(max_size=40), st.data())
@settings(max_examples=200)
def test_frames_survive_noise_between_them(
    messages: list[bytes], noise: bytes, data: st.DataObject
) -> None:
    """Noise costs at most one dropped frame per delimiter in it (plus the one that
    ends it); every message after it arrives, however the stream is cut."""
    stream = noise + b"\x00" + b"".join(encode_frame(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    deframer = Deframer(max_message=128)
    out: list[bytes | FrameError] = []
    last = 0
    for cut in [*cuts, len(stream)]:
        out += deframer.feed(stream[last:cut])
        last = cut
    good = [o for o in out if isinstance(o, bytes)]
    assert good[len(good) - len(messages) :] == messages
    assert len([o for o in out if isinstance(o, FrameError)]) <= noise.count(0) + 1


@given(st.binary(max_size=2000))
def test_deframer_never_raises(data: bytes) -> None:
    deframer = Deframer(max_message=64)
    for item in deframer.feed(data):
        assert isinstance(item, bytes | FrameError)


def test_fuzz_command_knows_every_target() -> None:
    from fuzz.__main__ import TARGET_NAMES
    from fuzz.targets import TARGETS

    assert set(TARGET_NAMES) == set(TARGETS)


@given(st.binary(max_size=40) | messages.map(encode))
def test_the_publish_peek_reads_what_the_decoder_reads(data: bytes) -> None:
    """The datagram fast path and the general decoder agree on every input."""
    from gateway.mqttsn.codec import flags_qos, peek_publish
    from gateway.mqttsn.packets import RETAIN, TOPIC_ID_TYPE

    peeked = peek_publish(data)
    if peeked is None:
        return
    flags, topic_id, msg_id, payload = peeked
    decoded = decode(data)
    assert decoded == p.Publish(
        topic_id,
        msg_id,
        payload,
        flags_qos(flags),
        bool(flags & RETAIN),
        bool(flags & 0x80),
        flags & TOPIC_ID_TYPE,
    )


def test_encode_ack_writes_what_encode_writes() -> None:
    from gateway.mqttsn.encoding import encode_ack

    assert encode_ack(p.MsgType.PUBACK, 0x1234, 0xBEEF, 2) == encode(p.PubAck(0x1234, 0xBEEF, 2))
    assert encode_ack(p.MsgType.REGACK, 1, 2) == encode(p.RegAck(1, 2))
