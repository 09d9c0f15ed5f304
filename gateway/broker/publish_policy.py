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

Steps 5 and 6 are ``authorize``, which the firmware bridge's devices pass too
(``proxy.ProxyClient.refusal``). Publishers inside the gateway call ``publish_local``,
whose docstring says which steps they skip and why.

Inbound QoS 2 uses the spec's method A: the message is routed on PUBLISH and its
packet identifier is remembered until PUBREL.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, NamedTuple

from gateway.broker.context import Context
from gateway.broker.delivery import publish
from gateway.broker.message import Message
from gateway.broker.output import write
from gateway.broker.state import Connection
from gateway.mqtt.errors import MQTTError, ProtocolError
from gateway.mqtt.fastpath import encode_ack
from gateway.mqtt.packets import MQTT_5, PacketType
from gateway.mqtt.properties import EMPTY, Properties, encode_properties
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.topics import SHARE_PREFIX

if TYPE_CHECKING:
    from gateway.broker.acl import Rules

log = logging.getLogger("ledge.broker")

_SUCCESS = ReasonCode.SUCCESS
_NOT_AUTHORIZED = ReasonCode.NOT_AUTHORIZED
_QUOTA_EXCEEDED = ReasonCode.QUOTA_EXCEEDED
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
    # -- 5. authorization, 6. gates
    elif (
        # ``may_refuse`` inline: the hot path pays no call for a PUBLISH none of the
        # checks of ``authorize`` could refuse.
        (
            topic[0] == "$"
            or conn.rules is not None
            or (qos and (ctx.store_full or ctx.publish_gates))
        )
        and (
            verdict := authorize(
                ctx, conn.client_id, conn.rules, topic, qos, retain, len(payload), props
            )
        )
        is not None
    ):
        code = verdict.code
        if verdict is ACL_DENIED:
            # MQTT 3.1.1 has no negative acknowledgement: the message is dropped (as
            # mosquitto does); so are $SYS and $share/ ones.
            ctx.publish_refusals(
                now,
                conn.source,
                "refusing PUBLISH from %s to %r: not authorized (%d refused so far)",
                conn.label,
                topic,
                stats.publish_denied,
            )
        elif code is _QUOTA_EXCEEDED:
            if version != MQTT_5:  # no refusal code in 3.1.1: the connection is closed
                raise MQTTError(verdict.reason, _QUOTA_EXCEEDED)
            ctx.refusals(
                now, conn.source, "refusing PUBLISH from %s: %s", conn.label, verdict.reason
            )
        else:
            ctx.publish_refusals(
                now,
                conn.source,
                "refusing PUBLISH from %s to %r: %s",
                conn.label,
                topic,
                verdict.reason,
            )
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


def publish_local(
    ctx: Context,
    topic: str,
    payload: bytes,
    now: float,
    *,
    qos: int = 0,
    retain: bool = False,
    properties: Properties = EMPTY,
    origin: str | None = None,
) -> int:
    """A message from inside the gateway (drivers, taps, ``$SYS``, the bridge's
    inbound, the firmware bridge once ``authorize`` let it through); returns how many
    sessions it went to. No TCP, no copies.

    Of the policy it gets step 7 (the retained store's bounds, which
    ``RetainedStore.store`` enforces for every publisher) and step 8 (routing, the
    same ``delivery.publish``). It skips the rest, for these reasons:

    1. validity -- no packet: no topic alias, no subscription identifier to refuse;
       ``LocalClient.publish`` checks the topic name (ValueError);
    2. counted -- ``publish/messages/received`` counts PUBLISH packets from clients
       (as mosquitto's does); a device of the firmware bridge is counted by its proxy;
    3. the QoS 2 flow -- there is no packet identifier and no acknowledgement, so
       nothing to deduplicate and no Receive Maximum;
    4. payload -- the Payload Format Indicator is set by the gateway's own code, or
       comes from the remote broker, which checked it;
    5. authorization -- the gateway's own code writes its own topics (``$SYS``
       included) and is configured by the operator, not let in by the ACL; a device
       of the firmware bridge passes ``authorize`` first (``ProxyClient.refusal``);
    6. gates -- there is no one to refuse: no acknowledgement to withhold, no client
       to retry (a full store or outbox applies its own bound to what arrives).
    """
    msg = Message(
        topic,
        payload,
        qos,
        retain,
        properties,
        expiry_interval=properties.message_expiry_interval,
        origin=origin,
        created=now,
    )
    return publish(ctx, msg, now)


