"""The store's rows and what a restart gives back from them.

Two levels: journal operations handed straight to a real ``Store`` (the rows each op
writes, the clock step, meta values, the outbox reader, the writer's counters, its
failure and fullness reports, bad files and migrations), and a harness broker whose
journal a real store commits (``tests.test_store.Durable``), restarted to see what
clients get back: subscription options, message ages and origins, message ids,
packet ids, shared-subscription entries, and the "restored ..." log line.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import sqlite3
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.broker.journal import (
    AddEntry,
    AddIncoming,
    AddSubscription,
    EndSession,
    ForgetMessage,
    MoveEntry,
    Op,
    PutOutbox,
    RemoveEntry,
    RemoveIncoming,
    RemoveOutbox,
    RemoveSubscription,
    Retain,
    SaveSession,
    SetMeta,
    StepClock,
    StoreMessage,
    Unretain,
)
from gateway.broker.state import Flow
from gateway.mqtt import (
    Disconnect,
    Properties,
    PubAck,
    Publish,
    ReasonCode,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
)
from gateway.mqtt.properties import encode_properties
from gateway.store.settings import OUTBOX_ENTRY_OVERHEAD, StoreSettings
from gateway.store.sqlite import (
    FILENAME,
    MIGRATIONS,
    RESERVE_FREE_BYTES,
    Snapshot,
    Store,
    StoredEntry,
    StoredMessage,
    StoredSession,
    StoredSubscription,
)
from tests.support.durable import WALL, Durable, persistent_sub, subscribe_stored
from tests.support.harness import FakeClient

#: The wall clock minus the core's clock in the direct-store tests.
OFFSET = 1_600_000_000.0
MIB = 1024 * 1024


class Writer:
    """A real store, its writer thread, and what it reports (in the writer thread)."""

    def __init__(
        self,
        directory: Path,
        settings: StoreSettings | None = None,
        store: Store | None = None,
    ) -> None:
        self.store = store or Store(
            directory, settings or StoreSettings(commit_interval=0.0, retry_interval=0.01)
        )
        self.snapshot = self.store.open()
        self.committed: queue.Queue[int] = queue.Queue()
        self.failures: queue.Queue[str] = queue.Queue()
        self.fullness: queue.Queue[bool] = queue.Queue()
        self.batch = 0

    def start(self) -> None:
        self.store.start(
            lambda fn, *args: fn(*args),
            self.committed.put,
            self.failures.put,
            self.fullness.put,
        )

    def submit(self, *ops: Op, offset: float = OFFSET) -> int:
        self.batch += 1
        self.store.submit(self.batch, list(ops), offset)
        return self.batch

    def write(self, *ops: Op, offset: float = OFFSET) -> None:
        """Submit one batch and wait until the writer says it is committed."""
        batch = self.submit(*ops, offset=offset)
        assert self.committed.get(timeout=10) == batch

    def close(self) -> None:
        self.store.close()


def store_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the store logged (a worker's earlier tests may leave other loggers on)."""
    return [r.getMessage() for r in caplog.records if r.name == "ledge.store"]


def reopen(directory: Path) -> Snapshot:
    """What the next start of the gateway reads."""
    store = Store(directory)
    try:
        return store.open()
    finally:
        store.close()


