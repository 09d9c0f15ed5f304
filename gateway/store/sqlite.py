"""The durable store: SQLite (standard library) in WAL mode, one batching writer thread.

The broker core records every change to persistent state as an operation in its
journal; the shell seals the journal into numbered batches and hands them here.
The writer applies everything that is waiting in one transaction (group commit)
and reports the highest batch committed; only then does the shell release the
acknowledgements that depended on it.

``durability = "power"`` (the default) commits with ``synchronous = FULL``: every
commit is fsynced, so what was acknowledged survives a power cut.
``durability = "process"`` uses ``synchronous = NORMAL``: commits reach the
operating system but are not fsynced, so they survive a crash of the process but
the last commits (up to the WAL's last checkpoint) can be lost with the power.

Group commit: a commit starts at most once per ``store.commit_interval``. A change
arriving after a quiet spell is committed at once; under load, what arrives within
the interval after a commit waits and goes in the next one. Each commit writes every
database page it changed whole to the WAL (4 KiB), so fewer commits mean fewer bytes
written to the card: at 100 messages/s into a persistent session, one commit per
message and one per its delivery wrote ~24 KiB per message; one commit per 0.1 s
writes about a tenth of that (``bench/wear.py``). The price is latency: an
acknowledgement waits up to one interval more, and a publisher that waits for each
acknowledgement before the next message gets at most one message per interval.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

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
from gateway.mqtt.packets import Will
from gateway.mqtt.properties import Where, decode_properties, encode_properties
from gateway.store.settings import OUTBOX_ENTRY_OVERHEAD, StoreSettings

log = logging.getLogger("ledge.store")

SCHEMA_VERSION: Final = 2
FILENAME: Final = "ledge.db"

#: Migrations from version N-1 to N, applied in order inside one transaction.
MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: (
        """CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
        """CREATE TABLE sessions (
            client_id TEXT PRIMARY KEY,
            expiry_interval INTEGER NOT NULL,
            expires_at REAL,
            protocol INTEGER NOT NULL,
            will TEXT,
            will_due REAL
        )""",
        """CREATE TABLE subscriptions (
            client_id TEXT NOT NULL,
            key TEXT NOT NULL,
            topic_filter TEXT NOT NULL,
            qos INTEGER NOT NULL,
            no_local INTEGER NOT NULL,
            retain_as_published INTEGER NOT NULL,
            retain_handling INTEGER NOT NULL,
            identifier INTEGER,
            share_name TEXT,
            PRIMARY KEY (client_id, key)
        ) WITHOUT ROWID""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            topic TEXT NOT NULL,
            payload BLOB NOT NULL,
            qos INTEGER NOT NULL,
            retain INTEGER NOT NULL,
            properties BLOB NOT NULL,
            origin TEXT,
            expiry_interval INTEGER,
            created REAL NOT NULL
        )""",
        """CREATE TABLE queue (
            client_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            message_id INTEGER NOT NULL,
            qos INTEGER NOT NULL,
            retain INTEGER NOT NULL,
            sub_ids TEXT NOT NULL,
            packet_id INTEGER NOT NULL,
            state INTEGER NOT NULL,
            share TEXT,
            PRIMARY KEY (client_id, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE incoming_qos2 (
            client_id TEXT NOT NULL,
            packet_id INTEGER NOT NULL,
            PRIMARY KEY (client_id, packet_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE retained (
            topic TEXT PRIMARY KEY,
            payload BLOB NOT NULL,
            qos INTEGER NOT NULL,
            properties BLOB NOT NULL,
            origin TEXT,
            expiry_interval INTEGER,
            created REAL NOT NULL
        ) WITHOUT ROWID""",
    ),
    2: (
        # The cloud bridges' outboxes: one contiguous run of positions per bridge.
        """CREATE TABLE outbox (
            bridge TEXT NOT NULL,
            pos INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            topic TEXT NOT NULL,
            payload BLOB NOT NULL,
            qos INTEGER NOT NULL,
            retain INTEGER NOT NULL,
            properties BLOB NOT NULL,
            created REAL NOT NULL,
            expires REAL,
            PRIMARY KEY (bridge, pos)
        )""",
    ),
}


