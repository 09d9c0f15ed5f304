"""Where Ledge deviated from the specification (found by Mosquitto's own broker tests),
each case over real sockets against ``ledge run``: Maximum Packet Size towards a
client, wills on takeover and reconnection, PUBLISH to ``$share/`` and ``$SYS``
(Mosquitto's 03-publish-dollar-v5), malformed SUBSCRIBE, MQTT 3.1 (paho's
``MQTTv31``) and the SIGHUP window of an ACL change.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    Subscribe,
    SubscriptionRequest,
    Will,
    encode,
)
from tests.support.procs import LedgeProcess, MosquittoProcess
from tests.support.raw import Raw
from tests.support.wait import wait_for

OPEN: list[Raw] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


def raw(port: int, version: int = MQTT_5) -> Raw:
    c = Raw(port, version=version)
    OPEN.append(c)
    return c


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[LedgeProcess]:
    config = tmp_path / "ledge.toml"
    config.write_text("[broker]\nmax_packet_size = 268435460\n")  # no limit of ours
    proc = LedgeProcess(config=config).start()
    yield proc
    assert proc.stop() == 0


def client(port: int, client_id: str, version: int = MQTT_5, **connect: object) -> Raw:
    c = raw(port, version)
    ack = c.connect(client_id, **connect)
    assert ack.reason_code == 0, ack
    return c


def subscribe(c: Raw, topic_filter: str, qos: int = 0) -> None:
    c.send(encode(Subscribe(1, (SubscriptionRequest(topic_filter, qos),)), c.version))
    c.expect(1)


def ping(c: Raw) -> list[object]:
    """Everything that arrives before the PINGRESP: the broker is done sending."""
    before = len(c.packets)
    c.send(encode(PingReq(), c.version))
    while not any(isinstance(p, PingResp) for p in c.packets[before:]):
        c.expect(1)
    return [p for p in c.packets[before:] if not isinstance(p, PingResp)]


def limited(port: int, client_id: str, limit: int) -> Raw:
    return client(port, client_id, properties=Properties(maximum_packet_size=limit))


# ------------------------------------------------------------ Maximum Packet Size


def test_a_forwarded_qos0_message_larger_than_the_clients_limit_is_not_sent(
    gateway: LedgeProcess,
) -> None:
    """MQTT-3.1.2-24/25: a plain QoS 0 PUBLISH is forwarded as it came (no
    re-encoding); it is checked against the receiver's Maximum Packet Size too."""
    topic = "mps/q0/topic"  # PUBLISH of 2 + 2 + 12 + 1 + payload bytes to a 5.0 client
    sub = limited(gateway.port, "mps-q0", 35)
    subscribe(sub, topic)
    pub = client(gateway.port, "mps-q0-pub")
    pub.send(encode(Publish(topic, b"x" * 19), MQTT_5))  # 36 bytes: one too many
    pub.send(encode(Publish(topic, b"y" * 18), MQTT_5))  # 35 bytes: fits
    ping(pub)  # both PUBLISHes are in
    ping(sub)
    got = [p for p in sub.packets if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"y" * 18]
    assert not sub.closed and not pub.closed


@pytest.mark.parametrize("qos", [1, 2])
def test_after_an_oversize_message_is_skipped_the_next_one_is_delivered(
    gateway: LedgeProcess, qos: int
) -> None:
    """The skipped message is discarded as if sent (MQTT-3.1.2-25): its packet
    identifier is used up, the window stays open, the next message that fits comes
    with the next identifier. The limit counts the whole packet, fixed header too."""
    topic = "12/max/publish/qos/test/topic"  # 29 bytes
    sub = limited(gateway.port, f"mps-q{qos}", 40)
    subscribe(sub, topic, qos)
    pub = client(gateway.port, f"mps-q{qos}-pub")
    for pid, payload in ((1, b"12345678901234567890"), (2, b"7890"), (3, b"78901")):
        # 2 + 2 + 29 + 2 + 1 + payload: 56, 40 and 41 bytes
        pub.send(encode(Publish(topic, payload, qos, packet_id=pid), MQTT_5))
        ack = pub.expect(1)[0]
        if qos == 2:
            assert isinstance(ack, PubRec)
            pub.send(encode(PubRel(pid), MQTT_5))
            pub.expect(1)
    got = [p for p in ping(sub) if isinstance(p, Publish)]
    assert [(p.payload, p.packet_id) for p in got] == [(b"7890", 2)]
    for more in range(3):  # no stall: the window keeps moving
        pub.send(encode(Publish(topic, b"m%d" % more, qos, packet_id=10 + more), MQTT_5))
        if qos == 2:
            pub.expect(1)
            pub.send(encode(PubRel(10 + more), MQTT_5))
        pub.expect(1)
        received = sub.expect(1)[0]
        assert isinstance(received, Publish) and received.payload == b"m%d" % more
        sub.send(encode((PubAck if qos == 1 else PubRec)(received.packet_id), MQTT_5))
        if qos == 2:
            sub.expect(1)  # PUBREL; the PUBCOMP is not needed for the next delivery