def rows(directory: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(directory / FILENAME)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


PROPS = encode_properties(Properties(content_type="text/plain"))
WILL = Will("w/s1", b"bye", 1, False, Properties(content_type="text/plain", will_delay_interval=30))


def session_ops() -> list[Op]:
    """Two sessions and their subscriptions (order-sensitive: applied op by op)."""
    return [
        SaveSession("s1", 3600, 100.0, 5, WILL, 130.0),
        SaveSession("s2", 60, None, 4, None, None),
        AddSubscription("s1", "a/#", "a/#", 1, 1, 0, 2, 7, None),
        AddSubscription("s1", "$share/g/b", "b", 2, 0, 1, 0, None, "g"),
        AddSubscription("s1", "gone", "gone", 0, 0, 0, 0, None, None),
        AddSubscription("s2", "c", "c", 1, 0, 0, 1, 3, None),
        RemoveSubscription("s1", "gone"),
        AddSubscription("ghost", "x", "x", 0, 0, 0, 0, None, None),  # no session: not read
    ]


def flow_ops() -> list[Op]:
    """Messages, queue entries, incoming ids, retained, outbox, meta (grouped)."""
    return [
        StoreMessage(1, "a/x", b"one", 1, 0, PROPS, "pub", 60, 50.0),
        StoreMessage(2, "b", b"two", 2, 1, b"\x00", None, None, 51.0),
        AddEntry("s1", 1, 1, 1, 0, (7,), 0, Flow.QUEUED, None),
        AddEntry("s1", 2, 2, 2, 1, (), 5, Flow.AWAIT_ACK, ("g", "b")),
        AddEntry("s1", 3, 99, 1, 0, (), 0, Flow.QUEUED, None),  # its message is gone
        AddEntry("ghost", 8, 1, 1, 0, (), 0, Flow.QUEUED, None),  # no session
        AddIncoming("s1", 9),
        AddIncoming("s1", 10),
        RemoveIncoming("s1", 10),
        AddIncoming("s2", 11),
        Retain("r/x", b"kept", 1, PROPS, "pub", 600, 40.0),
        Retain("r/y", b"old", 0, b"\x00", None, None, 41.0),
        Unretain("r/y"),
        PutOutbox("cloud", 1, 7, "o/t", b"p1", 1, 0, b"\x00", 1_700_000_000.0, None),
        PutOutbox("cloud", 2, 8, "o/t", b"p22", 1, 1, b"\x00", 1_700_000_001.0, 1_700_000_100.0),
        PutOutbox("edge", 1, 3, "e", b"", 0, 0, b"\x00", 1_700_000_002.0, None),
        SetMeta("k", "1"),
        SetMeta("k", "2"),
    ]


def test_a_restart_reads_back_every_row_the_journal_wrote(tmp_path: Path) -> None:
    """Sessions, wills, subscription options, queued and in-flight entries, inbound
    QoS 2 ids, retained messages, the outbox and meta all come back after a restart,
    times turned into wall-clock times; rows of sessions that are gone stay unread."""
    w = Writer(tmp_path)
    w.start()
    try:
        w.write(*session_ops())
        w.write(*flow_ops())
    finally:
        w.close()
    snap = reopen(tmp_path)
    s1 = StoredSession(
        "s1",
        3600,
        100.0 + OFFSET,
        5,
        WILL,
        130.0 + OFFSET,
        [
            StoredSubscription("$share/g/b", "b", 2, False, True, 0, None, "g"),
            StoredSubscription("a/#", "a/#", 1, True, False, 2, 7, None),
        ],
        [
            StoredEntry(1, 1, 1, False, (7,), 0, Flow.QUEUED, None),
            StoredEntry(2, 2, 2, True, (), 5, Flow.AWAIT_ACK, ("g", "b")),
        ],
        [9],
    )
    s2 = StoredSession(
        "s2", 60, None, 4, None, None, [StoredSubscription("c", "c", 1, False, False, 1, 3, None)]
    )
    s2.incoming_qos2 = [11]
    assert snap.sessions == [s1, s2]
    assert snap.messages == {
        1: StoredMessage(1, "a/x", b"one", 1, False, PROPS, "pub", 60, 50.0 + OFFSET),
        2: StoredMessage(2, "b", b"two", 2, True, b"\x00", None, None, 51.0 + OFFSET),
    }
    assert snap.retained == [
        StoredMessage(0, "r/x", b"kept", 1, True, PROPS, "pub", 600, 40.0 + OFFSET)
    ]
    assert (snap.next_message_id, snap.next_seq) == (3, 9)
    assert snap.outbox == {
        "cloud": [
            (1, 3 + 2 + 1 + OUTBOX_ENTRY_OVERHEAD, 1_700_000_000.0),
            (2, 3 + 3 + 1 + OUTBOX_ENTRY_OVERHEAD, 1_700_000_001.0),
        ],
        "edge": [(1, 1 + 0 + 1 + OUTBOX_ENTRY_OVERHEAD, 1_700_000_002.0)],
    }
    assert snap.outbox_max_seq == 8
    assert snap.meta == {"k": "2"}


@pytest.mark.parametrize("mixed", [False, True], ids=["grouped", "op-by-op"])
def test_removals_leave_only_what_is_still_owed(tmp_path: Path, mixed: bool) -> None:
    """Acknowledged entries, forgotten messages, cleared retained topics, sent outbox
    rows and ended sessions are gone after a restart, on both ways a batch is applied
    (grouped, or op by op when it also holds a session change); the rest stays."""
    w = Writer(tmp_path)
    w.start()
    try:
        w.write(*session_ops())
        w.write(*flow_ops())
        removals: list[Op] = [
            MoveEntry("s1", 1, 4, Flow.AWAIT_ACK),
            RemoveEntry("s1", 2),
            ForgetMessage(2),
            RemoveIncoming("s1", 9),
            Unretain("r/x"),
            RemoveOutbox("cloud", 1),
        ]
        if mixed:
            removals.append(EndSession("s2"))
        w.write(*removals)
    finally:
        w.close()
    snap = reopen(tmp_path)
    s1 = snap.sessions[0]
    assert s1.entries == [StoredEntry(1, 1, 1, False, (7,), 4, Flow.AWAIT_ACK, None)]
    assert s1.incoming_qos2 == []
    assert list(snap.messages) == [1]
    assert snap.retained == []
    assert [pos for pos, _, _ in snap.outbox["cloud"]] == [2]
    assert [s.client_id for s in snap.sessions] == (["s1"] if mixed else ["s1", "s2"])
    if mixed:  # every row of the ended session, and only of it
        for table in ("sessions", "subscriptions", "queue", "incoming_qos2"):
            assert rows(tmp_path, f"SELECT * FROM {table} WHERE client_id = 's2'") == []
        assert len(s1.subscriptions) == 2


def test_a_clock_step_moves_every_stored_time_written_before_it(tmp_path: Path) -> None:
    """The system clock set back an hour while running: session deadlines, will
    times, message and retained ages and outbox times stored before the step move
    with it (NULLs stay NULL), what is written after it in the same batch does not."""
    step = -3600.0
    w = Writer(tmp_path)
    w.start()
    try:
        w.write(*session_ops())
        w.write(*flow_ops())
        w.write(
            StepClock(step),
            StoreMessage(3, "late", b"3", 1, 0, b"\x00", None, None, 52.0),
            Retain("r/late", b"l", 0, b"\x00", None, None, 53.0),
            PutOutbox("cloud", 3, 9, "o/t", b"", 0, 0, b"\x00", 1_700_000_003.0, 1_700_000_050.0),
        )
    finally:
        w.close()
    snap = reopen(tmp_path)
    s1, s2 = snap.sessions
    assert (s1.expires_at, s1.will_due) == (100.0 + OFFSET + step, 130.0 + OFFSET + step)
    assert (s2.expires_at, s2.will_due) == (None, None)
    assert {i: m.created for i, m in snap.messages.items()} == {
        1: 50.0 + OFFSET + step,
        2: 51.0 + OFFSET + step,
        3: 52.0 + OFFSET,
    }
    assert {m.topic: m.created for m in snap.retained} == {
        "r/x": 40.0 + OFFSET + step,
        "r/late": 53.0 + OFFSET,
    }
    assert rows(tmp_path, "SELECT bridge, pos, created, expires FROM outbox ORDER BY 1, 2") == [
        ("cloud", 1, 1_700_000_000.0 + step, None),
        ("cloud", 2, 1_700_000_001.0 + step, 1_700_000_100.0 + step),
        ("cloud", 3, 1_700_000_003.0, 1_700_000_050.0),
        ("edge", 1, 1_700_000_002.0 + step, None),
    ]


def test_meta_written_at_once_before_the_writer_starts(tmp_path: Path) -> None:
    """``set_meta_now`` (the app's reserve bookkeeping) is durable without a commit of
    the writer, and the last value of a key wins."""
    store = Store(tmp_path)
    store.open()
    store.set_meta_now("reserve", "10")
    store.set_meta_now("reserve", "20")
    store.set_meta_now("other", "x")
    store.close()
    assert reopen(tmp_path).meta == {"reserve": "20", "other": "x"}


def test_the_outbox_reader_pages_committed_rows_of_one_bridge(tmp_path: Path) -> None:
    """A bridge reads its own committed outbox rows from a position on, in order and
    at most ``count``, from another thread; later commits are seen by the next read."""
    w = Writer(tmp_path)
    w.start()
    try:
        w.write(*flow_ops())
        w.write(PutOutbox("cloud", 3, 9, "o/3", b"p3", 2, 0, b"\x00", 1_700_000_005.0, None))
        got: list[list[tuple[Any, ...]]] = []
        reader = threading.Thread(target=lambda: got.append(w.store.read_outbox("cloud", 2, 2)))
        reader.start()
        reader.join(10)
        assert got == [
            [
                (2, 8, "o/t", b"p22", 1, 1, b"\x00", 1_700_000_001.0, 1_700_000_100.0),
                (3, 9, "o/3", b"p3", 2, 0, b"\x00", 1_700_000_005.0, None),
            ]
        ]
        w.write(RemoveOutbox("cloud", 2))
        assert [r[0] for r in w.store.read_outbox("cloud", 1, 10)] == [1, 3]
        assert w.store.read_outbox("edge", 2, 10) == []
    finally:
        w.close()


def test_backlog_and_counters_follow_the_commits(tmp_path: Path) -> None:
    """``backlog`` counts ops handed over and not yet written (summed over batches);
    ``commits`` and ``ops_written`` add up over commits (what $SYS and metrics show)."""
    w = Writer(tmp_path)
    try:
        w.submit(SetMeta("a", "1"), SetMeta("b", "1"), SetMeta("c", "1"))
        w.submit(SetMeta("d", "1"), SetMeta("e", "1"))
        assert w.store.backlog == 5
        w.start()
        assert w.committed.get(timeout=10) == 2  # both waiting batches in one commit
        assert (w.store.backlog, w.store.commits, w.store.ops_written) == (0, 1, 5)
        w.write(SetMeta("f", "1"), SetMeta("g", "1"))
        assert (w.store.backlog, w.store.commits, w.store.ops_written) == (0, 2, 7)
    finally:
        w.close()


class FailingStore(Store):
    """A store whose disk is full for the first ``fails`` commit attempts."""

    fails = 0

    def _apply(self, batches: list[tuple[int, list[Op], float]]) -> None:
        if self.fails:
            self.fails -= 1
            raise sqlite3.OperationalError("database or disk is full")
        super()._apply(batches)


def failing_writer(directory: Path, fails: int) -> tuple[Writer, FailingStore]:
    store = FailingStore(directory, StoreSettings(commit_interval=0.0, retry_interval=0.01))
    store.fails = fails
    w = Writer(directory, store=store)
    w.start()
    return w, store


def test_a_failing_commit_is_reported_once_and_retried_until_it_succeeds(
    tmp_path: Path,
) -> None:
    """A full disk is reported to the loop once (not at every retry), the batch is
    retried and committed when there is room, and no acknowledgement went out before."""
    w, store = failing_writer(tmp_path, 3)
    try:
        w.write(SetMeta("k", "v"))
        assert store.fails == 0  # it really retried three times
        assert w.failures.get_nowait() == "database or disk is full"
        assert w.failures.empty()
        assert (w.store.commits, w.store.backlog) == (1, 0)
    finally:
        w.close()
    assert reopen(tmp_path).meta == {"k": "v"}


def test_stopping_while_the_disk_is_full_logs_what_was_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop while commits fail returns (no hang) and says in the log that changes
    were not written; nothing is reported as committed."""
    w, _ = failing_writer(tmp_path, 1_000_000)
    w.submit(SetMeta("k", "v"))
    assert w.failures.get(timeout=10) == "database or disk is full"
    with caplog.at_level(logging.ERROR, logger="ledge.store"):
        w.close()
    assert store_lines(caplog) == [
        "store: stopping with changes it could not write: database or disk is full"
    ]
    assert w.committed.empty()
    assert reopen(tmp_path).meta == {}


def fake_disk(monkeypatch: pytest.MonkeyPatch, free: list[int]) -> None:
    """The store's filesystem has ``free[0]`` bytes available (4 KiB blocks)."""
    monkeypatch.setattr(
        os, "statvfs", lambda path: SimpleNamespace(f_bavail=free[0] // 4096, f_frsize=4096)
    )


def test_disk_reserve_watermarks_with_hysteresis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Less than 16 MiB free: full from the start; room again only from 32 MiB free
    (not at 20); at exactly 16 MiB free a store with room stays open, below it is full.
    While full, room made by others is noticed without any write."""
    free = [10 * MIB]
    fake_disk(monkeypatch, free)
    w = Writer(tmp_path)
    w.start()
    try:
        assert w.fullness.get(timeout=10) is True
        assert w.store.full
        free[0] = 20 * MIB
        w.write(SetMeta("k", "1"))
        assert w.fullness.empty()
        free[0] = 2 * RESERVE_FREE_BYTES
        w.write(SetMeta("k", "2"))
        assert w.fullness.get_nowait() is False
        free[0] = RESERVE_FREE_BYTES
        w.write(SetMeta("k", "3"))
        assert w.fullness.empty()
        free[0] = RESERVE_FREE_BYTES - 4096
        w.write(SetMeta("k", "4"))
        assert w.fullness.get_nowait() is True
        free[0] = 64 * MIB  # a file deleted elsewhere on the disk
        assert w.fullness.get(timeout=10) is False  # no write needed
    finally:
        w.close()


def test_a_store_past_90_percent_of_max_bytes_is_full_from_the_start(tmp_path: Path) -> None:
    """``store.max_bytes``: a file already using 90 % of it refuses from the start;
    one byte more of ``max_bytes`` than that and it takes messages."""
    reopen(tmp_path)  # creates the schema's pages
    used = rows(tmp_path, "PRAGMA page_count")[0][0] * rows(tmp_path, "PRAGMA page_size")[0][0]
    for max_bytes, full in ((int(used / 0.9), True), (int(used / 0.9) + 2, False)):
        w = Writer(tmp_path, StoreSettings(max_bytes=max_bytes, commit_interval=0.0))
        w.start()
        try:
            assert w.store.full is full
            if full:
                assert w.fullness.get(timeout=10) is True
            w.write(SetMeta("k", "v"))
            assert w.store.full is full
            assert w.fullness.empty()
        finally:
            w.close()


# --------------------------------------------------------------------------- bad files


def test_corrupt_store_moved_aside_under_a_dated_name_and_said_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``on_corrupt = "move-aside"``: the file goes, untouched, to
    ``ledge.db.corrupt-<local time>`` (kept for a post-mortem), the log says so with
    the reason and the new name, and the store starts empty."""
    path = tmp_path / FILENAME
    path.write_bytes(b"garbage" * 1000)
    before = time.time()
    store = Store(tmp_path, StoreSettings(on_corrupt="move-aside"))
    with caplog.at_level(logging.ERROR, logger="ledge.store"):
        snapshot = store.open()
    store.close()
    after = time.time()
    assert snapshot.sessions == [] and snapshot.meta == {}
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith(f"{FILENAME}.corrupt-")]
    match = re.fullmatch(rf"{re.escape(FILENAME)}\.corrupt-(\d{{8}}T\d{{6}})", aside.name)
    assert match, aside.name
    stamp = time.mktime(time.strptime(match.group(1), "%Y%m%dT%H%M%S"))
    assert int(before) - 1 <= stamp <= after
    assert aside.read_bytes() == b"garbage" * 1000
    assert store_lines(caplog) == [
        f"store {path} is unreadable (file is not a database): moved aside to {aside}; "
        "starting with an empty store -- sessions, queued and retained messages are NOT "
        "restored"
    ]


def test_a_second_gateway_is_told_the_pid_holding_the_directory(tmp_path: Path) -> None:
    """The lock file names the running gateway's pid, and the refusal repeats it."""
    first = Store(tmp_path)
    first.open()
    try:
        assert (tmp_path / "ledge.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(Exception) as info:
            Store(tmp_path).open()
        assert str(info.value) == (
            f"data directory {tmp_path} is in use by another Ledge (pid {os.getpid()}); "
            "stop it first, or give this one another --data-dir"
        )
    finally:
        first.close()


def test_a_version_1_store_is_migrated_keeping_its_sessions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store written before the bridge outbox existed (schema 1) gets the outbox
    table, keeps its sessions, and the log says so; a new store logs no migration."""
    db = sqlite3.connect(tmp_path / FILENAME)
    for statement in MIGRATIONS[1]:
        db.execute(statement)
    db.execute("INSERT INTO sessions VALUES ('old', 60, 5.0, 4, NULL, NULL)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with caplog.at_level(logging.INFO, logger="ledge.store"):
        w = Writer(tmp_path)
    w.start()
    try:
        assert [s.client_id for s in w.snapshot.sessions] == ["old"]
        w.write(PutOutbox("cloud", 1, 1, "t", b"p", 0, 0, b"\x00", 1.0, None))
        assert [r[0] for r in w.store.read_outbox("cloud", 1, 5)] == [1]
    finally:
        w.close()
    assert store_lines(caplog) == [f"store {tmp_path / FILENAME} migrated from schema 1 to 2"]
    assert rows(tmp_path, "PRAGMA user_version") == [(2,)]
    caplog.clear()
    fresh = tmp_path / "fresh"
    with caplog.at_level(logging.INFO, logger="ledge.store"):
        reopen(fresh)
    assert store_lines(caplog) == []
    assert rows(fresh, "PRAGMA user_version") == [(2,)]


# --------------------------------------------------------------------------- restore


def connect_back(d: Durable, client_id: str, **options: Any) -> FakeClient:
    c = d.h.client()
    ack = c.connect(client_id, clean_start=False, session_expiry_interval=3600, **options)
    assert ack.session_present
    return c


def test_subscription_options_and_unsubscribes_survive_a_restart(tmp_path: Path) -> None:
    """After a restart a subscription keeps No Local, Retain As Published and its
    Subscription Identifier, and an UNSUBSCRIBE made before it stays made."""
    d = Durable(tmp_path)
    c = d.h.client()
    c.connect("s", clean_start=False, session_expiry_interval=3600)
    c.send(
        Subscribe(
            1,
            (SubscriptionRequest("t/#", 1, no_local=True, retain_as_published=True),),
            Properties(subscription_identifiers=(7,)),
        )
    )
    d.commit()
    c.expect(SubAck)
    subscribe_stored(d, c, "gone/#")
    c.send(Unsubscribe(3, ("gone/#",)))
    d.commit()
    assert isinstance(c.expect(UnsubAck), UnsubAck)
    later = d.restart()
    try:
        back = connect_back(later, "s")
        other = later.h.client()
        other.connect("other")
        other.send(Publish("t/r", b"kept", 1, retain=True, packet_id=1))
        other.send(Publish("gone/x", b"no", 1, packet_id=2))
        back.send(Publish("t/own", b"mine", 1, packet_id=5))
        later.commit()
        packets = back.take()
        got = [p for p in packets if isinstance(p, Publish)]
        assert [(p.topic, p.retain, p.properties.subscription_identifiers) for p in got] == [
            ("t/r", True, (7,))
        ]
        # its own message reached nobody: No Local kept it from its only subscription
        assert PubAck(5, ReasonCode.NO_MATCHING_SUBSCRIBERS) in packets
    finally:
        later.close()


def test_retained_origin_and_message_ages_survive_a_restart(tmp_path: Path) -> None:
    """A retained message keeps its publisher (No Local still holds it back from that
    client), a queued message's expiry keeps counting through the downtime, and a
    retained message that expired meanwhile is gone, from the store too."""
    d = Durable(tmp_path)
    sub = persistent_sub(d, "sub", 1)
    sub.send(Disconnect())
    me = d.h.client()
    me.connect("me")
    me.send(Publish("r/mine", b"state", 1, retain=True, packet_id=1))
    me.send(
        Publish(
            "r/short",
            b"brief",
            1,
            retain=True,
            packet_id=2,
            properties=Properties(message_expiry_interval=10),
        )
    )
    me.send(
        Publish("t/x", b"ages", 1, packet_id=3, properties=Properties(message_expiry_interval=60))
    )
    d.commit()
    later = d.restart(downtime=20)
    try:
        later.commit()  # the expired retained message leaves the store
        assert rows(tmp_path, "SELECT topic FROM retained") == [("r/mine",)]
        again = later.h.client()
        again.connect("me")
        again.subscribe("r/#", 1, no_local=True)
        assert again.take() == []
        fresh = later.h.client()
        fresh.connect("fresh")
        fresh.subscribe("r/#", 1)
        assert [p.topic for p in fresh.publishes()] == ["r/mine"]
        back = connect_back(later, "sub")
        later.commit()
        [msg] = back.publishes()
        assert (msg.payload, msg.properties.message_expiry_interval) == (b"ages", 40)
    finally:
        later.close()


def test_message_ids_go_on_after_a_restart_and_delivered_messages_leave(
    tmp_path: Path,
) -> None:
    """A message stored after a restart gets a new id (it must not overwrite one still
    queued); once delivered and acknowledged, restored messages leave the store; a
    message row no queue refers to (left by a crash) is dropped at start-up."""
    d = Durable(tmp_path)
    sub = persistent_sub(d, "sub", 1)
    sub.send(Disconnect())
    pub = d.h.client()
    pub.connect("pub")
    pub.send(Publish("t/a", b"A", 1, packet_id=1))
    d.commit()
    d.close()
    db = sqlite3.connect(tmp_path / FILENAME)
    db.execute("INSERT INTO messages VALUES (77, 'lost', x'00', 1, 0, x'00', NULL, NULL, 1.0)")
    db.commit()
    db.close()
    later = d.restart()
    try:
        later.commit()
        assert rows(tmp_path, "SELECT count(*) FROM messages WHERE id = 77") == [(0,)]
        pub = later.h.client()
        pub.connect("pub")
        pub.send(Publish("t/b", b"B", 1, packet_id=1))
        later.commit()
    finally:
        later.close()
    latest = later.restart()
    try:
        back = connect_back(latest, "sub")
        latest.commit()
        got = back.publishes()
        assert [p.payload for p in got] == [b"A", b"B"]
        for p in got:
            back.send(PubAck(p.packet_id))
        latest.commit()
        assert rows(tmp_path, "SELECT count(*) FROM messages") == [(0,)]
        assert rows(tmp_path, "SELECT count(*) FROM queue") == [(0,)]
    finally:
        latest.close()


def test_restart_log_counts_what_was_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The start-up log line counts sessions, subscriptions, queued and in-flight
    messages and retained messages; with only retained messages it still appears."""
    d = Durable(tmp_path)
    a = d.h.client()
    a.connect("a", clean_start=False, session_expiry_interval=3600)
    for f in ("t/#", "u/#", "v/#"):
        subscribe_stored(d, a, f)
    a.send(Disconnect())
    b = persistent_sub(d, "b", 1)  # "t/#", stays connected
    b.send(Subscribe(b.pid(), (SubscriptionRequest("u/1", 1),)))
    d.commit()
    b.expect(SubAck)
    b.send(Unsubscribe(b.pid(), ("t/#",)))
    d.commit()
    b.expect(UnsubAck)
    pub = d.h.client()
    pub.connect("pub")
    for i, topic in enumerate(("t/1", "t/2", "u/1")):
        pub.send(Publish(topic, b"m", 1, packet_id=i + 1))
    for i in range(5):
        pub.send(Publish(f"r/{i}", b"r", 0, retain=True))
    d.commit()
    d.commit()  # b's packet id is stored: in flight
    assert [p.topic for p in b.publishes()] == ["u/1"]
    with caplog.at_level(logging.INFO, logger="ledge.store"):
        later = d.restart()
    later.close()
    assert store_lines(caplog) == [
        "restored 2 session(s), 4 subscription(s), 3 queued and 1 in-flight message(s), "
        "5 retained message(s)"
    ]
    only = tmp_path / "only-retained"
    r = Durable(only)
    p = r.h.client()
    p.connect("p")
    p.send(Publish("r/x", b"r", 0, retain=True))
    r.commit()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ledge.store"):
        again = r.restart()
    again.close()
    assert store_lines(caplog) == [
        "restored 0 session(s), 0 subscription(s), 0 queued and 0 in-flight message(s), "
        "1 retained message(s)"
    ]


def test_a_shared_subscription_message_moves_on_after_a_restart(tmp_path: Path) -> None:
    """A message in flight to one member of a shared subscription when the gateway
    stopped goes to another member when the first one's session is discarded."""
    d = Durable(tmp_path)
    b = d.h.client()
    b.connect("b", clean_start=False, session_expiry_interval=3600)
    subscribe_stored(d, b, "$share/g/t/#")
    b.send(Disconnect())
    a = d.h.client()
    a.connect("a", clean_start=False, session_expiry_interval=3600)
    subscribe_stored(d, a, "$share/g/t/#")
    pub = d.h.client()
    pub.connect("pub")
    pub.send(Publish("t/x", b"work", 1, packet_id=1))
    d.commit()
    d.commit()
    assert [p.payload for p in a.publishes()] == [b"work"]  # never acknowledged
    later = d.restart()
    try:
        b2 = connect_back(later, "b")
        later.commit()
        assert b2.take() == []
        a2 = later.h.client()
        a2.connect("a", clean_start=True)
        later.commit()
        assert [(p.topic, p.payload) for p in b2.publishes()] == [("t/x", b"work")]
    finally:
        later.close()


def test_packet_ids_after_a_restart_go_on_from_the_highest_in_flight(tmp_path: Path) -> None:
    """A session restored with packet id 65535 in flight resends it, and its next new
    message takes packet id 1 (ids wrap within 1..65535)."""
    w = Writer(tmp_path)
    w.start()
    try:
        w.write(
            SaveSession("p", 3600, None, 5, None, None),
            AddSubscription("p", "t/#", "t/#", 1, 0, 0, 0, None, None),
        )
        w.write(
            StoreMessage(1, "t/old", b"old", 1, 0, b"\x00", None, None, WALL - OFFSET),
            AddEntry("p", 1, 1, 1, 0, (), 65535, Flow.AWAIT_ACK, None),
        )
    finally:
        w.close()
    d = Durable(tmp_path)
    try:
        back = connect_back(d, "p")
        [old] = back.publishes()
        assert (old.topic, old.packet_id, old.dup) == ("t/old", 65535, True)
        pub = d.h.client()
        pub.connect("pub")
        pub.send(Publish("t/new", b"new", 1, packet_id=1))
        d.commit()
        d.commit()
        [new] = back.publishes()
        assert (new.topic, new.packet_id) == ("t/new", 1)
    finally:
        d.close()


def test_session_expiry_and_will_timing_after_a_restart(tmp_path: Path) -> None:
    """A disconnected session expires at its stored deadline, counted through the
    downtime; one connected when the gateway stopped starts its expiry at the restart;
    a delayed will not yet due is published when due, not before, keeping its
    properties and its retain flag (not retained)."""
    d = Durable(tmp_path)
    watch = persistent_sub(d, "watch", 1)
    watch.send(Subscribe(watch.pid(), (SubscriptionRequest("wills/#", 1),)))
    d.commit()
    watch.expect(SubAck)
    watch.send(Disconnect())
    short = d.h.client()
    short.connect("short", clean_start=False, session_expiry_interval=30)
    short.send(Disconnect())
    live = d.h.client()
    live.connect("live", clean_start=False, session_expiry_interval=30)
    w = d.h.client()
    w.connect(
        "w",
        clean_start=False,
        session_expiry_interval=100,
        will=Will(
            "wills/w",
            b"gone",
            1,
            False,
            Properties(will_delay_interval=60, content_type="text/plain"),
        ),
    )
    w.drop()
    d.commit()
    later = d.restart(downtime=20)
    try:
        sessions = later.broker.sessions
        assert {"short", "live", "w", "watch"} <= set(sessions)
        later.h.advance(9.5)
        assert "short" in sessions
        later.h.advance(1)  # 30 s after its disconnect
        assert "short" not in sessions
        assert "live" in sessions
        later.h.advance(19)  # 29.5 s after the restart
        assert "live" in sessions
        later.h.advance(1)
        assert "live" not in sessions
        back = connect_back(later, "watch")
        later.commit()
        assert back.take() == []  # the will is due 60 s after the drop: 9.5 s to go
        later.h.advance(10)
        later.commit()
        [will] = back.publishes()
        assert (will.topic, will.payload, will.properties.content_type) == (
            "wills/w",
            b"gone",
            "text/plain",
        )
        fresh = later.h.client()
        fresh.connect("fresh")
        fresh.subscribe("wills/#", 1)
        assert fresh.take() == []  # not retained
    finally:
        later.close()
