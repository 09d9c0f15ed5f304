"""How the bridge takes a local message into its outbox and hands it to the remote: marks,
loops, QoS 0 bypass, expiry, sequence numbers, the 3.1.1 envelope and MQTT 5
properties, refusals, echoes, a successor after a reload, and the TLS context."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from drivers.envelope import GATEWAY_PROPERTY, SEQUENCE_PROPERTY, open_envelope
from gateway.bridge import link
from gateway.bridge.link import BYPASS_QUEUE, ECHO_ENTRIES, ECHO_SECONDS, Bridge, EchoFilter
from gateway.bridge.outbox import Entry
from gateway.bridge.sequence import BLOCK, META_KEY, Sequence
from gateway.bridge.settings import RuleSettings, TlsSettings
from gateway.broker.journal import Journal, PutOutbox, SetMeta
from gateway.broker.message import Message
from gateway.mqtt.properties import Properties, Where, decode_properties, encode_properties
from gateway.store.sqlite import Store
from tests.support.bridge_world import (
    GATEWAY,
    UP,
    World,
    bridge_settings,
    listen,
)
from tests.support.certs import _ca


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    yield made
    made.close()


def marks(gateway: str, seq: int, **others: Any) -> Properties:
    """Properties carrying a Ledge bridge's marks (and ``others``)."""
    return Properties(
        user_properties=((GATEWAY_PROPERTY, gateway), (SEQUENCE_PROPERTY, str(seq))), **others
    )


def decoded(data: bytes) -> Properties:
    props, _ = decode_properties(data, 0, len(data), Where.PUBLISH)
    return props


def queued(bridge: Bridge) -> list[Entry]:
    return list(bridge.outbox.mem)


def run(story: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(story())


@dataclass
class Sent:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: object


class Info:
    """What paho's publish returns."""

    def __init__(self, rc: int, mid: int, published: bool) -> None:
        self.rc = rc
        self.mid = mid
        self._published = published

    def is_published(self) -> bool:
        return self._published


class FakePaho:
    """Stands in for paho's client: records each publish and answers as told."""

    def __init__(self, rc: int = mqtt.MQTT_ERR_SUCCESS, published: bool = False) -> None:
        self.rc = rc
        self.published = published
        self.sent: list[Sent] = []

    def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool, properties: object = None
    ) -> Info:
        self.sent.append(Sent(topic, payload, qos, retain, properties))
        return Info(self.rc, len(self.sent), self.published)


def packed(sent: Sent) -> Properties:
    """The MQTT 5 properties handed to paho with ``sent``, decoded."""
    assert isinstance(sent.properties, link._Packed), sent.properties
    return decoded(sent.properties.pack())


class Wakes:
    """Counts the broker's wake-ups (the shell's hook)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


# ---------------------------------------------------------------------- into the outbox


def test_a_message_no_rule_maps_is_counted_as_unmapped_and_not_queued(world: World) -> None:
    """``a/#`` matches ``a/``, but with the prefix taken off no remote topic is left."""
    bridge = world.bridge(bridge_settings(RuleSettings("#", local_prefix="a/")))
    device = world.device()
    device.publish("a/", b"1", world.h.now, qos=1)
    device.publish("a/x", b"2", world.h.now, qos=1)
    device.publish("a/", b"3", world.h.now, qos=1)
    assert bridge.stats.unmapped == 2
    assert [(e.topic, e.payload) for e in queued(bridge)] == [("x", b"2")]


def test_a_local_message_enters_the_outbox_mapped_numbered_and_stamped_with_the_wall_clock(
    world: World,
) -> None:
    bridge = world.bridge(sequence=Sequence(500))
    device = world.device()
    own = Properties(content_type="text/plain", user_properties=(("site", "n"),))
    device.publish("t/a", b"1", world.h.now, qos=2, retain=True, properties=own)
    world.wall.now = 5001.5
    device.publish("t/b", b"2", world.h.now, qos=1)
    first, second = queued(bridge)
    assert (first.pos, first.seq, first.topic, first.payload) == (1, 500, "fleet/t/a", b"1")
    assert (first.qos, first.retain) == (1, True)  # the rule's QoS 1 caps it
    assert first.properties == encode_properties(own)
    assert first.created == 5000.0 and first.expires is None and first.batch == 0
    assert (second.pos, second.seq, second.topic) == (2, 501, "fleet/t/b")
    assert second.properties == b""  # no properties: nothing to pass on
    assert second.created == 5001.5
    # Nothing to wait for without a store: both may go at once.
    assert bridge.outbox.next_ready(world.wall()) is first
    assert bridge.outbox.next_ready(world.wall()) is second


