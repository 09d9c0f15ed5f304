"""MQTT-SN on a serial line: COBS frames with a CRC-16, as ``firmware-bridge/UART.md``
specifies. Sans-IO: bytes in, frames out.

A frame is ``COBS(message + CRC-16/CCITT-FALSE(message), big-endian) + 0x00``. COBS
leaves no zero inside a frame, so a 0x00 always ends one: after line noise, a cut
cable or a reset half-way through a frame, the receiver is back in step at the next
0x00. Each frame carries one MQTT-SN message, possibly forwarder-encapsulated (one
radio coordinator on the UART carrying many wireless nodes).
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Final

DELIMITER: Final = 0x00

#: COBS adds one octet per 254 and one in front; the CRC adds two.
CRC_SIZE: Final = 2


def crc16(data: bytes) -> int:
    """CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection, no final XOR);
    check value 0x29B1 for ``b"123456789"``."""
    return binascii.crc_hqx(data, 0xFFFF)


def cobs_encode(data: bytes) -> bytes:
    """Consistent Overhead Byte Stuffing (Cheshire and Baker, 1999), canonical form:
    a block of 254 non-zero octets at the very end opens no further block."""
    out = bytearray(b"\x00")
    code_at = 0
    code = 1
    last = len(data) - 1
    for i, byte in enumerate(data):
        if byte == 0:
            out[code_at] = code
            code_at = len(out)
            out.append(0)
            code = 1
            continue
        out.append(byte)
        code += 1
        if code == 0xFF and i < last:
            out[code_at] = code
            code_at = len(out)
            out.append(0)
            code = 1
    out[code_at] = code
    return bytes(out)


def cobs_decode(data: bytes) -> bytes:
    """The inverse of ``cobs_encode``; ValueError naming the offset of a bad code."""
    out = bytearray()
    i = 0
    end = len(data)
    while i < end:
        code = data[i]
        if code == 0:
            raise ValueError(f"zero octet inside a COBS frame at {i}")
        block_end = i + code
        if block_end > end:
            raise ValueError(f"COBS block at {i} runs {block_end - end} octets past the frame")
        block = data[i + 1 : block_end]
        if 0 in block:
            raise ValueError(f"zero octet inside a COBS frame at {i + 1 + block.index(0)}")
        out += block
        i = block_end
        if code < 0xFF and i < end:
            out.append(0)
    return bytes(out)


def encode_frame(message: bytes) -> bytes:
    """One frame for ``message``, delimiter included."""
    return cobs_encode(message + crc16(message).to_bytes(CRC_SIZE, "big")) + b"\x00"


def max_encoded_size(max_message: int) -> int:
    """The longest frame (without its delimiter) a message of ``max_message`` octets makes."""
    body = max_message + CRC_SIZE
    return body + body // 254 + 1


@dataclass(frozen=True, slots=True)
class FrameError:
    """A frame that was dropped: why, and the stream offset where it started."""

    reason: str
    offset: int


class Deframer:
    """Splits a byte stream into messages; bad frames are reported, never raised.

    ``feed`` returns, in stream order, each message (``bytes``, CRC checked and
    removed) and each dropped frame (``FrameError``). Buffering is bounded: a frame
    growing past the longest one a ``max_message``-octet message makes is dropped at
    once, and everything up to the next 0x00 is skipped.
    """

    __slots__ = ("_buf", "_discarding", "_start", "frames", "limit", "offset")

    def __init__(self, max_message: int = 1024) -> None:
        self.limit = max_encoded_size(max_message)
        self._buf = bytearray()
        #: Stream offset of the first octet after everything fed so far.
        self.offset = 0
        #: Stream offset where the frame being collected started.
        self._start = 0
        self._discarding = False
        self.frames = 0

    def reset(self) -> None:
        """Forget a partial frame (the port was reopened)."""
        self._buf.clear()
        self._discarding = False
        self._start = self.offset

    def feed(self, data: bytes) -> list[bytes | FrameError]:
        out: list[bytes | FrameError] = []
        pos = 0
        size = len(data)
        while pos < size:
            zero = data.find(b"\x00", pos)
            chunk_end = size if zero < 0 else zero
            if not self._discarding:
                # Never buffer more than one octet past the limit, whatever arrives.
                room = self.limit + 1 - len(self._buf)
                self._buf += data[pos : min(chunk_end, pos + room)]
                if len(self._buf) > self.limit:
                    out.append(
                        FrameError(
                            f"frame longer than {self.limit} octets without a delimiter",
                            self._start,
                        )
                    )
                    self._buf.clear()
                    self._discarding = True
            if zero < 0:
                self.offset += size - pos
                break
            self.offset += zero + 1 - pos
            pos = zero + 1
            if self._discarding:
                self._discarding = False
            elif self._buf:
                out.append(self._complete(bytes(self._buf)))
                self._buf.clear()
            self._start = self.offset
        return out

    def _complete(self, encoded: bytes) -> bytes | FrameError:
        try:
            body = cobs_decode(encoded)
        except ValueError as exc:
            return FrameError(f"bad COBS: {exc}", self._start)
        if len(body) <= CRC_SIZE:
            return FrameError(f"frame of {len(body)} octets is too short for a CRC", self._start)
        message, check = body[:-CRC_SIZE], int.from_bytes(body[-CRC_SIZE:], "big")
        expected = crc16(message)
        if check != expected:
            return FrameError(
                f"CRC mismatch (frame says 0x{check:04x}, content gives 0x{expected:04x})",
                self._start,
            )
        self.frames += 1
        return message
