"""Just enough MQTT 3.1.1 for the load generator and the relay, independent of the broker code.

Encoders build the few client packets the benchmark sends (CONNECT, SUBSCRIBE,
PUBLISH, PUBACK, DISCONNECT), once, before a run starts. The receive side never
decodes a PUBLISH in full: it walks fixed headers and remaining lengths.

A stream of equal-sized frames (the common case: one topic length, one payload
size) is checked with strided slices instead of a Python loop per frame: if the
fixed header of the expected frame sits at every multiple of the frame size, each
of those positions is a frame start and the whole run is valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
SUBSCRIBE = 8
SUBACK = 9
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
PINGRESP_PACKET = b"\xd0\x00"
PINGREQ_PACKET = b"\xc0\x00"
DISCONNECT_PACKET = b"\xe0\x00"


class MalformedError(ValueError):
    """The byte stream is not a sequence of MQTT frames."""


def varint(n: int) -> bytes:
    """MQTT variable byte integer (remaining length)."""
    if not 0 <= n <= 268_435_455:
        raise ValueError(f"remaining length out of range: {n}")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def connect(client_id: str, keepalive: int = 600, clean_session: bool = True) -> bytes:
    """CONNECT, MQTT 3.1.1, no will, no credentials."""
    flags = 0x02 if clean_session else 0x00
    body = _string("MQTT") + bytes([4, flags]) + keepalive.to_bytes(2, "big") + _string(client_id)
    return _packet(0x10, body)


def subscribe(packet_id: int, filters: Iterable[tuple[str, int]]) -> bytes:
    """SUBSCRIBE with one or more (filter, requested QoS) pairs."""
    payload = b"".join(_string(f) + bytes([qos]) for f, qos in filters)
    return _packet(0x82, packet_id.to_bytes(2, "big") + payload)


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int = 0) -> bytes:
    """PUBLISH, no retain, no DUP."""
    pid = packet_id.to_bytes(2, "big") if qos else b""
    return _packet(0x30 | (qos << 1), _string(topic) + pid + payload)


def publish_parts(topic: str, payload: bytes, qos: int) -> tuple[bytes, bytes]:
    """A QoS 1/2 PUBLISH split around its packet id: ``head + pid(2) + payload``."""
    head_body = _string(topic)
    body_len = len(head_body) + 2 + len(payload)
    return bytes([0x30 | (qos << 1)]) + varint(body_len) + head_body, payload


def puback(packet_id: int) -> bytes:
    return b"\x40\x02" + packet_id.to_bytes(2, "big")


def header(data: bytes, pos: int) -> tuple[int, int] | None:
    """``(fixed header length, remaining length)`` of the frame at ``pos``; None if incomplete."""
    n = len(data)
    value = 0
    shift = 0
    i = pos + 1
    while True:
        if i >= n:
            return None
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return i - pos, value
        shift += 7
        if shift > 21:
            raise MalformedError(f"remaining length longer than 4 bytes at offset {pos}")


class Shape:
    """The expected frame: its fixed header bytes and its total size (0: none expected)."""

    __slots__ = ("prefix", "size")

    def __init__(self, frame: bytes | None = None) -> None:
        if frame is None:
            self.prefix = b""
            self.size = 0
            return
        found = header(frame, 0)
        if found is None:
            raise ValueError("incomplete sample frame")
        hl, rl = found
        if hl + rl != len(frame):
            raise ValueError("sample must be exactly one frame")
        self.prefix = frame[:hl]
        self.size = len(frame)

    def run(self, data: bytes, pos: int) -> int:
        """How many whole expected frames start at ``pos`` (all or nothing per call)."""
        size = self.size
        if not size:
            return 0
        k = (len(data) - pos) // size
        if k <= 0:
            return 0
        end = pos + k * size
        for i, byte in enumerate(self.prefix):
            if data[pos + i : end : size].count(byte) != k:
                return 0
        return k


def walk(data: bytes, pos: int, shape: Shape) -> tuple[int, int]:
    """Walk complete frames from ``pos``: ``(end of the last complete frame, PUBLISH count)``."""
    n = len(data)
    publishes = 0
    k = shape.run(data, pos)
    if k:
        pos += k * shape.size
        publishes += k if shape.prefix[0] >> 4 == PUBLISH else 0
    while pos < n:
        found = header(data, pos)
        if found is None:
            break
        hl, rl = found
        end = pos + hl + rl
        if end > n:
            break
        if data[pos] >> 4 == PUBLISH:
            publishes += 1
        pos = end
    return pos, publishes


def frames(data: bytes, pos: int = 0) -> Iterator[tuple[int, int, int]]:
    """``(packet type and flags byte, body start, body end)`` of each complete frame."""
    n = len(data)
    while pos < n:
        found = header(data, pos)
        if found is None:
            return
        hl, rl = found
        end = pos + hl + rl
        if end > n:
            return
        yield data[pos], pos + hl, end
        pos = end


class PublishCounter:
    """Counts PUBLISH frames in a byte stream, one chunk at a time, without copying it.

    Only the fixed header of each frame is read; a frame's body is skipped, also
    across chunk boundaries. Frames are counted when their header arrives.
    """

    __slots__ = ("head", "shape", "skip")

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.skip = 0  # bytes of the current frame body still to come
        self.head = b""  # an incomplete fixed header from the previous chunk

    def feed(self, data: bytes) -> int:
        n = len(data)
        pos = self.skip
        if pos >= n:
            self.skip = pos - n
            return 0
        if self.head:
            data = self.head + data
            self.head = b""
            n = len(data)
        shape = self.shape
        count = 0
        k = shape.run(data, pos)
        if k:
            pos += k * shape.size
            count = k
        while pos < n:
            found = header(data, pos)
            if found is None:
                self.head = data[pos:]
                self.skip = 0
                return count
            if data[pos] >> 4 == PUBLISH:
                count += 1
            pos += found[0] + found[1]
        self.skip = pos - n
        return count


class Splitter:
    """Cuts a byte stream at frame boundaries: each call returns only whole frames."""

    __slots__ = ("carry", "publishes", "shape")

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.carry = b""
        self.publishes = 0

    def feed(self, data: bytes) -> bytes:
        if self.carry:
            data = self.carry + data
        end, count = walk(data, 0, self.shape)
        self.publishes += count
        if end == len(data):
            self.carry = b""
            return data
        self.carry = data[end:]
        return data[:end]


def acks_for(data: bytes, shape: Shape, pid_offset: int) -> tuple[int, int, bytes]:
    """PUBACKs for the QoS 1 PUBLISH frames at the start of ``data``.

    ``pid_offset`` is where the packet id sits inside an expected frame. Returns
    ``(bytes consumed, PUBLISH frames seen, PUBACK bytes to send)``; an incomplete
    trailing frame is left unconsumed.
    """
    k = shape.run(data, 0)
    acks = b""
    pos = 0
    count = 0
    if k:
        size = shape.size
        end = k * size
        out = bytearray(4 * k)
        out[0::4] = b"\x40" * k
        out[1::4] = b"\x02" * k
        out[2::4] = data[pid_offset:end:size]
        out[3::4] = data[pid_offset + 1 : end : size]
        acks = bytes(out)
        pos = end
        count = k
    if pos < len(data):
        extra = bytearray()
        for first, start, stop in frames(data, pos):
            pos = stop
            if first >> 4 != PUBLISH:
                continue
            count += 1
            qos = (first >> 1) & 0x03
            if qos:
                tlen = int.from_bytes(data[start : start + 2], "big")
                pid = data[start + 2 + tlen : start + 4 + tlen]
                extra += b"\x40\x02" + pid
        acks += bytes(extra)
    return pos, count, acks