def test_bridges_handed_the_same_message_give_it_the_same_number(world: World) -> None:
    sequence = Sequence(500)
    cloud = world.bridge(sequence=sequence)
    backup = world.bridge(bridge_settings(name="backup"), sequence=sequence)
    device = world.device()
    device.publish("t/a", b"1", world.h.now, qos=1)
    device.publish("t/b", b"2", world.h.now, qos=1)
    assert [e.seq for e in queued(cloud)] == [500, 501]
    assert [e.seq for e in queued(backup)] == [500, 501]
    assert sequence.next == 502


def test_a_message_marked_by_another_gateway_keeps_its_first_marks(world: World) -> None:
    sequence = Sequence(500)
    bridge = world.bridge(sequence=sequence)
    world.device().publish("t/a", b"1", world.h.now, qos=1, properties=marks("gw2", 77))
    (entry,) = queued(bridge)
    assert entry.seq == 77
    assert decoded(entry.properties).user_properties == marks("gw2", 77).user_properties
    assert sequence.next == 500  # no number of this gateway's was used
    assert bridge.stats.loops == 0


def test_a_message_marked_with_this_gateways_id_is_a_loop_dropped_and_logged_ever_more_rarely(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Marked here, gone out and come back through someone else: dropped and counted; the
    warning names the count, for the 1st, 2nd, 4th, 8th... of them."""
    caplog.set_level(logging.WARNING, logger="ledge.bridge")
    bridge = world.bridge()
    device = world.device()
    for i in range(10):
        device.publish(f"t/{i}", b"x", world.h.now, qos=1, properties=marks(GATEWAY, 40 + i))
    assert bridge.stats.loops == 10
    assert queued(bridge) == [] and bridge.outbox.stats.queued == 0
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ledge.bridge"]
    assert lines == [
        (
            logging.WARNING,
            f"bridge cloud: dropped 't/{n - 1}', marked with this gateway's id "
            f"(a loop; {n} so far)",
        )
        for n in (1, 2, 4, 8)
    ]


def test_this_gateways_mark_on_what_another_of_its_bridges_brought_in_is_no_loop(
    world: World,
) -> None:
    """A bridge of this gateway stamped it coming in: it goes up with those marks."""
    sequence = Sequence(500)
    cloud = world.bridge(sequence=sequence)
    down = world.bridge(bridge_settings(RuleSettings("d/#"), name="down"), sequence=sequence)
    down.local.publish("t/cmd", b"1", world.h.now, qos=1, properties=marks(GATEWAY, 42))
    (entry,) = queued(cloud)
    assert (entry.topic, entry.seq) == ("fleet/t/cmd", 42)
    assert cloud.stats.loops == 0 and sequence.next == 500


def test_an_expiring_message_expires_in_the_outbox_after_what_is_left_of_its_interval(
    world: World,
) -> None:
    bridge = world.bridge()
    world.device().publish(
        "t/a", b"1", world.h.now, qos=1, properties=Properties(message_expiry_interval=30)
    )
    now = world.h.now
    bridge._sink(Message("t/b", b"2", 1, expiry_interval=30, created=now - 10), 1, False, ())
    bridge._sink(Message("t/c", b"3", 1, expiry_interval=30, created=now - 100), 1, False, ())
    fresh, waited, late = queued(bridge)
    assert fresh.expires == 5030.0
    assert waited.expires == 5020.0
    assert late.expires == 5000.0  # already over: due now, never in the past
    assert fresh.properties == b""  # the interval travels as the entry's expiry only


def test_with_a_store_an_entry_waits_for_its_batch_and_its_number_is_reserved_there(
    world: World, tmp_path: Path
) -> None:
    journal = Journal()
    journal.batch_id = 7
    world.h.broker.journal = journal
    sequence = Sequence(10, reserved=10 + BLOCK // 2)  # the next number crosses half a block
    bridge = world.bridge(sequence=sequence, store=Store(tmp_path))
    world.device().publish("t/a", b"1", world.h.now, qos=1)
    (entry,) = queued(bridge)
    assert (entry.seq, entry.batch) == (10, 7)
    reserved = 10 + BLOCK // 2 + BLOCK
    puts = [op for op in journal.ops if isinstance(op, PutOutbox)]
    assert [(p.bridge, p.pos, p.seq, p.topic) for p in puts] == [("cloud", 1, 10, "fleet/t/a")]
    assert SetMeta(META_KEY, str(reserved)) in journal.ops
    assert bridge.outbox.next_ready(world.wall()) is None  # batch 7 not yet committed
    sequence.commit(6)
    assert sequence.limit == 10 + BLOCK // 2
    sequence.commit(7)  # the reservation went into batch 7
    assert sequence.limit == reserved


def test_without_a_store_nothing_waits_for_a_batch_even_with_a_journal(world: World) -> None:
    journal = Journal()
    journal.batch_id = 7
    world.h.broker.journal = journal
    bridge = world.bridge(sequence=Sequence(10))
    world.device().publish("t/a", b"1", world.h.now, qos=1)
    (entry,) = queued(bridge)
    assert entry.batch == 0
    assert not any(isinstance(op, PutOutbox) for op in journal.ops)
    assert bridge.outbox.next_ready(world.wall()) is entry


def test_without_a_journal_no_reservation_is_made(world: World) -> None:
    sequence = Sequence(10, reserved=10 + BLOCK // 2)
    bridge = world.bridge(sequence=sequence)
    world.device().publish("t/a", b"1", world.h.now, qos=1)
    assert [e.seq for e in queued(bridge)] == [10]
    assert sequence.reserved == 10 + BLOCK // 2


# ---------------------------------------------------------------------- QoS 0 bypass


def test_with_qos0_bypass_qos_0_skips_the_outbox_while_connected_and_qos_1_does_not(
    world: World,
) -> None:
    bridge = world.bridge(bridge_settings(qos0="bypass"))
    bridge.state = "connected"
    device = world.device()
    device.publish("t/a", b"0", world.h.now, qos=0)
    device.publish("t/b", b"1", world.h.now, qos=1)
    assert [(e.topic, e.seq, e.pos, e.batch) for e in bridge._bypass] == [("fleet/t/a", 500, 0, 0)]
    assert [e.topic for e in queued(bridge)] == ["fleet/t/b"]
    assert bridge.stats.dropped_qos0_offline == 0
    # Sent at once, nothing to wait for: not counted against the window.
    paho = FakePaho()
    bridge._send_entry(paho, bridge._bypass[0])
    assert [(s.topic, s.payload, s.qos) for s in paho.sent] == [("fleet/t/a", b"0", 0)]
    assert bridge.inflight == 0 and bridge._pending == {}


def test_with_qos0_bypass_qos_0_is_dropped_and_counted_while_not_connected(
    world: World,
) -> None:
    bridge = world.bridge(bridge_settings(qos0="bypass"))
    assert bridge.state == "disconnected"
    device = world.device()
    device.publish("t/a", b"0", world.h.now, qos=0)
    device.publish("t/b", b"1", world.h.now, qos=1)
    device.publish("t/c", b"0", world.h.now, qos=0)
    assert bridge.stats.dropped_qos0_offline == 2
    assert bridge._bypass == []
    assert [e.topic for e in queued(bridge)] == ["fleet/t/b"]


def test_with_qos0_in_the_outbox_qos_0_is_queued_like_the_rest(world: World) -> None:
    bridge = world.bridge(bridge_settings(qos0="outbox"))
    world.device().publish("t/a", b"0", world.h.now, qos=0)
    assert [(e.topic, e.qos) for e in queued(bridge)] == [("fleet/t/a", 0)]
    assert bridge._bypass == [] and bridge.stats.dropped_qos0_offline == 0


def test_the_bypass_queue_takes_bypass_queue_messages_and_drops_beyond(world: World) -> None:
    bridge = world.bridge(bridge_settings(qos0="bypass"))
    bridge.state = "connected"
    device = world.device()
    for i in range(BYPASS_QUEUE):
        device.publish(f"t/{i}", b"0", world.h.now)
    assert len(bridge._bypass) == BYPASS_QUEUE
    assert bridge.stats.dropped_qos0_offline == 0
    device.publish("t/more", b"0", world.h.now)
    assert len(bridge._bypass) == BYPASS_QUEUE
    assert bridge.stats.dropped_qos0_offline == 1
    assert bridge._bypass[-1].topic == f"fleet/t/{BYPASS_QUEUE - 1}"


# ---------------------------------------------------------------------- to the remote


def entry(
    seq: int = 42,
    properties: Properties | None = None,
    *,
    pos: int = 1,
    expires: float | None = None,
) -> Entry:
    encoded = encode_properties(properties) if properties is not None else b""
    return Entry(pos, seq, "fleet/t", b"21.5", 1, False, encoded, 5000.0, expires)


def test_mqtt5_sends_this_gateways_marks_with_an_unmarked_message(world: World) -> None:
    bridge = world.bridge()
    paho = FakePaho()
    bridge._send_entry(paho, entry(42))
    (sent,) = paho.sent
    assert (sent.topic, sent.payload, sent.qos, sent.retain) == ("fleet/t", b"21.5", 1, False)
    assert packed(sent).user_properties == marks(GATEWAY, 42).user_properties


def test_mqtt5_sends_a_marked_message_with_its_first_marks_only(world: World) -> None:
    bridge = world.bridge()
    paho = FakePaho()
    bridge._send_entry(paho, entry(77, marks("gw2", 77, content_type="text/plain")))
    props = packed(paho.sent[0])
    assert props.user_properties == marks("gw2", 77).user_properties
    assert props.content_type == "text/plain"
    assert paho.sent[0].payload == b"21.5"


def test_mqtt5_sends_the_expiry_left_when_it_goes(world: World) -> None:
    """Published with 30 s to live, sent 10.5 s later: 20 s (rounded up) are left."""
    bridge = world.bridge()
    world.device().publish(
        "t/a", b"1", world.h.now, qos=1, properties=Properties(message_expiry_interval=30)
    )
    world.wall.now += 10.5
    ready = bridge.outbox.next_ready(world.wall())
    assert ready is not None
    paho = FakePaho()
    bridge._send_entry(paho, ready)
    props = packed(paho.sent[0])
    assert props.message_expiry_interval == 20
    assert props.user_properties == marks(GATEWAY, 500).user_properties


@pytest.mark.parametrize(
    ("mark", "gateway", "seq"), [(None, GATEWAY, 42), (("gw2", 77), "gw2", 77)]
)
def test_over_mqtt_311_the_envelope_carries_the_first_gateway_and_the_number(
    world: World, mark: tuple[str, int] | None, gateway: str, seq: int
) -> None:
    bridge = world.bridge(bridge_settings(protocol="3.1.1", envelope=True))
    assert bridge.echo is None  # the envelope's marks tell echoes apart
    props = marks(*mark) if mark is not None else None
    paho = FakePaho()
    bridge._send_entry(paho, entry(seq, props))
    (sent,) = paho.sent
    assert sent.properties is None  # 3.1.1 has no properties
    assert open_envelope(sent.payload) == (gateway, seq, b"21.5")
    assert (sent.topic, sent.qos, sent.retain) == ("fleet/t", 1, False)


def test_over_mqtt_311_without_the_envelope_the_payload_goes_as_it_is_and_is_remembered(
    world: World,
) -> None:
    bridge = world.bridge(bridge_settings(protocol="3.1.1"))
    paho = FakePaho()
    bridge._send_entry(paho, entry(42))
    (sent,) = paho.sent
    assert (sent.payload, sent.properties) == (b"21.5", None)
    assert bridge.echo is not None
    assert bridge.echo.is_echo("fleet/t", b"21.5", time.monotonic())


def test_a_publish_paho_refuses_breaks_the_link_with_paho_s_reason(world: World) -> None:
    bridge = world.bridge()
    paho = FakePaho(rc=mqtt.MQTT_ERR_NO_CONN)
    with pytest.raises(ConnectionError) as info:
        bridge._send_entry(paho, entry(42))
    assert str(info.value) == "publish failed: The client is not currently connected."
    assert bridge.inflight == 0 and bridge._pending == {}


def test_an_entry_written_at_once_is_done_at_once(world: World) -> None:
    """paho says a QoS 0 entry of the outbox was written: it leaves the outbox then."""
    wakes = Wakes()

    async def story() -> None:
        bridge = world.bridge(bridge_settings(RuleSettings("t/#", qos=0)))
        world.device().publish("t/a", b"1", world.h.now)
        ready = bridge.outbox.next_ready(world.wall())
        assert ready is not None and ready.qos == 0
        world.h.broker.wake = wakes
        bridge._send_entry(FakePaho(published=True), ready)
        assert bridge.inflight == 0 and bridge._pending == {}
        assert bridge.outbox.count == 0 and bridge.outbox.stats.acknowledged == 1
        assert bridge.stats.rejected == 0
        await asyncio.sleep(0)  # one turn of the loop
        assert wakes.count == 1

    run(story)


def test_a_refusal_by_the_remote_drops_the_message_counts_and_warns(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A reason code of 0x80 or above is a refusal; below it the message went."""
    caplog.set_level(logging.WARNING, logger="ledge.bridge")

    async def story() -> None:
        bridge = world.bridge()
        device = world.device()
        for name in ("a", "b", "c", "d"):
            device.publish(f"t/{name}", b"1", world.h.now, qos=1)
        paho = FakePaho()
        while (ready := bridge.outbox.next_ready(world.wall())) is not None:
            bridge._send_entry(paho, ready)
        assert bridge.inflight == 4 and sorted(bridge._pending) == [1, 2, 3, 4]
        for mid, reason in ((1, 0x00), (2, 0x10), (3, 0x80), (4, 0x8A)):
            bridge.on_publish(mid, reason)
        assert bridge.stats.rejected == 2
        assert bridge.inflight == 0 and bridge._pending == {}
        assert bridge.outbox.count == 0 and bridge.outbox.stats.acknowledged == 4
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (
                logging.WARNING,
                f"bridge cloud: the remote refused the message on 'fleet/t/{name}' "
                f"(reason code 0x{code}); dropped",
            )
            for name, code in (("c", "80"), ("d", "8A"))
        ]

    run(story)


