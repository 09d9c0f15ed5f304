"""The durable store: journal -> SQLite -> restore, held acknowledgements, bad files.

The broker core runs packet by packet (fake clock); its journal is committed by
the real store writer thread into a real SQLite file in a temporary directory,
and read back into a fresh broker.
"""

from __future__ import annotations

import queue
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.broker.journal import (
    AddEntry,
    ForgetMessage,
    Journal,
    Op,
    RemoveEntry,
    SetMeta,
    StoreMessage,
)
from gateway.mqtt import (
    MQTT_311,
    Disconnect,
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
)
from gateway.store.settings import StoreSettings
from gateway.store.sqlite import FILENAME, NewerStore, Store, StoreError
from tests.support.durable import Durable, persistent_sub, subscribe_stored
from tests.support.harness import Harness


@pytest.fixture
def durable(tmp_path: Path) -> Any:
    d = Durable(tmp_path)
    yield d
    d.store.close()


def test_puback_is_held_until_the_store_commits(durable: Durable) -> None:
    sub = persistent_sub(durable)
    sub.send(Disconnect())
    pub = durable.h.client()
    pub.connect("pub")
    pub.send(Publish("t/x", b"stored", 1, packet_id=7))
    assert pub.take() == []  # not yet: the message is not durable
    durable.commit()
    assert pub.take() == [PubAck(7)]


HELD_CASES = {
    # The general path (decoded PUBLISH), each way a message is stored.
    "qos2-pubrec": (Publish("t/x", b"stored", 2, packet_id=7), PubRec(7)),
    "qos1-retained": (Publish("t/x", b"stored", 1, retain=True, packet_id=7), PubAck(7)),
    "qos2-retained": (Publish("t/x", b"stored", 2, retain=True, packet_id=7), PubRec(7)),
    "qos1-properties": (
        Publish("t/x", b"stored", 1, packet_id=7, properties=Properties(content_type="text")),
        PubAck(7),
    ),
    "qos2-properties": (
        Publish(
            "t/x", b"stored", 2, packet_id=7, properties=Properties(user_properties=(("k", "v"),))
        ),
        PubRec(7),
    ),
}


@pytest.mark.parametrize("case", HELD_CASES)
def test_every_acknowledgement_that_promises_storage_waits_for_the_commit(
    durable: Durable, case: str
) -> None:
    """PUBACK / PUBREC leave only after the store committed the message (a persistent
    subscriber's queue, the retained store), on every path, and the message is then
    really there after a restart."""
    packet, ack = HELD_CASES[case]
    sub = persistent_sub(durable)
    sub.send(Disconnect())
    pub = durable.h.client()
    pub.connect("pub")
    pub.send(packet)
    assert pub.take() == []  # not yet: the message is not durable
    durable.commit()
    assert pub.take() == [ack]
    again = durable.restart()
    try:
        back = again.h.client()
        back.connect("sub", clean_start=False, session_expiry_interval=3600)
        again.commit()  # its packet id is stored before it goes out
        got = back.publishes()
        assert [(p.topic, p.payload, p.qos) for p in got] == [("t/x", b"stored", packet.qos)]
        assert got[0].properties.content_type == packet.properties.content_type
        assert got[0].properties.user_properties == packet.properties.user_properties
        if packet.retain:
            fresh = again.h.client()
            fresh.connect("fresh")
            fresh.subscribe("t/#", 1)
            assert [p.payload for p in fresh.publishes()] == [b"stored"]
    finally:
        again.close()


def test_a_retained_message_without_subscribers_is_held_too(durable: Durable) -> None:
    pub = durable.h.client()
    pub.connect("pub")
    pub.send(Publish("r/x", b"kept", 1, retain=True, packet_id=3))
    assert pub.take() == []
    durable.commit()
    assert pub.take() == [PubAck(3, ReasonCode.NO_MATCHING_SUBSCRIBERS)]


def test_acknowledgements_keep_their_order_behind_held_ones(durable: Durable) -> None:
    """MQTT-4.6.0-2: PUBACKs in the order of the PUBLISHes, even when only some wait."""
    sub = persistent_sub(durable)
    sub.send(Disconnect())
    pub = durable.h.client()
    pub.connect("pub")
    pub.send(Publish("t/x", b"stored", 1, packet_id=1))
    pub.send(Publish("nobody/listens", b"not stored", 1, packet_id=2))
    assert pub.take() == []
    durable.commit()
    acks = pub.take()
    assert [a.packet_id for a in acks if isinstance(a, PubAck)] == [1, 2]