def test_a_connack_larger_than_the_clients_limit_refuses_the_connect_at_once(
    gateway: LedgeProcess,
) -> None:
    """MQTT-3.1.2-25 forbids sending the CONNACK; the connection is closed at once,
    not held until keep alive."""
    c = raw(gateway.port)
    c.send(encode(Connect("tiny", MQTT_5, properties=Properties(maximum_packet_size=2)), 5))
    started = time.monotonic()
    # Held until keep alive it would take 1.5 x its keep alive (60 s).
    assert c.until_closed(within=20) == []
    assert time.monotonic() - started < 20


def test_a_small_maximum_packet_size_of_ours_is_announced_and_enforced(tmp_path: Path) -> None:
    """``broker.max_packet_size`` as small as Mosquitto allows (30 here, as in its
    12-prop-maximum-packet-size-broker): the CONNACK announces it, a PUBLISH within it
    is served, a larger one gets DISCONNECT 0x95 (MQTT-3.2.2-15 for the client, ours
    enforced from the header)."""
    config = tmp_path / "ledge.toml"
    config.write_text("[broker]\nmax_packet_size = 30\n")
    proc = LedgeProcess(config=config).start()
    try:
        c = client(proc.port, "small-mps")
        ack = c.packets[0]
        assert isinstance(ack, ConnAck) and ack.properties.maximum_packet_size == 30
        c.send(encode(Publish("t", b"x" * 20, 1, packet_id=1), MQTT_5))  # 2 + 3 + 2 + 1 + 20
        assert isinstance(c.expect(1)[0], PubAck)
        c.send(encode(Publish("t", b"x" * 30, 1, packet_id=2), MQTT_5))
        got = c.until_closed()[-1]
        assert isinstance(got, Disconnect) and got.reason_code == ReasonCode.PACKET_TOO_LARGE
    finally:
        assert proc.stop() == 0


# ------------------------------------------------------------------------ wills


WILL = Will("will/takeover/test", b"LWT")


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@pytest.mark.parametrize("old_clean", [True, False])
@pytest.mark.parametrize("new_clean", [True, False])
def test_will_of_a_taken_over_connection(
    gateway: LedgeProcess, version: int, old_clean: bool, new_clean: bool
) -> None:
    """A takeover publishes the old connection's will (no Will Delay) only when the
    old session ends with it -- it was not persistent, or the new CONNECT has Clean
    Start; a persistent session carried into the new connection keeps its will quiet."""
    watcher = client(gateway.port, "will-watcher")
    subscribe(watcher, "will/#")

    def props(clean: bool) -> Properties:
        if version != MQTT_5:
            return Properties()
        return Properties(session_expiry_interval=0 if clean else 60)

    client(
        gateway.port,
        "taken",
        version,
        clean_start=old_clean,
        will=WILL,
        properties=props(old_clean),
    )
    new = client(gateway.port, "taken", version, clean_start=new_clean, properties=props(new_clean))
    wills = [p for p in ping(watcher) if isinstance(p, Publish)]
    if old_clean or new_clean:
        wills += [p for p in watcher.expect(1) if isinstance(p, Publish)] if not wills else []
        assert [p.payload for p in wills] == [b"LWT"]
    else:
        assert wills == []
    new.send(encode(Disconnect(), version))


