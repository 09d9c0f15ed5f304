"""MQTT-SN output: every datagram counted once, answers held for a store commit and
released in order (to a node behind a forwarder too), the shell kicked only when
there is something to send, message ids and their wrap, sparse log lines.

In-process, on the real broker core and the fake clock of ``tests.support.mqttsn``.
"""

from __future__ import annotations

import logging

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.broker.journal import Journal
from gateway.mqtt import MQTT_311
from gateway.mqttsn.codec import decode
from gateway.mqttsn.encoding import encode
from gateway.mqttsn.gateway import Gateway
from gateway.mqttsn.packets import (
    Advertise,
    ConnAck,
    Connect,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    ReturnCode,
    SubAck,
    Subscribe,
    TopicIdType,
    UnsubAck,
    Unsubscribe,
)
from gateway.mqttsn.state import TransportPolicy
from tests.support.mqttsn import SnHarness

LOGGER = "ledge.mqttsn"


def test_messages_sent_counts_each_datagram_once() -> None:
    h = SnHarness([TransportPolicy("udp", can_broadcast=True)], advertise_interval=30)
    h.advance(0)
    assert [type(p) for p in h.broadcasts()] == [Advertise]
    sent = h.gateway.stats.messages_sent
    assert sent == 1
    dev = h.device()
    dev.connect()
    dev.register("a")
    dev.ping()
    assert h.gateway.stats.messages_sent == sent + 3
    h.advance(30)
    assert len(h.broadcasts()) == 1
    assert h.gateway.stats.messages_sent == sent + 4


def test_held_answers_are_counted_and_released_encapsulated_to_their_node() -> None:
    h = SnHarness()
    h.broker.journal = Journal()
    node = h.device("ttyS0", transport="uart", node_id=b"\x00\x07")
    node.connect("n7")
    tid = node.register("state/x").topic_id
    sent = h.gateway.stats.messages_sent
    pid = node.publish(tid, b"kept", qos=1, retain=True)
    node.send(PingReq())
    node.nothing()
    assert h.gateway.stats.messages_sent == sent + 2
    batch = h.broker.seal_batch()
    assert batch is not None
    h.gateway.committed(batch[0])
    assert node.take() == [PubAck(tid, pid, ReturnCode.ACCEPTED), PingResp()]
    assert h.gateway.stats.messages_sent == sent + 2


def test_after_its_commit_a_client_is_answered_at_once_again() -> None:
    h = SnHarness()
    h.broker.journal = Journal()
    kicks: list[int] = []
    h.gateway.kick = lambda: kicks.append(1)
    dev = h.device()
    dev.connect()
    tid = dev.register("state/x").topic_id
    dev.publish(tid, b"kept", qos=1, retain=True)
    batch = h.broker.seal_batch()
    assert batch is not None
    kicks.clear()
    h.gateway.committed(batch[0] - 1)  # an earlier batch: nothing to release
    assert kicks == []
    h.gateway.committed(batch[0])
    assert kicks == [1]
    assert dev.expect(PubAck).return_code == ReturnCode.ACCEPTED
    dev.send(PingReq())  # nothing held any more: straight out
    assert dev.take() == [PingResp()]


def test_message_ids_to_a_client_count_up_and_wrap_to_one() -> None:
    h = SnHarness()
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect("d1")
    dev.subscribe("in", qos=1)
    mqtt.publish("in", b"1", qos=1)
    first = dev.expect(Publish)
    dev.ack(first)
    mqtt.publish("in", b"2", qos=1)
    second = dev.expect(Publish)
    dev.ack(second)
    assert second.msg_id == first.msg_id + 1
    h.gateway.by_id["d1"].next_msg_id = 0xFFFF
    ids = []
    for n in (b"3", b"4"):
        mqtt.publish("in", n, qos=1)
        pub = dev.expect(Publish)
        ids.append(pub.msg_id)
        dev.ack(pub)
    assert ids == [0xFFFF, 1]


def test_evictions_are_logged_sparsely(caplog: pytest.LogCaptureFixture) -> None:
    """The 1st, 2nd, 4th, 8th ... eviction is logged: a flood stays readable."""
    h = SnHarness(max_clients=2, unproven_grace=0)
    keeper = h.device(("10.0.0.1", 1))
    keeper.connect("keeper")
    keeper.ping()
    for i in range(9):
        h.device((f"10.0.1.{i}", 1)).connect(f"g{i}")
        h.advance(1)
    assert h.gateway.stats.clients_evicted_unproven == 8
    lines = [r.getMessage() for r in caplog.records if "since its CONNACK" in r.getMessage()]
    assert [line.rsplit("(", 1)[1] for line in lines] == [
        "1 evicted so far)",
        "2 evicted so far)",
        "4 evicted so far)",
        "8 evicted so far)",
    ]


