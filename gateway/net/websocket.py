"""MQTT over WebSockets (MQTT 5.0 section 6, RFC 6455, server side).

Only what MQTT needs, written here rather than taken from a library: the upgrade
handshake with the ``mqtt`` subprotocol, binary frames in both directions, fragmented
frames, ping/pong and the close handshake. The MQTT byte stream is the concatenation of
the binary frames' payloads (MQTT-6.0.0-2: packets are not aligned with frames), so
payloads are unmasked and handed on as they arrive -- a frame is never buffered whole,
whatever length it announces -- and the MQTT framer's bounds apply unchanged.

``handshake`` and ``FrameReader`` are sans-IO (bytes in, values out);
``WebSocketProtocol`` is the asyncio shell around them, which presents the connection
to the ordinary ``MQTTProtocol`` as a transport.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gateway.net.endpoint import Endpoint, linger_close
from gateway.net.layer import Layer

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("ledge.net")

#: The longest upgrade request read (request line and headers).
HANDSHAKE_MAX: Final = 8192
_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3

CONTINUATION: Final = 0x0
TEXT: Final = 0x1
BINARY: Final = 0x2
CLOSE: Final = 0x8
PING: Final = 0x9
PONG: Final = 0xA

#: Close codes (RFC 6455 section 7.4.1).
NORMAL: Final = 1000
PROTOCOL_ERROR: Final = 1002
UNSUPPORTED_DATA: Final = 1003


class WebSocketError(Exception):
    """The client broke RFC 6455 (or sent what MQTT forbids); close with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# ----------------------------------------------------------------------------- handshake


@dataclass(frozen=True, slots=True)
class Handshake:
    """The answer to an upgrade request: the bytes to send, and why it failed (or None)."""

    response: bytes
    error: str | None = None
    subprotocol: str | None = None


def _refusal(status: str, error: str, extra: str = "") -> Handshake:
    text = f"HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
    return Handshake(text.encode("ascii"), error)


def handshake(request: bytes, path: str) -> Handshake:
    """Answer one HTTP upgrade request (everything up to and including the blank line)."""
    import base64
    import hashlib

    try:
        lines = request.decode("ascii").split("\r\n")
    except UnicodeDecodeError:
        return _refusal("400 Bad Request", "request is not ASCII")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[0] != "GET" or not parts[2].startswith("HTTP/1."):
        return _refusal("400 Bad Request", f"not an HTTP/1.1 GET: {lines[0][:80]!r}")
    target = parts[1].split("?", 1)[0]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return _refusal("400 Bad Request", "malformed header line")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if target != path:
        return _refusal("404 Not Found", f"path {target[:80]!r} is not {path!r}")

    def tokens(name: str) -> set[str]:
        return {t.strip().lower() for t in headers.get(name, "").split(",")}

    if "websocket" not in tokens("upgrade") or "upgrade" not in tokens("connection"):
        return _refusal("426 Upgrade Required", "not a WebSocket upgrade", "Upgrade: websocket\r\n")
    if headers.get("sec-websocket-version") != "13":
        return _refusal(
            "426 Upgrade Required",
            "WebSocket version is not 13",
            "Sec-WebSocket-Version: 13\r\n",
        )
    key = headers.get("sec-websocket-key", "")
    try:
        raw_key = base64.b64decode(key, validate=True)
    except ValueError:
        raw_key = b""
    if len(raw_key) != 16:
        return _refusal("400 Bad Request", "bad Sec-WebSocket-Key")
    subprotocol = None
    if "sec-websocket-protocol" in headers:
        offered = tokens("sec-websocket-protocol")
        # MQTT-6.0.0-3, -4: the client offers "mqtt" and the server selects it. Clients
        # of the MQTT 3.1 era offer "mqttv3.1".
        for name in ("mqtt", "mqttv3.1"):
            if name in offered:
                subprotocol = name
                break
        else:
            return _refusal("400 Bad Request", "the mqtt subprotocol is not offered")
    accept = base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode()
    response = (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept}\r\n"
    )
    if subprotocol is not None:
        response += f"Sec-WebSocket-Protocol: {subprotocol}\r\n"
    return Handshake((response + "\r\n").encode("ascii"), None, subprotocol)


# ----------------------------------------------------------------------------- frames