@pytest.mark.parametrize("clean", [True, False])
def test_a_reconnection_within_the_will_delay_cancels_the_will(
    gateway: LedgeProcess, clean: bool
) -> None:
    """MQTT-3.1.3-9: a new connection for the client before the Will Delay Interval
    has passed means no will -- with Clean Start too, though it ends the session."""
    watcher = client(gateway.port, "delay-watcher")
    subscribe(watcher, "will/#")
    will = Will("will/delay", b"late", 0, False, Properties(will_delay_interval=2))
    first = client(
        gateway.port,
        "delayed",
        will=will,
        clean_start=False,
        properties=Properties(session_expiry_interval=30),
    )
    first.close()  # no DISCONNECT: the will is pending for 2 s
    wait_for(lambda: "client 'delayed'" in gateway.log and "connection lost" in gateway.log, 5)
    again = client(gateway.port, "delayed", clean_start=clean)
    time.sleep(2.5)  # past the Will Delay: the will must not come now either
    assert [p for p in ping(watcher) if isinstance(p, Publish)] == []
    again.send(encode(Disconnect(), MQTT_5))


def test_a_delayed_will_goes_out_when_the_session_ends_first(gateway: LedgeProcess) -> None:
    """MQTT 5.0 3.1.3.2.2: the will is published when the Will Delay has passed or the
    session ends, whichever is first -- with Session Expiry 0 the session ends with the
    connection, so the will goes out then (Mosquitto 2.0.11 waited for the delay)."""
    watcher = client(gateway.port, "end-watcher")
    subscribe(watcher, "will/#")
    will = Will("will/end", b"now", 0, False, Properties(will_delay_interval=30))
    client(gateway.port, "ending", will=will).close()
    got = watcher.expect(1, within=5)[0]
    assert isinstance(got, Publish) and got.payload == b"now"


# ------------------------------------------------ acknowledgements of the wrong kind


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311])
@pytest.mark.parametrize(("qos", "wrong"), [(1, PubComp), (1, PubRec), (2, PubAck), (2, PubComp)])
def test_an_acknowledgement_of_the_other_flow_closes_the_connection(
    gateway: LedgeProcess, version: int, qos: int, wrong: type[PubAck | PubRec | PubComp]
) -> None:
    """A QoS 1 PUBLISH is answered by PUBACK, a QoS 2 one by PUBREC, and PUBCOMP
    answers a PUBREL (MQTT 5.0 4.3.2, 4.3.3): another acknowledgement for its
    identifier is a Protocol Error, and the connection is closed (DISCONNECT 0x82
    first on 5.0)."""
    sub = client(gateway.port, f"wrong-{qos}-{wrong.__name__}", version)
    subscribe(sub, "wrong/ack", qos)
    pub = client(gateway.port, f"wrong-pub-{qos}-{wrong.__name__}", version)
    pub.send(encode(Publish("wrong/ack", b"m", qos, packet_id=1), version))
    got = sub.expect(1)[0]
    assert isinstance(got, Publish) and got.packet_id is not None
    before = len(sub.packets)
    sub.send(encode(wrong(got.packet_id), version))
    after = sub.until_closed()[before:]
    if version == MQTT_5:
        assert [(type(p), p.reason_code) for p in after if isinstance(p, Disconnect)] == [
            (Disconnect, ReasonCode.PROTOCOL_ERROR)
        ]
    else:
        assert after == []


# ----------------------------------------------------------- $share and SUBSCRIBE


def test_publish_to_share_is_refused(gateway: LedgeProcess) -> None:
    """ "$share/..." names shared subscriptions, never a topic: 0x90 (the name is not
    accepted), nothing routed; 3.1.1 cannot be told, the message is dropped."""
    watcher = client(gateway.port, "share-watcher")
    subscribe(watcher, "$share/g/x")
    five = client(gateway.port, "share-pub5")
    five.send(encode(Publish("$share/g/x", b"no", 1, packet_id=5), MQTT_5))
    ack = five.expect(1)[0]
    assert isinstance(ack, PubAck) and ack.reason_code == ReasonCode.TOPIC_NAME_INVALID
    three = client(gateway.port, "share-pub3", MQTT_311)
    three.send(encode(Publish("$share/g/x", b"no", 1, packet_id=6), MQTT_311))
    assert isinstance(three.expect(1)[0], PubAck)
    assert [p for p in ping(watcher) if isinstance(p, Publish)] == []
    assert not five.closed and not three.closed