def test_memory_only_sessions_never_wait(durable: Durable) -> None:
    c = durable.h.client()
    c.connect("volatile")  # session expiry 0: nothing to store
    c.subscribe("v/#", 1)
    pub = durable.h.client()
    pub.connect("pub")
    pub.send(Publish("v/x", b"x", 1, packet_id=3))
    assert pub.take() == [PubAck(3, ReasonCode.SUCCESS)]
    assert [p.payload for p in c.publishes()] == [b"x"]
    assert durable.broker.seal_batch() is None


def test_everything_survives_a_restart(durable: Durable) -> None:
    sub = persistent_sub(durable, "sub", 2)
    sub.send(Disconnect(0, Properties(session_expiry_interval=3600)))
    pub = durable.h.client()
    pub.connect("pub")
    for i in range(5):
        pub.send(Publish("t/q", b"%d" % i, 1 + i % 2, packet_id=i + 1))
    pub.send(Publish("r/state", b"retained", 1, retain=True, packet_id=10))
    durable.commit()
    old = 3600  # keep mypy happy about unused
    del old
    later = durable.restart(downtime=10)
    try:
        assert "sub" in later.broker.sessions
        back = later.h.client()
        ack = back.connect("sub", clean_start=False, session_expiry_interval=3600)
        assert ack.session_present
        assert back.take() == []  # write-ahead: in flight only once the packet ids are stored
        later.commit()
        got = back.publishes()
        assert [p.payload for p in got] == [b"0", b"1", b"2", b"3", b"4"]
        assert [p.qos for p in got] == [1, 2, 1, 2, 1]
        fresh = later.h.client()
        fresh.connect("fresh")
        fresh.subscribe("r/#", 1)
        [ret] = fresh.publishes()
        assert (ret.topic, ret.payload, ret.retain) == ("r/state", b"retained", True)
    finally:
        later.close()


def test_inflight_messages_resume_with_their_packet_ids_and_qos2_state(durable: Durable) -> None:
    sub = persistent_sub(durable, "sub", 2)
    pub = durable.h.client()
    pub.connect("pub")
    pub.send(Publish("t/a", b"one", 2, packet_id=1))
    pub.send(Publish("t/b", b"two", 2, packet_id=2))
    durable.commit()
    pub.take()
    first, second = sub.publishes()
    sub.send(PubRec(second.packet_id))  # second reaches the PUBREL stage
    durable.commit()
    assert sub.take() == [PubRel(second.packet_id)]
    later = durable.restart()
    try:
        back = later.h.client()
        assert back.connect("sub", clean_start=False, session_expiry_interval=3600).session_present
        packets = back.take()
        assert packets[0] == Publish(
            "t/a",
            b"one",
            2,
            False,
            True,
            first.packet_id,
            packets[0].properties,  # type: ignore[union-attr]
        )
        assert packets[1] == PubRel(second.packet_id)
    finally:
        later.close()


def test_inbound_qos2_stays_exactly_once_across_a_restart(durable: Durable) -> None:
    sub = persistent_sub(durable, "sub", 2)
    sub.send(Disconnect())
    pub = durable.h.client()
    pub.connect("pub", clean_start=False, session_expiry_interval=3600)
    pub.send(Publish("t/x", b"once", 2, packet_id=9))
    durable.commit()
    assert pub.take() == [PubRec(9)]
    later = durable.restart()  # the publisher never got to send PUBREL
    try:
        again = later.h.client()
        assert again.connect("pub", clean_start=False, session_expiry_interval=3600).session_present
        again.send(Publish("t/x", b"once", 2, dup=True, packet_id=9))  # re-sent
        later.commit()
        assert again.take() == [PubRec(9)]
        again.send(PubRel(9))
        later.commit()
        assert again.take() == [PubComp(9)]
        back = later.h.client()
        back.connect("sub", clean_start=False, session_expiry_interval=3600)
        later.commit()
        assert [p.payload for p in back.publishes()] == [b"once"]
    finally:
        later.close()


