"""The MQTT-SN gateway: datagrams in, datagrams out, each client a broker session. Pure.

The shell hands in what a transport received (``received(transport, address, data,
now)``) and fires timers (``tick(now)`` at ``next_deadline()``); the gateway answers by
appending ``(transport, address, bytes)`` to ``out`` and calling ``kick`` so the shell
sends them. ``address`` is whatever the transport uses (a UDP ``(host, port)``, a
serial line's name); a wireless node behind a forwarder is told apart by its node id
(section 5.5), and every answer to it is encapsulated again.

This module is the dispatcher: ``received`` decodes a datagram and hands the message
to its handler through ``HANDLERS`` (one module per message family: ``handle_connect``,
``handle_publish``, ``handle_subscribe``, ``handle_ack``, ``handle_sleep``,
``registry``, ``discovery``), except a plain PUBLISH from a connected client, whose
fields the codec peeks straight from the datagram for ``handle_publish.publish`` --
the same policy the PUBLISH handler runs. Handlers call small modules (``output``,
``sessions``, ``keepalive``, ``delivery``, ``pool``, ``registry``), never this one.
See ``gateway/mqttsn/README.md``. Section numbers refer to the MQTT-SN 1.2
specification.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from gateway.mqttsn import (
    delivery,
    discovery,
    handle_ack,
    handle_connect,
    handle_publish,
    handle_sleep,
    handle_subscribe,
    output,
    registry,
    sessions,
    systopics,
)
from gateway.mqttsn.addresses import address_text, log_source, where
from gateway.mqttsn.codec import MalformedMessage, decode, flags_qos, peek_publish
from gateway.mqttsn.context import Context, SnClient, log
from gateway.mqttsn.encoding import encode
from gateway.mqttsn.errors import NotConnected, Refused
from gateway.mqttsn.packets import (
    RETAIN,
    TOPIC_ID_TYPE,
    ConnAck,
    Connect,
    Disconnect,
    Encapsulated,
    PingReq,
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
    CONNECTED_STATES,
    Address,
    Datagram,
    Key,
    TransportPolicy,
)

if TYPE_CHECKING:
    from gateway.broker.acl import Acl
    from gateway.broker.core import Broker
    from gateway.broker.message import Message

Handler = Callable[[Context, Key, Any, float], None]

#: The handler of each message a client sends. ADVERTISE, GWINFO and the messages
#: only a gateway sends have none: they are ignored.
HANDLERS: Final[dict[type, Handler]] = {
    Connect: handle_connect.handle_connect,
    WillTopic: handle_connect.handle_willtopic,
    WillMsg: handle_connect.handle_willmsg,
    WillTopicUpd: handle_connect.handle_willtopicupd,
    WillMsgUpd: handle_connect.handle_willmsgupd,
    SearchGw: discovery.handle_searchgw,
    Register: registry.handle_register,
    RegAck: handle_ack.handle_regack,
    Publish: handle_publish.handle_publish,
    PubAck: handle_ack.handle_puback,
    PubRec: handle_ack.handle_pubrec,
    PubRel: handle_publish.handle_pubrel,
    PubComp: handle_ack.handle_pubcomp,
    Subscribe: handle_subscribe.handle_subscribe,
    Unsubscribe: handle_subscribe.handle_unsubscribe,
    PingReq: handle_sleep.handle_pingreq,
    Disconnect: handle_sleep.handle_disconnect,
}


class Gateway(Context):
    """The dispatcher and the shell's API over the shared state (``Context``)."""

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
        discovery.start(self, now)

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
            self.malformed(transport, address, exc.reason, exc.offset, now)
            return
        node_id = b""
        if isinstance(packet, Encapsulated):
            node_id = packet.node_id
            packet = packet.packet
        self.stats.messages_received += 1
        key = (transport, address, node_id)
        handler = HANDLERS.get(type(packet))
        if handler is None:
            log.debug("%s: ignoring %s", where(key), type(packet).__name__)
            return
        try:
            handler(self, key, packet, now)
        except NotConnected:
            # DISCONNECT tells the device to connect (again, e.g. after a restart).
            self.stats.not_connected += 1
            log.debug("%s: %s without a connection: DISCONNECT", where(key), type(packet).__name__)
            output.send_to(self, key, encode(Disconnect()))
        except Refused as refused:
            self._refused(key, refused, now)

    def malformed(
        self, transport: str, address: Address, reason: str, offset: int, now: float
    ) -> None:
        """A message or frame that could not be read (bad COBS, CRC, a bad length):
        counted and logged, at most a line per source a minute."""
        self.stats.malformed += 1
        self.refusals(
            now,
            log_source((transport, address, b"")),
            "%s: unreadable message from %s at byte %d: %s",
            transport,
            address_text(address),
            offset,
            reason,
        )

    def _refused(self, key: Key, refused: Refused, now: float) -> None:
        """A CONNECT refused (``errors.Refused``): counted, logged at a bounded rate
        per source, answered CONNACK with its return code; a client whose connection
        attempt it ends is forgotten."""
        self.stats.clients_refused += 1
        self.refusals(
            now,
            log_source(key),
            "%s: refusing CONNECT of %r: %s",
            where(key),
            refused.client_id,
            refused.why,
        )
        ending = refused.ending
        if ending is None:
            output.send_to(self, key, encode(ConnAck(refused.return_code)))
            return
        output.send(self, ending, ConnAck(refused.return_code))
        sessions.forget(self, ending, now)

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
        return systopics.values(self)

    def deliver(self, client: SnClient, msg: Message, qos: int, retain: bool) -> None:
        """A message for ``client`` from the broker: sent now or queued (bounded)."""
        delivery.deliver(self, client, msg, qos, retain)
