"""The bridge's own state in process: $SYS values, link state, store paging, gate, inbound."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, cast

import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from drivers.envelope import GATEWAY_PROPERTY, SEQUENCE_PROPERTY, envelope
from gateway.bridge import link
from gateway.bridge.aiomqtt_client import HookedClient
from gateway.bridge.link import DONE_DELAY, Bridge
from gateway.bridge.outbox import Entry
from gateway.bridge.sequence import BLOCK, META_KEY, Sequence
from gateway.bridge.settings import REFUSE, OutboxSettings, RuleSettings
from gateway.broker import systopics
from gateway.broker.journal import Journal, PutOutbox, RemoveOutbox, SetMeta
from gateway.mqtt import MQTT_5, PubAck, Publish
from gateway.mqtt.properties import EMPTY, Properties
from gateway.mqtt.reason_codes import ReasonCode
from gateway.store.settings import OUTBOX_ENTRY_OVERHEAD
from gateway.store.sqlite import Store
from tests.support.bridge_world import (
    GATEWAY,
    UP,
    HarnessBridge,
    Watcher,
    World,
    bridge_settings,
)
from tests.support.wait import async_wait_for

#: Commands come down from ``fleet/gw1/cmd/...`` to ``cloud/cmd/...``.
DOWN = RuleSettings(
    "cmd/#", direction="in", qos=1, local_prefix="cloud/", remote_prefix="fleet/gw1/"
)
#: Every value the bridge reports under ``$SYS/broker/bridge/<name>/``, in its order.
SYS_KEYS = (
    "address",
    "queued",
    "bytes",
    "sent",
    "acknowledged",
    "inflight",
    "window",
    "dropped",
    "dropped/full",
    "dropped/expired",
    "dropped/qos 0 offline",
    "dropped/rejected",
    "dropped/loops",
    "refused",
    "received",
    "oldest message age",
    "connects",
)


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    yield made
    made.close()


def run(story: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(story())


class Info:
    """What paho's publish returns."""

    def __init__(self, rc: int, mid: int, published: bool) -> None:
        self.rc = rc
        self.mid = mid
        self._published = published

    def is_published(self) -> bool:
        return self._published

    def wait_for_publish(self, timeout: float | None = None) -> None:
        return None


class FakePaho:
    """Stands in for paho's client: records each publish (topic, payload, QoS, retain)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, int, bool]] = []

    def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool, properties: object = None
    ) -> Info:
        self.sent.append((topic, payload, qos, retain))
        return Info(mqtt.MQTT_ERR_SUCCESS, len(self.sent), False)


class FakeLink:
    """Stands in for the aiomqtt client the sender is handed: only its paho client."""

    def __init__(self) -> None:
        self.paho = FakePaho()


class Wakes:
    """Counts the broker's wake-ups (the shell's hook)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def marks(gateway: str, seq: int, **others: Any) -> Properties:
    """Properties carrying a Ledge bridge's marks (and ``others``)."""
    return Properties(
        user_properties=((GATEWAY_PROPERTY, gateway), (SEQUENCE_PROPERTY, str(seq))), **others
    )


def paho_props(**values: Any) -> PahoProperties:
    """paho's PUBLISH properties with ``values`` (paho's names); ``UserProperty`` a list."""
    props = PahoProperties(PacketTypes.PUBLISH)
    for pair in values.pop("UserProperty", ()):
        props.UserProperty = pair
    for name, value in values.items():
        setattr(props, name, value)
    return props


def remote(
    topic: str,
    payload: object,
    *,
    qos: int = 1,
    retain: bool = False,
    properties: PahoProperties | None = None,
) -> aiomqtt.Message:
    """A message as aiomqtt hands it over from the remote (payload as aiomqtt may type it)."""
    return aiomqtt.Message(topic, cast(bytes, payload), qos, retain, 1, properties)


# ---------------------------------------------------------------------- $SYS values


def test_a_new_bridges_sys_values_are_its_name_no_address_its_window_and_zeros(
    world: World,
) -> None:
    bridge = world.bridge(bridge_settings(max_inflight=25))
    base = "bridge/cloud/"
    expected = {base + key: "0" for key in SYS_KEYS}
    expected[base + "address"] = ""
    expected[base + "window"] = "25"
    expected[base + "oldest message age"] = "0.0"
    assert bridge.sys_values() == expected