def test_session_expiry_keeps_running_while_the_broker_is_down(durable: Durable) -> None:
    c = durable.h.client()
    c.connect("short", clean_start=False, session_expiry_interval=5)
    subscribe_stored(durable, c, "x", 1)
    c.send(Disconnect())
    durable.commit()
    later = durable.restart(downtime=10)
    try:
        assert "short" not in later.broker.sessions
        later.commit()
        latest = later.restart()
        try:
            assert "short" not in latest.broker.sessions
        finally:
            latest.close()
    finally:
        if later.store._db is not None:
            later.close()


def test_pending_delayed_will_is_published_after_a_restart(durable: Durable) -> None:
    c = durable.h.client()
    c.connect(
        "w",
        clean_start=False,
        session_expiry_interval=100,
        will=Will("wills/w", b"gone", 1, True, Properties(will_delay_interval=30)),
    )
    c.drop()
    durable.commit()
    later = durable.restart(downtime=40)  # the delay passed while the broker was down
    try:
        fresh = later.h.client()
        fresh.connect("fresh")
        fresh.subscribe("wills/#", 1)
        [msg] = fresh.publishes()
        assert (msg.payload, msg.retain) == (b"gone", True)
    finally:
        later.close()


def test_311_persistent_session_survives(durable: Durable) -> None:
    sub = persistent_sub(durable, "old", 1, MQTT_311)
    sub.send(Disconnect())
    pub = durable.h.client(MQTT_311)
    pub.connect("pub3")
    pub.send(Publish("t/z", b"z", 1, packet_id=4))
    durable.commit()
    later = durable.restart()
    try:
        back = later.h.client(MQTT_311)
        assert back.connect("old", clean_start=False).session_present
        later.commit()
        assert [p.payload for p in back.publishes()] == [b"z"]
    finally:
        later.close()


def test_clean_start_removes_the_stored_session(durable: Durable) -> None:
    sub = persistent_sub(durable, "gone")
    sub.send(Disconnect())
    again = durable.h.client()
    again.connect("gone", clean_start=True)
    again.send(Disconnect())
    durable.commit()
    later = durable.restart()
    try:
        assert "gone" not in later.broker.sessions
        db = sqlite3.connect(durable.directory / FILENAME)
        assert db.execute("SELECT count(*) FROM subscriptions").fetchone()[0] == 0
        db.close()
    finally:
        later.close()


def test_acknowledged_messages_leave_the_store(durable: Durable) -> None:
    sub = persistent_sub(durable, "s", 1)
    pub = durable.h.client()
    pub.connect("pub")
    for i in range(20):
        pub.send(Publish("t/x", b"%d" % i, 1, packet_id=i + 1))
    durable.commit()
    for msg in sub.publishes():
        sub.send(PubAck(msg.packet_id))
    durable.commit()
    db = sqlite3.connect(durable.directory / FILENAME)
    assert db.execute("SELECT count(*) FROM queue").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    db.close()


# --------------------------------------------------------------------------- group commit


def test_a_retained_topic_holds_its_last_change_of_one_commit_after_a_restart(
    durable: Durable,
) -> None:
    """Changes of retained topics within one commit (one batch, applied grouped): each
    topic holds its last change after a restart, whatever came before it."""
    pub = durable.h.client()
    pub.connect("pub")
    changes = {
        "r/set-clear-set": [b"1", b"", b"2"],
        "r/set-clear": [b"1", b""],
        "r/clear-set": [b"", b"1"],
        "r/set-set": [b"1", b"2"],
        "r/clear-set-clear-set": [b"", b"1", b"", b"3"],
    }
    pid = 0
    for i in range(max(map(len, changes.values()))):  # interleaved, as devices do
        for topic, payloads in changes.items():
            if i < len(payloads):
                pid += 1
                pub.send(Publish(topic, payloads[i], 1, retain=True, packet_id=pid))
    durable.commit()
    later = durable.restart()
    try:
        fresh = later.h.client()
        fresh.connect("fresh")
        fresh.subscribe("r/#", 1)
        held = {p.topic: p.payload for p in fresh.publishes()}
        assert held == {t: p[-1] for t, p in changes.items() if p[-1]}
    finally:
        later.close()


