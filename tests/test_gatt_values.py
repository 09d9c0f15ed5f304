"""GATT characteristic values as configured fields: every type at its byte, in its byte
order and signedness, scale and offset, text and hex to the end, and each value too
short or not UTF-8 refused with its reason, text and byte offset. Fixed bytes."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from drivers.parsers.ble.gatt import TYPES, parse_value
from tests.support.adverts import refusal


@dataclass(frozen=True)
class Field:
    quantity: str
    type: str
    start: int = 0
    scale: float = 1.0
    offset: float = 0.0
    unit: str = ""


VALUE = bytes.fromhex("fffe8001020304")  # seven bytes


@pytest.mark.parametrize(
    ("type_", "start", "expected"),
    [
        ("uint8", 0, 255),
        ("int8", 0, -1),
        ("int8", 2, -128),
        ("uint16", 0, 0xFEFF),
        ("int16", 0, -257),
        ("uint16be", 0, 0xFFFE),
        ("int16be", 0, -2),
        ("uint24", 1, 0x0180FE),
        ("int24", 0, -(2**24 - 0x80FEFF)),
        ("int24", 3, 0x030201),
        ("uint32", 3, 0x04030201),
        ("int32", 0, int.from_bytes(VALUE[:4], "little", signed=True)),
        ("uint32be", 3, 0x01020304),
        ("int32be", 0, int.from_bytes(VALUE[:4], "big", signed=True)),
        ("bool", 3, True),
        ("bool", 4, True),  # any byte but 0
        ("bool", 0, True),
        ("hex", 4, "020304"),
    ],
)
def test_each_type_reads_its_bytes_in_its_order(type_: str, start: int, expected: object) -> None:
    [sample] = parse_value(VALUE, [Field("q", type_, start, unit="u")])
    assert (sample.field, sample.value, sample.unit) == ("q", expected, "u")
    assert type(sample.value) is type(expected)


def test_floats_text_scale_and_offset() -> None:
    half = bytes.fromhex("003c")  # float16 1.0
    assert parse_value(half, [Field("x", "float16")])[0].value == 1.0
    assert parse_value(struct.pack("<f", 21.5), [Field("x", "float32")])[0].value == 21.5
    # scale then offset, rounded to six places; none applied at 1 and 0
    got = parse_value(b"\x10\x27", [Field("t", "uint16", scale=0.01, offset=-40.0, unit="°C")])
    assert (got[0].value, got[0].unit) == (60.0, "°C")
    assert parse_value(b"\x03", [Field("t", "uint8", offset=0.5)])[0].value == 3.5
    micro = parse_value((1234567).to_bytes(4, "little"), [Field("v", "uint32", scale=1e-6)])
    assert micro[0].value == 1.234567
    assert parse_value(b"\x03", [Field("t", "uint8", scale=0.1)])[0].value == 0.3
    assert type(parse_value(b"\x03", [Field("t", "uint8")])[0].value) is int
    assert parse_value(b"\x00", [Field("b", "bool")])[0].value is False
    # text to the end, trailing NULs off; several fields from one value, in order
    text = parse_value(b"\x01hi\x00\x00", [Field("n", "uint8"), Field("s", "utf8", 1)])
    assert [(s.field, s.value) for s in text] == [("n", 1), ("s", "hi")]
    assert parse_value(b"\x01", [Field("s", "utf8", 1)])[0].value == ""  # nothing left: empty
    assert set(TYPES) >= {"uint8", "int24", "float16", "utf8", "hex", "bool"}


@pytest.mark.parametrize(
    ("value", "field", "expected"),
    [
        (
            b"\x01",
            Field("t", "int16"),
            ("short", "t: int16 at byte 0 needs 2 bytes, the value has 1", 1),
        ),
        (
            b"\x01\x02\x03",
            Field("t", "uint32", 1),
            ("short", "t: uint32 at byte 1 needs 5 bytes, the value has 3", 3),
        ),
        (
            b"\x01\x02",
            Field("s", "utf8", 3),
            ("short", "s: utf8 at byte 3 needs 2 bytes, the value has 2", 2),
        ),
        (b"ok\xc3\x28", Field("s", "utf8", 0), ("invalid_value", "s: not UTF-8", 2)),
        (b"\x00ok\xc3\x28", Field("s", "utf8", 1), ("invalid_value", "s: not UTF-8", 3)),
    ],
)
def test_each_refusal_names_its_reason_text_and_byte(
    value: bytes, field: Field, expected: tuple[str, str, int]
) -> None:
    assert refusal(lambda: parse_value(value, [field])) == expected  # offset: in the value