def test_the_sys_values_report_every_count_under_the_bridges_name(world: World) -> None:
    bridge = world.bridge(bridge_settings(name="uplink"))
    device = world.device()
    device.publish("t/a", b"1", world.h.now, qos=1)
    world.wall.now = 5001.0
    device.publish("t/b", b"22", world.h.now, qos=1)
    device.publish("t/c", b"333", world.h.now, qos=1)
    paho = FakePaho()

    async def story() -> None:
        for _ in range(2):
            ready = bridge.outbox.next_ready(world.wall())
            assert ready is not None
            bridge._send_entry(paho, ready)
        bridge.on_publish(1, 0)  # t/a acknowledged: t/b is the oldest now

    run(story)
    assert [topic for topic, *_ in paho.sent] == ["fleet/t/a", "fleet/t/b"]
    bridge.address = "cloud.example:8883"
    bridge.window = 7
    bridge.outbox.stats.dropped_full = 4
    bridge.outbox.stats.dropped_expired = 5
    bridge.outbox.stats.refused = 6
    bridge.stats.dropped_qos0_offline = 3
    bridge.stats.rejected = 1
    bridge.stats.loops = 2
    bridge.stats.received = 9
    bridge.stats.connects = 11
    world.wall.now = 5013.5
    left = len("fleet/t/b") + 2 + len("fleet/t/c") + 3 + 2 * OUTBOX_ENTRY_OVERHEAD
    base = "bridge/uplink/"
    assert bridge.sys_values() == {
        base + "address": "cloud.example:8883",
        base + "queued": "2",
        base + "bytes": str(left),
        base + "sent": "2",
        base + "acknowledged": "1",
        base + "inflight": "1",
        base + "window": "7",
        base + "dropped": str(4 + 5 + 3 + 1),  # full, expired, QoS 0 offline, rejected
        base + "dropped/full": "4",
        base + "dropped/expired": "5",
        base + "dropped/qos 0 offline": "3",
        base + "dropped/rejected": "1",
        base + "dropped/loops": "2",
        base + "refused": "6",
        base + "received": "9",
        base + "oldest message age": "12.5",
        base + "connects": "11",
    }


def test_forgetting_a_removed_bridge_clears_its_retained_sys_values_and_state_only(
    world: World,
) -> None:
    """Each value goes as an empty retained message at the broker's time; another
    bridge's values stay; a bridge of the same name added later shows its values again."""
    broker = world.h.broker
    cloud = world.bridge()
    backup = world.bridge(bridge_settings(name="backup"))
    for made in (cloud, backup):
        made.address = "cloud.example:8883"
        broker.sys_sources.append(made.sys_values)
        made._set_state("connected")
    systopics.publish_sys(broker, world.h.now)
    ours = [f"$SYS/broker/bridge/cloud/{key}" for key in (*SYS_KEYS, "state")]
    theirs = [f"$SYS/broker/bridge/backup/{key}" for key in (*SYS_KEYS, "state")]
    assert [t for t, _ in world.retained("$SYS/broker/bridge/#")] == sorted(ours + theirs)
    live = world.watch("$SYS/broker/bridge/#")
    world.h.advance(5)
    broker.sys_sources.remove(cloud.sys_values)  # as ``stop`` does
    cloud.forget_sys()
    assert [(g.topic, g.payload, g.retain, g.created) for g in live.got] == [
        (topic, b"", True, world.h.now) for topic in ours
    ]
    assert [t for t, _ in world.retained("$SYS/broker/bridge/#")] == sorted(theirs)
    assert not [t for t in broker.sys_last if t.startswith("$SYS/broker/bridge/cloud/")]
    assert [t for t in broker.sys_last if t.startswith("$SYS/broker/bridge/backup/")] == theirs[:-1]
    # Added again under the same name (a later reload): its values are published again.
    world.bridges.remove(cloud)
    cloud.detach()
    again = world.bridge()
    again.address = "cloud.example:8883"
    broker.sys_sources.append(again.sys_values)
    systopics.publish_sys(broker, world.h.now)
    assert [t for t, _ in world.retained("$SYS/broker/bridge/cloud/#")] == sorted(ours[:-1])


# ---------------------------------------------------------------------- state


def test_a_new_bridge_is_disconnected_and_knows_nothing_of_the_remote_yet(
    world: World, tmp_path: Path
) -> None:
    store = Store(tmp_path)
    bridge = world.bridge(bridge_settings(max_inflight=25), store=store)
    assert bridge.state == "disconnected"
    assert bridge.address == ""
    assert (bridge.last_error, bridge.last_error_at) == ("", None)
    assert bridge.since == 5000.0  # the gateway's wall clock when it was made
    assert bridge.remote_receive_maximum == 65_535
    assert (bridge.window, bridge.inflight) == (25, 0)
    assert bridge.client_id == "ledge-gw1-cloud"
    assert (bridge.name, bridge.gateway, bridge.prefix) == ("cloud", GATEWAY, "ledge")
    assert bridge.store is store


def test_the_state_is_retained_under_sys_and_since_moves_only_when_connected_changes(
    world: World,
) -> None:
    bridge = world.bridge()
    topic = "$SYS/broker/bridge/cloud/state"
    live = world.watch(topic)
    steps = [
        ("connecting", 5000.0),  # not connected before either: since stays
        ("connected", 5002.0),
        ("connected", 5002.0),
        ("disconnected", 5004.0),
        ("connecting", 5004.0),
    ]
    for i, (state, since) in enumerate(steps, 1):
        world.wall.now = 5000.0 + i
        world.h.advance(1)
        bridge._set_state(state)
        assert (bridge.state, bridge.since) == (state, since), state
        last = live.got[-1]
        assert (last.topic, last.payload, last.retain, last.created) == (
            topic,
            state.encode(),
            True,
            world.h.now,
        )
    assert len(live.got) == len(steps)
    assert world.retained(topic) == [(topic, b"connecting")]


# ---------------------------------------------------------------------- the MQTT library


class Refused(Exception):
    """What the stand-in client raises when the link tries to connect."""


