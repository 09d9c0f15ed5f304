"""A LAN flood of connections that never finish CONNECT, and what a client sees meanwhile.

Used by the flood test (``tests/test_security_flood.py``) against Ledge and by the
benchmark (``bench/flood.py``) against Ledge and Mosquitto alike: the same sockets,
the same clients, only the broker differs.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from dataclasses import dataclass, field

from gateway.mqtt import (
    MQTT_5,
    ConnAck,
    Connect,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from tests.support.raw import Raw

#: A CONNECT's fixed header, then nothing: slowloris.
SLOWLORIS_BYTES = encode(Connect("slowloris", MQTT_5), MQTT_5)[:2]


def raise_open_files(wanted: int) -> None:
    """Lift this process's soft open-file limit (up to the hard one) to ``wanted``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        top = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
        soft = top
    assert soft == resource.RLIM_INFINITY or soft >= wanted, (
        f"the flood needs {wanted} open files; the hard limit is {hard}"
    )


@dataclass
class Flood:
    """Sockets held open without ever finishing CONNECT, spread over ``sources``."""

    port: int
    sources: tuple[str, ...] = ("127.0.0.1",)
    socks: list[socket.socket] = field(default_factory=list)
    #: Connections the kernel would not even open (the broker's backlog was full).
    failed: int = 0

    def open(self, silent: int, slowloris: int) -> Flood:
        for i in range(silent + slowloris):
            source = self.sources[i % len(self.sources)]
            sock = socket.socket()
            sock.settimeout(2)
            try:
                sock.bind((source, 0))
                sock.connect(("127.0.0.1", self.port))
                if i >= silent:
                    sock.sendall(SLOWLORIS_BYTES)
            except OSError:
                self.failed += 1
                sock.close()
                continue
            self.socks.append(sock)
        return self

    def still_open(self) -> int:
        """How many of the flood's connections the broker has not closed."""
        alive = 0
        for sock in self.socks:
            sock.setblocking(False)
            try:
                data = sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                alive += 1
                continue
            except OSError:
                continue
            if data:
                alive += 1
        return alive

    def close(self) -> None:
        for sock in self.socks:
            with contextlib.suppress(OSError):
                sock.close()
        self.socks.clear()


def probe(port: int, source: str = "127.0.0.1", within: float = 10.0) -> float:
    """A normal client: CONNECT, SUBSCRIBE, then a QoS 1 PUBLISH it gets back.
    Returns the seconds it took; fails if any step is refused or takes past ``within``."""
    start = time.monotonic()
    topic = f"probe/{time.monotonic_ns()}"
    c = Raw(port, source=source)
    try:
        c.send(encode(Connect(f"probe-{time.monotonic_ns()}", MQTT_5), MQTT_5))
        (ack,) = c.expect(1, within)
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
        c.send(encode(Subscribe(1, (SubscriptionRequest(topic, 1),)), MQTT_5))
        (sub,) = c.expect(1, within)
        assert isinstance(sub, SubAck) and sub.reason_codes == (1,), sub
        c.send(encode(Publish(topic, b"probe", 1, packet_id=2, properties=Properties()), MQTT_5))
        got = c.expect(2, within)
        assert any(isinstance(p, PubAck) and p.reason_code == 0 for p in got), got
        assert any(isinstance(p, Publish) and p.payload == b"probe" for p in got), got
        return time.monotonic() - start
    finally:
        c.close()


@dataclass
class Subscribers:
    """Clients connected before the flood, all subscribed to one topic."""

    port: int
    count: int
    topic: str = "flood/fanout"
    clients: list[Raw] = field(default_factory=list)

    def connect(self) -> Subscribers:
        for i in range(self.count):
            c = Raw(self.port)
            assert c.connect(f"sub-{i}-{time.monotonic_ns()}").reason_code == 0
            c.send(encode(Subscribe(1, (SubscriptionRequest(self.topic, 0),)), MQTT_5))
            (ack,) = c.expect(1)
            assert isinstance(ack, SubAck), ack
            self.clients.append(c)
        return self

    def receiving(self, messages: int = 3, within: float = 10.0) -> int:
        """Publish ``messages`` to the topic; how many subscribers got every one."""
        publisher = Raw(self.port)
        try:
            assert publisher.connect(f"pub-{time.monotonic_ns()}").reason_code == 0
            payloads = [f"m{i}-{time.monotonic_ns()}".encode() for i in range(messages)]
            for payload in payloads:
                publisher.send(encode(Publish(self.topic, payload), MQTT_5))
        finally:
            publisher.close()
        deadline = time.monotonic() + within
        complete = 0
        for c in self.clients:
            try:
                got = c.expect(messages, max(0.1, deadline - time.monotonic()))
            except AssertionError:
                continue
            if [p.payload for p in got if isinstance(p, Publish)] == payloads:
                complete += 1
        return complete

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.clients.clear()
