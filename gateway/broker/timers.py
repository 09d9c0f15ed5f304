"""Deadlines for the core, with time passed in (the aioquic ``handle_timer(now)`` shape).

``at`` returns a handle that ``cancel`` voids. Cancelled entries are skipped when
they come due, and the heap is compacted once they are the majority, so a churn
of short-lived connections (each with a connect deadline and a keep-alive
deadline) cannot grow it beyond twice the live deadlines.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

#: A heap entry: [deadline, sequence, callback or None when cancelled, argument].
Handle = list[Any]

_COMPACT_MIN = 64


class Timers:
    __slots__ = ("_cancelled", "_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[Handle] = []
        self._seq = itertools.count()
        self._cancelled = 0

    def __len__(self) -> int:
        """Live (not cancelled) deadlines."""
        return len(self._heap) - self._cancelled

    def at(self, deadline: float, fn: Callable[[Any, float], None], arg: Any) -> Handle:
        handle: Handle = [deadline, next(self._seq), fn, arg]
        heapq.heappush(self._heap, handle)
        return handle

    def cancel(self, handle: Handle | None) -> None:
        if handle is None or handle[2] is None:
            return
        handle[2] = None
        handle[3] = None
        self._cancelled += 1
        heap = self._heap
        if self._cancelled > len(heap) // 2 and len(heap) > _COMPACT_MIN:
            self._heap = [h for h in heap if h[2] is not None]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
            self._cancelled -= 1
        return heap[0][0] if heap else None

    def run_due(self, now: float) -> int:
        """Fire every live entry due at ``now``; returns how many fired."""
        heap = self._heap
        fired = 0
        while heap and heap[0][0] <= now:
            handle = heapq.heappop(heap)
            fn = handle[2]
            if fn is None:
                self._cancelled -= 1
                continue
            handle[2] = None  # fired: a late cancel is a no-op
            fn(handle[3], now)
            fired += 1
            heap = self._heap  # a callback may have compacted it
        return fired