def test_acknowledgements_in_one_turn_wake_the_shell_once(world: World) -> None:
    wakes = Wakes()

    async def story() -> None:
        bridge = world.bridge()
        device = world.device()
        for name in ("a", "b", "c"):
            device.publish(f"t/{name}", b"1", world.h.now, qos=1)
        paho = FakePaho()
        while (ready := bridge.outbox.next_ready(world.wall())) is not None:
            bridge._send_entry(paho, ready)
        world.h.broker.wake = wakes
        bridge.on_publish(1, 0)
        bridge.on_publish(2, 0)
        assert wakes.count == 0  # not before the end of this turn
        await asyncio.sleep(0)
        assert wakes.count == 1
        bridge.on_publish(3, 0)
        await asyncio.sleep(0)
        assert wakes.count == 2
        await asyncio.sleep(0)
        assert wakes.count == 2

    run(story)


# ---------------------------------------------------------------------- MQTT 5 properties


def test_the_properties_of_a_plain_entry_are_the_marks_or_nothing(world: World) -> None:
    bridge = world.bridge()
    assert decoded(bridge._properties(entry(42), True).pack()) == marks(GATEWAY, 42)
    assert bridge._properties(entry(42), False).pack() == b"\x00"


def test_the_publishers_properties_go_up_as_they_were(world: World) -> None:
    bridge = world.bridge()
    own = Properties(content_type="text/plain", user_properties=(("site", "n"),))
    assert bridge._properties(entry(42, own), False).pack() == encode_properties(own)


