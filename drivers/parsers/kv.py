"""``key=value`` lines: ``temp=21.5 hum=40.1`` (separated by spaces, commas or
semicolons; ``key:value`` works too). Pure."""

from __future__ import annotations

import re

from drivers.parsers import ParseError, Sample, scalar

_PAIR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*[=:]\s*([^\s,;=]+)\s*[,;]?")


def parse(line: bytes) -> list[Sample]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError("line is not UTF-8", exc.start) from None
    out: list[Sample] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _PAIR.match(text, pos)
        if m is None:
            raise ParseError(f"expected key=value at {text[pos : pos + 20]!r}", pos)
        out.append(Sample(m.group(1), scalar(m.group(2))))
        pos = m.end()
    if not out:
        raise ParseError("no key=value pair")
    return out
