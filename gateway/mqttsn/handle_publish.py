"""PUBLISH from a device (sections 6.6, 6.8) and its QoS 2 PUBREL.

A PUBLISH names its topic by id (``registry.topic_of``); the broker then applies the
rules of an MQTT client to it (``ProxyClient.refusal``: ``$SYS``, ``$share/``, the
ACL, a full store or bridge outbox) and routes it. The answers: PUBACK (QoS 1) or
PUBREC (QoS 2), held until the store committed the message when it had to be stored
(``output.emit`` with the batch); PUBACK with a return code for a refusal -- for an
unknown or reserved topic id whatever the QoS (6.6), for a broker refusal only for
QoS 1/2. Inbound QoS 2 is the broker's method A: routed on PUBLISH, its message id
kept (at most ``MAX_INBOUND_QOS2``; policy: PUBACK "congestion") until PUBREL, so a
re-sent PUBLISH is acknowledged again but never routed twice.

QoS -1 (6.8) needs no connection: predefined and short topic ids only, nothing
answered, published by the client's session if it has one, else by the gateway's
own session (not counted as a connected client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.broker.proxy import ProxyClient
from gateway.mqttsn import output, registry, sessions
from gateway.mqttsn.addresses import log_source, where
from gateway.mqttsn.context import Context, SnClient, log
from gateway.mqttsn.encoding import encode, encode_ack
from gateway.mqttsn.packets import (
    MsgType,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReturnCode,
    TopicIdType,
)
from gateway.mqttsn.state import MAX_INBOUND_QOS2, RETURN_CODES, Key

if TYPE_CHECKING:
    from gateway.broker.message import Message

#: The client id of the gateway's own broker session for QoS -1 messages.
QOS_MINUS_ONE_CLIENT_ID = "ledge-mqttsn-qos-1"


def handle_publish(ctx: Context, key: Key, packet: Publish, now: float) -> None:
    if packet.qos == -1:
        _publish_qos_minus_one(ctx, key, packet, now)
        return
    client = sessions.connected(ctx, key, packet, now)
    publish(
        ctx,
        client,
        packet.qos,
        packet.retain,
        packet.topic_id_type,
        packet.topic_id,
        packet.msg_id,
        packet.data,
        now,
    )


def publish(
    ctx: Context,
    client: SnClient,
    qos: int,
    retain: bool,
    id_type: int,
    topic_id: int,
    msg_id: int,
    data: bytes,
    now: float,
) -> None:
    """A PUBLISH (QoS 0-2) from a connected client: the one policy, whether it came
    through ``decode`` or the datagram fast path (``Gateway.received``)."""
    if id_type == TopicIdType.RESERVED:
        output.send(ctx, client, PubAck(topic_id, msg_id, ReturnCode.NOT_SUPPORTED))
        return
    stats = ctx.stats
    topic = registry.topic_of(ctx, client, id_type, topic_id)
    if topic is None:
        # 6.6: an unknown topic id is answered "rejected: invalid topic ID".
        stats.publish_refused += 1
        output.send(ctx, client, PubAck(topic_id, msg_id, ReturnCode.INVALID_TOPIC_ID))
        return
    if qos == 2:
        inbound = client.inbound_qos2
        if inbound is not None and msg_id in inbound:
            output.send(ctx, client, PubRec(msg_id))  # a resend: routed already
            return
        if inbound is not None and len(inbound) >= MAX_INBOUND_QOS2:
            stats.publish_refused += 1
            output.send(ctx, client, PubAck(topic_id, msg_id, ReturnCode.CONGESTION))
            return
    proxy = client.proxy
    assert proxy is not None
    refused = proxy.refusal(topic, qos, retain, len(data))
    if refused is not None:
        stats.publish_refused += 1
        ctx.message_refusals(
            now,
            log_source(client.key),
            "client %r: PUBLISH on %r refused: %s",
            client.client_id,
            topic,
            refused.reason,
        )
        if qos:
            output.send(ctx, client, PubAck(topic_id, msg_id, RETURN_CODES[refused.kind]))
        return
    batch = proxy.publish_counted(topic, data, now, qos=qos, retain=retain)
    if qos == 1:
        output.emit(ctx, client, encode_ack(MsgType.PUBACK, topic_id, msg_id), batch or 0)
    elif qos == 2:
        if client.inbound_qos2 is None:
            client.inbound_qos2 = set()
        client.inbound_qos2.add(msg_id)
        output.emit(ctx, client, encode(PubRec(msg_id)), batch or 0)


def handle_pubrel(ctx: Context, key: Key, packet: PubRel, now: float) -> None:
    """The end of an inbound QoS 2 message: its id is free again; PUBCOMP."""
    client = sessions.connected(ctx, key, packet, now)
    if client.inbound_qos2 is not None:
        client.inbound_qos2.discard(packet.msg_id)
        if not client.inbound_qos2:
            client.inbound_qos2 = None
    output.emit(ctx, client, encode(PubComp(packet.msg_id)))


def _publish_qos_minus_one(ctx: Context, key: Key, packet: Publish, now: float) -> None:
    """6.8: no connection, predefined and short topics only, nothing answered."""
    stats = ctx.stats
    policy = ctx.transports.get(key[0])
    if not ctx.settings.qos_minus_one or (policy is not None and policy.allow_client_ids):
        stats.publish_refused += 1
        log.debug("%s: QoS -1 PUBLISH refused (not enabled here)", where(key))
        return
    if packet.topic_id_type not in (TopicIdType.PREDEFINED, TopicIdType.SHORT):
        stats.publish_refused += 1
        ctx.message_refusals(
            now, log_source(key), "%s: QoS -1 PUBLISH with a normal topic id dropped", where(key)
        )
        return
    topic = registry.topic_of(ctx, None, packet.topic_id_type, packet.topic_id)
    if topic is None:
        stats.publish_refused += 1
        ctx.message_refusals(
            now,
            log_source(key),
            "%s: QoS -1 PUBLISH to unknown topic id %d",
            where(key),
            packet.topic_id,
        )
        return
    client = ctx.by_key.get(key)
    proxy = client.proxy if client is not None and client.proxy is not None else None
    if proxy is None:
        proxy = _anonymous(ctx, now)
    if proxy.refusal(topic, 0, packet.retain, len(packet.data)) is not None:
        stats.publish_refused += 1
        return
    stats.qos_minus_one += 1
    proxy.publish_counted(topic, packet.data, now, qos=0, retain=packet.retain)


def _anonymous(ctx: Context, now: float) -> ProxyClient:
    """The broker session QoS -1 messages come from (not counted as connected)."""
    if ctx.anonymous is None:
        ctx.anonymous = ProxyClient(
            ctx.broker, QOS_MINUS_ONE_CLIENT_ID, _discard, acl=ctx.acl, now=now, counted=False
        )
    return ctx.anonymous


def _discard(msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
    """The sink of the QoS -1 session: it subscribes to nothing."""