@pytest.mark.parametrize(
    ("left", "interval"),
    [
        (0.3, 1),  # a fraction of a second: rounded up
        (20.0, 20),
        (-5.0, 1),  # over by now: the least there is
        (1e10, 0xFFFF_FFFF),  # beyond what the property holds
    ],
)
def test_the_expiry_interval_sent_is_what_is_left_in_whole_seconds(
    world: World, left: float, interval: int
) -> None:
    bridge = world.bridge()
    props = decoded(bridge._properties(entry(42, expires=world.wall() + left), False).pack())
    assert props == Properties(message_expiry_interval=interval)


def test_the_marks_in_encoded_properties_are_read_back() -> None:
    assert link._mark_bytes(b"") is None
    assert link._mark_bytes(encode_properties(marks("gw2", 77))) == ("gw2", 77)
    assert link._mark_bytes(encode_properties(Properties(content_type="x"))) is None
    unnumbered = Properties(user_properties=((GATEWAY_PROPERTY, "gw2"), (SEQUENCE_PROPERTY, "x")))
    assert link._mark_bytes(encode_properties(unnumbered)) is None


def test_packed_properties_show_what_they_hold() -> None:
    props = marks("gw2", 77, content_type="text/plain")
    data = encode_properties(props)
    shown = link._Packed(data)
    assert shown.pack() == data
    assert repr(shown) == repr(props)
    assert repr(shown) == (
        "Properties(content_type='text/plain', "
        "user_properties=(('ledge-gateway', 'gw2'), ('ledge-seq', '77')))"
    )


