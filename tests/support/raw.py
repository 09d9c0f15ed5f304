"""A raw MQTT client over a real socket, for sending bytes no real client would:
whatever the test writes goes out unchanged, and what comes back is decoded with our
own codec (the client side of it)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from gateway.mqtt import (
    MQTT_5,
    ConnAck,
    Connect,
    Packet,
    PacketReader,
    Properties,
    Publish,
    Subscribe,
    SubscriptionRequest,
    encode,
)


@dataclass
class Raw:
    port: int
    version: int = MQTT_5
    host: str = "127.0.0.1"
    #: The local address to connect from (another loopback address is another peer).
    source: str | None = None
    sock: socket.socket = field(init=False)
    #: Everything decoded so far, and whether the server closed the connection.
    packets: list[Packet] = field(default_factory=list)
    closed: bool = False
    _reader: PacketReader = field(init=False)

    def __post_init__(self) -> None:
        source = None if self.source is None else (self.source, 0)
        self.sock = socket.create_connection((self.host, self.port), 5, source)
        self._reader = PacketReader(version=self.version)

    def send(self, data: bytes) -> Raw:
        self.sock.sendall(data)
        return self

    def connect(self, client_id: str, **kwargs: object) -> ConnAck:
        """A valid CONNECT; returns the CONNACK."""
        self.send(encode(Connect(client_id, self.version, **kwargs), self.version))  # type: ignore[arg-type]
        packet = self.expect(1)[0]
        assert isinstance(packet, ConnAck), packet
        return packet

    def _pump(self, timeout: float) -> None:
        """Read once (up to ``timeout`` s); decode what arrived."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(65_536)
        except TimeoutError:
            return
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            return
        self._reader.receive_data(data)
        while True:
            packet = self._reader.next_packet()
            if not packet:
                break
            self.packets.append(packet)  # type: ignore[arg-type]

    def expect(self, count: int, within: float = 5.0) -> list[Packet]:
        """Wait until ``count`` more packets have arrived (fails on close or deadline)."""
        want = len(self.packets) + count
        deadline = time.monotonic() + within
        while len(self.packets) < want:
            if self.closed:
                raise AssertionError(f"closed after {self.packets}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for packets; got {self.packets}")
            self._pump(left)
        return self.packets[want - count : want]

    def until_closed(self, within: float = 5.0) -> list[Packet]:
        """Everything the server sends until it closes; fails if it does not in time."""
        deadline = time.monotonic() + within
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"still open after {within} s; got {self.packets}")
            self._pump(left)
        return self.packets

    def close(self) -> None:
        self.sock.close()


def round_trip(port: int, topic: str = "probe/still-serving") -> None:
    """A fresh client subscribes and gets its own QoS 1 message back: the broker
    still serves."""
    c = Raw(port)
    try:
        assert c.connect(f"probe-{time.monotonic_ns()}").reason_code == 0
        c.send(encode(Subscribe(1, (SubscriptionRequest(topic, 1),)), MQTT_5))
        c.expect(1)
        c.send(encode(Publish(topic, b"alive", 1, packet_id=7, properties=Properties()), MQTT_5))
        got = c.expect(2)
        assert any(isinstance(p, Publish) and p.payload == b"alive" for p in got), got
    finally:
        c.close()
