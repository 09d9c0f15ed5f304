"""MQTT-SN sessions over time: sessions ending and resuming, sleep and wake, keep-alive
deadlines to the fake clock's tick, topic ids and their limits, acknowledgements from
devices, the dispatcher's counters and log lines, shutdown.

In-process, on the real broker core and the fake clock of ``tests.support.mqttsn``.
Section numbers are those of the MQTT-SN 1.2 specification.
"""

from __future__ import annotations

import logging

import pytest

from gateway.mqtt import MQTT_311
from gateway.mqttsn.packets import (
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    ReturnCode,
    Subscribe,
    TopicIdType,
    Unsubscribe,
    WillMsgUpd,
    WillTopicUpd,
)
from tests.support.mqttsn import SnHarness
from tests.test_mqttsn_gateway import mqtt_messages, watcher

LOGGER = "ledge.mqttsn"


def log_lines(caplog: pytest.LogCaptureFixture, part: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if part in r.getMessage()]


# ---------------------------------------------------------------------- keep alive (6.11)


def test_the_next_deadline_is_the_keep_alive_exactly() -> None:
    """The shell sleeps until ``next_deadline``: 1.5 x Duration after the CONNECT, or
    ``idle_timeout`` without a Duration, or 1.5 x the sleep duration asleep."""
    h = SnHarness(idle_timeout=100)
    dev = h.device()
    dev.connect("d1", 10)
    assert h.gateway.next_deadline() == pytest.approx(h.now + 15)
    h.advance(3)
    dev.sleep(20)
    assert h.gateway.next_deadline() == pytest.approx(h.now + 30)
    other = h.device(("10.0.0.9", 1))
    h.advance(1)
    other.connect("d2", 0)
    assert h.gateway.next_deadline() == pytest.approx(h.now + 29)
    dev.connect("d1", 10)  # awake again: its keep alive, not its sleep
    assert h.gateway.next_deadline() == pytest.approx(h.now + 15)


def test_keep_alive_expires_exactly_and_counts_each_loss() -> None:
    h = SnHarness()
    a = h.device(("10.0.0.2", 1))
    b = h.device(("10.0.0.3", 1))
    a.connect("a", 10)
    h.advance(5)
    b.connect("b", 10)
    h.advance(9.99)
    assert set(h.gateway.by_id) == {"a", "b"}
    h.advance(0.01)
    assert set(h.gateway.by_id) == {"b"} and h.gateway.stats.clients_lost == 1
    h.advance(5)
    assert not h.gateway.by_id and h.gateway.stats.clients_lost == 2


def test_a_client_without_keep_alive_is_lost_at_idle_timeout_exactly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness(idle_timeout=40)
    dev = h.device()
    dev.connect("d1", 0)
    h.advance(20)
    dev.ping()
    h.advance(39.9)
    assert "d1" in h.gateway.by_id
    h.advance(0.1)
    assert "d1" not in h.gateway.by_id
    (line,) = log_lines(caplog, "lost:")
    assert "'d1'" in line and "10.0.0.2:5000 (udp)" in line
    assert "no keep alive and silent for 40 s (idle_timeout)" in line


def test_keep_alive_loss_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness()
    h.device().connect("d1", 10)
    h.advance(15)
    (line,) = log_lines(caplog, "lost:")
    assert "keep alive of 10 s passed without a message" in line


def test_a_sleeper_woken_and_back_asleep_has_a_new_sleep_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness()
    dev = h.device()
    dev.connect("d1", 10)
    dev.sleep(20)
    h.advance(29)
    dev.wake("d1")
    assert dev.expect(PingResp) == PingResp()
    h.advance(29.9)
    assert "d1" in h.gateway.by_id
    h.advance(0.1)
    assert "d1" not in h.gateway.by_id
    (line,) = log_lines(caplog, "lost:")
    assert "sleep duration of 20 s passed without a message" in line


# ---------------------------------------------------------------------- sessions


def test_a_lost_session_keeps_qos1_messages_drops_qos0_and_counts_them() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("d1", 10, clean=False)
    dev.subscribe("q/0", qos=0)
    dev.subscribe("q/1", qos=1)
    dev.sleep(20)
    mqtt.publish("q/0", b"a", qos=0)
    mqtt.publish("q/1", b"b", qos=1)
    mqtt.publish("q/0", b"c", qos=0)
    mqtt.publish("q/1", b"d", qos=1)
    h.advance(30)  # lost asleep: a remembered session
    assert h.gateway.stats.dropped_offline_qos0 == 2
    assert h.gateway.by_id["d1"].state.name == "DISCONNECTED"
    assert dev.connect("d1", 10, clean=False).return_code == 0
    got = []
    for _ in range(2):
        pub = dev.expect(Publish)
        got.append(pub.data)
        dev.ack(pub)
    assert got == [b"b", b"d"]
    dev.nothing()