def frame_header(opcode: int, length: int) -> bytes:
    """The header of an unmasked, final frame (servers never mask, RFC 6455 5.1)."""
    if length < 126:
        return bytes((0x80 | opcode, length))
    if length < 65_536:
        return bytes((0x80 | opcode, 126)) + length.to_bytes(2, "big")
    return bytes((0x80 | opcode, 127)) + length.to_bytes(8, "big")


def close_frame(code: int, reason: str = "") -> bytes:
    payload = code.to_bytes(2, "big") + reason.encode("utf-8")[:120]
    return frame_header(CLOSE, len(payload)) + payload


def unmask(data: bytes | bytearray, mask: bytes, offset: int) -> bytes:
    """XOR ``data`` with ``mask`` starting ``offset`` bytes into the mask's cycle
    (as one big-integer operation, so the work per byte happens in C)."""
    size = len(data)
    if not size:
        return b""
    if offset:
        mask = mask[offset:] + mask[:offset]
    key = (mask * ((size >> 2) + 1))[:size]
    value = int.from_bytes(data, "little") ^ int.from_bytes(key, "little")
    return value.to_bytes(size, "little")


#: What ``FrameReader.feed`` returns: (opcode, payload) with opcode BINARY for MQTT
#: bytes (of any frame, continuation or not), PING, PONG or CLOSE.
Event = tuple[int, bytes]


class FrameReader:
    """Client frames in, events out. Data payloads stream out as they arrive."""

    __slots__ = (
        "_buf",
        "_control",
        "_fragmented",
        "_mask",
        "_offset",
        "_opcode",
        "_remaining",
        "closed",
        "error",
    )

    def __init__(self) -> None:
        self._buf = b""
        #: Payload bytes of the current frame not yet received (-1: reading a header).
        self._remaining = -1
        self._opcode = 0
        self._mask = b""
        self._offset = 0
        self._control = b""
        #: A data message was started by a frame without FIN.
        self._fragmented = False
        #: Why the stream is unusable; set once, after which nothing more is read.
        self.error: WebSocketError | None = None
        #: A Close frame was read: nothing after it is, in this chunk or any later one.
        self.closed = False

    def feed(self, data: bytes) -> list[Event]:
        """The events in ``data`` (with what came before). After a protocol violation the
        events before it are returned and ``error`` says what went wrong."""
        events: list[Event] = []
        if self.error is not None or self.closed:
            return events
        buf = self._buf + data if self._buf else data
        pos = 0
        size = len(buf)
        while True:
            if self._remaining < 0:
                try:
                    header = self._header(buf, pos, size)
                except WebSocketError as exc:
                    self.error = exc
                    self._buf = b""
                    return events
                if header is None:
                    break
                pos = header
                if self._remaining == 0 and not self._control_frame:
                    continue
            if self._remaining > 0:
                take = min(self._remaining, size - pos)
                if not take:
                    break
                chunk = unmask(buf[pos : pos + take], self._mask, self._offset)
                pos += take
                self._remaining -= take
                self._offset = (self._offset + take) & 3
                if self._control_frame:
                    self._control += chunk
                else:
                    events.append((BINARY, chunk))
            if self._remaining == 0:
                self._remaining = -1
                if self._control_frame:
                    events.append((self._opcode, self._control))
                    self._control = b""
                    if self._opcode == CLOSE:
                        self.closed = True  # RFC 6455 5.5.1: nothing after it is read
                        self._buf = b""
                        return events
        self._buf = buf[pos:]
        return events

    @property
    def _control_frame(self) -> bool:
        return self._opcode >= CLOSE

    def _header(self, buf: bytes, pos: int, size: int) -> int | None:
        """Parse a frame header at ``pos``; returns the payload's start, or None."""
        if size - pos < 2:
            return None
        b0, b1 = buf[pos], buf[pos + 1]
        # What two bytes already tell is checked at once, before waiting for more.
        if b0 & 0x70:
            raise WebSocketError(PROTOCOL_ERROR, "reserved bits set (no extension agreed)")
        if not b1 & 0x80:
            raise WebSocketError(PROTOCOL_ERROR, "client frame not masked")
        opcode = b0 & 0x0F
        fin = bool(b0 & 0x80)
        length = b1 & 0x7F
        if opcode >= CLOSE:
            if opcode not in (CLOSE, PING, PONG):
                raise WebSocketError(PROTOCOL_ERROR, f"unknown opcode {opcode}")
            if not fin or length > 125:
                raise WebSocketError(PROTOCOL_ERROR, "control frame fragmented or too long")
            if opcode == CLOSE and length == 1:
                raise WebSocketError(PROTOCOL_ERROR, "close frame with a one-byte payload")
        elif opcode == TEXT:
            # MQTT-6.0.0-1: MQTT travels in binary frames only.
            raise WebSocketError(UNSUPPORTED_DATA, "text frame (MQTT needs binary frames)")
        elif opcode not in (BINARY, CONTINUATION):
            raise WebSocketError(PROTOCOL_ERROR, f"unknown opcode {opcode}")
        elif opcode == BINARY and self._fragmented:
            raise WebSocketError(PROTOCOL_ERROR, "new message inside a fragmented one")
        elif opcode == CONTINUATION and not self._fragmented:
            raise WebSocketError(PROTOCOL_ERROR, "continuation without a message")
        start = pos + 2
        if length == 126:
            start += 2
        elif length == 127:
            start += 8
        if size - start < 4:
            return None  # the mask key (and any extended length) is not all here yet
        if length == 126:
            length = int.from_bytes(buf[pos + 2 : pos + 4], "big")
        elif length == 127:
            length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
            if length >> 63:
                raise WebSocketError(PROTOCOL_ERROR, "frame length has its top bit set")
        if opcode < CLOSE:
            self._fragmented = not fin
        self._opcode = opcode
        self._mask = bytes(buf[start : start + 4])
        self._offset = 0
        self._remaining = length
        return start + 4


