"""Property tests for the codec: hostile bytes, round trips, and the framer's invariant.

- Any bytes fed to a ``PacketReader`` yield packets, ``NEED_DATA`` or an ``MQTTError``
  subclass: never another exception, never a loop; and chunking never changes the outcome.
- Every valid packet value round-trips: ``decode(encode(p)) == p`` in 3.1.1 and 5.0.
- N packets concatenated and fed in arbitrary chunks come out as exactly those N packets.

``HYPOTHESIS_PROFILE=long`` runs many more examples.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    NEED_DATA,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MQTTError,
    NeedData,
    Packet,
    PacketReader,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
    encode,
)
from gateway.mqtt.properties import BINARY, BYTE, FOUR, PAIR, SPEC, STRING, TWO, VARINT, Where
from gateway.mqtt.wire import VARINT_MAX, encode_varint

# conftest.py already exists (and loads the suite-wide profile), so this file registers its
# own profiles and picks one from the same environment variable.
settings.register_profile("codec-fuzz", max_examples=80, deadline=None)
settings.register_profile(
    "codec-fuzz-long",
    max_examples=5_000,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
FUZZ = settings(
    settings.get_profile(
        "codec-fuzz-long" if os.environ.get("HYPOTHESIS_PROFILE") == "long" else "codec-fuzz"
    ),
    deadline=None,
)

VERSIONS = pytest.mark.parametrize("version", [MQTT_311, MQTT_5], ids=["v311", "v5"])

# ------------------------------------------------------------------ value strategies

#: Well-formed UTF-8 strings: no U+0000, no surrogates (MQTT-1.5.4-1, -2).
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
#: Topic names: non-empty, no wildcards (MQTT-4.7.3-1, MQTT-3.3.2-2).
TOPIC = st.text(st.characters(codec="utf-8", exclude_characters="\x00+#"), min_size=1, max_size=12)
FILTER = st.one_of(
    TOPIC,
    TOPIC.map(lambda t: t + "/#"),
    TOPIC.map(lambda t: "+/" + t),
    st.just("#"),
    TOPIC.map(lambda t: "$share/g/" + t),
)
PACKET_ID = st.integers(1, 0xFFFF)
PAYLOAD = st.binary(max_size=24)

# Reason codes each packet may carry (MQTT 5.0 sections 3.2.2.2 ... 3.15.2.1).
CONNACK_CODES = [0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A]
CONNACK_CODES += [0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F]
PUB_RESPONSE_CODES = [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99]
PUB_RELEASE_CODES = [0x00, 0x92]
SUBACK_CODES = [0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2]
UNSUBACK_CODES = [0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91]
DISCONNECT_CODES = [0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F]
DISCONNECT_CODES += [0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D]
DISCONNECT_CODES += [0x9E, 0x9F, 0xA0, 0xA1, 0xA2]
AUTH_CODES = [0x00, 0x18, 0x19]

#: Properties that must not be 0 (receive maximum, topic alias, maximum packet size).
_NON_ZERO = frozenset({0x21, 0x23, 0x27})


def _property_value(pid: int, kind: int, where: Where) -> SearchStrategy[Any]:
    low = 1 if pid in _NON_ZERO else 0
    if kind == BYTE:
        return st.integers(0, 1)  # every byte property is 0 or 1
    if kind == TWO:
        return st.integers(low, 0xFFFF)
    if kind == FOUR:
        return st.integers(low, 0xFFFF_FFFF)
    if kind == VARINT:  # subscription identifiers: several in PUBLISH, one in SUBSCRIBE
        most = 3 if where is Where.PUBLISH else 1
        return st.lists(st.integers(1, VARINT_MAX), min_size=1, max_size=most).map(tuple)
    if kind == STRING:
        return TEXT
    if kind == BINARY:
        return st.binary(max_size=8)
    assert kind == PAIR
    return st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3).map(tuple)


def _fix_properties(values: dict[str, Any]) -> Properties:
    props = Properties(**values)
    if props.authentication_data is not None and props.authentication_method is None:
        props = replace(props, authentication_data=None)  # data needs a method (3.1.2.11.10)
    return props


def properties(where: Where) -> SearchStrategy[Properties]:
    """Properties valid in ``where``: allowed identifiers only, values in range."""
    optional = {
        name: _property_value(pid, kind, where)
        for pid, (name, kind, allowed) in SPEC.items()
        if where in allowed
    }
    return st.fixed_dictionaries({}, optional=optional).map(_fix_properties)


def props_for(version: int, where: Where) -> SearchStrategy[Properties]:
    return properties(where) if version == MQTT_5 else st.just(Properties())


@st.composite
def connects(draw: st.DrawFn, version: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(TOPIC),
            draw(PAYLOAD),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(props_for(version, Where.WILL)),
        )
    username = draw(st.none() | TEXT)
    password = draw(st.none() | st.binary(max_size=8))
    if version == MQTT_311 and username is None:
        password = None  # MQTT-3.1.2-22
    return Connect(
        draw(TEXT),
        version,
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        will,
        username,
        password,
        draw(props_for(version, Where.CONNECT)),
    )


@st.composite
def connacks(draw: st.DrawFn, version: int) -> ConnAck:
    code = draw(st.sampled_from(CONNACK_CODES) if version == MQTT_5 else st.integers(0, 5))
    return ConnAck(draw(st.booleans()), code, draw(props_for(version, Where.CONNACK)))


@st.composite
def publishes(draw: st.DrawFn, version: int) -> Publish:
    qos = draw(st.integers(0, 2))
    return Publish(
        draw(TOPIC),
        draw(PAYLOAD),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,  # MQTT-3.3.1-2
        draw(PACKET_ID) if qos else 0,
        draw(props_for(version, Where.PUBLISH)),
    )


AckType = type[PubAck] | type[PubRec] | type[PubRel] | type[PubComp]


@st.composite
def acks(draw: st.DrawFn, version: int, cls: AckType, codes: list[int], where: Where) -> Packet:
    if version != MQTT_5:
        return cls(draw(PACKET_ID))
    return cls(draw(PACKET_ID), draw(st.sampled_from(codes)), draw(properties(where)))


@st.composite
def subscribes(draw: st.DrawFn, version: int) -> Subscribe:
    if version == MQTT_5:
        request = st.builds(
            SubscriptionRequest,
            FILTER,
            st.integers(0, 2),
            st.booleans(),
            st.booleans(),
            st.integers(0, 2),
        )
    else:
        request = st.builds(SubscriptionRequest, FILTER, st.integers(0, 2))
    subs = draw(st.lists(request, min_size=1, max_size=4))
    return Subscribe(draw(PACKET_ID), tuple(subs), draw(props_for(version, Where.SUBSCRIBE)))


@st.composite
def subacks(draw: st.DrawFn, version: int) -> SubAck:
    allowed = SUBACK_CODES if version == MQTT_5 else [0x00, 0x01, 0x02, 0x80]
    codes = draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=4))
    return SubAck(draw(PACKET_ID), tuple(codes), draw(props_for(version, Where.SUBACK)))


@st.composite
def unsubscribes(draw: st.DrawFn, version: int) -> Unsubscribe:
    filters = draw(st.lists(FILTER, min_size=1, max_size=4))
    return Unsubscribe(draw(PACKET_ID), tuple(filters), draw(props_for(version, Where.UNSUBSCRIBE)))


@st.composite
def unsubacks(draw: st.DrawFn, version: int) -> UnsubAck:
    if version != MQTT_5:
        return UnsubAck(draw(PACKET_ID))
    codes = draw(st.lists(st.sampled_from(UNSUBACK_CODES), min_size=1, max_size=4))
    return UnsubAck(draw(PACKET_ID), tuple(codes), draw(properties(Where.UNSUBACK)))


def disconnects(version: int) -> SearchStrategy[Disconnect]:
    if version != MQTT_5:
        return st.just(Disconnect())
    return st.builds(Disconnect, st.sampled_from(DISCONNECT_CODES), properties(Where.DISCONNECT))


def auths() -> SearchStrategy[Auth]:
    return st.builds(Auth, st.sampled_from(AUTH_CODES), properties(Where.AUTH))


def packets(version: int) -> SearchStrategy[Packet]:
    """Any valid packet value of ``version``."""
    options: list[SearchStrategy[Packet]] = [
        connects(version),
        connacks(version),
        publishes(version),
        acks(version, PubAck, PUB_RESPONSE_CODES, Where.PUBACK),
        acks(version, PubRec, PUB_RESPONSE_CODES, Where.PUBREC),
        acks(version, PubRel, PUB_RELEASE_CODES, Where.PUBREL),
        acks(version, PubComp, PUB_RELEASE_CODES, Where.PUBCOMP),
        subscribes(version),
        subacks(version),
        unsubscribes(version),
        unsubacks(version),
        st.just(PingReq()),
        st.just(PingResp()),
        disconnects(version),
    ]
    if version == MQTT_5:
        options.append(auths())
    return st.one_of(options)


# ------------------------------------------------------------------ byte strategies


@st.composite
def framed_garbage(draw: st.DrawFn) -> bytes:
    """A well-framed packet of any type and flags around an arbitrary body."""
    body = draw(st.binary(max_size=40))
    return bytes((draw(st.integers(0, 255)),)) + encode_varint(len(body)) + body


@st.composite
def mutated(draw: st.DrawFn, version: int) -> bytes:
    """A valid encoded packet with a few bytes replaced, inserted or deleted."""
    data = bytearray(encode(draw(packets(version)), version))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["replace", "insert", "delete"]))
        if action == "insert" or at == len(data):
            data[at:at] = bytes((draw(st.integers(0, 255)),))
        elif action == "replace":
            data[at] = draw(st.integers(0, 255))
        else:
            del data[at]
    return bytes(data)


@st.composite
def reframed(draw: st.DrawFn, version: int) -> bytes:
    """A valid packet's body with bytes replaced, re-framed with its true length, so the
    mutation reaches the packet decoder instead of only breaking the framing."""
    data = encode(draw(packets(version)), version)
    header = 2
    while data[header - 1] & 0x80:
        header += 1
    body = bytearray(data[header:])
    for _ in range(draw(st.integers(1, 3))):
        if body:
            body[draw(st.integers(0, len(body) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        del body[draw(st.integers(0, len(body))) :]
    first = data[0] ^ draw(st.sampled_from([0, 0, 0, 1, 2, 4, 8]))
    return bytes((first,)) + encode_varint(len(body)) + bytes(body)


def hostile_bytes(version: int) -> SearchStrategy[bytes]:
    segment = st.one_of(
        st.binary(max_size=64), framed_garbage(), mutated(version), reframed(version)
    )
    return st.lists(segment, min_size=1, max_size=4).map(b"".join)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# ------------------------------------------------------------------ helpers

Outcome = tuple[list[Packet], object]


def drain(reader: PacketReader, packets_out: list[Packet], data_len: int) -> object | None:
    """Read packets until NEED_DATA (returns None) or an error (returns its type and code)."""
    for _ in range(data_len + 1):  # every packet consumes at least two bytes
        try:
            packet = reader.next_packet()
        except MQTTError as exc:
            return (type(exc), exc.reason_code)
        if isinstance(packet, NeedData):
            return None
        packets_out.append(packet)
    raise AssertionError("next_packet() kept returning packets: the framer does not advance")


def read_all(version: int, max_size: int, chunks: list[bytes]) -> Outcome:
    reader = PacketReader(max_packet_size=max_size, version=version)
    out: list[Packet] = []
    total = sum(len(c) for c in chunks)
    for chunk in chunks:
        reader.receive_data(chunk)
        ended = drain(reader, out, total)
        if ended is not None:
            return out, ended
    return out, NEED_DATA


MAX_SIZES = st.sampled_from([5, 16, 64, VARINT_MAX + 5])

# ------------------------------------------------------------------ (a) hostile input


@FUZZ
@VERSIONS
@given(data=st.data(), max_size=MAX_SIZES)
def test_arbitrary_bytes_yield_packets_or_mqtt_errors(
    version: int, data: st.DataObject, max_size: int
) -> None:
    raw = data.draw(hostile_bytes(version), label="bytes")
    packets, ended = read_all(version, max_size, [raw])
    if ended is not NEED_DATA:
        # The codec's own error with a failure reason code (anything else raised would
        # have escaped read_all and failed the test already).
        assert isinstance(ended, tuple), ended
        kind, code = ended
        assert issubclass(kind, MQTTError) and code >= 0x80, ended
    for packet in packets:  # what was read is a packet the codec can write again
        reader = PacketReader(version=version)
        reader.receive_data(encode(packet, version))
        assert reader.next_packet() == packet


@FUZZ
@VERSIONS
@given(data=st.data(), max_size=MAX_SIZES)
def test_chunking_never_changes_what_arbitrary_bytes_yield(
    version: int, data: st.DataObject, max_size: int
) -> None:
    raw = data.draw(hostile_bytes(version), label="bytes")
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12), label="cuts")
    whole = read_all(version, max_size, [raw])
    chunked = read_all(version, max_size, split(raw, cuts))
    assert chunked == whole


@FUZZ
@VERSIONS
@given(data=st.data())
def test_mutated_packets_yield_packets_or_mqtt_errors(version: int, data: st.DataObject) -> None:
    raw = data.draw(mutated(version))
    byte_by_byte = [raw[i : i + 1] for i in range(len(raw))]
    assert read_all(version, 64, byte_by_byte) == read_all(version, 64, [raw])


# ------------------------------------------------------------------ (b) round trip


@FUZZ
@VERSIONS
@given(data=st.data())
def test_every_packet_round_trips(version: int, data: st.DataObject) -> None:
    packet = data.draw(packets(version), label="packet")
    raw = encode(packet, version)
    reader = PacketReader(version=version)
    reader.receive_data(raw)
    assert reader.next_packet() == packet
    assert reader.next_packet() is NEED_DATA
    assert reader.framer.buffered == 0


# ------------------------------------------------------------------ (c) framer invariant


@FUZZ
@VERSIONS
@given(data=st.data())
def test_concatenated_packets_in_any_chunks_come_out_whole(
    version: int, data: st.DataObject
) -> None:
    sent = data.draw(st.lists(packets(version), min_size=1, max_size=6), label="packets")
    stream = b"".join(encode(p, version) for p in sent)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=16), label="cuts")
    reader = PacketReader(version=version)
    received: list[Packet] = []
    for chunk in split(stream, cuts):
        reader.receive_data(chunk)
        assert drain(reader, received, len(stream)) is None
    assert received == sent
    assert reader.framer.buffered == 0