def test_a_clean_session_starts_topic_ids_from_one_again() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect("d1")
    assert [dev.register(t).topic_id for t in ("a", "b", "c")] == [1, 2, 3]
    dev.connect("d1", clean=True)
    assert dev.register("z").topic_id == 1
    dev.publish(2, b"x", qos=1)  # "b" is forgotten
    assert dev.expect(PubAck).return_code == ReturnCode.INVALID_TOPIC_ID


def test_a_kept_session_keeps_topic_ids() -> None:
    h = SnHarness()
    w = watcher(h)
    dev = h.device()
    dev.connect("d1", clean=False)
    assert dev.register("a/b").topic_id == 1
    dev.send(Disconnect())
    assert dev.expect(Disconnect) == Disconnect()
    dev.connect("d1", clean=False)
    dev.publish(1, b"x", qos=1)
    assert dev.expect(PubAck) == PubAck(1, 1 + 1, ReturnCode.ACCEPTED)
    assert mqtt_messages(w) == [("a/b", b"x", 1, False)]
    assert dev.register("c").topic_id == 2


# ---------------------------------------------------------------------- registry (6.5)


def test_register_answers_carry_the_msg_id_and_topic_id_zero_when_refused() -> None:
    h = SnHarness(max_topics_per_client=1)
    dev = h.device()
    dev.connect()
    dev.send(Register(0, 41, "a/#"))
    assert dev.expect(RegAck) == RegAck(0, 41, ReturnCode.NOT_SUPPORTED)
    dev.send(Register(0, 42, "a/1"))
    assert dev.expect(RegAck) == RegAck(1, 42, ReturnCode.ACCEPTED)
    dev.send(Register(0, 43, "a/2"))
    assert dev.expect(RegAck) == RegAck(0, 43, ReturnCode.CONGESTION)
    assert h.gateway.stats.dropped_topic_table == 1


def test_register_refusals_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness(max_topics_per_client=1)
    dev = h.device()
    dev.connect()
    dev.register("a/#")
    (line,) = log_lines(caplog, "REGISTER of bad topic")
    assert line == "client 'dev1': REGISTER of bad topic 'a/#' refused"
    dev.register("a/1")
    dev.register("a/2")
    other = h.device(("10.0.0.3", 1))  # another source: its own line
    other.connect("dev2")
    other.register("b/1")
    other.register("b/2")
    assert log_lines(caplog, "topic table full") == [
        "client 'dev1': topic table full (1 topics): 'a/2' not registered",
        "client 'dev2': topic table full (1 topics): 'b/2' not registered",
    ]


def test_topic_ids_wrap_skipping_reserved_and_used_ones() -> None:
    """After 0xFFFE the next id is 1, never 0xFFFF, and ids still in use are skipped."""
    h = SnHarness()
    dev = h.device()
    dev.connect("d1")
    assert [dev.register(t).topic_id for t in ("a", "b")] == [1, 2]
    h.gateway.by_id["d1"].next_topic_id = 0xFFFE  # as after 65,533 registrations
    assert dev.register("c").topic_id == 0xFFFE
    assert dev.register("d").topic_id == 3
    assert dev.register("e").topic_id == 4


def test_short_topic_ids_with_wildcards_or_nul_are_invalid() -> None:
    h = SnHarness()
    w = watcher(h)
    dev = h.device()
    dev.connect()
    for name in (b"a#", b"+b", b"a\x00"):
        tid = int.from_bytes(name, "big")
        pid = dev.publish(tid, b"x", qos=1, id_type=TopicIdType.SHORT)
        assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.INVALID_TOPIC_ID)
    assert mqtt_messages(w) == []


# ---------------------------------------------------------------------- sleep (6.14)


def test_a_wake_from_an_address_held_by_another_client_takes_it_over() -> None:
    h = SnHarness()
    w = watcher(h, "st/#")
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    sleeper = h.device(("10.0.0.2", 1))
    sleeper.connect("sleeper", 10)
    sleeper.subscribe("to/s", qos=1)
    sleeper.sleep(100)
    squatter = h.device(("10.0.0.2", 2))
    squatter.connect("squatter", 10, will=("st/squatter", b"gone", 0, False))
    mqtt.publish("to/s", b"m", qos=1)
    squatter.wake("sleeper")
    pub = squatter.expect(Publish)
    assert pub.data == b"m"
    assert h.gateway.stats.clients_lost == 1
    assert h.gateway.by_key[("udp", ("10.0.0.2", 2), b"")].client_id == "sleeper"
    assert ("udp", ("10.0.0.2", 1), b"") not in h.gateway.by_key
    squatter.ack(pub)
    assert squatter.expect(PingResp) == PingResp()
    h.advance(30)
    assert mqtt_messages(w) == []  # the squatter's will was not published


