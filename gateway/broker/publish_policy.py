"""The one PUBLISH policy: every PUBLISH a client sends passes these checks, in this order.

The fast path (a plain PUBLISH peeked from the receive buffer) and the general path
(a decoded ``Publish``) both call ``receive``; only the extraction of the fields
differs. The order is what a client can observe, so it is fixed here once:

1. validity -- topic alias, subscription identifiers, an empty topic, retain when
   retained messages are off: a protocol violation ends the connection (raised as
   ``MQTTError``, translated once by the dispatcher);
2. counted -- every valid PUBLISH is ``publish/messages/received``;
3. the QoS 2 flow -- a re-sent QoS 2 PUBLISH is acknowledged again, never routed twice
   (MQTT-4.3.3-9); beyond our Receive Maximum is a violation (MQTT-3.3.4-9);
4. payload -- a Payload Format Indicator of 1 on a payload that is not UTF-8 (0x99);
5. authorization -- ``$SYS`` is read-only but for the client's own bridge state
   (``sys_write_refused``), ``$share/`` is no topic (0x90), then the ACL (0x87):
   the most specific answer, so it comes before the gates;
6. gates -- the store is full and the message would be stored, or a bridge's full
   outbox refuses (0x97; MQTT 3.1.1 has no refusal: the connection is closed);
7. quota -- the retained store is full (0x97 on MQTT 5.0, else not retained);
8. routing, then the acknowledgement (after the store, when it must be durable).

Inbound QoS 2 uses the spec's method A: the message is routed on PUBLISH and its
packet identifier is remembered until PUBREL.
"""

from __future__ import annotations

import logging

from gateway.broker.context import Context
from gateway.broker.delivery import publish
from gateway.broker.message import Message
from gateway.broker.output import write
from gateway.broker.state import Connection
from gateway.mqtt.errors import MQTTError, ProtocolError
from gateway.mqtt.fastpath import encode_ack
from gateway.mqtt.packets import MQTT_5, PacketType
from gateway.mqtt.properties import EMPTY, Properties
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.topics import SHARE_PREFIX

log = logging.getLogger("ledge.broker")

_SUCCESS = ReasonCode.SUCCESS
_NOT_AUTHORIZED = ReasonCode.NOT_AUTHORIZED
_PUBACK = PacketType.PUBACK
_PUBREC = PacketType.PUBREC


def receive(
    ctx: Context,
    conn: Connection,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    packet_id: int,
    props: Properties,
    now: float,
    raw: bytes | None = None,
) -> None:
    """Apply the policy to one PUBLISH from ``conn`` and acknowledge it.

    ``raw`` is the received frame of a QoS 0 PUBLISH that subscribers of the same
    protocol version may get byte for byte (no retain, no properties).
    """
    settings = ctx.settings
    version = conn.version
    # -- 1. validity
    if props is not EMPTY:
        if props.topic_alias is not None:
            topic = _resolve_alias(ctx, conn, props.topic_alias, topic)
        if props.subscription_identifiers:
            # MQTT-3.3.4-6
            raise ProtocolError("a client's PUBLISH must not carry a subscription identifier")
    if not topic:
        raise ProtocolError("PUBLISH without topic name or alias")
    if retain and not settings.retain_available:
        raise MQTTError("retained messages are disabled", ReasonCode.RETAIN_NOT_SUPPORTED)
    # -- 2. counted
    stats = ctx.stats
    stats.publish_received += 1
    # -- 3. the QoS 2 flow
    session = conn.session
    assert session is not None
    journal = ctx.journal
    if qos == 2:
        incoming = session.incoming_qos2
        if packet_id in incoming:
            # A re-sent QoS 2 PUBLISH: acknowledge again, do not route again (MQTT-4.3.3-9).
            # The first PUBREC may still be waiting for its store batch: so must this one.
            if journal is not None and session.persisted:
                journal.hold(conn)
            write(ctx, conn, encode_ack(_PUBREC, packet_id, 0, version))
            return
        if len(incoming) >= settings.receive_maximum and version == MQTT_5:
            # MQTT-3.3.4-9: more unacknowledged QoS 2 than our Receive Maximum.
            raise MQTTError(
                f"more than {settings.receive_maximum} QoS 2 messages unacknowledged",
                ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
            )
    code = _SUCCESS
    # -- 4. payload
    if props is not EMPTY and props.payload_format_indicator == 1 and not _utf8(payload):
        reason = "payload format indicator says UTF-8 but the payload is not"
        if qos == 0:
            raise MQTTError(reason, ReasonCode.PAYLOAD_FORMAT_INVALID)
        ctx.publish_refusals(
            now, conn.source, "refusing PUBLISH from %s on %r: %s", conn.label, topic, reason
        )
        code = ReasonCode.PAYLOAD_FORMAT_INVALID
    # -- 5. authorization
    elif topic.startswith("$SYS") and sys_write_refused(topic, conn.client_id):
        # $SYS belongs to the broker; a client's write is refused (3.1.1: silently dropped).
        stats.publish_denied += 1
        ctx.publish_refusals(
            now, conn.source, "refusing PUBLISH from %s to %r: $SYS is read-only", conn.label, topic
        )
        code = _NOT_AUTHORIZED
    elif topic.startswith(SHARE_PREFIX):
        # "$share/" names shared subscriptions, never a topic: the name is refused like
        # one the server does not accept (0x90 on MQTT 5.0; 3.1.1: acknowledged and
        # dropped), counted as denied. MQTT 5.0 4.7.2: $-topics are the server's.
        stats.publish_denied += 1
        ctx.publish_refusals(
            now,
            conn.source,
            "refusing PUBLISH from %s to %r: $share/ is not a topic",
            conn.label,
            topic,
        )
        code = ReasonCode.TOPIC_NAME_INVALID
    elif conn.rules is not None and not conn.rules.can_write(topic):
        # Not authorized by the ACL: MQTT 5.0 acknowledges with 0x87, MQTT 3.1.1 has no
        # negative acknowledgement and the message is dropped (as mosquitto does).
        _denied(ctx, conn, topic, now)
        code = _NOT_AUTHORIZED
    # -- 6. gates
    elif qos and (ctx.store_full or ctx.publish_gates):
        why = refusal(ctx, topic, retain, len(payload))
        if why is not None:
            stats.publish_denied += 1
            if version != MQTT_5:
                raise MQTTError(why, ReasonCode.QUOTA_EXCEEDED)
            ctx.refusals(now, conn.source, "refusing PUBLISH from %s: %s", conn.label, why)
            code = ReasonCode.QUOTA_EXCEEDED
    mark = len(journal.ops) if journal is not None else 0
    if code is _SUCCESS:
        msg = Message(
            topic,
            payload,
            qos,
            retain,
            props,
            expiry_interval=props.message_expiry_interval,
            origin=conn.client_id,
            created=now,
        )
        if raw is not None:
            msg.raw = raw
            msg.raw_version = version
        # -- 7. quota
        if retain and payload and not ctx.retained.has_room(msg):
            log.warning(
                "retained store full (%d messages, %d bytes): %r from %s not retained",
                len(ctx.retained),
                ctx.retained.bytes,
                topic,
                conn.label,
            )
            if qos and version == MQTT_5:
                # Refuse-new policy, told to the publisher; nothing is forwarded.
                ctx.retained.refused += 1
                code = ReasonCode.QUOTA_EXCEEDED
        # -- 8. routing
        if code is _SUCCESS and not publish(ctx, msg, now):
            code = ReasonCode.NO_MATCHING_SUBSCRIBERS
    if not qos:
        return
    if qos == 2 and code < 0x80:
        session.incoming_qos2.add(packet_id)
        if journal is not None:
            journal.incoming(session, packet_id)
    if journal is not None and len(journal.ops) != mark:
        journal.hold(conn)  # acknowledged means stored
    write(ctx, conn, encode_ack(_PUBACK if qos == 1 else _PUBREC, packet_id, code, version))


