"""Drive the pure broker core with encoded packets and a fake clock.

Every packet goes through the real codec both ways: a ``FakeClient`` encodes what
it sends and decodes what the broker wrote for it, so these tests pin down the
bytes a real client would see, without sockets or sleeping.
"""

from __future__ import annotations

from typing import Any, TypeVar

from gateway.broker.core import Broker
from gateway.broker.settings import BrokerSettings
from gateway.broker.state import State
from gateway.mqtt import (
    MQTT_5,
    ConnAck,
    Connect,
    NeedData,
    Packet,
    PacketReader,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
    encode,
)

P = TypeVar("P")


class Harness:
    """One broker, a fake clock, and any number of fake clients."""

    def __init__(self, **settings: Any) -> None:
        settings.setdefault("sys_interval", 0)
        # Tests open clients before they CONNECT, all from one address: the connecting
        # budget stays out of their way unless a test sets it.
        settings.setdefault("connecting_share", 1.0)
        settings.setdefault("max_connecting_per_address", 1 << 20)
        self.now = 1000.0
        self.broker = Broker(BrokerSettings(**settings), now=self.now)

    def client(
        self,
        version: int = MQTT_5,
        *,
        peer: str = "127.0.0.1:9",
        listener: str = "test",
        identity: str | None = None,
    ) -> FakeClient:
        return FakeClient(self, version, peer, listener, identity)

    def advance(self, seconds: float) -> None:
        """Move the clock forward in small steps, firing timers as the shell would."""
        target = self.now + seconds
        while True:
            deadline = self.broker.next_deadline()
            if deadline is None or deadline > target:
                break
            self.now = max(self.now, deadline)
            self.broker.tick(self.now)
        self.now = target
        self.broker.tick(self.now)


class FakeClient:
    def __init__(
        self,
        harness: Harness,
        version: int,
        peer: str = "127.0.0.1:9",
        listener: str = "test",
        identity: str | None = None,
    ) -> None:
        self.h = harness
        self.version = version
        conn = harness.broker.open_connection(peer, listener, harness.now, identity)
        assert conn is not None, "no free connection slot"
        self.conn = conn
        self.reader = PacketReader(version=version)
        self.inbox: list[Packet] = []
        self._next_pid = 1

    # ----------------------------------------------------------------- sending

    def send(self, packet: Packet) -> None:
        self.send_raw(encode(packet, self.version))

    def send_raw(self, data: bytes) -> None:
        self.h.broker.data_received(self.conn, data, self.h.now)

    def pid(self) -> int:
        pid = self._next_pid
        self._next_pid += 1
        return pid

    def connect(
        self,
        client_id: str = "c",
        *,
        clean_start: bool = True,
        keep_alive: int = 0,
        will: Will | None = None,
        username: str | None = None,
        password: bytes | None = None,
        **props: Any,
    ) -> ConnAck:
        self.send(
            Connect(
                client_id,
                self.version,
                clean_start,
                keep_alive,
                will,
                username,
                password,
                Properties(**props) if props else Properties(),
            )
        )
        return self.expect(ConnAck)

    def subscribe(
        self, topic_filter: str, qos: int = 0, sub_id: int | None = None, **options: Any
    ) -> SubAck:
        props = Properties(subscription_identifiers=(sub_id,)) if sub_id else Properties()
        self.send(
            Subscribe(self.pid(), (SubscriptionRequest(topic_filter, qos, **options),), props)
        )
        return self.expect(SubAck)

    def unsubscribe(self, *filters: str) -> UnsubAck:
        self.send(Unsubscribe(self.pid(), filters))
        return self.expect(UnsubAck)

    def publish(
        self,
        topic: str,
        payload: bytes = b"x",
        qos: int = 0,
        retain: bool = False,
        **props: Any,
    ) -> int:
        """Publish and run the acknowledgement flow; returns the packet id (0 for QoS 0)."""
        pid = self.pid() if qos else 0
        self.send(Publish(topic, payload, qos, retain, False, pid, Properties(**props)))
        if qos == 1:
            self.expect_ack(PubAck, pid)
        elif qos == 2:
            self.expect_ack(PubRec, pid)
            self.send(PubRel(pid))
            self.expect_ack(PubComp, pid)
        return pid

    def ack(self, packet: Publish) -> None:
        """Complete the receiver side of a QoS 1/2 delivery."""
        if packet.qos == 1:
            self.send(PubAck(packet.packet_id))
        elif packet.qos == 2:
            self.send(PubRec(packet.packet_id))
            self.expect_ack(PubRel, packet.packet_id)
            self.send(PubComp(packet.packet_id))

    # ----------------------------------------------------------------- receiving

    def poll(self) -> list[Packet]:
        """Decode everything the broker wrote for this client since the last poll."""
        broker = self.h.broker
        broker.dirty = [c for c in broker.dirty if c is not self.conn]
        for chunk in self.conn.take_output():
            self.reader.receive_data(chunk)
        while True:
            packet = self.reader.next_packet()
            if isinstance(packet, NeedData):
                break
            self.inbox.append(packet)
        return self.inbox

    def take(self) -> list[Packet]:
        self.poll()
        out = self.inbox
        self.inbox = []
        return out

    def expect(self, kind: type[P]) -> P:
        """The next packet, which must be of type ``kind``."""
        self.poll()
        assert self.inbox, f"expected {kind.__name__}, got nothing"
        packet = self.inbox.pop(0)
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet!r}"
        return packet

    def expect_ack(self, kind: type[P], pid: int) -> P:
        """The acknowledgement ``kind`` for ``pid``; other packets stay in the inbox."""
        self.poll()
        for i, packet in enumerate(self.inbox):
            if isinstance(packet, kind) and getattr(packet, "packet_id", None) == pid:
                del self.inbox[i]
                return packet
        raise AssertionError(f"no {kind.__name__} for packet id {pid} in {self.inbox!r}")

    def publishes(self) -> list[Publish]:
        """Take every pending packet; all must be PUBLISH."""
        packets = self.take()
        assert all(isinstance(p, Publish) for p in packets), packets
        return [p for p in packets if isinstance(p, Publish)]

    @property
    def closed(self) -> bool:
        return self.conn.state >= State.CLOSING

    def drop(self) -> None:
        """The network connection breaks (no DISCONNECT)."""
        self.h.broker.connection_lost(self.conn, self.h.now)
