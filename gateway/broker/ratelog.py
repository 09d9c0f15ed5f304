"""Refusal log lines at a bounded rate, whatever the attacker's rate. Pure: time is an
argument.

Every listener and transport refuses things (a CONNECT on a full pool, a wake from the
wrong address, a request from an address over its share). Each refusal is counted in
full by its owner's statistics; its log line is written at most once per ``interval``
per source address and kind of line (its message template), and the next such line
says how many were left out.
Sources are many on a hostile LAN (spoofed UDP sources cost nothing), so the table of
addresses is bounded (``max_sources``, oldest forgotten first) and so is the number of
lines per interval across all sources (``max_lines``); past it, one summary line per
interval says how many refusals from how many sources went unlogged.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Final

#: Seconds between two lines about one source.
DEFAULT_INTERVAL: Final = 60.0
#: Lines per interval across all sources before only a summary is written.
DEFAULT_MAX_LINES: Final = 20
#: Sources remembered at once (about 100 bytes each).
DEFAULT_MAX_SOURCES: Final = 1024


class RateLimitedLog:
    """One line per source per ``interval``; at most ``max_lines`` per interval in all."""

    __slots__ = (
        "_hidden",
        "_hidden_sources",
        "_lines",
        "_window",
        "interval",
        "level",
        "log",
        "max_lines",
        "max_sources",
        "sources",
    )

    def __init__(
        self,
        log: logging.Logger,
        *,
        level: int = logging.WARNING,
        interval: float = DEFAULT_INTERVAL,
        max_lines: int = DEFAULT_MAX_LINES,
        max_sources: int = DEFAULT_MAX_SOURCES,
    ) -> None:
        self.log = log
        self.level = level
        self.interval = interval
        self.max_lines = max_lines
        self.max_sources = max_sources
        #: (source, message template) -> [time of its last line, left out since]
        self.sources: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._window = float("-inf")
        self._lines = 0
        self._hidden = 0
        self._hidden_sources: set[str] = set()

    def __call__(self, now: float, source: str, message: str, *args: object) -> bool:
        """Log ``message % args`` about ``source`` unless a line of this kind about it
        is due later. True when a line was written."""
        if now - self._window >= self.interval:
            self._close_window(now)
        key = (source, message)
        entry = self.sources.get(key)
        if entry is not None and now - entry[0] < self.interval:
            entry[1] += 1
            return False
        if self._lines >= self.max_lines:
            self._hidden += 1
            if len(self._hidden_sources) < self.max_sources:
                self._hidden_sources.add(source)
            return False
        self._lines += 1
        left_out = int(entry[1]) if entry is not None else 0
        if entry is None:
            if len(self.sources) >= self.max_sources:
                self.sources.popitem(last=False)
            entry = self.sources[key] = [now, 0.0]
        else:
            self.sources.move_to_end(key)
            entry[0], entry[1] = now, 0.0
        if left_out:
            self.log.log(
                self.level,
                "%s (%d more from %s in the last %g s not logged)",
                message % args if args else message,
                left_out,
                source,
                self.interval,
            )
        else:
            self.log.log(self.level, message, *args)
        return True

    def _close_window(self, now: float) -> None:
        if self._hidden:
            self.log.log(
                self.level,
                "%d more refusals from %d sources in the last %g s not logged",
                self._hidden,
                len(self._hidden_sources),
                self.interval,
            )
        self._window = now
        self._lines = 0
        self._hidden = 0
        self._hidden_sources = set()
