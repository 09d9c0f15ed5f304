"""A relay that looks like a broker to the load generator but does no broker work.

    python -m bench.relay --port PORT

It answers CONNECT with CONNACK, SUBSCRIBE with SUBACK (granting the requested
QoS) and PINGREQ with PINGRESP. A connection that sends anything else after its
CONNECT is a publisher: from then on its bytes are forwarded, unparsed except
for frame boundaries (so frames of several publishers never interleave), to
every subscriber connection. Bytes from subscribers after their SUBSCRIBE
(PUBACKs in the QoS 1 scenario) go back to the publishers the same way.

No topic is read and nothing is matched: run against the relay, a scenario
measures the load generator and the loopback TCP path, i.e. the ceiling the
benchmark can observe on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import cast

from bench import mqtt

HANDSHAKE, PUBLISHER, SUBSCRIBER = 0, 1, 2

#: Output buffered towards one subscriber before the relay stops reading publishers.
SUB_HIGH = 1024 * 1024


class Relay:
    def __init__(self) -> None:
        self.subs: list[Conn] = []
        self.pubs: list[Conn] = []
        self.blocked = 0  # subscribers whose write buffer is above the high-water mark

    def to_subscribers(self, data: bytes) -> None:
        for sub in self.subs:
            sub.send(data)

    def to_publishers(self, data: bytes) -> None:
        for pub in self.pubs:
            pub.send(data)

    def block(self) -> None:
        self.blocked += 1
        if self.blocked == 1:
            for pub in self.pubs:
                pub.pause()

    def unblock(self) -> None:
        self.blocked -= 1
        if self.blocked == 0:
            for pub in self.pubs:
                pub.resume()


class Conn(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.role = HANDSHAKE
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.splitter = mqtt.Splitter(mqtt.Shape())
        self.ack_shape = mqtt.Shape(mqtt.puback(1))
        self.blocking = False
        self.reading = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=SUB_HIGH)

    def send(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def pause(self) -> None:
        if self.transport is not None and self.reading:
            self.reading = False
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.reading:
            self.reading = True
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.role == PUBLISHER:
            out = self.splitter.feed(data)
            if out:
                self.relay.to_subscribers(out)
            return
        if self.role == SUBSCRIBER and not self.buf:
            k = self.ack_shape.run(data, 0)
            if k and 4 * k == len(data):
                self.relay.to_publishers(data)
                return
        self.buf += data
        self._control()

    def _control(self) -> None:
        """Handle whole frames in the buffer while the role is not (yet) publisher."""
        buf = self.buf
        pos = 0
        forward = bytearray()
        for first, start, end in mqtt.frames(buf):
            kind = first >> 4
            if kind == mqtt.CONNECT:
                self.send(mqtt.CONNACK_ACCEPTED)
            elif kind == mqtt.SUBSCRIBE:
                self.send(_suback(buf, start, end))
                if self.role != SUBSCRIBER:
                    self.role = SUBSCRIBER
                    self.relay.subs.append(self)
            elif kind == mqtt.PINGREQ:
                self.send(mqtt.PINGRESP_PACKET)
            elif kind == mqtt.DISCONNECT:
                if self.transport is not None:
                    self.transport.close()
            elif self.role == SUBSCRIBER:
                forward += buf[pos:end]
            else:
                # The first packet that is none of the above: this is a publisher.
                self.role = PUBLISHER
                self.relay.pubs.append(self)
                if self.relay.blocked:
                    self.pause()
                rest = buf[pos:]
                self.buf = b""
                out = self.splitter.feed(rest)
                if out:
                    self.relay.to_subscribers(out)
                return
            pos = end
        self.buf = buf[pos:]
        if forward:
            self.relay.to_publishers(bytes(forward))

    def pause_writing(self) -> None:
        if self.role == SUBSCRIBER and not self.blocking:
            self.blocking = True
            self.relay.block()

    def resume_writing(self) -> None:
        if self.blocking:
            self.blocking = False
            self.relay.unblock()

    def connection_lost(self, exc: Exception | None) -> None:
        relay = self.relay
        if self in relay.subs:
            relay.subs.remove(self)
        if self in relay.pubs:
            relay.pubs.remove(self)
        if self.blocking:
            self.blocking = False
            relay.unblock()
        self.transport = None


def _suback(buf: bytes, start: int, end: int) -> bytes:
    pid = buf[start : start + 2]
    codes = bytearray()
    pos = start + 2
    while pos + 2 <= end:
        flen = int.from_bytes(buf[pos : pos + 2], "big")
        pos += 2 + flen
        if pos >= end:
            break
        codes.append(min(buf[pos] & 0x03, 1))
        pos += 1
    body = pid + bytes(codes)
    return b"\x90" + mqtt.varint(len(body)) + body


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    relay = Relay()
    server = await loop.create_server(lambda: Conn(relay), host, port, backlog=4096)
    stop = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await stop
    server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(serve(args.host, args.port))
    else:
        uvloop.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
