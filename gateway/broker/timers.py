"""Deadlines for the core, with time passed in (the aioquic ``handle_timer(now)`` shape).

Entries are never cancelled: a callback checks on firing whether its deadline
still holds (a keep-alive that saw traffic, a will whose session came back).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class Timers:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[Any, float], None], Any]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, deadline: float, fn: Callable[[Any, float], None], arg: Any) -> None:
        heapq.heappush(self._heap, (deadline, next(self._seq), fn, arg))

    def next_deadline(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_due(self, now: float) -> int:
        """Fire every entry due at ``now``; returns how many fired."""
        heap = self._heap
        fired = 0
        while heap and heap[0][0] <= now:
            _deadline, _seq, fn, arg = heapq.heappop(heap)
            fn(arg, now)
            fired += 1
        return fired
