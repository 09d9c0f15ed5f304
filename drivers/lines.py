"""Split a byte stream into lines, bounded, keeping byte offsets. Pure.

Devices print lines ended by LF, CRLF or CR. A line longer than ``max_line`` is
garbage: reported once with its offset and skipped up to the next line end,
without touching the good lines around it. Offsets count from the first byte
the device sent since it was (re)connected, so a log line can say exactly where.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Line:
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Garbage:
    offset: int
    size: int
    reason: str


class LineFramer:
    """Bytes in, ``Line`` / ``Garbage`` out; never holds more than ``max_line`` bytes."""

    __slots__ = ("_buf", "_discarding", "_start", "max_line", "offset")

    def __init__(self, max_line: int = 1024) -> None:
        self.max_line = max_line
        self.offset = 0  # bytes seen so far
        self._buf = bytearray()
        self._start = 0  # stream offset of _buf[0]
        self._discarding: Garbage | None = None

    def feed(self, data: bytes) -> list[Line | Garbage]:
        out: list[Line | Garbage] = []
        pos = 0
        n = len(data)
        while pos < n:
            # the next line end: LF, or CR (CRLF counts once: the LF ends an empty line
            # that is dropped)
            lf = data.find(b"\n", pos)
            cr = data.find(b"\r", pos)
            ends = [i for i in (lf, cr) if i >= 0]
            end = min(ends) if ends else -1
            chunk = data[pos:] if end < 0 else data[pos:end]
            if self._discarding is not None:
                self._discarding = Garbage(
                    self._discarding.offset,
                    self._discarding.size + len(chunk) + (0 if end < 0 else 1),
                    self._discarding.reason,
                )
                if end >= 0:
                    out.append(self._discarding)
                    self._discarding = None
            else:
                if not self._buf:
                    self._start = self.offset + pos
                if len(self._buf) + len(chunk) > self.max_line:
                    size = len(self._buf) + len(chunk) + (0 if end < 0 else 1)
                    garbage = Garbage(self._start, size, f"line longer than {self.max_line} bytes")
                    self._buf.clear()
                    if end >= 0:
                        out.append(garbage)
                    else:
                        self._discarding = garbage
                else:
                    self._buf += chunk
                    if end >= 0:
                        if self._buf:
                            out.append(Line(self._start, bytes(self._buf)))
                        self._buf.clear()
            if end < 0:
                break
            pos = end + 1
        self.offset += n
        return out

    def reset(self) -> None:
        """Forget a partial line (the device went away)."""
        self._buf.clear()
        self._discarding = None
        self.offset = 0