#: The store stops taking new messages when less than this is free on its filesystem...
RESERVE_FREE_BYTES: Final = 16 * 1024 * 1024
#: ... or when it reaches this share of ``store.max_bytes``; it takes them again below
#: the second share (hysteresis, so it does not flap).
FULL_AT: Final = 0.90
ROOM_AT: Final = 0.80


#: A group commit takes at most this many sealed batches (the shell seals one per event
#: loop iteration), so one transaction stays bounded under a flood.
GROUP_MAX_BATCHES: Final = 4096


class StoreError(Exception):
    """The store cannot be used; the message names the file and the way out."""


class NewerStore(StoreError):
    """Written by a newer Ledge: never moved aside, since an upgrade reads it."""


# --------------------------------------------------------------------------- snapshot


@dataclass(slots=True)
class StoredMessage:
    id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: bytes
    origin: str | None
    expiry_interval: int | None
    created: float  # wall clock


@dataclass(slots=True)
class StoredEntry:
    seq: int
    message_id: int
    qos: int
    retain: bool
    sub_ids: tuple[int, ...]
    packet_id: int
    state: int
    share: tuple[str, str] | None


@dataclass(slots=True)
class StoredSubscription:
    key: str
    topic_filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    identifier: int | None
    share_name: str | None


@dataclass(slots=True)
class StoredSession:
    client_id: str
    expiry_interval: int
    expires_at: float | None  # wall clock; None: was connected when last written
    protocol: int
    will: Will | None
    will_due: float | None  # wall clock
    subscriptions: list[StoredSubscription] = field(default_factory=list)
    entries: list[StoredEntry] = field(default_factory=list)
    incoming_qos2: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Snapshot:
    """Everything the store holds, read once at start-up."""

    sessions: list[StoredSession]
    messages: dict[int, StoredMessage]
    retained: list[StoredMessage]
    next_message_id: int
    next_seq: int
    #: Per bridge: ``(pos, size, created)`` of each outbox row, in position order.
    outbox: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    #: Per bridge: the highest gateway sequence number in its outbox.
    outbox_max_seq: int = 0
    meta: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- will codec


def encode_will(will: Will) -> str:
    return json.dumps(
        {
            "topic": will.topic,
            "payload": base64.b64encode(will.payload).decode(),
            "qos": will.qos,
            "retain": will.retain,
            "properties": base64.b64encode(encode_properties(will.properties)).decode(),
        }
    )


def decode_will(text: str) -> Will:
    data = json.loads(text)
    props_bytes = base64.b64decode(data["properties"])
    props, _ = decode_properties(props_bytes, 0, len(props_bytes), Where.WILL)
    return Will(
        data["topic"], base64.b64decode(data["payload"]), data["qos"], data["retain"], props
    )


# --------------------------------------------------------------------------- the store