def sys_write_refused(topic: str, client_id: str) -> bool:
    """May a client not write ``topic`` (PUBLISH it, or set a will on it)?

    ``$SYS`` is the broker's, with one exception: ``$SYS/broker/connection/<client
    id>/state``, where a bridge (Mosquitto's ``notifications``, on by default) says it
    is connected (``1``) and sets its will (``0``) -- only under its own client id, a
    single level as in Mosquitto's ``$SYS/broker/connection/+/state``. The ACL still
    applies to that topic. Every other topic starting ``$SYS`` is refused.
    """
    if not topic.startswith("$SYS"):
        return False
    return topic != f"$SYS/broker/connection/{client_id}/state" or not _one_level(client_id)


def _one_level(name: str) -> bool:
    return bool(name) and not any(c in name for c in "/+#")


def refusal(ctx: Context, topic: str, retain: bool, size: int) -> str | None:
    """Why a QoS 1/2 PUBLISH on ``topic`` cannot be accepted now, or None: the store
    is full and the message would be stored, or a gate (a bridge's full outbox with
    the policy "refuse") says no."""
    if ctx.store_full and would_store(ctx, topic, retain):
        return f"store full: message on {topic!r} for persistent sessions refused"
    for gate in ctx.publish_gates:
        why = gate(topic, size)
        if why is not None:
            return why
    return None


def would_store(ctx: Context, topic: str, retain: bool) -> bool:
    """Would a QoS 1/2 message on ``topic`` be written to the store?"""
    if retain:
        return True
    route = ctx.index.route(topic)
    if any(session.persisted for session, _subs in route.direct):
        return True
    return any(
        session.persisted for group in route.shared for session, _s in group.members.values()
    )


def _resolve_alias(ctx: Context, conn: Connection, alias: int, topic: str) -> str:
    """The topic an alias stands for, or sets (MQTT 5.0 section 3.3.2.3.4)."""
    maximum = ctx.settings.topic_alias_maximum
    if alias == 0 or alias > maximum:
        # MQTT-3.3.2-8, -9
        raise MQTTError(
            f"topic alias {alias} is outside 1..{maximum}", ReasonCode.TOPIC_ALIAS_INVALID
        )
    if topic:
        if not conn.aliases_in:  # the shared empty map: this connection's own now
            conn.aliases_in = {}
        conn.aliases_in[alias] = topic
        return topic
    known = conn.aliases_in.get(alias)
    if known is None:
        raise ProtocolError(f"topic alias {alias} was never set")
    return known


def _utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _denied(ctx: Context, conn: Connection, topic: str, now: float) -> None:
    """Count a PUBLISH the ACL refused; its line at most once a minute per address."""
    stats = ctx.stats
    stats.publish_denied += 1
    ctx.publish_refusals(
        now,
        conn.source,
        "refusing PUBLISH from %s to %r: not authorized (%d refused so far)",
        conn.label,
        topic,
        stats.publish_denied,
    )
