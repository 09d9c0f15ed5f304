"""The MQTT-SN gateway: datagrams in, datagrams out, each client a broker session. Pure.

The shell hands in what a transport received (``received(transport, address, data,
now)``) and fires timers (``tick(now)`` at ``next_deadline()``); the gateway answers by
appending ``(transport, address, bytes)`` to ``out`` and calling ``kick`` so the shell
sends them. ``address`` is whatever the transport uses (a UDP ``(host, port)``, a
serial line's name); a wireless node behind a forwarder is told apart by its node id
(section 5.5), and every answer to it is encapsulated again.

Each MQTT-SN client becomes a ``ProxyClient`` of the broker: what it publishes is
routed (ACL, ``$SYS``, store and bridge refusals, counters), what its subscriptions
match is handed back here and delivered with the MQTT-SN flows: REGISTER before the
first PUBLISH of a topic, one QoS 1/2 message in flight at a time, resent after
``retry_interval`` with DUP up to ``max_retries`` times. Sleeping clients (section
6.14) have their messages kept in their bounded queue and delivered once when they
wake with PINGREQ, followed by PINGRESP.

Section numbers refer to the MQTT-SN 1.2 specification.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from gateway.mqttsn import (
    addresses,
    delivery,
    handle_ack,
    handle_connect,
    handle_publish,
    handle_subscribe,
    keepalive,
    output,
    registry,
    sessions,
)
from gateway.mqttsn.codec import (
    RETAIN,
    TOPIC_ID_TYPE,
    MalformedMessage,
    decode,
    encode,
    flags_qos,
    peek_publish,
)
from gateway.mqttsn.context import Context, SnClient, log
from gateway.mqttsn.packets import (
    Advertise,
    Connect,
    Disconnect,
    Encapsulated,
    GwInfo,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    SearchGw,
    Subscribe,
    Unsubscribe,
    WillMsg,
    WillMsgUpd,
    WillTopic,
    WillTopicUpd,
)
from gateway.mqttsn.settings import MqttSnSettings
from gateway.mqttsn.state import (
    BROADCAST,
    CONNECTED_STATES,
    MAX_CLIENT_ID,
    MAX_INBOUND_QOS2,
    Address,
    Datagram,
    Key,
    State,
    TransportPolicy,
)

if TYPE_CHECKING:
    from gateway.broker.acl import Acl
    from gateway.broker.core import Broker
    from gateway.broker.message import Message

__all__ = [
    "BROADCAST",
    "MAX_CLIENT_ID",
    "MAX_INBOUND_QOS2",
    "Address",
    "Datagram",
    "Gateway",
    "SnClient",
    "State",
    "TransportPolicy",
]


class Gateway(Context):
    """The dispatcher over the shared state; driven by the shell with time as an argument."""

    def __init__(
        self,
        broker: Broker,
        settings: MqttSnSettings,
        transports: list[TransportPolicy],
        *,
        acl: Acl | None = None,
        now: float = 0.0,
        kick: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(broker, settings, transports, acl=acl, now=now, kick=kick)
        if settings.advertise_interval > 0 and any(t.can_broadcast for t in transports):
            self.timers.at(now, self._advertise_timer, None)

    # ================================================================== shell API

    def received(self, transport: str, address: Address, data: bytes, now: float) -> None:
        """One datagram (UDP) or frame (serial) from ``address`` on ``transport``."""
        self.now = now
        peeked = peek_publish(data)
        if peeked is not None and len(data) <= self.settings.max_message_size:
            # The fast path: a plain PUBLISH from a connected client, read without
            # building a message object; the same policy as the general path.
            flags, topic_id, msg_id, payload = peeked
            client = self.by_key.get((transport, address, b""))
            qos = flags_qos(flags)
            if client is not None and qos >= 0 and client.state in CONNECTED_STATES:
                self.stats.messages_received += 1
                sessions.heard(self, client, now)
                handle_publish.publish(
                    self,
                    client,
                    qos,
                    bool(flags & RETAIN),
                    flags & TOPIC_ID_TYPE,
                    topic_id,
                    msg_id,
                    payload,
                    now,
                )
                return
        try:
            packet = decode(data, self.settings.max_message_size)
        except MalformedMessage as exc:
            self._malformed(transport, address, exc.reason, exc.offset, now)
            return
        node_id = b""
        if isinstance(packet, Encapsulated):
            node_id = packet.node_id
            packet = packet.packet
        self.stats.messages_received += 1
        key = (transport, address, node_id)
        handler = _HANDLERS.get(type(packet))
        if handler is None:
            # ADVERTISE, GWINFO and the messages only a gateway sends: ignored.
            log.debug("%s: ignoring %s", addresses.where(key), type(packet).__name__)
            return
        handler(self, key, packet, now)

    def malformed(
        self, transport: str, address: Address, reason: str, offset: int, now: float
    ) -> None:
        """A frame the transport could not read (bad COBS, CRC): counted and logged."""
        self._malformed(transport, address, reason, offset, now)

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()

    def tick(self, now: float) -> None:
        self.now = now
        self.timers.run_due(now)

    def take_output(self) -> list[Datagram]:
        out = self.out
        self.out = []
        return out

    def committed(self, upto: int) -> None:
        """The store committed every batch up to ``upto``: send what waited for them."""
        output.release(self, upto)

    def shutdown(self, now: float) -> None:
        """The gateway stops: every session ends, no will is published (the clients did
        nothing wrong)."""
        for client in list(self.by_id.values()):
            client.will = None
            sessions.forget(self, client, now)
        if self.anonymous is not None:
            self.anonymous.close(now)
            self.anonymous = None

    def sys_values(self) -> dict[str, str]:
        """Values under ``$SYS/broker/`` (added to the broker's ``sys_sources``)."""
        st = self.stats
        states = [c.state for c in self.by_id.values()]
        base = "mqttsn/"
        return {
            base + "clients/connected": str(sum(s in (State.ACTIVE, State.AWAKE) for s in states)),
            base + "clients/asleep": str(states.count(State.ASLEEP)),
            base + "clients/disconnected": str(states.count(State.DISCONNECTED)),
            base + "clients/refused": str(st.clients_refused),
            base + "clients/lost": str(st.clients_lost),
            base + "clients/evicted": str(st.clients_evicted),
            base + "clients/evicted silent": str(st.clients_evicted_silent),
            base + "clients/refused per address": str(st.clients_refused_per_address),
            base + "clients/refused rate": str(st.clients_refused_rate),
            base + "clients/evicted unproven": str(st.clients_evicted_unproven),
            base + "clients/unproven": str(len(self.unproven)),
            base + "clients/wake refused": str(st.wakes_refused),
            base + "messages/received": str(st.messages_received),
            base + "messages/sent": str(st.messages_sent),
            base + "messages/malformed": str(st.malformed),
            base + "messages/retransmitted": str(st.retransmissions),
            base + "publish/qos -1": str(st.qos_minus_one),
            base + "publish/refused": str(st.publish_refused),
            base + "publish/dropped/queue full": str(st.dropped_queue_full),
            base + "publish/dropped/topic table full": str(st.dropped_topic_table),
            base + "publish/dropped/offline qos 0": str(st.dropped_offline_qos0),
            base + "publish/dropped/too large": str(st.dropped_too_large),
        }

    # ================================================================== discovery (6.1)

    def _searchgw(self, key: Key, packet: SearchGw, now: float) -> None:
        output.send_to(self, key, encode(GwInfo(self.settings.gateway_id)))

    def _advertise_timer(self, _arg: object, now: float) -> None:
        interval = self.settings.advertise_interval
        data = encode(Advertise(self.settings.gateway_id, min(int(interval), 0xFFFF)))
        output.broadcast(self, data)
        self.timers.at(now + interval, self._advertise_timer, None)

    # ================================================================== keep alive, sleep

    def _pingreq(self, key: Key, packet: PingReq, now: float) -> None:
        client = self.by_key.get(key)
        if packet.client_id:
            named = self.by_id.get(packet.client_id)
            if named is None or named.state in (State.CONNECTING, State.DISCONNECTED):
                return sessions.not_connected(self, key, packet)
            if named.key != key:
                # A sleeping device often wakes with a new source port; its buffered
                # messages go only where it connected from (the same IPv4 address or
                # IPv6 /64, serial line and forwarder node). A device that moved
                # CONNECTs again: the DISCONNECT below tells it to.
                if named.state not in (State.ASLEEP, State.AWAKE):
                    return sessions.not_connected(self, key, packet)
                if addresses.origin(key) != named.origin:
                    self.stats.wakes_refused += 1
                    self.refusals(
                        now,
                        addresses.log_source(key),
                        "%s: PINGREQ waking %r refused: it connected from %s",
                        addresses.where(key),
                        named.client_id,
                        named.where,
                    )
                    return sessions.not_connected(self, key, packet)
                self.by_key.pop(named.key, None)
                other = self.by_key.get(key)
                if other is not None:
                    sessions.lost(
                        self, other, now, f"address taken over by {named.client_id!r}", will=False
                    )
                self.by_key[key] = named
                named.move(key)
            client = named
        if client is None or client.state in (State.CONNECTING, State.DISCONNECTED):
            return sessions.not_connected(self, key, packet)
        sessions.heard(self, client, now)
        if client.state in (State.ASLEEP, State.AWAKE):
            # 6.14: awake; send what was buffered, then PINGRESP, then asleep again.
            client.state = State.AWAKE
            delivery.resume(self, client, now)
            return None
        output.send(self, client, PingResp())
        return None

    def _disconnect(self, key: Key, packet: Disconnect, now: float) -> None:
        client = self.by_key.get(key)
        if client is None or client.state in (State.CONNECTING, State.DISCONNECTED):
            # Nothing to end; confirm anyway so the device stops waiting.
            output.send_to(self, key, encode(Disconnect()))
            return
        sessions.heard(self, client, now)
        if packet.duration:
            # 6.14: asleep for ``duration`` seconds; its messages are buffered.
            client.sleep_duration = packet.duration
            keepalive.asleep(self, client, now)
            log.debug("client %r asleep for %d s", client.client_id, packet.duration)
            output.send(self, client, Disconnect())
            return
        output.send(self, client, Disconnect())
        log.info("client %r disconnected", client.client_id)
        sessions.end(self, client, now)

    # ================================================================== register (6.5)

    def deliver(self, client: SnClient, msg: Message, qos: int, retain: bool) -> None:
        """A message for ``client`` from the broker: sent now or queued (bounded)."""
        delivery.deliver(self, client, msg, qos, retain)

    # ================================================================== helpers

    def _malformed(
        self, transport: str, address: Address, reason: str, offset: int, now: float
    ) -> None:
        self.stats.malformed += 1
        self.refusals(
            now,
            addresses.log_source((transport, address, b"")),
            "%s: unreadable message from %s at byte %d: %s",
            transport,
            addresses.address_text(address),
            offset,
            reason,
        )


Handler = Callable[[Gateway, Key, Packet, float], None]

_HANDLERS: Final[dict[type, Handler]] = {
    Connect: handle_connect.handle_connect,  # type: ignore[dict-item]
    WillTopic: handle_connect.handle_willtopic,  # type: ignore[dict-item]
    WillMsg: handle_connect.handle_willmsg,  # type: ignore[dict-item]
    WillTopicUpd: handle_connect.handle_willtopicupd,  # type: ignore[dict-item]
    WillMsgUpd: handle_connect.handle_willmsgupd,  # type: ignore[dict-item]
    SearchGw: Gateway._searchgw,  # type: ignore[dict-item]
    Register: registry.handle_register,  # type: ignore[dict-item]
    RegAck: handle_ack.handle_regack,  # type: ignore[dict-item]
    Publish: handle_publish.handle_publish,  # type: ignore[dict-item]
    PubAck: handle_ack.handle_puback,  # type: ignore[dict-item]
    PubRec: handle_ack.handle_pubrec,  # type: ignore[dict-item]
    PubRel: handle_publish.handle_pubrel,  # type: ignore[dict-item]
    PubComp: handle_ack.handle_pubcomp,  # type: ignore[dict-item]
    Subscribe: handle_subscribe.handle_subscribe,  # type: ignore[dict-item]
    Unsubscribe: handle_subscribe.handle_unsubscribe,  # type: ignore[dict-item]
    PingReq: Gateway._pingreq,  # type: ignore[dict-item]
    Disconnect: Gateway._disconnect,  # type: ignore[dict-item]
}