def close_code(payload: bytes) -> int:
    """The status code of a received Close frame (1000 when it has none)."""
    return int.from_bytes(payload[:2], "big") if len(payload) >= 2 else NORMAL


# ----------------------------------------------------------------------------- asyncio shell


class WebSocketProtocol(Layer):
    """One WebSocket connection: the upgrade (bounded, timed), then frames around an
    ``MQTTProtocol``."""

    def __init__(self, endpoint: Endpoint, inner: asyncio.Protocol) -> None:
        super().__init__(endpoint, inner)
        self.reader = FrameReader()
        self.request = bytearray()

    def timed_out(self) -> None:
        log.info("closing %s: WebSocket upgrade not completed in time", self._peer())
        assert self.raw is not None
        self.raw.abort()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """One binary frame per write of the inner protocol."""
        if self.closing:
            return
        assert self.raw is not None
        self.raw.writelines((frame_header(BINARY, len(data)), data))

    def end(self) -> None:
        self.close(NORMAL)

    def data_received(self, data: bytes) -> None:
        raw = self.raw
        assert raw is not None
        if self.open:
            self._frames(data)
            return
        request = self.request
        request += data
        end = request.find(b"\r\n\r\n")
        if end < 0:
            if len(request) > HANDSHAKE_MAX:
                raw.write(_refusal("431 Request Header Fields Too Large", "").response)
                self._refused("upgrade request too long")
            return
        answer = handshake(bytes(request[: end + 4]), self.endpoint.path)
        rest = bytes(request[end + 4 :])
        self.request = bytearray()
        raw.write(answer.response)
        if answer.error is not None:
            self._refused(answer.error)
            return
        self.opened()
        if rest:
            self._frames(rest)

    def _refused(self, error: str) -> None:
        log.info("refusing WebSocket upgrade from %s: %s", self._peer(), error)
        assert self.raw is not None
        self.closing = True
        self.raw.close()

    def _frames(self, data: bytes) -> None:
        raw = self.raw
        assert raw is not None
        reader = self.reader
        events = reader.feed(data)
        inner = self.inner
        for opcode, payload in events:
            if opcode == BINARY:
                if not self.closing:
                    inner.data_received(payload)
            elif opcode == PING:
                if not self.closing:
                    raw.writelines((frame_header(PONG, len(payload)), payload))
            elif opcode == CLOSE:
                self.close(close_code(payload))
                raw.close()  # the client said goodbye first: done
            # PONG: nothing to do
        error = reader.error
        if error is not None and not self.closing:
            log.info("closing WebSocket from %s: %s (%d)", self._peer(), error.reason, error.code)
            self.close(error.code, error.reason)

    def close(self, code: int, reason: str = "") -> None:
        """Start the close handshake: send Close, then let the client answer (bounded)."""
        raw = self.raw
        if raw is None or self.closing:
            return
        self.closing = True
        raw.write(close_frame(code, reason))
        linger_close(raw, self.loop)