# ---------------------------------------------------------------------- echoes


def test_the_echo_filter_keeps_the_newest_echo_entries_and_forgets_the_oldest_first() -> None:
    echo = EchoFilter()
    for i in range(ECHO_ENTRIES + 1):
        echo.sent(f"t/{i}", b"p", 1000.0)
    assert not echo.is_echo("t/0", b"p", 1001.0)
    assert echo.is_echo("t/1", b"p", 1001.0)
    assert echo.is_echo(f"t/{ECHO_ENTRIES}", b"p", 1001.0)
    kept = sum(echo.is_echo(f"t/{i}", b"p", 1001.0) for i in range(2, ECHO_ENTRIES))
    assert kept == ECHO_ENTRIES - 2  # with the two above: ECHO_ENTRIES in all


def test_an_echo_counts_until_echo_seconds_have_passed_and_once() -> None:
    echo = EchoFilter()
    echo.sent("t", b"p", 1000.0)
    assert echo.is_echo("t", b"p", 1000.0 + ECHO_SECONDS - 0.5)
    assert not echo.is_echo("t", b"p", 1000.0 + ECHO_SECONDS - 0.5)  # taken already
    echo.sent("t", b"p", 1000.0)
    assert not echo.is_echo("t", b"p", 1000.0 + ECHO_SECONDS)
    echo.sent("t", b"p", 1000.0)
    assert not echo.is_echo("t", b"other", 1000.0)


