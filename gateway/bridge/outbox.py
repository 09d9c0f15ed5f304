"""The outbox: messages waiting to go upstream, in order, bounded, durable. Pure.

Every message selected for upstream gets a place (``pos``, contiguous per bridge)
and leaves only when the remote has acknowledged it, when the outbox is full and
its policy drops it, or when its Message Expiry Interval runs out. With a store,
each change is an operation for the store (``emit``), so the outbox survives
restarts; the entries nearest the head stay in memory (``memory_bytes``) and the
rest waits on disk, read back a page at a time as the uplink drains the head.

Entries leave the store only from the head, so the rows on disk always form one
contiguous run of positions; an entry acknowledged out of order (QoS 1 and 2
mixed) is remembered in memory and deleted when it reaches the head -- after a
crash it is sent again, which at-least-once delivery and the sequence numbers
allow.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from gateway.bridge.settings import DROP_OLDEST, OutboxSettings
from gateway.broker.journal import Op, PutOutbox, RemoveOutbox
from gateway.store.settings import OUTBOX_ENTRY_OVERHEAD

PENDING: Final = 0
INFLIGHT: Final = 1
DONE: Final = 2

#: Read the next page from disk when fewer than this many entries wait in memory.
REFILL_BELOW: Final = 512
PAGE: Final = 2048


@dataclass(slots=True, eq=False)
class Entry:
    pos: int
    seq: int
    topic: str  # the remote topic
    payload: bytes
    qos: int
    retain: bool
    properties: bytes  # encoded MQTT 5 properties to pass on
    created: float  # wall clock
    expires: float | None = None  # wall clock
    batch: int = 0  # store batch holding it; 0: nothing to wait for
    state: int = PENDING
    dropped: bool = False

    @property
    def size(self) -> int:
        return len(self.topic) + len(self.payload) + len(self.properties) + OUTBOX_ENTRY_OVERHEAD


@dataclass(slots=True)
class OutboxStats:
    queued: int = 0  # entered the outbox
    sent: int = 0  # handed to the remote (again after a reconnect counts again)
    acknowledged: int = 0
    dropped_full: int = 0  # policy drop-oldest or drop-newest
    dropped_expired: int = 0
    refused: int = 0  # policy refuse: publishers told no

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_expired


class Outbox:
    """One bridge's outbox."""

    def __init__(
        self,
        name: str,
        settings: OutboxSettings,
        emit: Callable[[Op], None] | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        #: Store operations go here; None: memory only (no data_dir).
        self.emit = emit
        self.mem: deque[Entry] = deque()
        self.mem_bytes = 0
        #: Index in ``mem`` of the next entry to look at for sending.
        self.cursor = 0
        # Entries only on disk, after the last one in memory: positions and sizes.
        self._spill_pos: array[int] = array("q")
        self._spill_size: array[int] = array("q")
        self._spill_created: array[float] = array("d")
        self._spill_start = 0
        self.refilling = False
        self.count = 0
        self.bytes = 0
        self.next_pos = 1
        self.committed = 0  # highest store batch known committed
        #: Steps of the wall clock followed so far, and the store batch that moves the
        #: stored times with the last one: pages are read from disk only once it is
        #: committed, so what is read is in the current time frame.
        self.wall_steps = 0
        self._step_batch = 0
        self.stats = OutboxStats()

    # ------------------------------------------------------------------ state

    @property
    def spilled(self) -> int:
        return len(self._spill_pos) - self._spill_start

    def restore(self, rows: Iterable[tuple[int, int, float]]) -> None:
        """At start-up: what the store holds for this bridge, as ``(pos, size, created)``
        in position order. Everything starts on disk and is paged in."""
        for pos, size, created in rows:
            self._spill_pos.append(pos)
            self._spill_size.append(size)
            self._spill_created.append(created)
            self.count += 1
            self.bytes += size
            self.next_pos = pos + 1

    def oldest_age(self, wall_now: float) -> float:
        if self.mem:
            return max(0.0, wall_now - self.mem[0].created)
        if self.spilled:
            return max(0.0, wall_now - self._spill_created[self._spill_start])
        return 0.0

    def shift_wall(self, step: float, batch: int) -> None:
        """The wall clock was set ``step`` seconds forward (or back): the times of the
        entries move with it, so their age and remaining expiry stay what they were.
        ``batch`` is the store batch moving the stored times (0: no store)."""
        for entry in self.mem:
            entry.created += step
            if entry.expires is not None:
                entry.expires += step
        for i in range(self._spill_start, len(self._spill_created)):
            self._spill_created[i] += step
        self.wall_steps += 1
        self._step_batch = max(self._step_batch, batch)

    def would_overflow(self, size: int) -> bool:
        s = self.settings
        return self.count + 1 > s.max_messages or self.bytes + size > s.max_bytes

    # ------------------------------------------------------------------ in

    def put(self, entry: Entry) -> bool:
        """Add ``entry`` (its ``pos`` is assigned here). False: dropped (drop-newest, or
        larger than the whole outbox); with drop-oldest the oldest make room first."""
        size = entry.size
        s = self.settings
        if size > s.max_bytes:
            self.stats.dropped_full += 1
            return False
        while self.would_overflow(size):
            if s.when_full != DROP_OLDEST or not self._drop_head():
                self.stats.dropped_full += 1
                return False
        entry.pos = self.next_pos
        self.next_pos += 1
        self.count += 1
        self.bytes += size
        self.stats.queued += 1
        if self.emit is not None:
            self.emit(
                PutOutbox(
                    self.name,
                    entry.pos,
                    entry.seq,
                    entry.topic,
                    entry.payload,
                    entry.qos,
                    int(entry.retain),
                    entry.properties,
                    entry.created,
                    entry.expires,
                )
            )
            if self.spilled or self.mem_bytes + size > s.memory_bytes:
                # Kept on disk only; read back when the head gets near it.
                self._spill_pos.append(entry.pos)
                self._spill_size.append(size)
                self._spill_created.append(entry.created)
                return True
        self.mem.append(entry)
        self.mem_bytes += size
        return True

    def _drop_head(self) -> bool:
        """Drop the oldest entry (policy drop-oldest). False when there is none."""
        if self.mem:
            entry = self.mem.popleft()
            self.mem_bytes -= entry.size
            if self.cursor:
                self.cursor -= 1
            entry.dropped = True  # if it is in flight, its acknowledgement is ignored
            self.stats.dropped_full += 1
            self._gone(entry.pos, entry.size)
            # Entries acknowledged behind it waited only for it: released, not dropped.
            self._release_head()
            return True
        if self.spilled:
            i = self._spill_start
            pos, size = self._spill_pos[i], self._spill_size[i]
            self._pop_spill()
            self.stats.dropped_full += 1
            self._gone(pos, size)
            return True
        return False

    def _gone(self, pos: int, size: int) -> None:
        self.count -= 1
        self.bytes -= size
        if self.emit is not None:
            self.emit(RemoveOutbox(self.name, pos))

    def _pop_spill(self) -> None:
        self._spill_start += 1
        if self._spill_start >= 4096 and self._spill_start * 2 >= len(self._spill_pos):
            del self._spill_pos[: self._spill_start]
            del self._spill_size[: self._spill_start]
            del self._spill_created[: self._spill_start]
            self._spill_start = 0

    # ------------------------------------------------------------------ out

    def next_ready(self, wall_now: float) -> Entry | None:
        """The next entry to send, now in flight; None when there is none (yet).

        Entries whose store batch is not committed wait: a message goes upstream only
        once it is durable here, so a crash can never make it travel twice under two
        sequence numbers."""
        mem = self.mem
        while self.cursor < len(mem):
            entry = mem[self.cursor]
            if entry.state != PENDING:
                self.cursor += 1
                continue
            if entry.batch > self.committed:
                return None
            if entry.expires is not None and wall_now >= entry.expires:
                entry.state = DONE
                self.stats.dropped_expired += 1
                self.cursor += 1
                self._release_head()
                continue
            entry.state = INFLIGHT
            self.cursor += 1
            self.stats.sent += 1
            return entry
        return None

    def acknowledged(self, entry: Entry) -> None:
        """The remote acknowledged ``entry`` (PUBACK, PUBCOMP, or written for QoS 0)."""
        if entry.dropped or entry.state == DONE:
            return
        entry.state = DONE
        self.stats.acknowledged += 1
        self._release_head()

    def _release_head(self) -> None:
        mem = self.mem
        while mem and mem[0].state == DONE:
            entry = mem.popleft()
            self.mem_bytes -= entry.size
            if self.cursor:
                self.cursor -= 1
            self._gone(entry.pos, entry.size)

    def rewind(self) -> int:
        """The link dropped: everything in flight is pending again, from the head.
        Returns how many entries were in flight."""
        count = 0
        for entry in self.mem:
            if entry.state == INFLIGHT:
                entry.state = PENDING
                count += 1
        self.cursor = 0
        return count

    def commit(self, upto: int) -> None:
        self.committed = max(self.committed, upto)

    # ------------------------------------------------------------------ paging

    def refill_request(self) -> tuple[int, int] | None:
        """``(first position, how many)`` to read from disk, or None when not needed.
        A page holds at most half of ``memory_bytes``."""
        if (
            self.refilling
            or self._step_batch > self.committed
            or not self.spilled
            or len(self.mem) - self.cursor >= REFILL_BELOW
            or self.mem_bytes >= self.settings.memory_bytes
        ):
            return None
        budget = max(1, self.settings.memory_bytes // 2)
        start = self._spill_start
        end = min(len(self._spill_pos), start + PAGE)
        count, total = 0, 0
        for i in range(start, end):
            total += self._spill_size[i]
            count += 1
            if total >= budget:
                break
        self.refilling = True
        return self._spill_pos[start], count

    def refilled(self, rows: Iterable[Entry]) -> int:
        """Entries read from disk (committed rows, in position order). Rows no longer
        wanted (dropped meanwhile) are skipped; returns how many were taken."""
        self.refilling = False
        taken = 0
        for entry in rows:
            if not self.spilled:
                break
            head = self._spill_pos[self._spill_start]
            if entry.pos < head:
                continue  # dropped while the page was being read
            if entry.pos != head:
                break  # not committed yet; read again later
            self._pop_spill()
            self.mem.append(entry)
            self.mem_bytes += entry.size
            taken += 1
        return taken
