"""The gateway's sequence numbers for upstream marks: they only grow, across restarts. Pure.

With a store, numbers are reserved in blocks: the reservation is written before
any number of the block can travel upstream, and the next block is reserved when
half of the current one is used, so writing it never holds anything up. After a
crash numbering resumes above the last reservation -- some numbers are skipped,
none is used twice. Without a store the numbers start at the wall clock in
microseconds, which keeps them growing across restarts as long as the clock does
and fewer than a million are used per second on average.
"""

from __future__ import annotations

from typing import Final

from gateway.broker.journal import Op, SetMeta

#: Sequence numbers reserved per store write.
BLOCK: Final = 1_000_000
META_KEY: Final = "bridge_seq_reserved"


class Sequence:
    """Hands out the numbers; ``limit`` is the first one not yet safely reserved."""

    __slots__ = ("_last", "_pending", "limit", "next", "reserved")

    def __init__(self, start: int, reserved: int | None = None) -> None:
        self.next = start
        #: Reserved (written or being written) up to here, exclusive.
        self.reserved = reserved if reserved is not None else 1 << 62
        #: Numbers below this may travel: their reservation is committed.
        self.limit = self.reserved
        self._pending: list[tuple[int, int]] = []  # (batch, reserved up to)
        self._last: tuple[object, int] | None = None

    @classmethod
    def resume(cls, stored_reserved: int, highest_used: int) -> tuple[Sequence, int]:
        """From the store's last reservation and the highest number still in an outbox:
        the sequence and the reservation to write before starting."""
        start = max(stored_reserved, highest_used + 1, 1)
        return cls(start, start + BLOCK), start + BLOCK

    def take(self, batch: int, ops: list[Op] | None) -> int:
        """The next number; when half the block is used, the next reservation goes into
        ``ops`` (the store batch ``batch``)."""
        n = self.next
        self.next = n + 1
        if ops is not None and self.reserved - self.next < BLOCK // 2:
            self.reserved += BLOCK
            ops.append(SetMeta(META_KEY, str(self.reserved)))
            self._pending.append((batch, self.reserved))
        return n

    def for_message(self, message: object, batch: int, ops: list[Op] | None) -> int:
        """The number of ``message``: bridges handed the same message in turn share it,
        so consumers behind two bridges deduplicate it too."""
        last = self._last
        if last is not None and last[0] is message:
            return last[1]
        n = self.take(batch, ops)
        self._last = (message, n)
        return n

    def commit(self, upto: int) -> None:
        """Store batches up to ``upto`` are committed."""
        while self._pending and self._pending[0][0] <= upto:
            self.limit = self._pending.pop(0)[1]