def test_group_commit_commits_a_lone_change_at_once_and_groups_what_follows(
    tmp_path: Path,
) -> None:
    """``store.commit_interval``: the first change after a quiet spell is committed at
    once; what comes within the interval after a commit waits for the next one, which
    takes all of it; closing the store commits what waits without waiting."""
    store = Store(tmp_path, StoreSettings(commit_interval=60.0))
    store.open()
    committed: queue.Queue[int] = queue.Queue()
    store.start(lambda fn, *args: fn(*args), committed.put, pytest.fail)
    try:
        store.submit(1, [SetMeta("k", "1")], 0.0)
        assert committed.get(timeout=10) == 1  # not the 60 s of the interval
        store.submit(2, [SetMeta("k", "2")], 0.0)
        store.submit(3, [SetMeta("k", "3")], 0.0)
        with pytest.raises(queue.Empty):  # within the interval: nothing committed
            committed.get(timeout=0.5)
    finally:
        store.close()  # the stop commits them (one transaction) at once
    assert committed.get_nowait() == 3
    assert store.commits == 2
    db = sqlite3.connect(tmp_path / FILENAME)
    assert db.execute("SELECT value FROM meta WHERE key = 'k'").fetchone() == ("3",)
    db.close()


# --------------------------------------------------------------------------- bad files


def test_corrupt_store_is_refused_naming_the_file_and_the_way_out(tmp_path: Path) -> None:
    (tmp_path / FILENAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError) as info:
        Store(tmp_path).open()
    text = str(info.value)
    assert str(tmp_path / FILENAME) in text and "Move it aside" in text
    assert (tmp_path / FILENAME).read_bytes().startswith(b"this is not")  # untouched


def test_corrupt_store_moved_aside_when_configured(tmp_path: Path) -> None:
    (tmp_path / FILENAME).write_bytes(b"garbage" * 1000)
    store = Store(tmp_path, StoreSettings(on_corrupt="move-aside"))
    snapshot = store.open()
    store.close()
    assert snapshot.sessions == []
    assert list(tmp_path.glob(f"{FILENAME}.corrupt-*"))


def test_truncated_store_is_refused(tmp_path: Path) -> None:
    d = Durable(tmp_path)
    for i in range(50):
        c = d.h.client()
        c.connect(f"c{i}", clean_start=False, session_expiry_interval=3600)
        subscribe_stored(d, c, f"t/{i}/" + "x" * 200, 1)
        c.send(Disconnect())
    d.commit()
    d.close()
    path = tmp_path / FILENAME
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreError):
        Store(tmp_path).open()


def test_store_from_a_newer_version_is_refused_even_with_move_aside(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / FILENAME)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(NewerStore, match="newer Ledge"):
        Store(tmp_path, StoreSettings(on_corrupt="move-aside")).open()
    assert (tmp_path / FILENAME).exists()


def test_one_gateway_per_data_directory(tmp_path: Path) -> None:
    first = Store(tmp_path)
    first.open()
    try:
        with pytest.raises(StoreError, match="in use by another Ledge"):
            Store(tmp_path).open()
    finally:
        first.close()
    Store(tmp_path).open()  # free again


def test_full_store_refuses_what_must_be_stored_and_serves_the_rest(tmp_path: Path) -> None:
    d = Durable(tmp_path)
    d.store.settings = StoreSettings(max_bytes=64 * 1024, retry_interval=0.05)
    d.store._db.execute("PRAGMA max_page_count = 16")  # type: ignore[union-attr]
    try:
        sub = persistent_sub(d, "sub", 1)
        sub.send(Disconnect())
        live = d.h.client()
        live.connect("live")
        live.subscribe("t/#", 1)
        pub5 = d.h.client()
        pub5.connect("pub5")
        pub5.send(Publish("t/big", b"x" * 60_000, 1, packet_id=1))
        batch = d.broker.seal_batch()
        assert batch is not None
        d.store.submit(batch[0], batch[1], 0.0)
        fn, args = d.events.get(timeout=10)
        fn(*args)
        assert d.failures and "full" in d.failures[0]
        d.broker.store_full = True  # as the app does on the failure callback
        assert pub5.take() == []  # its first message is not stored: no PUBACK, ever yet
        other5 = d.h.client()
        other5.connect("other5")
        other5.send(Publish("t/more", b"y", 1, packet_id=2))
        assert other5.take() == [PubAck(2, ReasonCode.QUOTA_EXCEEDED)]
        pub3 = d.h.client(MQTT_311)
        pub3.connect("pub3")
        pub3.send(Publish("t/more", b"z", 1, packet_id=3))
        assert pub3.closed
        other = d.h.client()
        other.connect("other")
        other.send(Publish("untouched/topic", b"ok", 1, packet_id=4))
        assert PubAck(4, ReasonCode.NO_MATCHING_SUBSCRIBERS) in other.take()
    finally:
        d.store.close()  # the writer is still retrying: it must stop anyway


