"""The PUBLISH fast path must behave exactly like the general path.

Broker A gets the bytes through ``data_received`` (fast path where it applies);
broker B gets the same packet decoded by the codec and handed to
``handle_publish``. Every byte either one sends to the publisher and to the
subscribers, and whether it closes the connection, must be the same.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.broker.handle_publish import handle_publish
from gateway.mqtt import MQTT_5, MQTT_311, MQTTError, Properties, Publish, decode, encode
from tests.support.harness import FakeClient, Harness

topics = st.sampled_from(["a", "a/b", "$x/y", "", "a/+", "#", "sport/tennis", "a\x00b", "é/ü"])
payloads = st.binary(max_size=40)
props = st.one_of(
    st.just(Properties()),
    st.builds(Properties, user_properties=st.just((("k", "v"),))),
    st.builds(Properties, message_expiry_interval=st.integers(1, 100)),
    st.builds(Properties, payload_format_indicator=st.just(1)),
    st.builds(Properties, topic_alias=st.integers(0, 12)),
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


def world(version: int) -> tuple[Harness, FakeClient, FakeClient, FakeClient]:
    h = Harness()
    subs = []
    for name, version_ in (("s3", MQTT_311), ("s5", MQTT_5)):
        s = h.client(version_)
        s.connect(name)
        s.subscribe("#", 2)
        s.subscribe("$x/#", 1)
        subs.append(s)
    pub = h.client(version)
    pub.connect("pub")
    return h, pub, subs[0], subs[1]


def outputs(*clients: FakeClient) -> list[object]:
    out: list[object] = []
    for c in clients:
        out.append(b"".join(c.conn.take_output()))
        out.append(c.closed)
    return out


@given(st.data())
def test_fast_path_matches_general_path(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from([MQTT_311, MQTT_5]))
    raw = data.draw(publish_bytes(version))
    _ha, pa, a3, a5 = world(version)
    hb, pb, b3, b5 = world(version)
    pa.send_raw(raw)
    # The general path: the codec, then handle_publish; errors go where the core sends them.
    try:
        packet = decode(raw[0], raw[2:] if raw[1] < 0x80 else raw[3:], version)
    except MQTTError as exc:
        hb.broker.data_received(pb.conn, b"", hb.now)
        hb.broker._codec_failure(pb.conn, exc, hb.now)
    else:
        assert isinstance(packet, Publish)
        handle_publish(hb.broker, pb.conn, packet, hb.now)
    assert outputs(pa, a3, a5) == outputs(pb, b3, b5)