def test_a_refused_wake_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    h = SnHarness()
    dev = h.device(("10.0.0.2", 1))
    dev.connect("d1", 10)
    dev.sleep(100)
    stranger = h.device(("10.9.9.9", 7))
    stranger.wake("d1")
    assert stranger.expect(Disconnect) == Disconnect()
    assert h.gateway.stats.wakes_refused == 1
    (line,) = log_lines(caplog, "PINGREQ waking")
    assert line == (
        "10.9.9.9:7 (udp): PINGREQ waking 'd1' refused: it connected from 10.0.0.2:1 (udp)"
    )


def test_disconnect_without_a_connection_is_confirmed() -> None:
    h = SnHarness()
    dev = h.device()
    dev.send(Disconnect())
    assert dev.expect(Disconnect) == Disconnect()
    dev.send(Disconnect(30))
    assert dev.expect(Disconnect) == Disconnect()


def test_a_disconnect_ends_a_kept_session_remembered() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect("d1", clean=False)
    dev.send(Disconnect())
    assert dev.expect(Disconnect) == Disconnect()
    assert h.gateway.by_id["d1"].state.name == "DISCONNECTED"
    assert ("udp", dev.address, b"") not in h.gateway.by_key


# ---------------------------------------------------------------------- acknowledgements


def test_an_ack_resets_the_retry_count_for_the_next_message() -> None:
    h = SnHarness(retry_interval=5, max_retries=1)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("d1", duration=600)
    dev.subscribe("in", qos=1)
    mqtt.publish("in", b"1", qos=1)
    first = dev.expect(Publish)
    h.advance(5)
    assert dev.expect(Publish).dup  # the one retry
    dev.ack(first)
    mqtt.publish("in", b"2", qos=1)
    second = dev.expect(Publish)
    h.advance(5)
    again = dev.expect(Publish)
    assert again.dup and again.msg_id == second.msg_id
    assert "d1" in h.gateway.by_id and h.gateway.stats.clients_lost == 0


def test_a_pubrec_resets_the_retry_count_for_the_pubrel() -> None:
    h = SnHarness(retry_interval=5, max_retries=1)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("d1", duration=600)
    dev.subscribe("in", qos=2)
    mqtt.publish("in", b"1", qos=2)
    first = dev.expect(Publish)
    h.advance(5)
    assert dev.expect(Publish).dup
    dev.send(PubRec(first.msg_id))
    assert dev.expect(PubRel) == PubRel(first.msg_id)
    h.advance(5)
    assert dev.expect(PubRel) == PubRel(first.msg_id)
    assert h.gateway.stats.clients_lost == 0
    dev.send(PubComp(first.msg_id))
    h.advance(30)
    dev.nothing()


def test_acks_for_another_msg_id_or_without_a_message_in_flight_are_ignored() -> None:
    h = SnHarness(retry_interval=5)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("d1", duration=600)
    tid = dev.subscribe("in", qos=1).topic_id
    dev.send(PubAck(tid, 999))
    dev.send(PubRec(999))
    dev.send(PubComp(999))
    dev.send(RegAck(1, 999))
    dev.nothing()
    mqtt.publish("in", b"1", qos=1)
    first = dev.expect(Publish)
    dev.send(PubAck(tid, first.msg_id + 1))
    h.advance(5)
    assert dev.expect(Publish).msg_id == first.msg_id  # still in flight


def test_refusals_by_the_device_are_counted_each_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("d1")
    tid = dev.subscribe("busy", qos=1).topic_id
    for n in (b"1", b"2"):
        mqtt.publish("busy", n, qos=1)
        pub = dev.expect(Publish)
        dev.send(PubAck(tid, pub.msg_id, ReturnCode.CONGESTION))
    assert h.gateway.stats.publish_refused == 2
    lines = log_lines(caplog, "refused a message")
    assert lines[0] == "client 'd1' refused a message on 'busy' (return code 1)"
    dev.subscribe("cmd/#", qos=1)
    for n in (b"1", b"2"):
        mqtt.publish("cmd/x", n, qos=1)
        reg = dev.expect(Register)
        dev.send(RegAck(0, reg.msg_id, ReturnCode.NOT_SUPPORTED))
    assert h.gateway.stats.publish_refused == 4
    lines = log_lines(caplog, "refused REGISTER")
    assert lines[0] == "client 'd1' refused REGISTER of 'cmd/x' (return code 3): message dropped"


