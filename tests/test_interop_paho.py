"""paho-mqtt (3.1.1 and 5.0) against ``ledge run`` on a loopback port."""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.clients import Paho
from tests.support.procs import LedgeProcess

VERSIONS = [pytest.param(4, id="3.1.1"), pytest.param(5, id="5.0")]


@pytest.mark.parametrize("version", VERSIONS)
def test_qos_0_1_2_both_ways(shared_ledge: LedgeProcess, version: int) -> None:
    port = shared_ledge.port
    a = Paho(port, f"qos-a-{version}", version).connect()
    b = Paho(port, f"qos-b-{version}", version).connect()
    assert a.subscribe(f"qos{version}/to-a", 2) == [2]
    assert b.subscribe(f"qos{version}/to-b", 2) == [2]
    for qos in range(3):
        a.publish(f"qos{version}/to-b", b"a%d" % qos, qos)
        b.publish(f"qos{version}/to-a", b"b%d" % qos, qos)
    got_a = a.wait_messages(3)
    got_b = b.wait_messages(3)
    assert sorted((m.payload, m.qos) for m in got_a) == [(b"b0", 0), (b"b1", 1), (b"b2", 2)]
    assert sorted((m.payload, m.qos) for m in got_b) == [(b"a0", 0), (b"a1", 1), (b"a2", 2)]
    a.disconnect()
    b.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_delivered_replaced_and_cleared(shared_ledge: LedgeProcess, version: int) -> None:
    port = shared_ledge.port
    topic = f"retained{version}/state"
    pub = Paho(port, f"ret-pub-{version}", version).connect()
    pub.publish(topic, b"first", 1, retain=True)
    pub.publish(topic, b"second", 1, retain=True)
    sub = Paho(port, f"ret-sub-{version}", version).connect()
    sub.subscribe(f"retained{version}/#", 1)
    [msg] = sub.wait_messages(1)
    assert (msg.payload, msg.retain) == (b"second", True)
    pub.publish(topic, b"", 1, retain=True)
    late = Paho(port, f"ret-late-{version}", version).connect()
    late.subscribe(f"retained{version}/#", 1)
    pub.publish(f"retained{version}/marker", b"marker", 1)
    got = late.wait_messages(1)
    assert [m.payload for m in got] == [b"marker"]
    for c in (pub, sub, late):
        c.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_will_fires_on_broken_connection(shared_ledge: LedgeProcess, version: int) -> None:
    port = shared_ledge.port
    watcher = Paho(port, f"will-w-{version}", version).connect()
    watcher.subscribe(f"will{version}/#", 1)
    dying = Paho(port, f"will-d-{version}", version)
    dying.connect(will=(f"will{version}/dying", b"offline", 1, False))
    dying.kill()
    [msg] = watcher.wait_messages(1)
    assert (msg.topic, msg.payload, msg.qos) == (f"will{version}/dying", b"offline", 1)
    watcher.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_persistent_session_resumes_with_queued_messages(
    shared_ledge: LedgeProcess, version: int
) -> None:
    port = shared_ledge.port
    sub = Paho(port, f"persist-{version}", version)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe(f"persist{version}/#", 1)
    sub.disconnect()
    pub = Paho(port, f"persist-pub-{version}", version).connect()
    for i in range(20):
        pub.publish(f"persist{version}/x", b"%d" % i, 1)
    sub.connect(clean=False, session_expiry=3600)
    assert sub.session_present
    got = sub.wait_messages(20)
    assert [m.payload for m in got] == [b"%d" % i for i in range(20)]
    sub.disconnect()
    pub.disconnect()


def test_shared_subscription_splits_messages(shared_ledge: LedgeProcess) -> None:
    port = shared_ledge.port
    members = [Paho(port, f"share-{i}").connect() for i in range(2)]
    for m in members:
        m.subscribe("$share/workers/jobs/#", 1)
    pub = Paho(port, "share-pub").connect()
    for i in range(10):
        pub.publish("jobs/new", b"%d" % i, 1)
    counts = [0, 0]

    def total() -> int:
        counts[:] = [len(m.messages) for m in members]
        return sum(counts)

    from tests.support.wait import wait_for

    wait_for(lambda: total() == 10, 5, "all jobs")
    assert counts == [5, 5]
    payloads = sorted(msg.payload for m in members for msg in m.messages)
    assert payloads == sorted(b"%d" % i for i in range(10))
    for c in (*members, pub):
        c.disconnect()


def test_v5_properties_round_trip(shared_ledge: LedgeProcess) -> None:
    port = shared_ledge.port
    sub = Paho(port, "props-sub").connect()
    sub.subscribe("props/#", 2)
    pub = Paho(port, "props-pub").connect()
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("a", "1"), ("b", "2")]
    props.ContentType = "application/json"
    props.ResponseTopic = "props/reply"
    props.CorrelationData = b"\x01\x02"
    props.PayloadFormatIndicator = 1
    props.MessageExpiryInterval = 3600
    pub.publish("props/req", b'{"x": 1}', 2, properties=props)
    [msg] = sub.wait_messages(1)
    got = msg.properties
    assert got.UserProperty == [("a", "1"), ("b", "2")]
    assert got.ContentType == "application/json"
    assert got.ResponseTopic == "props/reply"
    assert got.CorrelationData == b"\x01\x02"
    assert got.PayloadFormatIndicator == 1
    assert 3595 <= got.MessageExpiryInterval <= 3600
    sub.disconnect()
    pub.disconnect()


def test_denied_subscription_and_connack_details(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    config = tmp_path / "ledge.toml"
    config.write_text('[broker]\ndeny_subscriptions = ["test/nosubscribe"]\n')
    proc = LedgeProcess(config=config).start()
    try:
        c5 = Paho(proc.port, "deny5").connect()
        assert c5.subscribe("test/nosubscribe", 2) == [0x80]
        c3 = Paho(proc.port, "deny3", 4).connect()
        assert c3.subscribe("test/nosubscribe", 2) == [0x80]
        assert c5.subscribe("test/allowed", 2) == [2]
        c5.disconnect()
        c3.disconnect()
    finally:
        assert proc.stop() == 0
