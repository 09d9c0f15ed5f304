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

from gateway.broker.proxy import ProxyClient
from gateway.broker.publish_policy import sys_write_refused
from gateway.mqtt.topics import topic_name_error
from gateway.mqttsn import (
    addresses,
    delivery,
    handle_ack,
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
from gateway.mqttsn.context import Context, SnClient, log, sparse
from gateway.mqttsn.packets import (
    PROTOCOL_ID,
    Advertise,
    ConnAck,
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
    ReturnCode,
    SearchGw,
    Subscribe,
    Unsubscribe,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
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
    Will,
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

    # ================================================================== connect (6.2)

    def _connect(self, key: Key, packet: Connect, now: float) -> None:
        cid = packet.client_id
        st = self.stats
        too_fast = self._connect_rate_exceeded(key, now)
        if too_fast is not None:
            st.clients_refused += 1
            st.clients_refused_rate += 1
            self._refuse_connect(key, cid, ReturnCode.CONGESTION, too_fast, now)
            return
        refuse = self._connect_refusal(key, packet)
        if refuse is not None:
            st.clients_refused += 1
            self._refuse_connect(key, cid, refuse[0], refuse[1], now)
            return
        if self._address_full(key, cid) and not self._evict_unproven_at(key, cid, now):
            st.clients_refused += 1
            st.clients_refused_per_address += 1
            why = (
                f"{self.settings.max_clients_per_address} clients from this address already"
                " (mqttsn.max_clients_per_address)"
            )
            self._refuse_connect(key, cid, ReturnCode.CONGESTION, why, now)
            return
        self.stats.connects += 1
        existing = self.by_id.get(cid)
        client = self.by_key.get(key)
        if client is not None and client is not existing:
            # Another client id at this address: the device restarted under a new id.
            sessions.lost(self, client, now, f"address taken over by client {cid!r}", will=False)
        if existing is not None:
            client = self._resume(existing, key, packet, now)
        else:
            if not self._make_room(cid, now):
                st.clients_refused += 1
                why = f"all {self.settings.max_clients} client slots held by established clients"
                self._refuse_connect(key, cid, ReturnCode.CONGESTION, why, now)
                return
            client = SnClient(self, key, cid, now)
            self.by_id[cid] = client
            self.by_key[key] = client
        client.clean = packet.clean_session
        client.duration = packet.duration
        client.last_rx = now
        if packet.will:
            if client.state is not State.CONNECTING:
                client.state = State.CONNECTING
                self.connecting += 1
            sessions.cancel_timers(self, client)
            client.timer = self.timers.at(
                now + self.settings.connect_timeout, _connect_deadline, client
            )
            output.send(self, client, WillTopicReq())
            return
        if client.clean or client.state is State.CONNECTING:
            client.will = None  # 6.3: CleanSession=true, Will=false deletes the Will
        self._accept(client, now)

    def _refuse_connect(self, key: Key, cid: str, code: int, why: str, now: float) -> None:
        """CONNACK ``code``; the line about it at a bounded rate per source."""
        self.refusals(
            now,
            addresses.log_source(key),
            "%s: refusing CONNECT of %r: %s",
            addresses.where(key),
            cid,
            why,
        )
        output.send_to(self, key, encode(ConnAck(code)))

    def _connect_rate_exceeded(self, key: Key, now: float) -> str | None:
        """Why a CONNECT now is over ``max_connect_rate_per_address`` (UDP sources) or
        ``max_connect_rate`` (everyone), or None."""
        settings = self.settings
        source = addresses.source(key[1])
        if source is not None and not self.connect_rate_by_source.take(source, now):
            rate = settings.max_connect_rate_per_address
            return (
                f"more than {rate:g} CONNECTs a second from {source}"
                " (mqttsn.max_connect_rate_per_address)"
            )
        if not self.connect_rate.take(now):
            rate = settings.max_connect_rate
            return f"more than {rate:g} CONNECTs a second in all (mqttsn.max_connect_rate)"
        return None

    def _connect_refusal(self, key: Key, packet: Connect) -> tuple[int, str] | None:
        cid = packet.client_id
        if packet.protocol_id != PROTOCOL_ID:
            return ReturnCode.NOT_SUPPORTED, f"protocol id 0x{packet.protocol_id:02x} is not 0x01"
        if not cid or len(cid) > MAX_CLIENT_ID or topic_name_error(cid) or "/" in cid:
            return ReturnCode.NOT_SUPPORTED, "client id must be 1-64 characters, no '/', '+', '#'"
        policy = self.transports.get(key[0])
        if policy is not None and policy.allow_client_ids and cid not in policy.allow_client_ids:
            return ReturnCode.NOT_SUPPORTED, f"client id not in {key[0]}'s allow_client_ids"
        if cid not in self.by_id and cid in self.broker.sessions:
            return ReturnCode.NOT_SUPPORTED, "client id in use by an MQTT client"
        if packet.will and self.connecting >= self.settings.max_connecting:
            return ReturnCode.CONGESTION, f"{self.connecting} clients already connecting"
        return None

    def _resume(self, client: SnClient, key: Key, packet: Connect, now: float) -> SnClient:
        """A client id we know connects again (maybe from a new address)."""
        if client.key != key:
            if self.by_key.get(client.key) is client:
                log.info(
                    "client %r moves from %s to %s",
                    client.client_id,
                    client.where,
                    addresses.where(key),
                )
                del self.by_key[client.key]
            client.move(key)
        self.by_key[key] = client
        sleeping = client.state in (State.ASLEEP, State.AWAKE)
        if packet.clean_session and not sleeping:
            # 6.3: a clean session forgets subscriptions, registrations and the Will.
            sessions.clear_session(self, client, now)
        return client

    def _address_full(self, key: Key, cid: str) -> bool:
        """``max_clients_per_address`` clients already hold a connection from the source
        of ``key`` (its IPv4 address or IPv6 /64, any port, any node behind a forwarder
        there), not counting the client ``cid`` itself or the one at ``key`` (this
        CONNECT replaces both). A serial line is one wired coordinator: not limited."""
        source = addresses.source(key[1])
        if source is None:
            return False
        limit = self.settings.max_clients_per_address
        count = 0
        for other_key, client in self.by_key.items():
            if client.source == source and other_key != key and client.client_id != cid:
                count += 1
                if count >= limit:
                    return True
        return False

    def _evict_unproven_at(self, key: Key, cid: str, now: float) -> bool:
        """The source of ``key`` is at ``max_clients_per_address``: the oldest unproven
        client from there (not ``cid`` itself) makes room, whatever its age (a source's
        own clients are all it can push out). False when there is none."""
        source = addresses.source(key[1])
        for client in self.unproven.values():
            if client.source == source and client.client_id != cid:
                why = f"{self.settings.max_clients_per_address} clients from {source}"
                self._evict_unproven(client, cid, why, now)
                return True
        return False

    def _evict_unproven(self, client: SnClient, cid: str, why: str, now: float) -> None:
        """End ``client``, silent since its CONNACK, to admit ``cid``. DISCONNECT tells a
        real device to connect again; no will is published (a spoofed CONNECT must not
        publish one); a persistent session is kept, disconnected."""
        st = self.stats
        st.clients_evicted_unproven += 1
        if sparse(st.clients_evicted_unproven):
            log.warning(
                "client %r at %s, silent for %.1f s since its CONNACK, evicted to admit %r:"
                " %s (%d evicted so far)",
                client.client_id,
                client.where,
                now - client.last_rx,
                cid,
                why,
                st.clients_evicted_unproven,
            )
        output.send(self, client, Disconnect())
        client.will = None
        sessions.end(self, client, now)

    def _make_room(self, cid: str, now: float) -> bool:
        """A slot for the new client ``cid``. Unproven clients beyond
        ``unproven_share`` and past ``unproven_grace`` go first, oldest first; then, if
        every slot is taken (policy "evict unproven, then longest silent"), the oldest
        unproven client whatever its age, else the longest-disconnected remembered
        session, else the connected client without a keep-alive (Duration 0) silent
        the longest. Never a proven client with a keep-alive or asleep: while it keeps
        to its Duration it is established (6.11, 6.14) and its own timer ends it when
        it stops; nor one in the middle of its CONNECT (``max_connecting``,
        ``connect_timeout``)."""
        settings = self.settings
        unproven = self.unproven
        share = settings.max_unproven
        judged = now - settings.unproven_grace
        while len(unproven) - (cid in unproven) >= share:
            oldest = next(c for c in unproven.values() if c.client_id != cid)
            if oldest.last_rx > judged:
                break
            why = f"{len(unproven)} unproven clients (mqttsn.unproven_share of {share})"
            self._evict_unproven(oldest, cid, why, now)
        if len(self.by_id) < settings.max_clients:
            return True
        victim = next((c for c in unproven.values() if c.client_id != cid), None)
        if victim is not None:
            self._evict_unproven(victim, cid, f"all {settings.max_clients} slots in use", now)
            if len(self.by_id) < settings.max_clients:
                return True
        gone: SnClient | None = None
        idle: SnClient | None = None
        for client in self.by_id.values():
            if client.state is State.DISCONNECTED:
                if gone is None or client.last_rx < gone.last_rx:
                    gone = client
            elif (
                client.state is State.ACTIVE
                and not client.duration
                and (idle is None or client.last_rx < idle.last_rx)
            ):
                idle = client
        if gone is not None:
            self.stats.clients_evicted += 1
            if sparse(self.stats.clients_evicted):
                log.info(
                    "forgetting the disconnected session of %r to make room (%d forgotten so far)",
                    gone.client_id,
                    self.stats.clients_evicted,
                )
            sessions.forget(self, gone, gone.last_rx)
            return True
        if idle is None:
            return False
        st = self.stats
        st.clients_evicted_silent += 1
        if sparse(st.clients_evicted_silent):
            log.warning(
                "client %r at %s evicted for %r: all %d client slots in use and it has no"
                " keep alive and was silent for %.0f s (%d evicted so far)",
                idle.client_id,
                idle.where,
                cid,
                self.settings.max_clients,
                now - idle.last_rx,
                st.clients_evicted_silent,
            )
        # The gateway ends the connection: DISCONNECT tells the device (5.4.21), and
        # its Will is published as for any connection ended without its DISCONNECT.
        output.send(self, idle, Disconnect())
        sessions.publish_will(idle, now)
        sessions.forget(self, idle, now)
        return True

    def _accept(self, client: SnClient, now: float) -> None:
        """The CONNECT is complete: the client is active (CONNACK accepted), unproven
        until it is heard from again."""
        if client.state is State.CONNECTING:
            self.connecting -= 1
        if client.will is not None:
            rules = self.rules(client)
            if sys_write_refused(client.will.topic, client.client_id) or (
                rules is not None and not rules.can_write(client.will.topic)
            ):
                self.stats.clients_refused += 1
                self.refusals(
                    now,
                    addresses.log_source(client.key),
                    "%s: refusing CONNECT of %r: not authorized to publish its will on %r",
                    client.where,
                    client.client_id,
                    client.will.topic,
                )
                output.send(self, client, ConnAck(ReturnCode.NOT_SUPPORTED))
                sessions.forget(self, client, now)
                return
        if client.proxy is None:
            client.proxy = ProxyClient(
                self.broker, client.client_id, client.receive, acl=self.acl, now=now
            )
        client.state = State.ACTIVE
        client.proven = False
        self.unproven.pop(client.client_id, None)
        self.unproven[client.client_id] = client
        sessions.cancel_timers(self, client)
        keepalive.arm(self, client, now)
        log.info(
            "client %r connected from %s (keep alive %d s, clean session %s)",
            client.client_id,
            client.where,
            client.duration,
            client.clean,
        )
        output.send(self, client, ConnAck(ReturnCode.ACCEPTED))
        delivery.resume(self, client, now)

    def _will_topic(self, key: Key, packet: WillTopic, now: float) -> None:
        client = self.by_key.get(key)
        if client is None or client.state is not State.CONNECTING:
            return sessions.not_connected(self, key, packet)
        client.last_rx = now
        if not packet.topic:
            client.will = None  # an empty WILLTOPIC: no Will (5.4.7)
            return self._accept(client, now)
        if topic_name_error(packet.topic):
            self.stats.clients_refused += 1
            self.refusals(
                now,
                addresses.log_source(key),
                "%s: refusing CONNECT of %r: bad will topic %r",
                addresses.where(key),
                client.client_id,
                packet.topic,
            )
            output.send(self, client, ConnAck(ReturnCode.NOT_SUPPORTED))
            sessions.forget(self, client, now)
            return None
        client.will = Will(packet.topic, packet.qos, packet.retain)
        output.send(self, client, WillMsgReq())
        return None

    def _will_msg(self, key: Key, packet: WillMsg, now: float) -> None:
        client = self.by_key.get(key)
        if client is None or client.state is not State.CONNECTING or client.will is None:
            return sessions.not_connected(self, key, packet)
        client.last_rx = now
        client.will.message = packet.message
        self._accept(client, now)
        return None

    def _connect_timer(self, client: SnClient, now: float) -> None:
        if client.state is State.CONNECTING and self.by_id.get(client.client_id) is client:
            log.info("client %r: CONNECT not completed in time", client.client_id)
            sessions.forget(self, client, now)

    # ================================================================== will updates (6.4)

    def _will_topic_upd(self, key: Key, packet: WillTopicUpd, now: float) -> None:
        client = sessions.connected(self, key, packet, now)
        if client is None:
            return
        if not packet.topic:
            client.will = None
            output.send(self, client, WillTopicResp(ReturnCode.ACCEPTED))
            return
        rules = self.rules(client)
        if (
            topic_name_error(packet.topic)
            or sys_write_refused(packet.topic, client.client_id)
            or (rules is not None and not rules.can_write(packet.topic))
        ):
            output.send(self, client, WillTopicResp(ReturnCode.NOT_SUPPORTED))
            return
        message = client.will.message if client.will is not None else b""
        client.will = Will(packet.topic, packet.qos, packet.retain)
        client.will.message = message
        output.send(self, client, WillTopicResp(ReturnCode.ACCEPTED))

    def _will_msg_upd(self, key: Key, packet: WillMsgUpd, now: float) -> None:
        client = sessions.connected(self, key, packet, now)
        if client is None:
            return
        if client.will is None:
            output.send(self, client, WillMsgResp(ReturnCode.NOT_SUPPORTED))
            return
        client.will.message = packet.message
        output.send(self, client, WillMsgResp(ReturnCode.ACCEPTED))

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


def _gw(client: SnClient) -> Gateway:
    ctx = client.ctx
    assert isinstance(ctx, Gateway)
    return ctx


# Timer callbacks as plain functions: a bound method would be one more object per
# client and deadline (idle clients are many; each byte counts a thousand times).
def _connect_deadline(client: SnClient, now: float) -> None:
    _gw(client)._connect_timer(client, now)


Handler = Callable[[Gateway, Key, Packet, float], None]

_HANDLERS: Final[dict[type, Handler]] = {
    Connect: Gateway._connect,  # type: ignore[dict-item]
    WillTopic: Gateway._will_topic,  # type: ignore[dict-item]
    WillMsg: Gateway._will_msg,  # type: ignore[dict-item]
    WillTopicUpd: Gateway._will_topic_upd,  # type: ignore[dict-item]
    WillMsgUpd: Gateway._will_msg_upd,  # type: ignore[dict-item]
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