# ---------------------------------------------------------------------- the dispatcher


def test_messages_received_counts_each_datagram_once() -> None:
    h = SnHarness(predefined_topics={1: "p/one"})
    dev = h.device()
    dev.connect()
    tid = dev.register("a/b").topic_id
    before = h.gateway.stats.messages_received
    dev.publish(tid, b"x", qos=0)
    dev.publish(tid, b"y", qos=1)
    dev.send(PingReq())
    dev.publish(1, b"z", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert h.gateway.stats.messages_received == before + 4


def test_a_plain_publish_is_not_retained_and_a_retained_one_is() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect()
    tid = dev.register("r/a").topic_id
    dev.publish(tid, b"plain", qos=0)
    dev.publish(tid, b"plain1", qos=1)
    dev.expect(PubAck)
    assert h.broker.retained.matching("r/a", h.now) == []
    dev.publish(tid, b"kept", qos=1, retain=True)
    dev.expect(PubAck)
    assert [m.payload for m in h.broker.retained.matching("r/a", h.now)] == [b"kept"]


def test_a_publish_heard_keeps_a_sleeping_client_from_the_fast_path() -> None:
    """A plain PUBLISH from a client that is connected takes the fast path and
    proves it; from one that ended it gets DISCONNECT."""
    h = SnHarness()
    dev = h.device()
    dev.connect("d1", 10, clean=False)
    tid = dev.register("a").topic_id
    dev.send(Disconnect())
    dev.expect(Disconnect)
    dev.publish(tid, b"x", qos=1)
    assert dev.expect(Disconnect) == Disconnect()
    assert h.gateway.stats.not_connected == 1


def test_malformed_datagrams_are_logged_with_where_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = SnHarness()
    h.device(("fe80::1", 5000, 0, 0)).send_raw(b"\x03\x11\x00")
    h.device("ttyUSB0", transport="serial").send_raw(b"\x00")
    lines = log_lines(caplog, "unreadable message")
    assert len(lines) == 2
    assert lines == [
        "udp: unreadable message from [fe80::1]:5000 at byte 1: reserved MsgType 0x11",
        "serial: unreadable message from ttyUSB0 at byte 0: Length 0",
    ]
    assert h.gateway.stats.malformed == 2


def test_refusal_lines_name_the_node_behind_a_forwarder(caplog: pytest.LogCaptureFixture) -> None:
    h = SnHarness()
    node = h.device("ttyS1", transport="uart", node_id=b"\x0a\x01")
    assert node.connect("a/b").return_code == ReturnCode.NOT_SUPPORTED
    ipv6 = h.device(("2001:db8::5", 1883, 0, 0))
    assert ipv6.connect("c/d").return_code == ReturnCode.NOT_SUPPORTED
    lines = log_lines(caplog, "refusing CONNECT")
    assert lines[0].startswith("ttyS1 node 0a01 (uart): refusing CONNECT of 'a/b': ")
    assert lines[1].startswith("[2001:db8::5]:1883 (udp): refusing CONNECT of 'c/d': ")


def test_shutdown_ends_every_session_without_wills() -> None:
    h = SnHarness(predefined_topics={1: "p/one"})
    w = watcher(h, "st/#")
    a = h.device(("10.0.0.2", 1))
    a.connect("a", 10, will=("st/a", b"gone", 0, False))
    b = h.device(("10.0.0.3", 1))
    b.connect("b", 10, clean=False, will=("st/b", b"gone", 0, False))
    h.device(("10.0.0.4", 1)).publish(1, b"x", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert h.gateway.anonymous is not None
    h.gateway.shutdown(h.now)
    assert not h.gateway.by_id and not h.gateway.by_key
    assert h.gateway.anonymous is None
    assert h.broker.connected == 1  # the watcher
    assert "a" not in h.broker.sessions
    h.advance(60)
    assert mqtt_messages(w) == []


def test_a_publish_in_the_middle_of_the_will_prompts_gets_disconnect() -> None:
    h = SnHarness()
    w = watcher(h)
    dev = h.device()
    dev.connect("d1")
    tid = dev.register("a").topic_id
    dev.send(Connect("d1", 60, clean_session=False, will=True))
    dev.take()  # WILLTOPICREQ
    dev.publish(tid, b"x", qos=0)
    assert dev.expect(Disconnect) == Disconnect()
    assert mqtt_messages(w) == []


def test_a_datagram_over_max_message_size_is_malformed_not_answered() -> None:
    h = SnHarness(max_message_size=64)
    dev = h.device()
    dev.connect()
    dev.send(Register(0, 1, "t" * 70))
    dev.nothing()
    assert h.gateway.stats.malformed == 1
    dev.send(Register(0, 2, "t" * 50))
    assert dev.expect(RegAck).return_code == ReturnCode.ACCEPTED


def test_every_kind_of_message_keeps_a_client_alive() -> None:
    """Acknowledgements, SUBSCRIBE, UNSUBSCRIBE, REGISTER, Will updates: each is heard
    and restarts the keep alive (1.5 x 10 s), so the client outlives many of them."""
    h = SnHarness(retry_interval=100)
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("d1", 10, will=("st/d1", b"m", 0, False))
    sent: list[Packet] = [
        Subscribe(1, "in/1", 1),
        Subscribe(2, "in/2", 2),
        Subscribe(3, "cmd/#", 1),
        Unsubscribe(4, "none"),
        Register(0, 5, "out"),
        WillTopicUpd("st/d1", 0, False),
        WillMsgUpd(b"m2"),
    ]
    for packet in sent:
        h.advance(14)
        dev.send(packet)
    dev.take()  # SUBACKs, UNSUBACK, REGACK, WILLTOPICRESP, WILLMSGRESP
    mqtt.publish("in/1", b"1", qos=1)
    pub = dev.expect(Publish)
    h.advance(14)
    dev.ack(pub)
    mqtt.publish("in/2", b"2", qos=2)
    pub = dev.expect(Publish)
    h.advance(14)
    dev.send(PubRec(pub.msg_id))
    assert dev.expect(PubRel) == PubRel(pub.msg_id)
    h.advance(14)
    dev.send(PubComp(pub.msg_id))
    mqtt.publish("cmd/x", b"3", qos=1)
    reg = dev.expect(Register)
    h.advance(14)
    dev.send(RegAck(reg.topic_id, reg.msg_id))
    h.advance(14.9)
    assert h.gateway.by_id["d1"].state.name == "ACTIVE"
    h.advance(0.1)
    assert "d1" not in h.gateway.by_id


def test_debug_lines_say_what_was_ignored(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    h = SnHarness(predefined_topics={1: "p/one"}, qos_minus_one=False)
    dev = h.device()
    dev.send(PingResp())  # only a gateway sends it
    dev.send(PingReq())
    dev.expect(Disconnect)
    dev.publish(1, b"x", qos=-1, id_type=TopicIdType.PREDEFINED)
    dev.connect("d1")
    dev.sleep(30)
    text = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert "10.0.0.2:5000 (udp): ignoring PingResp" in text
    assert "10.0.0.2:5000 (udp): PingReq without a connection: DISCONNECT" in text
    assert "10.0.0.2:5000 (udp): QoS -1 PUBLISH refused (not enabled here)" in text
    assert "client 'd1' asleep for 30 s" in text


def test_after_the_wrap_no_topic_id_in_use_is_given_twice() -> None:
    """After 0xFFFE, every new id skips those still in use -- not only the first: an id
    given twice would publish a device's messages on the other topic."""
    h = SnHarness()
    w = watcher(h, "+")  # the single-level topics the device publishes on
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("d1")
    assert dev.register("a").topic_id == 1
    dev.subscribe("cmd/#", qos=1)
    mqtt.publish("cmd/x", b"v", qos=1)
    reg = dev.expect(Register)
    assert reg.topic_id == 2
    dev.send(RegAck(0, reg.msg_id, ReturnCode.NOT_SUPPORTED))  # 2 is free again
    assert dev.register("c").topic_id == 3
    h.gateway.by_id["d1"].next_topic_id = 0xFFFE  # as after 65,531 more
    assert dev.register("d").topic_id == 0xFFFE
    assert dev.register("e").topic_id == 2
    f = dev.register("f").topic_id
    assert f not in (1, 2, 3, 0xFFFE)
    pc = dev.publish(3, b"to c", qos=1)
    pf = dev.publish(f, b"to f", qos=1)
    assert dev.take() == [PubAck(3, pc, ReturnCode.ACCEPTED), PubAck(f, pf, ReturnCode.ACCEPTED)]
    assert [(t, p) for t, p, _q, _r in mqtt_messages(w)] == [("c", b"to c"), ("f", b"to f")]