def used_share(d: Durable, max_bytes: int) -> float:
    """The share of ``max_bytes`` the store's file uses (pages not on the free list)."""
    db = sqlite3.connect(f"file:{d.directory / FILENAME}?mode=ro", uri=True)
    try:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()
    return float((pages - free) * size / max_bytes)


def test_a_store_at_90_percent_refuses_and_takes_again_only_below_80(tmp_path: Path) -> None:
    """The README's watermarks on store.max_bytes: full at 90 %, room again below 80 %."""
    max_bytes = 512 * 1024
    d = Durable(tmp_path, StoreSettings(max_bytes=max_bytes, retry_interval=0.05), max_inflight=4)
    try:
        sub = persistent_sub(d, "sub", 1)
        sub.send(Disconnect())
        pub = d.h.client()
        pub.connect("pub")
        sent = 0
        while not d.fullness:
            sent += 1
            assert sent < 400, "never full"
            pub.send(Publish("t/x", b"%05d" % sent + b"x" * 2000, 1, packet_id=sent % 60000 + 1))
            d.commit()
        assert d.fullness == [True]
        assert 0.9 <= used_share(d, max_bytes) < 0.93  # full from 90 % (one message more)
        back = d.h.client()
        back.connect("sub", clean_start=False, session_expiry_interval=3600)
        seen_between = False
        while d.fullness == [True]:
            share = used_share(d, max_bytes)
            seen_between = seen_between or 0.8 <= share < 0.9
            d.commit()  # packet ids stored: the next window goes out
            got = back.publishes()
            assert got, f"still full at {share:.0%} with nothing left to deliver"
            for p in got:
                back.ack(p)
            d.commit()  # the acknowledged messages leave the store
        assert d.fullness == [True, False]
        assert used_share(d, max_bytes) < 0.8
        assert seen_between  # between 80 % and 90 % it still refused
    finally:
        d.close()


def test_journal_counts_message_references() -> None:
    """A message stored for two sessions leaves the store with the last of them."""
    h = Harness()
    h.broker.journal = Journal()
    ops: list[Op] = []

    def commit() -> None:  # as if the store committed each batch at once
        batch = h.broker.seal_batch()
        if batch is not None:
            ops.extend(batch[1])
            h.broker.batch_committed(batch[0])

    for name in ("a", "b"):
        c = h.client()
        c.connect(name, clean_start=False, session_expiry_interval=100)
        c.send(Subscribe(c.pid(), (SubscriptionRequest("t", 1),)))
        commit()
        c.send(Disconnect())
    pub = h.client()
    pub.connect("p")
    pub.send(Publish("t", b"m", 1, packet_id=1))
    commit()
    kinds = [type(op) for op in ops]
    assert kinds.count(StoreMessage) == 1
    assert kinds.count(AddEntry) == 2
    ops.clear()
    for name in ("a", "b"):
        back = h.client()
        back.connect(name, clean_start=False, session_expiry_interval=100)
        commit()
        [msg] = back.publishes()
        back.send(PubAck(msg.packet_id))
        commit()
    kinds = [type(op) for op in ops]
    assert kinds.count(RemoveEntry) == 2
    assert kinds.count(ForgetMessage) == 1


@pytest.mark.parametrize(("durability", "level"), [("power", 2), ("process", 1)])
def test_durability_sets_how_sqlite_syncs_each_commit(
    tmp_path: Path, durability: str, level: int
) -> None:
    """``power``: SQLite fsyncs the WAL at every commit (synchronous FULL = 2), so a
    power cut keeps what was acknowledged; ``process``: only at checkpoints (NORMAL =
    1), which a crash of the process survives. Read from the store's own connection,
    where the setting lives (it is per connection); the power-cut rigs
    (``tests/test_power.py``) show what it buys."""
    store = Store(tmp_path, StoreSettings(durability=durability))  # type: ignore[arg-type]
    store.open()
    try:
        db = store._db
        assert db is not None
        assert db.execute("PRAGMA synchronous").fetchone()[0] == level
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()
