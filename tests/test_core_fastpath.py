"""The PUBLISH fast path must behave exactly like the general path.

Broker A gets the bytes through ``data_received`` (fast path where it applies);
broker B gets the same packet decoded by the codec and handed to the general path
(``Broker.dispatch``). Every byte either one sends to the publisher and to the
subscribers, what waits for the store, what it journals, every counter, and whether
it closes the connection, must be the same -- in a world with an ACL, publish gates
(a bridge's full outbox with the policy "refuse"), a store that may be full and a
persistent subscriber, for MQTT 3.1.1 and 5.0 publishers alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.broker.acl import parse_acl_file
from gateway.broker.closing import fail
from gateway.broker.journal import Journal
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    MQTTError,
    Properties,
    Publish,
    Subscribe,
    SubscriptionRequest,
    decode,
    encode,
)
from gateway.mqtt.fastpath import peek_publish
from tests.support.harness import FakeClient, Harness

topics = st.sampled_from(
    ["a", "a/b", "$x/y", "", "a/+", "#", "sport/tennis", "a\x00b", "é/ü", "$SYS/x", "deny/x"]
)
payloads = st.binary(max_size=40)
props = st.one_of(
    st.just(Properties()),
    st.builds(Properties, user_properties=st.just((("k", "v"),))),
    st.builds(Properties, message_expiry_interval=st.integers(1, 100)),
    st.builds(Properties, payload_format_indicator=st.just(1)),
    st.builds(Properties, topic_alias=st.integers(0, 12)),
)

#: Anonymous clients may read everything and write anywhere but ``deny/#`` and ``a/b``.
ACL = """\
topic read #
topic read $x/#
topic write a
topic write sport/#
topic write é/ü
topic write $x/#
topic write $SYS/#
topic write deny/x
topic deny deny/#
"""


@dataclass(frozen=True)
class World:
    """What surrounds the publisher."""

    version: int
    acl: bool
    #: A publish gate refusing topics starting with this ("" : none; "*": all).
    gate: str
    store: bool
    store_full: bool


worlds = st.builds(
    World,
    st.sampled_from([MQTT_311, MQTT_5]),
    st.booleans(),
    st.sampled_from(["", "*", "a", "sport"]),
    st.booleans(),
    st.booleans(),
)


@st.composite
def publish_bytes(draw: st.DrawFn, version: int) -> bytes:
    qos = draw(st.integers(0, 2))
    packet = Publish(
        draw(topics),
        draw(payloads),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(st.integers(0, 3)) if qos else 0,
        draw(props) if version == MQTT_5 else Properties(),
    )
    try:
        data = encode(packet, version)
    except ValueError:
        data = encode(Publish("a", b"x"), version)
    if draw(st.booleans()):
        # corrupt one byte after the fixed header
        i = draw(st.integers(2, max(2, len(data) - 1)))
        if i < len(data):
            data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    return data


def build(world: World) -> tuple[Harness, FakeClient, list[FakeClient]]:
    h = Harness()
    broker = h.broker
    if world.acl:
        broker.acl = parse_acl_file(ACL)
    if world.gate:
        prefix = world.gate

        def gate(topic: str, size: int) -> str | None:
            if prefix == "*" or topic.startswith(prefix):
                return f"outbox full for {topic!r}"
            return None

        broker.publish_gates.append(gate)
    if world.store:
        broker.journal = Journal()
    subs = []
    for name, version_ in (("s3", MQTT_311), ("s5", MQTT_5)):
        s = h.client(version_)
        s.connect(name)
        s.subscribe("#", 2)
        s.subscribe("$x/#", 1)
        subs.append(s)
    if world.store:
        keeper = h.client(MQTT_5)
        keeper.connect("keeper", clean_start=False, session_expiry_interval=600)
        keeper.send(Subscribe(keeper.pid(), (SubscriptionRequest("#", 1),)))
        commit(h)
        keeper.take()
        subs.append(keeper)
    broker.store_full = world.store_full
    pub = h.client(world.version)
    pub.connect("pub")
    commit(h)
    pub.take()
    return h, pub, subs


def commit(h: Harness) -> None:
    """As if the store committed everything journaled so far."""
    batch = h.broker.seal_batch()
    if batch is not None:
        h.broker.batch_committed(batch[0])


def outputs(h: Harness, *clients: FakeClient) -> list[object]:
    out: list[object] = []
    for c in clients:
        out.append(b"".join(c.conn.take_output()))
        out.append(c.conn.held)
        out.append(c.closed)
    journal = h.broker.journal
    out.append(None if journal is None else journal.ops)
    stats = asdict(h.broker.stats)
    del stats["messages_received"], stats["bytes_received"]  # counted by the framing loop
    out.append(stats)
    out.append(h.broker.retained.refused)
    return out


def general_path(h: Harness, pub: FakeClient, raw: bytes) -> None:
    """The codec, then the general dispatch; errors go where the core sends them."""
    body = raw[2:] if raw[1] < 0x80 else raw[3:]
    try:
        packet = decode(raw[0], body, pub.version)
    except MQTTError as exc:
        fail(h.broker, pub.conn, exc, h.now)
    else:
        assert isinstance(packet, Publish)
        h.broker.dispatch(pub.conn, packet, h.now)


@given(worlds, st.data())
def test_fast_path_matches_general_path(world: World, data: st.DataObject) -> None:
    raw = data.draw(publish_bytes(world.version))
    ha, pa, subs_a = build(world)
    hb, pb, subs_b = build(world)
    pa.send_raw(raw)
    general_path(hb, pb, raw)
    assert outputs(ha, pa, *subs_a) == outputs(hb, pb, *subs_b)


def test_the_general_path_is_what_the_comparison_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PUBLISH the fast path takes is handled by the general path in broker B: the
    comparison above compares two paths, not one path with itself."""
    from gateway.broker import core

    world = World(MQTT_5, acl=True, gate="a", store=False, store_full=False)
    raw = encode(Publish("a", b"x", 1, packet_id=1), MQTT_5)
    calls: list[object] = []

    def counting(*args: Any) -> tuple[str, int, int, int] | None:
        peeked = peek_publish(*args)
        calls.append(peeked)
        return peeked

    monkeypatch.setattr(core, "peek_publish", counting)
    _ha, pa, _ = build(world)
    hb, pb, _ = build(world)
    pa.send_raw(raw)
    assert calls == [("a", 1, 1, 8)]
    general_path(hb, pb, raw)
    assert len(calls) == 1  # the general path never peeked
