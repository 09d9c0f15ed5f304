"""Values in GATT characteristic bytes, described by configuration. Pure.

A field names a type, a start byte, a scale and an offset: ``int16`` at 0 x 0.01
reads a temperature in hundredths. Types are little endian unless they end in
``be``, as Bluetooth GATT values are.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Final, Protocol

from drivers.parsers import Sample
from drivers.parsers.ble.base import AdvertError

#: type -> (struct format or "", size in bytes; 0: the rest of the value)
TYPES: Final[dict[str, tuple[str, int]]] = {
    "uint8": ("<B", 1),
    "int8": ("<b", 1),
    "uint16": ("<H", 2),
    "int16": ("<h", 2),
    "uint16be": (">H", 2),
    "int16be": (">h", 2),
    "uint24": ("", 3),
    "int24": ("", 3),
    "uint32": ("<I", 4),
    "int32": ("<i", 4),
    "uint32be": (">I", 4),
    "int32be": (">i", 4),
    "float32": ("<f", 4),
    "float16": ("<e", 2),
    "bool": ("<B", 1),
    "utf8": ("", 0),
    "hex": ("", 0),
}


class FieldSpec(Protocol):
    @property
    def quantity(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def start(self) -> int: ...
    @property
    def scale(self) -> float: ...
    @property
    def offset(self) -> float: ...
    @property
    def unit(self) -> str: ...


def parse_value(data: bytes, specs: Iterable[FieldSpec]) -> list[Sample]:
    """Every field of one characteristic value; AdvertError for a value too short."""
    out: list[Sample] = []
    for spec in specs:
        fmt, size = TYPES[spec.type]
        end = spec.start + size if size else len(data)
        if end > len(data) or spec.start > len(data):
            raise AdvertError(
                "short",
                f"{spec.quantity}: {spec.type} at byte {spec.start} needs {end} bytes, "
                f"the value has {len(data)}",
                len(data),
            )
        value: float | int | str | bool
        if spec.type == "utf8":
            try:
                value = data[spec.start :].decode("utf-8").rstrip("\x00")
            except UnicodeDecodeError as exc:
                raise AdvertError(
                    "invalid_value", f"{spec.quantity}: not UTF-8", spec.start + exc.start
                ) from None
        elif spec.type == "hex":
            value = data[spec.start :].hex()
        elif spec.type == "bool":
            value = data[spec.start] != 0
        else:
            if fmt:
                number: float | int = struct.unpack_from(fmt, data, spec.start)[0]
            else:
                number = int.from_bytes(
                    data[spec.start : end], "little", signed=spec.type == "int24"
                )
            if spec.scale != 1 or spec.offset:
                number = round(number * spec.scale + spec.offset, 6)
            value = number
        out.append(Sample(spec.quantity, value, spec.unit))
    return out