def test_publish_refusals_are_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness()
    dev = h.device()
    dev.connect()
    tid = dev.register("$SYS/x").topic_id
    dev.publish(tid, b"x", qos=1)
    (record,) = [r for r in caplog.records if "PUBLISH on" in r.getMessage()]
    assert record.levelno == logging.INFO


# ---------------------------------------------------------------------- SUBSCRIBE (6.9)


def test_subscribe_answers_carry_their_ids_and_granted_qos() -> None:
    h = SnHarness(max_topics_per_client=1, predefined_topics={3: "p/three"})
    dev = h.device()
    dev.connect()
    dev.send(Subscribe(51, "a", -1))
    assert dev.expect(SubAck) == SubAck(0, 51, ReturnCode.NOT_SUPPORTED)
    dev.send(Subscribe(52, "a", 2))
    assert dev.expect(SubAck) == SubAck(1, 52, ReturnCode.ACCEPTED, 2)
    dev.send(Subscribe(53, "b", 1))  # the topic table is full: no id yet
    assert dev.expect(SubAck) == SubAck(0, 53, ReturnCode.ACCEPTED, 1)
    dev.send(Subscribe(54, 3, 1, TopicIdType.PREDEFINED))
    assert dev.expect(SubAck) == SubAck(3, 54, ReturnCode.ACCEPTED, 1)
    dev.send(Subscribe(55, 9, 1, TopicIdType.PREDEFINED))
    assert dev.expect(SubAck) == SubAck(9, 55, ReturnCode.INVALID_TOPIC_ID)


def test_a_refused_subscribe_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    h = SnHarness(acl=parse_acl_file("pattern readwrite devices/%c/#\n"))
    dev = h.device()
    dev.connect("d1")
    dev.send(Subscribe(5, "elsewhere/x", 1))
    ack = dev.expect(SubAck)
    assert (ack.msg_id, ack.return_code) == (5, ReturnCode.NOT_SUPPORTED)
    other = h.device(("10.0.0.3", 1))  # another source: its own line
    other.connect("d2")
    other.send(Subscribe(6, "elsewhere/y", 1))
    other.expect(SubAck)
    lines = [r.getMessage() for r in caplog.records if "SUBSCRIBE" in r.getMessage()]
    assert len(lines) == 2
    assert lines == [
        "client 'd1': SUBSCRIBE 'elsewhere/x' refused: not authorized by the ACL",
        "client 'd2': SUBSCRIBE 'elsewhere/y' refused: not authorized by the ACL",
    ]


def test_unsubscribe_of_a_predefined_id_stops_delivery_and_unknown_ids_are_acked() -> None:
    h = SnHarness(predefined_topics={3: "p/three"})
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    dev = h.device()
    dev.connect()
    dev.subscribe(3, 0, TopicIdType.PREDEFINED)
    dev.subscribe("s/plain", 0)
    dev.send(Unsubscribe(60, 9, TopicIdType.PREDEFINED))
    assert dev.expect(UnsubAck) == UnsubAck(60)
    dev.send(Unsubscribe(61, 3, TopicIdType.PREDEFINED))
    assert dev.expect(UnsubAck) == UnsubAck(61)
    dev.send(Unsubscribe(62, "s/plain"))
    assert dev.expect(UnsubAck) == UnsubAck(62)
    mqtt.publish("p/three", b"x", qos=0)
    mqtt.publish("s/plain", b"y", qos=0)
    dev.nothing()


def test_the_shell_is_kicked_by_the_gateway_it_built() -> None:
    """``kick`` given to the constructor is what tells the shell there is output."""
    h = SnHarness()
    kicks: list[int] = []
    gw = Gateway(
        h.broker, h.settings, [TransportPolicy("udp")], now=h.now, kick=lambda: kicks.append(1)
    )
    gw.received("udp", ("10.0.0.2", 1), encode(Connect("k1", 60)), h.now)
    assert kicks == [1]
    assert [decode(d) for _t, _a, d in gw.take_output()] == [ConnAck(ReturnCode.ACCEPTED)]
