"""JSON lines: one JSON object per line, each field a sample. Pure.

``{"temp": 21.5, "hum": 40, "env": {"lux": 300}}`` gives ``temp``, ``hum`` and
``env.lux`` (nested objects are flattened with dots). Lists and nulls are skipped.
"""

from __future__ import annotations

import json
import math
from typing import Any

from drivers.parsers import ParseError, Sample


def parse(line: bytes) -> list[Sample]:
    try:
        data = json.loads(line)
    except UnicodeDecodeError as exc:
        raise ParseError("line is not UTF-8", exc.start) from None
    except json.JSONDecodeError as exc:
        raise ParseError(f"not JSON: {exc.msg}", exc.pos) from None
    if not isinstance(data, dict):
        raise ParseError(f"a JSON {type(data).__name__}, not an object")
    out: list[Sample] = []
    _flatten("", data, out)
    return out


def _flatten(prefix: str, data: dict[str, Any], out: list[Sample]) -> None:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(name + ".", value, out)
        elif isinstance(value, bool | int | str) or (
            isinstance(value, float) and math.isfinite(value)
        ):
            out.append(Sample(name, value))
