"""The line framer at its edges: a line end as the first byte of a chunk, a line of
exactly ``max_line`` bytes (kept) and one byte more (garbage, its size counting the
line end), garbage that ends in a later chunk, offsets across chunks, and a reset that
starts the offsets again. Garbage and lines are what the log and the readings show."""

from __future__ import annotations

from drivers.lines import Garbage, Line, LineFramer


def test_a_line_end_first_in_a_chunk_and_offsets_across_chunks() -> None:
    f = LineFramer(max_line=8)
    assert f.feed(b"ab") == []
    assert f.feed(b"\ncd\r\nef") == [Line(0, b"ab"), Line(3, b"cd")]
    assert f.feed(b"\r") == [Line(7, b"ef")]
    assert f.feed(b"\n\n") == []  # empty lines are dropped
    assert f.offset == 12


def test_exactly_max_line_is_a_line_and_one_byte_more_is_garbage() -> None:
    f = LineFramer(max_line=4)
    assert f.feed(b"abcd\nabcde\nok\n") == [
        Line(0, b"abcd"),
        Garbage(5, 6, "line longer than 4 bytes"),  # five bytes and the line end
        Line(11, b"ok"),
    ]
    # the same, the long line spread over chunks: reported once, when it ends
    g = LineFramer(max_line=4)
    assert g.feed(b"ab") == [] and g.feed(b"cde") == [] and g.feed(b"fg") == []
    assert g.feed(b"h\nok\n") == [Garbage(0, 9, "line longer than 4 bytes"), Line(9, b"ok")]
    # garbage whose line end is the first byte of the next chunk
    assert g.feed(b"abcdefg") == []
    assert g.feed(b"\nok\n") == [Garbage(12, 8, "line longer than 4 bytes"), Line(20, b"ok")]


def test_a_reset_forgets_the_partial_line_and_counts_from_zero() -> None:
    f = LineFramer(max_line=4)
    f.feed(b"xy")
    f.reset()
    assert f.offset == 0
    assert f.feed(b"ab\n") == [Line(0, b"ab")]
    f.feed(b"abcdefg")  # garbage in progress
    f.reset()
    assert f.feed(b"ok\n") == [Line(0, b"ok")]