# ---------------------------------------------------------------------- reload and removal


@pytest.mark.parametrize("durable", [True, False], ids=["store", "memory"])
def test_a_successor_keeps_prefix_store_wall_clock_and_outbox(
    world: World, tmp_path: Path, durable: bool
) -> None:
    journal = Journal()
    journal.batch_id = 3
    world.h.broker.journal = journal
    store = Store(tmp_path) if durable else None
    status = RuleSettings("ledge/gw1/status", remote_prefix="site/")
    old = world.bridge(bridge_settings(UP, status), store=store)
    world.device().publish("t/a", b"1", world.h.now, qos=1)

    async def story() -> None:
        world.wall.now = 6000.0
        new = old.successor(bridge_settings(RuleSettings("u/#", remote_prefix="new/"), status))
        try:
            assert new.prefix == "ledge" and new._status_topic == "site/ledge/gw1/status"
            assert new.store is store
            assert new.since == 6000.0  # the gateway's wall clock, not the system's
            assert new.outbox is old.outbox and new.stats is old.stats
            journal.ops.clear()
            listen(new, world.h.now)
            world.device("other").publish("u/b", b"2", world.h.now, qos=1)
            assert [(e.topic, e.created) for e in queued(new)] == [
                ("fleet/t/a", 5000.0),
                ("new/u/b", 6000.0),
            ]
            added = queued(new)[1]
            puts = [(op.bridge, op.topic) for op in journal.ops if isinstance(op, PutOutbox)]
            if durable:
                assert added.batch == 3 and puts == [("cloud", "new/u/b")]
            else:
                assert added.batch == 0 and puts == []
        finally:
            new.detach()

    run(story)


def test_a_detached_bridge_takes_no_more_messages_and_leaves_the_log_alone(
    world: World,
) -> None:
    bridge = world.bridge()
    mqtt_log = logging.getLogger("ledge.bridge.cloud")
    assert bridge._repeats in mqtt_log.filters
    bridge.detach()
    assert bridge._repeats not in mqtt_log.filters
    assert "ledge-bridge-cloud" not in world.h.broker.sessions
    assert "ledge-bridge-cloud" not in Bridge.local_ids
    world.device().publish("t/a", b"1", world.h.now, qos=1)
    assert bridge.outbox.count == 0 and bridge.stats.unmapped == 0


# ---------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cert, _key = _ca(tmp_path_factory.mktemp("ca"), "ledge-bridge-test-ca")
    return cert


def trusted(context: ssl.SSLContext) -> list[object]:
    """The subjects of the CAs ``context`` trusts from its CA file."""
    return [cert["subject"] for cert in context.get_ca_certs()]


#: The subject of the test CA.
TEST_CA = ((("commonName", "ledge-bridge-test-ca"),),)


def test_the_tls_context_verifies_the_remote_by_the_ca_file_and_its_name(ca_file: Path) -> None:
    context = link._tls_context(
        bridge_settings(tls=TlsSettings(enabled=True, ca_file=str(ca_file)))
    )
    assert context.check_hostname is True
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert TEST_CA in trusted(context)


def test_an_insecure_tls_context_still_verifies_the_certificate_but_not_the_name(
    ca_file: Path,
) -> None:
    tls = TlsSettings(enabled=True, ca_file=str(ca_file), insecure=True)
    context = link._tls_context(bridge_settings(tls=tls))
    assert context.check_hostname is False
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert TEST_CA in trusted(context)
