"""Wire data types (MQTT 5.0 section 1.5): integers, strings, binary data, varints.

Readers take ``(buf, pos, end)`` and return ``(value, new_pos)``; every bound is
checked and a short or invalid value raises ``MalformedPacket``.
"""

from __future__ import annotations

from typing import Final

from gateway.mqtt.errors import MalformedPacket

#: Largest value a variable byte integer can hold (four bytes).
VARINT_MAX: Final = 268_435_455

Buffer = bytes | bytearray | memoryview


def encode_varint(value: int) -> bytes:
    if value < 128:
        return _SMALL_VARINTS[value]
    if value > VARINT_MAX:
        raise ValueError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while True:
        digit = value & 0x7F
        value >>= 7
        if value:
            out.append(digit | 0x80)
        else:
            out.append(digit)
            return bytes(out)


_SMALL_VARINTS: Final = tuple(bytes((i,)) for i in range(128))


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """A variable byte integer of at most four bytes (section 1.5.5), minimally
    encoded (MQTT-1.5.5-1); anything else is malformed."""
    value = 0
    shift = 0
    for _ in range(4):
        if pos >= end:
            raise MalformedPacket("variable byte integer runs past the end of the packet")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and shift:
                raise MalformedPacket("variable byte integer not in its minimal encoding")
            return value, pos
        shift += 7
    raise MalformedPacket("variable byte integer longer than four bytes")


def encode_string(value: str) -> bytes:
    data = value.encode("utf-8")
    if len(data) > 65_535:
        raise ValueError("UTF-8 string longer than 65,535 bytes")
    return len(data).to_bytes(2, "big") + data


def encode_binary(value: bytes) -> bytes:
    if len(value) > 65_535:
        raise ValueError("binary data longer than 65,535 bytes")
    return len(value).to_bytes(2, "big") + value


def read_u16(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    if pos + 2 > end:
        raise MalformedPacket("two-byte integer runs past the end of the packet")
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def read_binary(buf: Buffer, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacket("length prefix runs past the end of the packet")
    size = (buf[pos] << 8) | buf[pos + 1]
    stop = pos + 2 + size
    if stop > end:
        raise MalformedPacket("binary data runs past the end of the packet")
    return bytes(buf[pos + 2 : stop]), stop


def read_string(buf: Buffer, pos: int, end: int) -> tuple[str, int]:
    """A UTF-8 encoded string: well-formed UTF-8, no U+0000 (MQTT-1.5.4-1, -2)."""
    if pos + 2 > end:
        raise MalformedPacket("length prefix runs past the end of the packet")
    size = (buf[pos] << 8) | buf[pos + 1]
    stop = pos + 2 + size
    if stop > end:
        raise MalformedPacket("UTF-8 string runs past the end of the packet")
    try:
        text = str(buf[pos + 2 : stop], "utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"invalid UTF-8 at byte {pos + 2 + exc.start}") from None
    if "\x00" in text:
        raise MalformedPacket("UTF-8 string contains U+0000")
    return text, stop
