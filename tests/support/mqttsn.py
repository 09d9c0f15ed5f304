"""Drive the pure MQTT-SN gateway with encoded messages and a fake clock.

A ``SnHarness`` is one broker (``tests.support.harness.Harness``, so MQTT clients
can watch and publish) with an MQTT-SN ``Gateway`` on it. ``SnDevice`` encodes what
it sends with the codec and decodes what the gateway wrote to its address, so the
tests pin down the bytes a device would see, without sockets or sleeping.
"""

from __future__ import annotations

from typing import Any, TypeVar

from gateway.mqttsn.codec import decode
from gateway.mqttsn.encoding import encode
from gateway.mqttsn.gateway import Gateway
from gateway.mqttsn.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Encapsulated,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    RegAck,
    Register,
    SubAck,
    Subscribe,
    TopicIdType,
    WillMsg,
    WillMsgReq,
    WillTopic,
    WillTopicReq,
)
from gateway.mqttsn.settings import MqttSnSettings
from gateway.mqttsn.state import BROADCAST, TransportPolicy
from tests.support.harness import Harness

P = TypeVar("P")

UDP = "udp"


class SnHarness(Harness):
    """A broker and an MQTT-SN gateway on it, one fake clock."""

    def __init__(
        self,
        transports: list[TransportPolicy] | None = None,
        acl: Any = None,
        broker: dict[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(**(broker or {}))
        settings.setdefault("advertise_interval", 0)
        self.settings = MqttSnSettings(**settings)
        self.gateway = Gateway(
            self.broker,
            self.settings,
            transports or [TransportPolicy(UDP)],
            acl=acl,
            now=self.now,
        )
        #: Everything the gateway sent, in order, per (transport, address).
        self.mailbox: dict[tuple[str, Any], list[bytes]] = {}

    def device(
        self, address: Any = ("10.0.0.2", 5000), transport: str = UDP, node_id: bytes = b""
    ) -> SnDevice:
        return SnDevice(self, transport, address, node_id)

    def collect(self) -> None:
        for transport, address, data in self.gateway.take_output():
            self.mailbox.setdefault((transport, address), []).append(data)

    def broadcasts(self, transport: str = UDP) -> list[Packet]:
        self.collect()
        return [decode(d) for d in self.mailbox.pop((transport, BROADCAST), [])]

    def advance(self, seconds: float) -> None:
        """Move the clock, firing the broker's and the gateway's timers in order."""
        target = self.now + seconds
        while True:
            deadlines = [
                d
                for d in (self.broker.next_deadline(), self.gateway.next_deadline())
                if d is not None and d <= target
            ]
            if not deadlines:
                break
            self.now = max(self.now, min(deadlines))
            self.broker.tick(self.now)
            self.gateway.tick(self.now)
        self.now = target
        self.broker.tick(self.now)
        self.gateway.tick(self.now)


class SnDevice:
    """One MQTT-SN client (or a wireless node behind a forwarder at ``address``)."""

    def __init__(self, h: SnHarness, transport: str, address: Any, node_id: bytes) -> None:
        self.h = h
        self.transport = transport
        self.address = address
        self.node_id = node_id
        self.inbox: list[Packet] = []
        self._msg_id = 0

    def msg_id(self) -> int:
        self._msg_id += 1
        return self._msg_id

    def send(self, packet: Packet) -> None:
        if self.node_id:
            packet = Encapsulated(self.node_id, packet)
        self.send_raw(encode(packet))

    def send_raw(self, data: bytes) -> None:
        self.h.gateway.received(self.transport, self.address, data, self.h.now)

    def poll(self) -> list[Packet]:
        self.h.collect()
        for data in self.h.mailbox.pop((self.transport, self.address), []):
            packet = decode(data)
            if self.node_id:
                assert isinstance(packet, Encapsulated), packet
                if packet.node_id != self.node_id:
                    # Another node behind the same forwarder: put it back.
                    self.h.mailbox.setdefault((self.transport, self.address), []).append(data)
                    continue
                packet = packet.packet
            self.inbox.append(packet)
        return self.inbox

    def take(self) -> list[Packet]:
        self.poll()
        out, self.inbox = self.inbox, []
        return out

    def expect(self, kind: type[P]) -> P:
        self.poll()
        assert self.inbox, f"expected {kind.__name__}, got nothing"
        packet = self.inbox.pop(0)
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet!r}"
        return packet

    def nothing(self) -> None:
        assert self.take() == []

    # ------------------------------------------------------------------ flows

    def connect(
        self,
        client_id: str = "dev1",
        duration: int = 60,
        clean: bool = True,
        will: tuple[str, bytes, int, bool] | None = None,
    ) -> ConnAck:
        self.send(Connect(client_id, duration, clean, will is not None))
        if will is not None:
            self.expect(WillTopicReq)
            topic, message, qos, retain = will
            self.send(WillTopic(topic, qos, retain))
            self.expect(WillMsgReq)
            self.send(WillMsg(message))
        return self.expect(ConnAck)

    def ping(self) -> None:
        """PINGREQ, answered PINGRESP (after its CONNACK, this proves the client)."""
        self.send(PingReq())
        assert self.expect(PingResp) == PingResp()

    def register(self, topic: str) -> RegAck:
        self.send(Register(0, self.msg_id(), topic))
        return self.expect(RegAck)

    def publish(
        self,
        topic_id: int,
        data: bytes = b"x",
        qos: int = 0,
        id_type: int = TopicIdType.NORMAL,
        retain: bool = False,
    ) -> int:
        msg_id = self.msg_id() if qos > 0 else 0
        self.send(Publish(topic_id, msg_id, data, qos, retain, False, id_type))
        return msg_id

    def subscribe(
        self, topic: str | int, qos: int = 0, id_type: int = TopicIdType.NORMAL
    ) -> SubAck:
        self.send(Subscribe(self.msg_id(), topic, qos, id_type))
        return self.expect(SubAck)

    def ack(self, publish: Publish) -> None:
        self.send(PubAck(publish.topic_id, publish.msg_id))

    def sleep(self, duration: int) -> None:
        self.send(Disconnect(duration))
        assert self.expect(Disconnect) == Disconnect()

    def wake(self, client_id: str = "dev1") -> None:
        self.send(PingReq(client_id))