async def attempt(bridge: Bridge, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """One connection attempt of ``bridge`` whose remote refuses it: the arguments its
    MQTT client was made with."""
    made: dict[str, Any] = {}

    class Client:
        def __init__(self, **kwargs: Any) -> None:
            made.update(kwargs)

        async def __aenter__(self) -> Client:
            raise Refused

        async def __aexit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(link, "HookedClient", Client)
    with pytest.raises(Refused):
        await bridge._connection("127.0.0.1", 1)
    return made


def test_each_attempt_gets_the_bridges_own_logger_and_its_last_problem_to_explain_a_loss(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    bridge = world.bridge()
    made: dict[str, Any] = {}

    async def story() -> None:
        made.update(await attempt(bridge, monkeypatch))

    run(story)
    mqtt_log = made["logger"]
    assert mqtt_log is logging.getLogger("ledge.bridge.cloud")
    last_error = made["last_error"]
    assert not last_error()  # nothing went wrong yet: nothing to explain with
    mqtt_log.warning("failed to receive on socket: %s", "[Errno 104] reset")
    assert last_error() == "failed to receive on socket: [Errno 104] reset"
    mqtt_log.error("Caught exception in on_connect")
    assert last_error() == "Caught exception in on_connect"
    mqtt_log.info("Sending PINGREQ")  # below a warning: no problem
    assert last_error() == "Caught exception in on_connect"


def test_the_mqtt_librarys_repeated_problem_is_a_warning_once_then_debug(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """What the MQTT library logs for a bridge: an identical problem in a row (every
    reconnect attempt) goes to debug; a different one is news; info passes untouched."""
    caplog.set_level(logging.DEBUG, logger="ledge.bridge.cloud")
    world.bridge()
    mqtt_log = logging.getLogger("ledge.bridge.cloud")
    mqtt_log.warning("failed to connect: %s", "refused")
    mqtt_log.warning("failed to connect: %s", "refused")
    mqtt_log.error("failed to connect: refused")
    mqtt_log.warning("failed to connect: timed out")
    mqtt_log.info("failed to connect: timed out")
    mqtt_log.warning("failed to connect: timed out")
    mqtt_log.warning("failed to connect: refused")
    lines = [
        (r.levelno, r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "ledge.bridge.cloud"
    ]
    warning, debug = (logging.WARNING, "WARNING"), (logging.DEBUG, "DEBUG")
    assert lines == [
        (*warning, "failed to connect: refused"),
        (*debug, "failed to connect: refused"),
        (*debug, "failed to connect: refused"),
        (*warning, "failed to connect: timed out"),
        (logging.INFO, "INFO", "failed to connect: timed out"),
        (*debug, "failed to connect: timed out"),
        (*warning, "failed to connect: refused"),
    ]


def test_a_successors_will_and_status_go_under_the_same_prefix(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = RuleSettings("ledge/gw1/status", remote_prefix="site/")
    old = world.bridge(bridge_settings(UP, status))
    world.bridges.remove(old)

    async def story() -> None:
        new = old.successor(bridge_settings(RuleSettings("u/#"), status))
        try:
            assert new.prefix == "ledge"
            will = (await attempt(new, monkeypatch))["will"]
            assert (will.topic, will.payload, will.qos, will.retain) == (
                "site/ledge/gw1/status",
                b"offline",
                1,
                True,
            )
        finally:
            new.detach()

    run(story)


def test_without_a_status_rule_there_is_no_will(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    bridge = world.bridge()

    async def story() -> None:
        assert (await attempt(bridge, monkeypatch))["will"] is None

    run(story)


# ---------------------------------------------------------------------- up


def test_with_a_rate_limit_the_first_message_goes_at_once(world: World) -> None:
    bridge = world.bridge(bridge_settings(rate_limit=50.0))
    world.device().publish("t/a", b"1", world.h.now, qos=1)
    client = FakeLink()

    async def story() -> None:
        sender = asyncio.get_running_loop().create_task(bridge._send(cast(HookedClient, client)))
        try:
            await async_wait_for(lambda: client.paho.sent or sender.done(), 2, "a send")
            assert not sender.done()
            assert client.paho.sent == [("fleet/t/a", b"1", 1, False)]
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    run(story)


def test_an_acknowledgement_wakes_the_shell_at_the_end_of_the_turn(world: World) -> None:
    wakes = Wakes()

    async def story() -> None:
        bridge = world.bridge()
        world.device().publish("t/a", b"1", world.h.now, qos=1)
        ready = bridge.outbox.next_ready(world.wall())
        assert ready is not None
        bridge._send_entry(FakePaho(), ready)
        world.h.broker.wake = wakes
        bridge.on_publish(1, 0)
        assert wakes.count == 0
        await asyncio.sleep(0)
        assert wakes.count == 1
        assert bridge.outbox.count == 0

    run(story)


# ---------------------------------------------------------------------- the store


def stored_bridge(world: World, tmp_path: Path, *topics: str) -> tuple[HarnessBridge, Journal]:
    """A bridge with a store, ``topics`` queued (their batch committed), and the journal."""
    journal = Journal()
    world.h.broker.journal = journal
    bridge = world.bridge(store=Store(tmp_path))
    device = world.device()
    for topic in topics:
        device.publish(topic, topic.encode(), world.h.now, qos=1)
    bridge.committed(journal.batch_id)  # the store has them
    return bridge, journal


def removed(journal: Journal) -> list[tuple[str, int]]:
    return [(op.bridge, op.pos) for op in journal.ops if isinstance(op, RemoveOutbox)]


def test_with_a_store_puts_reach_the_journal_at_once_and_removals_grouped_a_little_later(
    world: World, tmp_path: Path
) -> None:
    bridge, journal = stored_bridge(world, tmp_path, "t/a", "t/b", "t/c")
    puts = [
        (op.bridge, op.pos, op.topic, op.payload) for op in journal.ops if isinstance(op, PutOutbox)
    ]
    assert puts == [("cloud", i, f"fleet/t/{n}", f"t/{n}".encode()) for i, n in enumerate("abc", 1)]
    assert len(journal.ops) == 3
    wakes = Wakes()
    world.h.broker.wake = wakes

    async def story() -> None:
        loop = asyncio.get_running_loop()
        first, second = (bridge.outbox.next_ready(world.wall()) for _ in range(2))
        assert first is not None and second is not None
        bridge.outbox.acknowledged(first)
        bridge.outbox.acknowledged(second)
        acked = loop.time()
        assert removed(journal) == [] and wakes.count == 0  # not yet
        await async_wait_for(lambda: removed(journal), 2, "the removals")
        assert loop.time() - acked >= DONE_DELAY - 0.01
        assert removed(journal) == [("cloud", 1), ("cloud", 2)]
        assert wakes.count == 1  # together, one wake-up
        assert len(journal.ops) == 5
        bridge._flush_done()  # nothing waits: nothing to store, nobody to wake
        assert len(journal.ops) == 5 and wakes.count == 1

    run(story)


def test_after_a_flush_the_next_removal_is_grouped_anew(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link, "DONE_DELAY", 0.01)
    bridge, journal = stored_bridge(world, tmp_path, "t/a", "t/b")
    wakes = Wakes()
    world.h.broker.wake = wakes

    async def story() -> None:
        first, second = (bridge.outbox.next_ready(world.wall()) for _ in range(2))
        assert first is not None and second is not None
        for done, count in ((first, 1), (second, 2)):
            bridge.outbox.acknowledged(done)
            assert len(removed(journal)) == count - 1

            def flushed(count: int = count) -> bool:
                return len(removed(journal)) == count

            await async_wait_for(flushed, 2, "the removal")
            assert wakes.count == count
        assert removed(journal) == [("cloud", 1), ("cloud", 2)]

    run(story)


class PagedStore(Store):
    """A store whose outbox rows are given by the test; ``fail`` reads raise."""

    def __init__(self, directory: Path, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        super().__init__(directory)
        self.rows = rows
        self.reads: list[tuple[str, int, int]] = []
        self.fail = 0

    def read_outbox(self, bridge: str, first: int, count: int) -> list[tuple[Any, ...]]:
        self.reads.append((bridge, first, count))
        if self.fail:
            self.fail -= 1
            raise OSError(5, "Input/output error")
        return [row for row in self.rows.get(bridge, []) if row[0] >= first][:count]


#: Room in memory for two of ``ROWS`` (a page is at most half of it).
MEMORY = 64 * 1024
#: Outbox rows as the store holds them: pos, seq, topic, payload, qos, retain,
#: properties, created, expires.
ROWS: list[tuple[Any, ...]] = [
    (1, 501, "fleet/t/a", b"a" * 16_400, 1, 1, b"\x03\x00\x01x", 4000.0, 9000.0),
    (2, 502, "fleet/t/b", b"b" * 16_500, 2, 0, b"", 4001.5, None),
    (3, 503, "fleet/t/c", b"c" * 16_400, 0, 1, b"", 4002.0, None),
    (4, 504, "fleet/t/d", b"d" * 16_400, 1, 0, b"", 4003.0, None),
]


def on_disk(world: World, tmp_path: Path) -> tuple[HarnessBridge, PagedStore]:
    """A bridge whose outbox is all in the store (as after a restart)."""
    world.h.broker.journal = Journal()
    store = PagedStore(tmp_path, {"cloud": ROWS, "other": [(1, 9, "x", b"", 0, 0, b"", 0.0, None)]})
    outbox = OutboxSettings(memory_bytes=MEMORY)
    bridge = world.bridge(bridge_settings(outbox=outbox), store=store)
    bridge.outbox.restore(
        (pos, len(topic) + len(data) + len(props) + OUTBOX_ENTRY_OVERHEAD, made)
        for pos, _, topic, data, _, _, props, made, _ in ROWS
    )
    return bridge, store


def fields(entry: Entry) -> tuple[Any, ...]:
    return (
        entry.pos,
        entry.seq,
        entry.topic,
        entry.payload,
        entry.qos,
        entry.retain,
        entry.properties,
        entry.created,
        entry.expires,
    )


def test_a_page_of_the_outbox_is_read_back_from_the_store_entry_for_entry(
    world: World, tmp_path: Path
) -> None:
    bridge, store = on_disk(world, tmp_path)

    async def story() -> None:
        bridge._refill()
        assert [task.get_name() for task in bridge._loads] == ["bridge cloud outbox"]
        await asyncio.gather(*bridge._loads)
        assert not bridge._loads  # finished reads are not kept

    run(story)
    assert store.reads == [("cloud", 1, 2)]  # two rows make half the memory
    loaded = list(bridge.outbox.mem)
    assert [fields(e) for e in loaded] == [
        (1, 501, "fleet/t/a", b"a" * 16_400, 1, True, b"\x03\x00\x01x", 4000.0, 9000.0),
        (2, 502, "fleet/t/b", b"b" * 16_500, 2, False, b"", 4001.5, None),
    ]
    assert [type(e.retain) for e in loaded] == [bool, bool]
    assert bridge.outbox.spilled == 2 and not bridge.outbox.refilling
    sent = bridge.outbox.next_ready(world.wall())
    assert sent is loaded[0]


def test_the_next_page_starts_where_the_last_one_ended(world: World, tmp_path: Path) -> None:
    bridge, store = on_disk(world, tmp_path)

    async def story() -> None:
        bridge._refill()
        await asyncio.gather(*bridge._loads)
        for _ in range(2):
            ready = bridge.outbox.next_ready(world.wall())
            assert ready is not None
            bridge.outbox.acknowledged(ready)
        bridge._refill()
        await asyncio.gather(*bridge._loads)

    run(story)
    assert store.reads == [("cloud", 1, 2), ("cloud", 3, 2)]
    assert [e.seq for e in bridge.outbox.mem] == [503, 504]


def test_nothing_is_read_while_nothing_waits_on_disk(world: World, tmp_path: Path) -> None:
    world.h.broker.journal = Journal()
    store = PagedStore(tmp_path, {"cloud": ROWS})
    bridge = world.bridge(store=store)
    world.device().publish("t/a", b"1", world.h.now, qos=1)

    async def story() -> None:
        bridge._refill()
        assert not bridge._loads

    run(story)
    assert store.reads == [] and not bridge.outbox.refilling


def test_a_page_read_while_the_clock_was_set_is_read_again(world: World, tmp_path: Path) -> None:
    bridge, store = on_disk(world, tmp_path)

    async def story() -> None:
        bridge._refill()
        bridge.outbox.shift_wall(60.0, 0)  # before the read ends
        await asyncio.gather(*bridge._loads)
        assert list(bridge.outbox.mem) == [] and not bridge.outbox.refilling
        bridge._refill()
        await asyncio.gather(*bridge._loads)

    run(story)
    assert store.reads == [("cloud", 1, 2), ("cloud", 1, 2)]
    assert [e.pos for e in bridge.outbox.mem] == [1, 2]


def test_a_page_the_store_cannot_read_is_logged_and_asked_for_again_after_a_while(
    world: World,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed read is logged with when it is tried again; until then nothing is read
    (a sender woken by new messages does not hammer a failing store), and then the
    sender is woken by the retry itself: the backlog may be all on disk, with nothing
    else to wake it."""
    caplog.set_level(logging.ERROR, logger="ledge.bridge")
    monkeypatch.setattr(link, "REFILL_RETRY", 0.05)
    bridge, store = on_disk(world, tmp_path)
    store.fail = 1

    async def story() -> None:
        bridge._refill()
        await asyncio.gather(*bridge._loads)
        assert list(bridge.outbox.mem) == [] and not bridge.outbox.refilling
        bridge._refill()  # too soon: nothing read
        assert not bridge._loads and len(store.reads) == 1
        bridge._wake.clear()
        await async_wait_for(bridge._wake.is_set, 5, "the retry to wake the sender")
        bridge._refill()
        await asyncio.gather(*bridge._loads)

    run(story)
    errors = [r for r in caplog.records if r.name == "ledge.bridge"]
    assert [(r.levelno, r.getMessage()) for r in errors] == [
        (
            logging.ERROR,
            "bridge cloud: cannot read the outbox from the store (trying again in 0.05 s)",
        )
    ]
    assert errors[0].exc_info is not None and isinstance(errors[0].exc_info[1], OSError)
    assert store.reads == [("cloud", 1, 2), ("cloud", 1, 2)]
    assert [e.pos for e in bridge.outbox.mem] == [1, 2]
    assert bridge._load_failures == 0


# ---------------------------------------------------------------------- refuse gate


def refusing(world: World, **outbox: Any) -> HarnessBridge:
    return world.bridge(bridge_settings(outbox=OutboxSettings(when_full=REFUSE, **outbox)))


def test_the_gate_refuses_once_topic_payload_and_overhead_would_not_fit_the_bytes(
    world: World,
) -> None:
    bridge = refusing(world, max_bytes=2048)
    world.device().publish("t/a", b"12345", world.h.now, qos=1)
    held = bridge.outbox.bytes
    assert held == len("fleet/t/a") + 5 + OUTBOX_ENTRY_OVERHEAD
    topic = "t/abcdef"  # kept as fleet/t/abcdef
    fits = 2048 - held - len("fleet/" + topic) - 64
    assert bridge._gate(topic, fits) is None
    full = f"bridge cloud: outbox full (1 messages, {held} bytes)"
    assert bridge._gate(topic, fits + 1) == full
    assert bridge._gate(topic, 2000) == full
    assert bridge._gate("u/elsewhere", 2000) is None  # no rule takes it up
    assert (bridge.stats.refused_publishes, bridge.outbox.stats.refused) == (2, 2)
    assert bridge.sys_values()["bridge/cloud/refused"] == "2"


def test_the_gate_refuses_once_the_messages_would_not_fit_the_count(world: World) -> None:
    bridge = refusing(world, max_messages=2)
    device = world.device()
    device.publish("t/a", b"1", world.h.now, qos=1)
    assert bridge._gate("t/b", 1) is None
    device.publish("t/b", b"1", world.h.now, qos=1)
    held = bridge.outbox.bytes
    assert bridge._gate("t/c", 1) == f"bridge cloud: outbox full (2 messages, {held} bytes)"
    assert bridge._gate("x/c", 1) is None
    assert (bridge.stats.refused_publishes, bridge.outbox.stats.refused) == (1, 1)


def test_an_mqtt5_publisher_is_told_quota_exceeded_while_the_outbox_is_full(
    world: World,
) -> None:
    bridge = refusing(world, max_messages=1)
    world.h.broker.publish_gates.append(bridge._gate)  # as ``start`` does
    world.device().publish("t/a", b"1", world.h.now, qos=1)
    client = world.h.client(MQTT_5)
    client.connect("pub")
    client.send(Publish("t/b", b"2", 1, False, False, 7, Properties()))
    assert client.expect(PubAck).reason_code == ReasonCode.QUOTA_EXCEEDED
    client.send(Publish("v/b", b"2", 1, False, False, 8, Properties()))  # no rule takes v/
    assert client.expect(PubAck).reason_code != ReasonCode.QUOTA_EXCEEDED
    assert [e.topic for e in bridge.outbox.mem] == ["fleet/t/a"]
    assert bridge.stats.refused_publishes == 1


def test_a_message_the_gate_accepts_is_kept_with_its_remote_topic_and_properties(
    world: World,
) -> None:
    """What the gate lets through fits the outbox as the entry it becomes: under the
    remote topic (``fleet/`` added), with the publisher's properties. What would not
    fit is refused with Quota exceeded, never acknowledged and then dropped."""
    bridge = refusing(world, max_bytes=2048)
    world.h.broker.publish_gates.append(bridge._gate)  # as ``start`` does
    client = world.h.client(MQTT_5)
    client.connect("pub")
    room = 2048 - len("fleet/t/a") - OUTBOX_ENTRY_OVERHEAD
    client.send(Publish("t/a", b"x" * (room + 1), 1, False, False, 1, Properties()))
    assert client.expect(PubAck).reason_code == ReasonCode.QUOTA_EXCEEDED
    big = Properties(user_properties=(("note", "y" * 1900),))
    client.send(Publish("t/a", b"x" * 100, 1, False, False, 2, big))
    assert client.expect(PubAck).reason_code == ReasonCode.QUOTA_EXCEEDED
    assert bridge.outbox.count == 0 and bridge.outbox.stats.dropped_full == 0
    client.send(Publish("t/a", b"x" * room, 1, False, False, 3, Properties()))
    assert client.expect(PubAck).reason_code == ReasonCode.SUCCESS
    assert bridge.outbox.bytes == 2048 and bridge.outbox.stats.dropped_full == 0
    assert (bridge.stats.refused_publishes, bridge.outbox.stats.refused) == (2, 2)


# ---------------------------------------------------------------------- down


def down_world(world: World, **options: Any) -> tuple[HarnessBridge, Watcher, Sequence]:
    sequence = Sequence(10)
    bridge = world.bridge(bridge_settings(DOWN, **options), sequence=sequence)
    return bridge, world.watch("cloud/#"), sequence


def test_a_remote_message_is_published_locally_mapped_stamped_and_numbered_in_the_batch(
    world: World,
) -> None:
    journal = Journal()
    journal.batch_id = 7
    world.h.broker.journal = journal
    sequence = Sequence(10, reserved=10 + BLOCK // 2)  # the next number crosses half a block
    bridge = world.bridge(bridge_settings(DOWN), sequence=sequence)
    live = world.watch("cloud/#")
    world.h.advance(3)
    props = paho_props(
        PayloadFormatIndicator=1,
        ContentType="text/plain",
        ResponseTopic="fleet/gw1/replies",
        CorrelationData=b"\x01\x02",
        MessageExpiryInterval=30,
        UserProperty=[("site", "n")],
    )
    bridge._inbound(remote("fleet/gw1/cmd/reboot", b"now", qos=2, retain=True, properties=props))
    (got,) = live.got
    assert (got.topic, got.payload, got.qos, got.retain) == ("cloud/cmd/reboot", b"now", 1, True)
    assert got.properties == Properties(
        payload_format_indicator=1,
        content_type="text/plain",
        response_topic="fleet/gw1/replies",
        correlation_data=b"\x01\x02",
        user_properties=(("site", "n"), (GATEWAY_PROPERTY, GATEWAY), (SEQUENCE_PROPERTY, "10")),
    )
    assert (got.created, got.expires_at) == (world.h.now, world.h.now + 30)
    assert got.origin == "ledge-bridge-cloud"
    assert world.retained("cloud/#") == [("cloud/cmd/reboot", b"now")]
    assert (bridge.stats.received, bridge.stats.unmapped) == (1, 0)
    reserved = 10 + BLOCK // 2 + BLOCK
    assert [op for op in journal.ops if isinstance(op, SetMeta)] == [
        SetMeta(META_KEY, str(reserved))
    ]
    sequence.commit(6)
    assert sequence.limit == 10 + BLOCK // 2
    sequence.commit(7)  # the reservation went into batch 7
    assert sequence.limit == reserved


def test_a_remote_message_with_the_retain_flag_stripped_by_its_rule_is_not_retained(
    world: World,
) -> None:
    rule = RuleSettings("cmd/#", direction="in", local_prefix="cloud/", retain="strip")
    bridge = world.bridge(bridge_settings(rule))
    live = world.watch("cloud/#")
    bridge._inbound(remote("cmd/x", b"1", retain=True))
    assert [(g.topic, g.retain) for g in live.got] == [("cloud/cmd/x", False)]
    assert world.retained("cloud/#") == []


@pytest.mark.parametrize(
    ("payload", "local"),
    [
        ("21.5 °C", "21.5 °C".encode()),
        (42, b"42"),
        (1.5, b"1.5"),
        (None, b""),
        (bytearray(b"\x00raw"), b"\x00raw"),
    ],
    ids=["text", "int", "float", "none", "bytearray"],
)
def test_a_remote_payload_of_any_type_aiomqtt_gives_arrives_as_bytes(
    world: World, payload: object, local: bytes
) -> None:
    bridge, live, _ = down_world(world)
    bridge._inbound(remote("fleet/gw1/cmd/x", payload))
    assert [(g.topic, g.payload) for g in live.got] == [("cloud/cmd/x", local)]
    assert type(live.got[0].payload) is bytes


def test_a_remote_message_no_rule_maps_is_counted_and_dropped(world: World) -> None:
    bridge, live, sequence = down_world(world)
    bridge._inbound(remote("fleet/gw2/cmd/x", b"1"))
    bridge._inbound(remote("other/cmd/x", b"1"))
    assert (bridge.stats.unmapped, bridge.stats.received) == (2, 0)
    assert live.got == [] and sequence.next == 10


def test_a_remote_message_marked_by_another_gateway_keeps_its_marks_alone(world: World) -> None:
    bridge, live, sequence = down_world(world)
    props = paho_props(UserProperty=[(GATEWAY_PROPERTY, "gw2"), (SEQUENCE_PROPERTY, "77")])
    bridge._inbound(remote("fleet/gw1/cmd/x", b"1", properties=props))
    assert [g.properties for g in live.got] == [marks("gw2", 77)]
    assert sequence.next == 10 and bridge.stats.received == 1


def test_a_remote_message_marked_with_this_gateways_id_is_a_loop_dropped_and_counted(
    world: World,
) -> None:
    bridge, live, sequence = down_world(world)
    for seq in ("40", "41"):
        props = paho_props(UserProperty=[(GATEWAY_PROPERTY, GATEWAY), (SEQUENCE_PROPERTY, seq)])
        bridge._inbound(remote("fleet/gw1/cmd/x", b"1", properties=props))
    assert (bridge.stats.loops, bridge.stats.received) == (2, 0)
    assert live.got == [] and sequence.next == 10


@pytest.mark.parametrize(
    "user",
    [
        [(SEQUENCE_PROPERTY, "40")],
        [(GATEWAY_PROPERTY, GATEWAY)],
        [(GATEWAY_PROPERTY, GATEWAY), (SEQUENCE_PROPERTY, "4x")],
    ],
    ids=["number-only", "gateway-only", "not-a-number"],
)
def test_half_a_mark_is_no_mark_the_message_is_stamped_here(
    world: World, user: list[tuple[str, str]]
) -> None:
    bridge, live, sequence = down_world(world)
    bridge._inbound(remote("fleet/gw1/cmd/x", b"1", properties=paho_props(UserProperty=user)))
    stamped = (*user, (GATEWAY_PROPERTY, GATEWAY), (SEQUENCE_PROPERTY, "10"))
    assert [g.properties.user_properties for g in live.got] == [stamped]
    assert bridge.stats.loops == 0 and sequence.next == 11


def test_without_the_envelope_a_payload_that_looks_like_one_is_just_a_payload(
    world: World,
) -> None:
    bridge, live, sequence = down_world(world)
    for gateway in ("gw2", GATEWAY):
        bridge._inbound(remote("fleet/gw1/cmd/x", envelope(gateway, 5, b'"x"')))
    assert [g.payload for g in live.got] == [
        envelope("gw2", 5, b'"x"'),
        envelope(GATEWAY, 5, b'"x"'),
    ]
    assert [g.properties for g in live.got] == [marks(GATEWAY, 10), marks(GATEWAY, 11)]
    assert bridge.stats.loops == 0 and sequence.next == 12


def test_with_the_envelope_its_marks_decide_loop_pass_through_or_stamp(world: World) -> None:
    """Over MQTT 3.1.1 with the envelope: this gateway's envelope is a loop; another's
    passes as it is; a plain payload entered the bridged world here and is stamped."""
    bridge, live, sequence = down_world(world, protocol="3.1.1", envelope=True)
    mine = envelope(GATEWAY, 40, b'"x"')
    theirs = envelope("gw2", 77, b'"y"')
    broken = b'{"gateway": 5}'  # starts like an envelope, is none
    for payload in (mine, theirs, mine, b"plain", broken):
        bridge._inbound(remote("fleet/gw1/cmd/x", payload))
    assert [(g.payload, g.properties) for g in live.got] == [
        (theirs, EMPTY),
        (b"plain", marks(GATEWAY, 10)),
        (broken, EMPTY),
    ]
    assert (bridge.stats.loops, bridge.stats.received) == (2, 3)
    assert sequence.next == 11


# ---------------------------------------------------------------------- echoes


@pytest.mark.parametrize(
    ("protocol", "with_envelope", "filtered"),
    [("5.0", False, False), ("5.0", True, False), ("3.1.1", True, False), ("3.1.1", False, True)],
)
def test_only_mqtt_311_without_the_envelope_filters_echoes(
    world: World, protocol: str, with_envelope: bool, filtered: bool
) -> None:
    bridge = world.bridge(bridge_settings(protocol=protocol, envelope=with_envelope))
    assert (bridge.echo is not None) == filtered


def test_over_mqtt5_what_comes_back_equal_to_what_went_up_is_no_echo(world: World) -> None:
    """No Local and the marks tell: the remote's own message comes down even when equal."""
    both = RuleSettings("cmd/#", direction="both", local_prefix="cloud/", remote_prefix="fleet/")
    bridge = world.bridge(bridge_settings(both), sequence=Sequence(10))
    live = world.watch("cloud/cmd/#")
    entry = Entry(1, 42, "fleet/cmd/x", b"go", 1, False, b"", 5000.0)
    bridge._send_entry(FakePaho(), entry)
    bridge._inbound(remote("fleet/cmd/x", b"go"))
    assert [(g.topic, g.payload, g.properties) for g in live.got] == [
        ("cloud/cmd/x", b"go", marks(GATEWAY, 10))
    ]
    assert bridge.stats.echoes == 0


def test_over_mqtt_311_each_echo_of_what_went_up_is_dropped_and_counted(world: World) -> None:
    bridge, live, _ = down_world(world, protocol="3.1.1")
    paho = FakePaho()
    for seq, payload in ((1, b"go"), (2, b"stop")):
        bridge._send_entry(paho, Entry(seq, seq, "fleet/gw1/cmd/x", payload, 1, False, b"", 0.0))
    for payload in (b"go", b"stop", b"go"):
        bridge._inbound(remote("fleet/gw1/cmd/x", payload))
    assert bridge.stats.echoes == 2
    assert [g.payload for g in live.got] == [b"go"]  # an echo counts once


# ---------------------------------------------------------------------- helpers


def test_pahos_properties_become_ours_with_what_is_worth_passing_on() -> None:
    props = paho_props(
        PayloadFormatIndicator=0,
        ContentType="application/json",
        ResponseTopic="r/1",
        CorrelationData=b"id",
        MessageExpiryInterval=0,
        UserProperty=[("a", "1"), ("a", "2")],
    )
    assert link._our_properties(props) == Properties(
        payload_format_indicator=0,
        message_expiry_interval=0,
        content_type="application/json",
        response_topic="r/1",
        correlation_data=b"id",
        user_properties=(("a", "1"), ("a", "2")),
    )
    assert link._our_properties(paho_props(ContentType="x")) == Properties(content_type="x")


def test_no_properties_from_paho_are_the_shared_empty_ones() -> None:
    """The gateway takes the shared ``EMPTY`` for "no properties" (it tests identity)."""
    assert link._our_properties(None) is EMPTY
    assert link._our_properties(paho_props()) is EMPTY


@pytest.mark.parametrize(
    ("user", "mark"),
    [
        ([(GATEWAY_PROPERTY, "gw2"), (SEQUENCE_PROPERTY, "77")], ("gw2", 77)),
        ([("site", "n"), (SEQUENCE_PROPERTY, "7"), (GATEWAY_PROPERTY, "gw3")], ("gw3", 7)),
        ([], None),
        ([(SEQUENCE_PROPERTY, "77")], None),
        ([(GATEWAY_PROPERTY, "gw2")], None),
        ([(GATEWAY_PROPERTY, "gw2"), (SEQUENCE_PROPERTY, "-1")], None),
    ],
)
def test_the_marks_are_a_gateway_and_a_decimal_number_both(
    user: list[tuple[str, str]], mark: tuple[str, int] | None
) -> None:
    assert link._mark(Properties(user_properties=tuple(user))) == mark


def test_a_failure_is_described_by_its_text_or_its_kind_every_part_of_a_group() -> None:
    assert link._describe(OSError(111, "Connection refused")) == "[Errno 111] Connection refused"
    assert link._describe(TimeoutError()) == "TimeoutError"
    group = ExceptionGroup(
        "link", [ConnectionResetError("reset by peer"), ExceptionGroup("in", [TimeoutError()])]
    )
    assert link._describe(group) == "reset by peer; TimeoutError"