class Verdict(NamedTuple):
    """Why a PUBLISH is refused (steps 5 and 6): the MQTT 5.0 reason code, and words
    for the log. MQTT-SN devices get the same verdicts (``proxy.ProxyClient.refusal``)."""

    code: ReasonCode
    reason: str


#: ``$SYS`` is the broker's (3.1.1: the PUBLISH is acknowledged and dropped).
SYS_READ_ONLY: Final = Verdict(_NOT_AUTHORIZED, "$SYS is read-only")
#: "$share/" names shared subscriptions, never a topic: refused like a name the server
#: does not accept (0x90; MQTT 5.0 4.7.2: $-topics are the server's).
SHARE_NOT_A_TOPIC: Final = Verdict(ReasonCode.TOPIC_NAME_INVALID, "$share/ is not a topic")
#: Not authorized by the ACL (0x87; 3.1.1: acknowledged and dropped, as mosquitto does).
ACL_DENIED: Final = Verdict(_NOT_AUTHORIZED, "not authorized")


def may_refuse(ctx: Context, rules: Rules | None, topic: str, qos: int) -> bool:
    """Could ``authorize`` refuse this PUBLISH at all? Only a topic starting with "$"
    (``$SYS``, ``$share/``), a client under an ACL, or QoS 1/2 while the store is full
    or a gate is set. ``receive`` inlines this test on its hot path;
    ``tests/test_publish_policy_shared.py`` holds the two to ``authorize``."""
    return (
        topic[0] == "$" or rules is not None or bool(qos and (ctx.store_full or ctx.publish_gates))
    )


def authorize(
    ctx: Context,
    client_id: str,
    rules: Rules | None,
    topic: str,
    qos: int,
    retain: bool,
    size: int,
    props: Properties = EMPTY,
) -> Verdict | None:
    """Steps 5 and 6 for one PUBLISH of ``client_id`` (an MQTT client, or a device of
    the firmware bridge), in their order: ``$SYS``, ``$share/``, the ACL -- the most
    specific answer, so before the gates -- then the gates for QoS 1/2 (a full store,
    a bridge's full outbox). A refusal is counted in ``publish/messages/denied``;
    None: accepted."""
    if topic.startswith("$SYS") and sys_write_refused(topic, client_id):
        verdict = SYS_READ_ONLY
    elif topic.startswith(SHARE_PREFIX):
        verdict = SHARE_NOT_A_TOPIC
    elif rules is not None and not rules.can_write(topic):
        verdict = ACL_DENIED
    elif qos and (ctx.store_full or ctx.publish_gates):
        why = refusal(ctx, topic, retain, size, props)
        if why is None:
            return None
        verdict = Verdict(_QUOTA_EXCEEDED, why)
    else:
        return None
    ctx.stats.publish_denied += 1
    return verdict


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


def refusal(
    ctx: Context, topic: str, retain: bool, size: int, props: Properties = EMPTY
) -> str | None:
    """Why a QoS 1/2 PUBLISH on ``topic`` cannot be accepted now, or None: the store
    is full and the message would be stored, or a gate (a bridge's full outbox with
    the policy "refuse") says no. A gate is given the payload's and the properties'
    bytes: what the message would hold where it is kept."""
    if ctx.store_full and would_store(ctx, topic, retain):
        return f"store full: message on {topic!r} for persistent sessions refused"
    if ctx.publish_gates and props is not EMPTY:
        size += len(encode_properties(props))
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
