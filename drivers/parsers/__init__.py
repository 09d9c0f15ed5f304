"""Pure line parsers: one line of bytes in, named samples out (or ``ParseError``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

Scalar = float | int | str | bool


@dataclass(frozen=True, slots=True)
class Sample:
    """One named value a device reported, before it is mapped to a quantity."""

    field: str
    value: Scalar
    unit: str = ""


class ParseError(ValueError):
    """A line the parser cannot read; ``column`` is where it went wrong (0-based)."""

    def __init__(self, reason: str, column: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.column = column


def scalar(text: str) -> Scalar:
    """A number if it reads as one, a boolean for true/false/on/off, else the text."""
    digits = text[1:] if text[:1] in ("-", "+") else text
    if digits.isdigit() and digits.isascii():
        return int(text)  # the common case first, without raising
    lowered = text.lower()
    if lowered in ("true", "on"):
        return True
    if lowered in ("false", "off"):
        return False
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text
