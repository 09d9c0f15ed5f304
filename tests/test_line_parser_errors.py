"""What a serial line parser says when a line cannot be read: the reason and the column
(0-based) that the log line shows with the device, exactly, for key=value and JSON
lines; and the edges of what they read (spaces around a line, separators)."""

from __future__ import annotations

import pytest

from drivers.parsers import ParseError, Sample, jsonl, kv


def error(parse: object, line: bytes) -> tuple[str, int]:
    with pytest.raises(ParseError) as caught:
        parse(line)  # type: ignore[operator]
    e = caught.value
    assert str(e) == e.reason
    return e.reason, e.column


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"temp=21.5 \xff", ("line is not UTF-8", 10)),
        (b"temp=21.5 oops hum=40", ("expected key=value at 'oops hum=40'", 10)),
        (b"temp=21.5 " + b"x" * 30, ("expected key=value at 'xxxxxxxxxxxxxxxxxxxx'", 10)),
        (b"", ("no key=value pair", 0)),
        (b"   \r\n", ("no key=value pair", 0)),
    ],
)
def test_key_value_refusals(line: bytes, expected: tuple[str, int]) -> None:
    assert error(kv.parse, line) == expected


def test_key_value_lines_read_around_spaces_and_separators() -> None:
    want = [Sample("temp", 21.5), Sample("hum", 40), Sample("ok", True)]
    for line in (b"temp=21.5 hum=40 ok=on", b"  temp = 21.5, hum:40; ok=on  \r\n"):
        assert kv.parse(line) == want


def test_a_key_value_line_ending_in_a_separator_and_blanks_is_read() -> None:
    """A device printing ``key=value;`` pairs and then a CRLF (Arduino's ``println``), or
    trailing blanks, ends its line with a separator and white space: that is the end of
    the line, not a pair missing; its readings arrive, not a bad-line count."""
    want = [Sample("temp", 21.5), Sample("hum", 40)]
    for line in (b"temp=21.5; hum=40;\r\n", b"temp=21.5, hum=40, \t ", b"temp=21.5;hum=40;\r"):
        assert kv.parse(line) == want, line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"t": "\xff"}', ("line is not UTF-8", 7)),
        (b'{"t": 1,}', ("not JSON: Expecting property name enclosed in double quotes", 8)),
        (b'{"t" 1}', ("not JSON: Expecting ':' delimiter", 5)),
        (b"[1, 2]", ("a JSON list, not an object", 0)),
        (b"21.5", ("a JSON float, not an object", 0)),
    ],
)
def test_json_line_refusals(line: bytes, expected: tuple[str, int]) -> None:
    assert error(jsonl.parse, line) == expected