# ------------------------------------------------------------------ $ topics


#: Mosquitto's 03-publish-dollar-v5, case by case: each PUBLISH (QoS 1, MQTT 5.0) on a
#: connection of its own with client id "03-publish-dollar-v5", and Mosquitto's PUBACK.
#: Ledge answers the same but where the README's Differences table says otherwise.
DOLLAR_V5 = "03-publish-dollar-v5"
DOLLAR_CASES = [
    # (topic, Mosquitto's reason code, Ledge's)
    ("$SYS/broker/uptime", ReasonCode.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED),
    ("$SYS/broker/connection/me", ReasonCode.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED),
    # Mosquitto lets any client write any bridge's state (unless an ACL says no);
    # Ledge only the state under the client's own id (the next case).
    (
        "$SYS/broker/connection/me/state",
        ReasonCode.NO_MATCHING_SUBSCRIBERS,
        ReasonCode.NOT_AUTHORIZED,
    ),
    (
        f"$SYS/broker/connection/{DOLLAR_V5}/state",
        ReasonCode.NO_MATCHING_SUBSCRIBERS,
        ReasonCode.NO_MATCHING_SUBSCRIBERS,
    ),
    # "$share/" names shared subscriptions, never a topic (see test_publish_to_share_is_refused).
    (
        "$share/share/03/publish/dollar/v5/topic",
        ReasonCode.NOT_AUTHORIZED,
        ReasonCode.TOPIC_NAME_INVALID,
    ),
]


def dollar_v5_answers(port: int) -> list[int]:
    codes = []
    for mid, (topic, _mosquitto, _ledge) in enumerate(DOLLAR_CASES, start=1):
        c = client(port, DOLLAR_V5)
        c.send(encode(Publish(topic, b"message", 1, packet_id=mid), MQTT_5))
        ack = c.expect(1)[0]
        assert isinstance(ack, PubAck) and ack.packet_id == mid, (topic, ack)
        codes.append(ack.reason_code)
        c.close()
    return codes


def test_mosquittos_03_publish_dollar_v5(gateway: LedgeProcess) -> None:
    """PUBLISH to ``$`` topics: ``$SYS`` is the broker's but for the client's own bridge
    state, ``$SYS/broker/connection/<client id>/state``, which a Mosquitto bridge
    writes by default (test_mosquitto_bridge_in runs one)."""
    assert dollar_v5_answers(gateway.port) == [ledge for _t, _m, ledge in DOLLAR_CASES]


def test_03_publish_dollar_v5_on_mosquitto_answers_as_listed(mosquitto: MosquittoProcess) -> None:
    """The Mosquitto column above, from Debian's Mosquitto itself."""
    assert dollar_v5_answers(mosquitto.port) == [m for _t, m, _ledge in DOLLAR_CASES]


@pytest.mark.parametrize("bad", ["#/x", "a/b#", "$share/g"])
def test_a_subscribe_with_a_filter_that_is_no_filter_is_malformed(
    gateway: LedgeProcess, bad: str
) -> None:
    five = client(gateway.port, "malformed5")
    five.send(encode(Subscribe(1, (SubscriptionRequest(bad, 0),)), MQTT_5))
    got = five.until_closed()
    assert [(type(p), getattr(p, "reason_code", None)) for p in got[-1:]] == [
        (Disconnect, ReasonCode.MALFORMED_PACKET)
    ]
    three = client(gateway.port, "malformed3", MQTT_311)
    three.send(encode(Subscribe(1, (SubscriptionRequest(bad, 0),)), MQTT_311))
    assert three.until_closed()[1:] == []  # after the CONNACK: nothing, closed


# ------------------------------------------------------------------- MQTT 3.1


def paho31(port: int, client_id: str, clean: bool = True) -> tuple[mqtt.Client, list[object]]:
    """paho's own MQTT 3.1 client (protocol name MQIsdp, level 3)."""
    events: list[object] = []
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv31, clean_session=clean
    )
    c.on_connect = lambda _c, _u, flags, rc, _p=None: events.append(("connack", flags, rc.value))
    c.on_message = lambda _c, _u, msg: events.append((msg.topic, bytes(msg.payload), msg.qos))
    c.on_subscribe = lambda _c, _u, _m, codes, _p=None: events.append(
        ("suback", [r.value for r in codes])
    )
    c.connect("127.0.0.1", port, 30)
    c.loop_start()
    wait_for(lambda: any(e[0] == "connack" for e in events), 5, "CONNACK")  # type: ignore[index]
    return c, events


