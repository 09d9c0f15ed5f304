"""The stream framer: bytes in, whole packets out (the h11 ``receive_data`` shape).

``Framer.feed(data)`` buffers; ``next_frame()`` returns ``(first_byte, body)`` or
``NEED_DATA`` when the next packet is incomplete. A remaining length longer than
four bytes or a packet larger than the maximum is rejected as soon as its fixed
header is read, before any of its body is buffered.
"""

from __future__ import annotations

from typing import Final

from gateway.mqtt.codec import decode
from gateway.mqtt.errors import MalformedPacket, PacketTooLarge
from gateway.mqtt.packets import Packet
from gateway.mqtt.wire import VARINT_MAX


class NeedData:
    """Sentinel: the buffer holds no complete packet yet."""

    _instance: NeedData | None = None

    def __new__(cls) -> NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"

    def __bool__(self) -> bool:
        return False


NEED_DATA: Final = NeedData()


class Framer:
    """Splits a byte stream into MQTT packets, bounded by ``max_packet_size``."""

    __slots__ = ("_buf", "_pos", "max_packet_size")

    def __init__(self, max_packet_size: int = VARINT_MAX + 5) -> None:
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self.max_packet_size = max_packet_size

    def reset(self) -> None:
        """Forget everything buffered (the connection is being reused)."""
        self._buf = b""
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        buf = self._buf
        if self._pos >= len(buf):
            # Nothing pending: frame straight out of the received bytes.
            self._buf = data
        elif isinstance(buf, bytes):
            # A partial packet is pending: accumulate in place from now on.
            acc = bytearray(buf[self._pos :])
            acc += data
            self._buf = acc
        else:
            del buf[: self._pos]
            buf += data
        self._pos = 0

    @property
    def buffer(self) -> bytes | bytearray:
        """The bytes ``next_span`` offsets point into (valid until the next ``feed``)."""
        return self._buf

    def next_span(self) -> tuple[int, int, int, int] | NeedData:
        """``(first_byte, frame_start, body_start, end)`` of the next whole packet in
        ``buffer``, or ``NEED_DATA``."""
        buf = self._buf
        pos = self._pos
        size = len(buf)
        if size - pos < 2:
            return NEED_DATA
        byte = buf[pos + 1]
        if byte < 0x80:  # the common case: a one-byte remaining length
            start = pos + 2
            end = start + byte
        else:
            # Remaining length: a variable byte integer of at most four bytes (section
            # 1.5.5, 2.1.4), in the minimum number of bytes (MQTT-1.5.5-1).
            length = 0
            shift = 0
            start = pos + 1
            while True:
                if start >= size:
                    return NEED_DATA
                byte = buf[start]
                start += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    if byte == 0 and shift:
                        # A last byte of 0 after a continuation byte is an overlong encoding.
                        raise MalformedPacket("remaining length not in its minimal encoding")
                    break
                shift += 7
                if shift >= 28:
                    raise MalformedPacket("remaining length longer than four bytes")
            end = start + length
        if end - pos > self.max_packet_size:
            raise PacketTooLarge(
                f"packet of {end - pos} bytes exceeds the maximum packet size "
                f"{self.max_packet_size}"
            )
        if end > size:
            return NEED_DATA
        self._pos = end
        return buf[pos], pos, start, end

    def next_frame(self) -> tuple[int, bytes | bytearray] | NeedData:
        """``(first_byte, body)`` of the next whole packet, or ``NEED_DATA``."""
        span = self.next_span()
        if isinstance(span, NeedData):
            return span
        first, _pos, start, end = span
        return first, self._buf[start:end]


class PacketReader:
    """A framer plus the codec: bytes in, packet values out."""

    __slots__ = ("framer", "version")

    def __init__(self, max_packet_size: int = VARINT_MAX + 5, version: int = 4) -> None:
        self.framer = Framer(max_packet_size)
        self.version = version

    def reset(self, version: int = 4) -> None:
        self.framer.reset()
        self.version = version

    def receive_data(self, data: bytes) -> None:
        self.framer.feed(data)

    def next_packet(self) -> Packet | NeedData:
        framed = self.framer.next_frame()
        if isinstance(framed, NeedData):
            return framed
        first, body = framed
        return decode(first, body, self.version)
