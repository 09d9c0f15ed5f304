"""MQTT-SN edges a device would suffer from: each refusal's return code, log line and
counter, the Will prompts and updates, PUBLISH return codes and counts, QoS -1.

In-process, on the real broker core and the fake clock of ``tests.support.mqttsn``.
Section numbers are those of the MQTT-SN 1.2 specification.
"""

from __future__ import annotations

import logging

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.mqtt import MQTT_311
from gateway.mqttsn.packets import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReturnCode,
    TopicIdType,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
    WillTopicUpd,
)
from gateway.mqttsn.state import TransportPolicy
from tests.support.mqttsn import SnHarness
from tests.test_mqttsn_gateway import mqtt_messages, watcher

LOGGER = "ledge.mqttsn"


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refusing CONNECT" in r.getMessage()]


# ---------------------------------------------------------------------- CONNECT refusals


def test_each_connect_refusal_logs_its_client_id_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator reads why a device is refused: the line names the client id and
    the reason, each from its own source (one line per source a minute)."""
    h = SnHarness([TransportPolicy("udp"), TransportPolicy("serial", frozenset({"ok"}))])
    h.device(("10.1.0.1", 1)).send(Connect("p1", 60, protocol_id=0x02))
    h.device(("10.1.0.2", 1)).send(Connect("a+b", 60))
    h.device("ttyS0", transport="serial").send(Connect("nope", 60))
    mqtt = h.client(MQTT_311)
    mqtt.connect("taken")
    h.device(("10.1.0.3", 1)).send(Connect("taken", 60))
    lines = refusal_lines(caplog)
    assert len(lines) == 4
    assert "'p1'" in lines[0] and "protocol id 0x02 is not 0x01" in lines[0]
    assert "'a+b'" in lines[1]
    assert lines[1].endswith(": client id must be 1-64 characters, no '/', '+', '#'")
    assert "'nope'" in lines[2] and "client id not in serial's allow_client_ids" in lines[2]
    assert lines[3].endswith("refusing CONNECT of 'taken': client id in use by an MQTT client")
    assert h.gateway.stats.clients_refused == 4


def test_client_id_length_boundary_and_wildcards() -> None:
    h = SnHarness()
    dev = h.device()
    assert dev.connect("x" * 65).return_code == ReturnCode.NOT_SUPPORTED
    assert dev.connect("a#").return_code == ReturnCode.NOT_SUPPORTED
    assert dev.connect("a+").return_code == ReturnCode.NOT_SUPPORTED
    assert dev.connect("x" * 64).return_code == ReturnCode.ACCEPTED
    assert h.gateway.stats.clients_refused == 3


def test_rate_refusal_is_congestion_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    h = SnHarness(max_connect_rate_per_address=1, max_connect_rate=2)
    for i in range(2):  # a burst of two seconds' worth
        assert h.device(("10.2.0.1", i)).connect(f"r{i}").return_code == ReturnCode.ACCEPTED
    assert h.device(("10.2.0.1", 2)).connect("r2").return_code == ReturnCode.CONGESTION
    assert h.device(("10.2.0.2", 1)).connect("r3").return_code == ReturnCode.ACCEPTED
    assert h.device(("10.2.0.3", 1)).connect("r4").return_code == ReturnCode.ACCEPTED
    assert h.device(("10.2.0.4", 1)).connect("r5").return_code == ReturnCode.CONGESTION
    assert h.gateway.stats.clients_refused_rate == 2
    assert h.gateway.stats.clients_refused == 2
    one, every = refusal_lines(caplog)
    assert "'r2'" in one and "more than 1 CONNECTs a second from 10.2.0.1" in one
    assert "'r5'" in every and "more than 2 CONNECTs a second in all" in every


def test_per_address_refusal_names_the_setting(caplog: pytest.LogCaptureFixture) -> None:
    h = SnHarness(max_clients_per_address=1, max_connect_rate_per_address=1e6)
    first = h.device(("10.3.0.1", 1))
    first.connect("a1")
    first.ping()  # proven: it cannot be evicted for a newcomer
    assert h.device(("10.3.0.1", 2)).connect("a2").return_code == ReturnCode.CONGESTION
    assert h.gateway.stats.clients_refused_per_address == 1
    (line,) = refusal_lines(caplog)
    assert "'a2'" in line
    assert "1 clients from this address already (mqttsn.max_clients_per_address)" in line


def test_full_pool_refusal_names_the_slots(caplog: pytest.LogCaptureFixture) -> None:
    h = SnHarness(max_clients=1)
    keeper = h.device(("10.4.0.1", 1))
    keeper.connect("keeper")
    keeper.ping()
    assert h.device(("10.4.0.2", 1)).connect("new").return_code == ReturnCode.CONGESTION
    (line,) = refusal_lines(caplog)
    assert "'new'" in line and "all 1 client slots held by established clients" in line
    assert "new" not in h.gateway.by_id


def test_too_many_connecting_is_congestion_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = SnHarness(max_connecting=1)
    h.device(("10.5.0.1", 1)).send(Connect("w1", 60, will=True))
    late = h.device(("10.5.0.2", 1))
    late.send(Connect("w2", 60, will=True))
    assert late.expect(ConnAck) == ConnAck(ReturnCode.CONGESTION)
    (line,) = refusal_lines(caplog)
    assert "'w2'" in line and "1 clients already connecting" in line


# ---------------------------------------------------------------------- Will prompts (6.3)


def test_will_prompts_complete_and_release_the_connecting_place() -> None:
    h = SnHarness(max_connecting=1)
    dev = h.device()
    assert dev.connect("d1", will=("st/d1", b"bye", 1, False)).return_code == 0
    assert h.gateway.connecting == 0
    other = h.device(("10.0.0.9", 1))
    assert other.connect("d2", will=("st/d2", b"bye", 0, False)).return_code == 0
    assert h.gateway.connecting == 0


def test_a_bad_will_topic_refuses_and_forgets_the_connecting_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = SnHarness(max_connecting=1)
    dev = h.device()
    dev.send(Connect("d1", 60, will=True))
    assert dev.expect(WillTopicReq) == WillTopicReq()
    dev.send(WillTopic("bad/#", 0, False))
    assert dev.expect(ConnAck) == ConnAck(ReturnCode.NOT_SUPPORTED)
    assert "d1" not in h.gateway.by_id and h.gateway.connecting == 0
    (line,) = refusal_lines(caplog)
    assert "'d1'" in line and "bad will topic 'bad/#'" in line
    dev.send(WillMsg(b"late"))  # its CONNECT is over
    assert dev.expect(Disconnect) == Disconnect()


def test_a_refused_will_logs_its_topic(caplog: pytest.LogCaptureFixture) -> None:
    h = SnHarness(acl=parse_acl_file("pattern write devices/%c/#\n"))
    dev = h.device()
    assert dev.connect("d1", will=("elsewhere/x", b"", 0, False)).return_code == (
        ReturnCode.NOT_SUPPORTED
    )
    (line,) = refusal_lines(caplog)
    assert "'d1'" in line and "not authorized to publish its will on 'elsewhere/x'" in line


def test_an_empty_will_topic_connects_without_a_will() -> None:
    h = SnHarness()
    w = watcher(h)
    dev = h.device()
    dev.send(Connect("d1", 10, will=True))
    dev.expect(WillTopicReq)
    dev.send(WillTopic("", 0, False))
    assert dev.expect(ConnAck) == ConnAck(ReturnCode.ACCEPTED)
    assert h.gateway.connecting == 0
    h.advance(16)
    assert "d1" not in h.gateway.by_id
    assert mqtt_messages(w) == []


def test_will_prompts_out_of_turn_get_disconnect() -> None:
    h = SnHarness()
    stranger = h.device(("10.0.0.7", 1))
    stranger.send(WillTopic("t", 0, False))
    assert stranger.expect(Disconnect) == Disconnect()
    stranger.send(WillMsg(b"m"))
    assert stranger.expect(Disconnect) == Disconnect()
    dev = h.device()
    dev.connect("d1", 10, will=("st/d1", b"orig", 0, False))
    dev.send(WillTopic("st/other", 0, False))
    assert dev.expect(Disconnect) == Disconnect()
    dev.send(WillMsg(b"changed"))
    assert dev.expect(Disconnect) == Disconnect()
    assert h.gateway.stats.not_connected == 4
    w = watcher(h, "st/#")
    h.advance(16)
    assert mqtt_messages(w) == [("st/d1", b"orig", 0, False)]


def test_unanswered_will_prompts_time_out_exactly_at_connect_timeout() -> None:
    h = SnHarness(connect_timeout=5)
    dev = h.device()
    dev.send(Connect("d1", 60, will=True))
    dev.expect(WillTopicReq)
    h.advance(4.9)
    assert "d1" in h.gateway.by_id and h.gateway.connecting == 1
    dev.send(WillTopic("st/d1", 0, False))
    assert dev.expect(WillMsgReq) == WillMsgReq()
    h.advance(0.1)
    assert "d1" not in h.gateway.by_id and h.gateway.connecting == 0
    dev.send(WillMsg(b"late"))
    assert dev.expect(Disconnect) == Disconnect()


def test_connect_without_will_flag_keeps_the_will_only_without_clean_session() -> None:
    """6.3: CleanSession=false and Will=false keeps the Will; a clean one deletes it."""
    h = SnHarness()
    w = watcher(h, "st/#")
    dev = h.device()
    dev.connect("d1", 10, clean=False, will=("st/d1", b"gone", 0, False))
    assert dev.connect("d1", 10, clean=False).return_code == 0
    h.advance(16)
    assert mqtt_messages(w) == [("st/d1", b"gone", 0, False)]


def test_a_clean_connect_of_a_sleeping_client_without_will_deletes_its_will() -> None:
    h = SnHarness()
    w = watcher(h, "st/#")
    dev = h.device()
    dev.connect("d1", 10, will=("st/d1", b"gone", 0, False))
    dev.sleep(100)
    assert dev.connect("d1", 10, clean=True).return_code == 0
    h.advance(16)
    assert "d1" not in h.gateway.by_id
    assert mqtt_messages(w) == []


def test_an_address_taken_over_loses_the_old_client_without_its_will() -> None:
    h = SnHarness()
    w = watcher(h, "st/#")
    dev = h.device()
    dev.connect("old", 10, clean=False, will=("st/old", b"gone", 0, False))
    assert dev.connect("new", 10).return_code == 0
    assert h.gateway.stats.clients_lost == 1
    assert h.gateway.by_key[("udp", dev.address, b"")].client_id == "new"
    assert h.gateway.by_id["old"].state.name == "DISCONNECTED"  # remembered session
    h.advance(30)
    assert mqtt_messages(w) == []


# ---------------------------------------------------------------------- Will updates (6.4)


def test_will_topic_update_without_a_will_sets_an_empty_message() -> None:
    h = SnHarness()
    w = watcher(h, "st/#")
    dev = h.device()
    dev.connect("d1", 10)
    dev.send(WillMsgUpd(b"no will yet"))
    assert dev.expect(WillMsgResp) == WillMsgResp(ReturnCode.NOT_SUPPORTED)
    dev.send(WillTopicUpd("st/d1", 1, False))
    assert dev.expect(WillTopicResp) == WillTopicResp(ReturnCode.ACCEPTED)
    h.advance(16)
    assert mqtt_messages(w) == [("st/d1", b"", 1, False)]


def test_will_topic_update_sets_retain() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect("d1", 10, will=("st/d1", b"m", 0, False))
    dev.send(WillTopicUpd("st/d1", 1, True))
    assert dev.expect(WillTopicResp) == WillTopicResp(ReturnCode.ACCEPTED)
    h.advance(16)
    retained = h.broker.retained.matching("st/d1", h.now)
    assert [(m.payload, m.qos) for m in retained] == [(b"m", 1)]


def test_will_topic_update_keeps_the_message_and_an_empty_one_deletes_the_will() -> None:
    h = SnHarness()
    w = watcher(h, "st/#")
    dev = h.device()
    dev.connect("d1", 10, will=("st/a", b"msg", 0, False))
    dev.send(WillTopicUpd("st/b", 0, False))
    assert dev.expect(WillTopicResp) == WillTopicResp(ReturnCode.ACCEPTED)
    dev2 = h.device(("10.0.0.8", 1))
    dev2.connect("d2", 10, will=("st/c", b"msg2", 0, False))
    dev2.send(WillTopicUpd(""))
    assert dev2.expect(WillTopicResp) == WillTopicResp(ReturnCode.ACCEPTED)
    h.advance(16)
    assert mqtt_messages(w) == [("st/b", b"msg", 0, False)]


def test_will_updates_need_a_connection() -> None:
    h = SnHarness()
    dev = h.device()
    dev.send(WillTopicUpd("st/x", 0, False))
    assert dev.expect(Disconnect) == Disconnect()
    dev.send(WillMsgUpd(b"x"))
    assert dev.expect(Disconnect) == Disconnect()


# ---------------------------------------------------------------------- PUBLISH


def test_reserved_topic_id_type_is_not_supported_with_the_ids_echoed() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect()
    dev.send(Publish(0x1234, 77, b"x", 1, False, False, TopicIdType.RESERVED))
    assert dev.expect(PubAck) == PubAck(0x1234, 77, ReturnCode.NOT_SUPPORTED)


def test_publish_refusals_are_counted_once_each_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness()
    dev = h.device()
    dev.connect()
    dev.publish(42, b"x", qos=1)
    assert h.gateway.stats.publish_refused == 1
    assert dev.expect(PubAck).return_code == ReturnCode.INVALID_TOPIC_ID
    tid = dev.register("$SYS/x").topic_id
    pid = dev.publish(tid, b"x", qos=1)
    assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.NOT_SUPPORTED)
    assert h.gateway.stats.publish_refused == 2
    other = h.device(("10.0.0.77", 1))  # another source: its own line
    other.connect("dev2")
    tid2 = other.register("$SYS/y").topic_id
    other.publish(tid2, b"y", qos=1)
    lines = [r.getMessage() for r in caplog.records if "PUBLISH on" in r.getMessage()]
    assert lines == [
        "client 'dev1': PUBLISH on '$SYS/x' refused: $SYS is read-only",
        "client 'dev2': PUBLISH on '$SYS/y' refused: $SYS is read-only",
    ]


def test_gates_see_the_payload_size_and_a_full_store_refuses_retained_only() -> None:
    h = SnHarness()
    sizes: list[int] = []

    def gate(topic: str, size: int) -> str | None:
        sizes.append(size)
        return "too big" if size > 10 else None

    h.broker.publish_gates.append(gate)
    dev = h.device()
    dev.connect()
    tid = dev.register("up/x").topic_id
    pid = dev.publish(tid, b"y" * 11, qos=1)
    assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.CONGESTION)
    pid = dev.publish(tid, b"y" * 10, qos=1)
    assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.ACCEPTED)
    assert sizes == [11, 10]
    assert h.gateway.stats.publish_refused == 1
    h.broker.publish_gates.clear()
    h.broker.store_full = True
    pid = dev.publish(tid, b"r", qos=1, retain=True)
    assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.CONGESTION)
    pid = dev.publish(tid, b"n", qos=1)
    assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.ACCEPTED)
    assert h.gateway.stats.publish_refused == 2


def test_qos_minus_one_is_not_gated_as_qos_1() -> None:
    h = SnHarness(predefined_topics={1: "p/one"})
    h.broker.publish_gates.append(lambda topic, size: "bridge outbox full")
    w = watcher(h)
    h.device().publish(1, b"x", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert h.gateway.stats.qos_minus_one == 1 and h.gateway.stats.publish_refused == 0
    assert mqtt_messages(w) == [("p/one", b"x", 0, False)]


def test_qos2_congestion_counts_once() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect()
    tid = dev.register("q/2").topic_id
    for _ in range(16):
        dev.publish(tid, b"x", qos=2)
        dev.expect(PubRec)
    pid = dev.publish(tid, b"x", qos=2)
    assert dev.expect(PubAck) == PubAck(tid, pid, ReturnCode.CONGESTION)
    assert h.gateway.stats.publish_refused == 1


def test_pubrel_frees_only_its_own_qos2_id() -> None:
    """A PUBREL for one message keeps the others' ids: their resends are not routed
    twice; after the last PUBREL a new QoS 2 message is routed."""
    h = SnHarness()
    w = watcher(h, qos=2)
    dev = h.device()
    dev.connect()
    tid = dev.register("q/2").topic_id
    a = dev.publish(tid, b"a", qos=2)
    b = dev.publish(tid, b"b", qos=2)
    assert dev.take() == [PubRec(a), PubRec(b)]
    dev.send(PubRel(a))
    assert dev.expect(PubComp) == PubComp(a)
    dev.send(Publish(tid, b, b"b", 2, dup=True))
    assert dev.expect(PubRec) == PubRec(b)
    dev.send(PubRel(b))
    assert dev.expect(PubComp) == PubComp(b)
    c = dev.publish(tid, b"c", qos=2)
    assert dev.expect(PubRec) == PubRec(c)
    assert [m[1] for m in mqtt_messages(w)] == [b"a", b"b", b"c"]


def test_a_pubrec_that_needs_the_store_waits_for_its_commit() -> None:
    from gateway.broker.journal import Journal

    h = SnHarness()
    h.broker.journal = Journal()
    dev = h.device()
    dev.connect()
    tid = dev.register("state/x").topic_id
    pid = dev.publish(tid, b"kept", qos=2, retain=True)
    dev.nothing()
    batch = h.broker.seal_batch()
    assert batch is not None
    h.gateway.committed(batch[0])
    assert dev.take() == [PubRec(pid)]


def test_publish_keeps_the_client_alive() -> None:
    """Any message, a PUBLISH too, restarts the keep-alive (1.5 x Duration)."""
    h = SnHarness()
    dev = h.device()
    dev.connect("d1", 10)
    tid = dev.register("k/a").topic_id
    h.advance(14)
    dev.publish(tid, b"x", qos=1)
    dev.expect(PubAck)
    h.advance(14.9)
    assert h.gateway.by_id["d1"].state.name == "ACTIVE"
    dev.send(PubRel(9))  # a PUBREL is heard too
    assert dev.expect(PubComp) == PubComp(9)
    h.advance(14.9)
    assert h.gateway.by_id["d1"].state.name == "ACTIVE"
    h.advance(0.2)
    assert "d1" not in h.gateway.by_id


# ---------------------------------------------------------------------- QoS -1 (6.8)


def test_qos_minus_one_refusals_are_counted_once_each(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness(predefined_topics={1: "p/one", 2: "$SYS/x"})
    w = watcher(h)
    dev = h.device()
    stats = h.gateway.stats
    dev.publish(1, b"n", qos=-1, id_type=TopicIdType.NORMAL)
    assert stats.publish_refused == 1
    dev.publish(9, b"u", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert stats.publish_refused == 2
    dev.publish(2, b"s", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert stats.publish_refused == 3
    dev.publish(1, b"ok", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert stats.publish_refused == 3 and stats.qos_minus_one == 1
    assert mqtt_messages(w) == [("p/one", b"ok", 0, False)]
    other = h.device(("10.0.0.8", 1))  # another source: its own lines
    other.publish(1, b"n", qos=-1, id_type=TopicIdType.NORMAL)
    other.publish(8, b"u", qos=-1, id_type=TopicIdType.PREDEFINED)
    text = [r.getMessage() for r in caplog.records if "QoS -1" in r.getMessage()]
    assert text == [
        "10.0.0.2:5000 (udp): QoS -1 PUBLISH with a normal topic id dropped",
        "10.0.0.2:5000 (udp): QoS -1 PUBLISH to unknown topic id 9",
        "10.0.0.8:1 (udp): QoS -1 PUBLISH with a normal topic id dropped",
        "10.0.0.8:1 (udp): QoS -1 PUBLISH to unknown topic id 8",
    ]


def test_qos_minus_one_disabled_is_counted() -> None:
    h = SnHarness(predefined_topics={1: "p/one"}, qos_minus_one=False)
    h.device().publish(1, b"x", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert h.gateway.stats.publish_refused == 1 and h.gateway.stats.qos_minus_one == 0


def test_qos_minus_one_from_a_connected_client_uses_its_own_session() -> None:
    """The ACL judges a connected client's QoS -1 message by its own client id;
    the gateway's anonymous session could not write there."""
    acl = parse_acl_file("pattern write devices/%c/#\npattern read #\n")
    h = SnHarness(acl=acl, predefined_topics={1: "devices/d1/t"})
    w = watcher(h)
    stranger = h.device(("10.0.0.9", 1))
    stranger.publish(1, b"anon", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert h.gateway.stats.publish_refused == 1
    dev = h.device()
    dev.connect("d1")
    dev.publish(1, b"mine", qos=-1, id_type=TopicIdType.PREDEFINED, retain=True)
    assert h.gateway.stats.qos_minus_one == 1
    assert mqtt_messages(w) == [("devices/d1/t", b"mine", 0, False)]
    assert [m.payload for m in h.broker.retained.matching("devices/d1/t", h.now)] == [b"mine"]


def test_pingreq_keeps_a_client_active_with_pingresp() -> None:
    h = SnHarness()
    dev = h.device()
    dev.connect("d1", 10)
    dev.send(PingReq())
    assert dev.expect(PingResp) == PingResp()


def test_each_refusal_adds_one_to_publish_refused() -> None:
    """A counter added to, not set: the second refusal of each kind makes it 2."""
    h = SnHarness()
    dev = h.device()
    dev.connect()
    for _ in range(2):
        dev.publish(42, b"x", qos=1)
    assert h.gateway.stats.publish_refused == 2
    dev.take()
    tid = dev.register("$SYS/x").topic_id
    for _ in range(2):
        dev.publish(tid, b"x", qos=1)
    assert h.gateway.stats.publish_refused == 4
    dev.take()
    ok = dev.register("q/2").topic_id
    for _ in range(16):
        dev.publish(ok, b"x", qos=2)
    for _ in range(2):
        dev.publish(ok, b"x", qos=2)
    assert h.gateway.stats.publish_refused == 6


def test_each_qos_minus_one_refusal_adds_one() -> None:
    h = SnHarness(predefined_topics={1: "p/one", 2: "$SYS/x"})
    dev = h.device()
    for _ in range(2):
        dev.publish(1, b"n", qos=-1, id_type=TopicIdType.NORMAL)
    assert h.gateway.stats.publish_refused == 2
    for _ in range(2):
        dev.publish(9, b"u", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert h.gateway.stats.publish_refused == 4
    for _ in range(2):
        dev.publish(2, b"s", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert h.gateway.stats.publish_refused == 6
    off = SnHarness(predefined_topics={1: "p/one"}, qos_minus_one=False)
    for _ in range(2):
        off.device().publish(1, b"x", qos=-1, id_type=TopicIdType.PREDEFINED)
    assert off.gateway.stats.publish_refused == 2


def test_a_node_behind_a_forwarder_publishes_retained_qos1() -> None:
    """A forwarded PUBLISH takes the decoded path: its flags and time count the same."""
    h = SnHarness()
    w = watcher(h, qos=1)
    node = h.device("ttyS0", transport="uart", node_id=b"\x00\x05")
    node.connect("n5", 10)
    tid = node.register("n/5").topic_id
    h.advance(14)
    pid = node.publish(tid, b"v", qos=1, retain=True)
    assert node.expect(PubAck) == PubAck(tid, pid, ReturnCode.ACCEPTED)
    assert mqtt_messages(w) == [("n/5", b"v", 1, False)]
    assert [m.payload for m in h.broker.retained.matching("n/5", h.now)] == [b"v"]
    h.advance(14.9)
    assert "n5" in h.gateway.by_id