def test_mqtt_31_clients_are_served_by_the_31_rules(gateway: LedgeProcess) -> None:
    old, events = paho31(gateway.port, "firmware-31", clean=False)
    assert events[0][2] == 0  # type: ignore[index]
    old.subscribe("legacy/#", 2)
    wait_for(lambda: any(e[0] == "suback" for e in events), 5, "SUBACK")  # type: ignore[index]
    modern = client(gateway.port, "modern")
    for qos in (0, 1, 2):
        modern.send(encode(Publish(f"legacy/q{qos}", b"hi", qos, packet_id=qos), MQTT_5))
        if qos:
            modern.expect(1)
            if qos == 2:
                modern.send(encode(PubRel(qos), MQTT_5))
                modern.expect(1)
    wait_for(lambda: len([e for e in events if str(e[0]).startswith("legacy")]) == 3, 5, "3 msgs")  # type: ignore[index]
    assert sorted(e for e in events if str(e[0]).startswith("legacy")) == [  # type: ignore[index, type-var]
        ("legacy/q0", b"hi", 0),
        ("legacy/q1", b"hi", 1),
        ("legacy/q2", b"hi", 2),
    ]
    old.disconnect()
    old.loop_stop()
    # A resumed 3.1 session: its CONNACK has no session present flag (3.1 has none).
    again, events = paho31(gateway.port, "firmware-31", clean=False)
    assert events[0][1].session_present is False  # type: ignore[index]
    again.disconnect()
    again.loop_stop()
    too_long, events = paho31(gateway.port, "x" * 24)
    assert events[0][2] == 0x85  # type: ignore[index]  # paho reports CONNACK 2 so
    too_long.loop_stop()


# ------------------------------------------------------------------ SIGHUP, ACL


def test_an_acl_change_applies_before_the_next_packet_after_sighup(tmp_path: Path) -> None:
    """Mosquitto's 09-acl-change without its pause: a queued message the new ACL no
    longer lets the client read is not delivered, and a publish it may no longer make
    is not routed, though the client reconnects the moment SIGHUP is sent."""
    acl = tmp_path / "acl"
    acl.write_text("user username\ntopic readwrite topic/one\ntopic readwrite topic/two\n")
    config = tmp_path / "ledge.toml"
    config.write_text(f'[auth]\nacl_file = "{acl}"\nfailed_login_delay = 0\n')
    proc = LedgeProcess(config=config).start()
    try:
        sub = client(proc.port, "acl-check", MQTT_311, clean_start=False, username="username")
        subscribe(sub, "topic/one", 1)
        subscribe(sub, "topic/two", 1)
        sub.send(encode(Disconnect(), MQTT_311))
        helper = client(proc.port, "helper", MQTT_311, username="username")
        for pid, topic in ((1, "topic/one"), (2, "topic/two")):
            helper.send(encode(Publish(topic, b"queued", 1, packet_id=pid), MQTT_311))
            helper.expect(1)
        acl.write_text("user username\ntopic readwrite topic/one\n")
        proc.signal(signal.SIGHUP)
        sub = raw(proc.port, MQTT_311)
        ack = sub.connect("acl-check", clean_start=False, username="username")
        assert isinstance(ack, ConnAck) and ack.session_present
        ping(sub)  # the broker is done sending what the session had queued
        got = [p for p in sub.packets if isinstance(p, Publish)]
        assert [p.topic for p in got] == ["topic/one"]
        sub.send(encode(PubAck(got[0].packet_id), MQTT_311))
        sub.send(encode(Publish("topic/two", b"denied", 1, packet_id=9), MQTT_311))
        assert isinstance(sub.expect(1)[0], PubAck)  # 3.1.1: acknowledged, dropped
        assert [p for p in ping(sub) if isinstance(p, Publish)] == []
    finally:
        assert proc.stop() == 0
    assert "password and ACL files read again and applied" in proc.log