class Store:
    """One SQLite database file and the thread that writes it."""

    def __init__(self, directory: Path, settings: StoreSettings | None = None) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILENAME
        self.settings = settings or StoreSettings()
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._stopping = threading.Event()
        self._queue: queue.Queue[tuple[int, list[Op], float] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pending_ops = 0
        self._lock = threading.Lock()
        #: Called (on the loop, via the scheduler given to ``start``) with the highest
        #: batch id committed, or with an error text when a commit failed.
        self._committed: Callable[[int], None] | None = None
        self._failed: Callable[[str], None] | None = None
        self._fullness: Callable[[bool], None] | None = None
        self.full = False
        self._schedule: Callable[..., Any] | None = None
        self.commits = 0
        self.ops_written = 0
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()

    # ------------------------------------------------------------------ opening

    def open(self) -> Snapshot:
        """Open (or create) the database, check and migrate it, read everything."""
        os.makedirs(self.directory, exist_ok=True)
        self._lock_directory()
        try:
            return self._open()
        except (sqlite3.DatabaseError, StoreError) as exc:
            if self._db is not None:
                self._db.close()
                self._db = None
            if isinstance(exc, NewerStore):
                raise
            problem = str(exc)
            if self.settings.on_corrupt == "move-aside":
                aside = self._move_aside()
                log.error(
                    "store %s is unreadable (%s): moved aside to %s; starting with an "
                    "empty store -- sessions, queued and retained messages are NOT restored",
                    self.path,
                    problem,
                    aside,
                )
                return self._open()
            raise StoreError(
                f"store {self.path} is unreadable ({problem}). Nothing was changed. "
                f"Move it aside to start empty (mv {self.path} {self.path}.bad; also its "
                f'-wal and -shm files), or set store.on_corrupt = "move-aside".'
            ) from None

    def _lock_directory(self) -> None:
        """One gateway per data directory: a second one would interleave its writes."""
        lock_path = self.directory / "ledge.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(
                f"data directory {self.directory} is in use by another Ledge (pid {holder}); "
                "stop it first, or give this one another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                src.rename(Path(str(aside) + suffix))
        return aside

    def _open(self) -> Snapshot:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db = db
        db.execute("PRAGMA journal_mode = WAL")
        sync = "FULL" if self.settings.durability == "power" else "NORMAL"
        db.execute(f"PRAGMA synchronous = {sync}")
        if self.settings.max_bytes:
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            db.execute(f"PRAGMA max_page_count = {max(16, self.settings.max_bytes // page_size)}")
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise StoreError(f"integrity check failed: {check}")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise NewerStore(
                f"store {self.path} was written by a newer Ledge (schema version {version}; "
                f"this one reads up to {SCHEMA_VERSION}). Upgrade Ledge, or move the file "
                f"aside to start empty (mv {self.path} {self.path}.newer)."
            )
        if version < SCHEMA_VERSION:
            self._migrate(db, version)
        return self._load(db)

    def _migrate(self, db: sqlite3.Connection, version: int) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[target]:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {target}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if version:
            log.info("store %s migrated from schema %d to %d", self.path, version, SCHEMA_VERSION)

    def _load(self, db: sqlite3.Connection) -> Snapshot:
        sessions: dict[str, StoredSession] = {}
        for row in db.execute(
            "SELECT client_id, expiry_interval, expires_at, protocol, will, will_due FROM sessions"
        ):
            sessions[row[0]] = StoredSession(
                row[0], row[1], row[2], row[3], decode_will(row[4]) if row[4] else None, row[5]
            )
        for row in db.execute(
            "SELECT client_id, key, topic_filter, qos, no_local, retain_as_published, "
            "retain_handling, identifier, share_name FROM subscriptions"
        ):
            s = sessions.get(row[0])
            if s is not None:
                s.subscriptions.append(
                    StoredSubscription(
                        row[1], row[2], row[3], bool(row[4]), bool(row[5]), row[6], row[7], row[8]
                    )
                )
        messages: dict[int, StoredMessage] = {}
        for row in db.execute(
            "SELECT id, topic, payload, qos, retain, properties, origin, expiry_interval, "
            "created FROM messages"
        ):
            messages[row[0]] = StoredMessage(
                row[0],
                row[1],
                bytes(row[2]),
                row[3],
                bool(row[4]),
                bytes(row[5]),
                row[6],
                row[7],
                row[8],
            )
        next_seq = 1
        for row in db.execute(
            "SELECT client_id, seq, message_id, qos, retain, sub_ids, packet_id, state, share "
            "FROM queue ORDER BY client_id, seq"
        ):
            s = sessions.get(row[0])
            next_seq = max(next_seq, row[1] + 1)
            if s is None or row[2] not in messages:
                continue
            share = tuple(json.loads(row[8])) if row[8] else None
            s.entries.append(
                StoredEntry(
                    row[1],
                    row[2],
                    row[3],
                    bool(row[4]),
                    tuple(json.loads(row[5])),
                    row[6],
                    row[7],
                    (share[0], share[1]) if share else None,
                )
            )
        for row in db.execute("SELECT client_id, packet_id FROM incoming_qos2"):
            s = sessions.get(row[0])
            if s is not None:
                s.incoming_qos2.append(row[1])
        retained = [
            StoredMessage(
                0, row[0], bytes(row[1]), row[2], True, bytes(row[3]), row[4], row[5], row[6]
            )
            for row in db.execute(
                "SELECT topic, payload, qos, properties, origin, expiry_interval, created "
                "FROM retained"
            )
        ]
        next_id = (db.execute("SELECT max(id) FROM messages").fetchone()[0] or 0) + 1
        outbox: dict[str, list[tuple[int, int, float]]] = {}
        for row in db.execute(
            "SELECT bridge, pos, length(topic) + length(payload) + length(properties), created "
            "FROM outbox ORDER BY bridge, pos"
        ):
            outbox.setdefault(row[0], []).append((row[1], row[2] + OUTBOX_ENTRY_OVERHEAD, row[3]))
        max_seq = db.execute("SELECT max(seq) FROM outbox").fetchone()[0] or 0
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        return Snapshot(
            list(sessions.values()), messages, retained, next_id, next_seq, outbox, max_seq, meta
        )

    # ------------------------------------------------------------------ reading

    def read_outbox(self, bridge: str, first: int, count: int) -> list[tuple[Any, ...]]:
        """Committed outbox rows of ``bridge`` from position ``first`` on (any thread):
        ``(pos, seq, topic, payload, qos, retain, properties, created, expires)``."""
        with self._read_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(self.path, check_same_thread=False)
            return self._reader.execute(
                "SELECT pos, seq, topic, payload, qos, retain, properties, created, expires "
                "FROM outbox WHERE bridge = ? AND pos >= ? ORDER BY pos LIMIT ?",
                (bridge, first, count),
            ).fetchall()

    def set_meta_now(self, key: str, value: str) -> None:
        """Write one meta value at once, durably (before the writer starts)."""
        assert self._db is not None
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # ------------------------------------------------------------------ writing

    def start(
        self,
        schedule: Callable[..., Any],
        committed: Callable[[int], None],
        failed: Callable[[str], None],
        fullness: Callable[[bool], None] | None = None,
    ) -> None:
        """Start the writer; ``schedule(fn, *args)`` runs ``fn`` on the event loop
        (``loop.call_soon_threadsafe``). ``fullness(True)`` says the store should take no
        more (watermark reached), ``fullness(False)`` that it has room again."""
        self._schedule = schedule
        self._committed = committed
        self._failed = failed
        self._fullness = fullness
        self.full = self._is_full()
        if self.full and fullness is not None:
            schedule(fullness, True)
        self._thread = threading.Thread(target=self._run, name="ledge-store", daemon=True)
        self._thread.start()

    @property
    def backlog(self) -> int:
        """Operations handed to the writer and not yet committed."""
        return self._pending_ops

    def submit(self, batch_id: int, ops: list[Op], wall_offset: float) -> None:
        """Queue a sealed batch; ``wall_offset`` turns the core's clock into wall time."""
        with self._lock:
            self._pending_ops += len(ops)
        self._queue.put((batch_id, ops, wall_offset))

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the file."""
        if self._thread is not None:
            self._queue.put(None)
            self._stopping.set()
            self._thread.join(30)
            self._thread = None
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        if self._db is not None:
            with contextlib.suppress(sqlite3.DatabaseError):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
            self._db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _run(self) -> None:
        stop = False
        interval = self.settings.commit_interval
        last_commit = -interval
        while not stop:
            try:
                # While full, look again every retry_interval even when nothing is
                # written: room made by others (a file deleted on the disk) ends the
                # refusals without waiting for a write that may never come.
                item = self._queue.get(timeout=self.settings.retry_interval if self.full else None)
            except queue.Empty:
                self._check_room()
                continue
            batches = []
            if item is None:
                stop = True
            else:
                batches.append(item)
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    batches.append(more)
            # Group commit: within the interval after the last commit, gather what
            # comes (a stop commits what is there at once).
            due = last_commit + interval
            while not stop and batches and len(batches) < GROUP_MAX_BATCHES:
                wait = due - time.monotonic()
                if wait <= 0:
                    break
                try:
                    more = self._queue.get(timeout=wait)
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    batches.append(more)
            if batches:
                last_commit = time.monotonic()
                self._commit_until_done(batches, stop)

    def _commit_until_done(
        self, batches: list[tuple[int, list[Op], float]], stopping: bool
    ) -> None:
        assert self._db is not None
        reported = False
        while True:
            try:
                self._apply(batches)
            except sqlite3.OperationalError as exc:
                # Disk (or store.max_bytes) full, or locked: keep the batch and retry;
                # nothing it covers has been acknowledged.
                if not reported and self._schedule is not None and self._failed is not None:
                    self._schedule(self._failed, str(exc))
                    reported = True
                if stopping or self._stopping.wait(self.settings.retry_interval):
                    # Nothing in these batches was acknowledged to anyone.
                    log.error("store: stopping with changes it could not write: %s", exc)
                    return
                continue
            break
        count = sum(len(ops) for _, ops, _ in batches)
        with self._lock:
            self._pending_ops -= count
        self.commits += 1
        self.ops_written += count
        if self._schedule is not None and self._committed is not None:
            self._schedule(self._committed, batches[-1][0])
        self._check_room()

    def _check_room(self) -> None:
        """Compare with the watermarks; tell the loop when fullness changes."""
        full = self._is_full()
        if full != self.full:
            self.full = full
            if self._schedule is not None and self._fullness is not None:
                self._schedule(self._fullness, full)

    def _is_full(self) -> bool:
        """Watermarks: the share of ``max_bytes`` in use and the space left on the disk."""
        db = self._db
        assert db is not None
        share = FULL_AT if not self.full else ROOM_AT
        if self.settings.max_bytes:
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            free_pages = db.execute("PRAGMA freelist_count").fetchone()[0]
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            if (pages - free_pages) * page_size >= share * self.settings.max_bytes:
                return True
        stat = os.statvfs(self.directory)
        reserve = RESERVE_FREE_BYTES if not self.full else 2 * RESERVE_FREE_BYTES
        return stat.f_bavail * stat.f_frsize < reserve

    def _apply(self, batches: list[tuple[int, list[Op], float]]) -> None:
        db = self._db
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        try:
            for _batch_id, ops, offset in batches:
                if any(isinstance(op, _ORDER_SENSITIVE) for op in ops):
                    for op in ops:
                        _APPLY[type(op)](db, op, offset)
                else:
                    _apply_grouped(db, ops, offset)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # SQLite rolls back by itself on some errors (SQLITE_FULL)
                db.execute("ROLLBACK")
            raise


# --------------------------------------------------------------------------- operations
# Each journal operation is a named tuple (see gateway.broker.journal); its type says
# what it writes.


def _wall(mono: float | None, offset: float) -> float | None:
    return None if mono is None else mono + offset


def _session(db: sqlite3.Connection, op: Op, offset: float) -> None:
    assert isinstance(op, SaveSession)
    db.execute(
        "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?)",
        (
            op.client_id,
            op.expiry_interval,
            _wall(op.expires_at, offset),
            op.protocol_version,
            encode_will(op.will) if op.will is not None else None,
            _wall(op.will_due, offset),
        ),
    )


def _session_end(db: sqlite3.Connection, op: Op, offset: float) -> None:
    assert isinstance(op, EndSession)
    for table in ("sessions", "subscriptions", "queue", "incoming_qos2"):
        db.execute(f"DELETE FROM {table} WHERE client_id = ?", (op.client_id,))


def _subscribe(db: sqlite3.Connection, op: Op, offset: float) -> None:
    db.execute("INSERT OR REPLACE INTO subscriptions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", op)


def _unsubscribe(db: sqlite3.Connection, op: Op, offset: float) -> None:
    db.execute("DELETE FROM subscriptions WHERE client_id = ? AND key = ?", op)


def _incoming(db: sqlite3.Connection, op: Op, offset: float) -> None:
    db.execute("INSERT OR IGNORE INTO incoming_qos2 VALUES (?, ?)", op)


def _incoming_done(db: sqlite3.Connection, op: Op, offset: float) -> None:
    db.execute("DELETE FROM incoming_qos2 WHERE client_id = ? AND packet_id = ?", op)


def _clock_step(db: sqlite3.Connection, op: Op, offset: float) -> None:
    """The system clock was set ``op.step`` seconds forward (or back) while the gateway
    ran: every stored wall-clock time moves with it, in the same order as the writes
    around it, so what was stored before and after the step shares one time frame."""
    assert isinstance(op, StepClock)
    step = op.step
    db.execute(
        "UPDATE sessions SET expires_at = expires_at + ?1, will_due = will_due + ?1", (step,)
    )
    for table in ("messages", "retained"):
        db.execute(f"UPDATE {table} SET created = created + ?", (step,))
    db.execute("UPDATE outbox SET created = created + ?1, expires = expires + ?1", (step,))


_OUTBOX_PUT: Final = "INSERT OR REPLACE INTO outbox VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_OUTBOX_DONE: Final = "DELETE FROM outbox WHERE bridge = ? AND pos = ?"
_META: Final = "INSERT OR REPLACE INTO meta VALUES (?, ?)"


def _rows(op: Op, offset: float) -> tuple[Any, ...]:
    """The SQL parameters of a message-flow operation (``_GROUPED``)."""
    if isinstance(op, StoreMessage):
        return (*op[:-1], op.created + offset)
    if isinstance(op, Retain):
        return (*op[:-1], op.created + offset)
    if isinstance(op, AddEntry):
        return (
            *op[:5],
            json.dumps(list(op.sub_ids)),
            op.packet_id,
            op.state,
            json.dumps(list(op.share)) if op.share else None,
        )
    if isinstance(op, MoveEntry):
        return (op.packet_id, op.state, op.client_id, op.seq)
    return op  # the columns in order; wall-clock times already


#: The message-flow operations, grouped per kind and applied with executemany in this
#: order. Safe: message ids, queue seqs and outbox positions are never reused within a
#: batch, so every insert of a row precedes its update and its delete. Retained topics
#: are reused (set, cleared, set again): only each topic's last change is applied.
_GROUPED: Final[tuple[tuple[type, str], ...]] = (
    (StoreMessage, "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"),
    (AddEntry, "INSERT OR REPLACE INTO queue VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"),
    (MoveEntry, "UPDATE queue SET packet_id = ?, state = ? WHERE client_id = ? AND seq = ?"),
    (RemoveEntry, "DELETE FROM queue WHERE client_id = ? AND seq = ?"),
    (ForgetMessage, "DELETE FROM messages WHERE id = ?"),
    (Retain, "INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?, ?, ?, ?)"),
    (Unretain, "DELETE FROM retained WHERE topic = ?"),
    (PutOutbox, _OUTBOX_PUT),
    (RemoveOutbox, _OUTBOX_DONE),
    (SetMeta, _META),
)
_SQL: Final = dict(_GROUPED)


def _one(db: sqlite3.Connection, op: Op, offset: float) -> None:
    db.execute(_SQL[type(op)], _rows(op, offset))


_APPLY: Final[dict[type, Callable[[sqlite3.Connection, Op, float], None]]] = {
    SaveSession: _session,
    EndSession: _session_end,
    AddSubscription: _subscribe,
    RemoveSubscription: _unsubscribe,
    AddIncoming: _incoming,
    RemoveIncoming: _incoming_done,
    StepClock: _clock_step,
    **dict.fromkeys(_SQL, _one),
}

#: Operations whose place in the sequence matters beyond their own rows (a session end
#: deletes every row of a client). A batch holding one is applied op by op.
_ORDER_SENSITIVE: Final = (
    SaveSession,
    EndSession,
    AddSubscription,
    RemoveSubscription,
    StepClock,
)


def _apply_grouped(db: sqlite3.Connection, ops: list[Op], offset: float) -> None:
    """Apply a batch of message-flow operations with one executemany per kind.

    The incoming-QoS-2 operations keep their relative order among themselves (a packet
    id can be added, released and added again within one batch); of a retained topic's
    changes only the last is applied (a set, a clear and a set again must leave the
    set, which deleting after every insert would not)."""
    groups: dict[type, list[tuple[Any, ...]]] = {}
    incoming: list[Op] = []
    retained: dict[str, Op] = {}
    for op in ops:
        if isinstance(op, AddIncoming | RemoveIncoming):
            incoming.append(op)
        elif isinstance(op, Retain | Unretain):
            retained[op.topic] = op  # a topic's last change is its state
        else:
            groups.setdefault(type(op), []).append(_rows(op, offset))
    for op in retained.values():
        groups.setdefault(type(op), []).append(_rows(op, offset))
    for kind, sql in _GROUPED:
        rows = groups.get(kind)
        if rows:
            db.executemany(sql, rows)
    for op in incoming:
        _APPLY[type(op)](db, op, offset)
