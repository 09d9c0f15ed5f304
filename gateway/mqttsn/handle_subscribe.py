"""SUBSCRIBE and UNSUBSCRIBE (section 6.9): a device's subscriptions in the broker.

A filter is a name (with wildcards) or a predefined topic id; the broker applies the
rules of an MQTT client to it (``ProxyClient.subscribe_checked``: the ACL,
``deny_subscriptions``, the subscriptions per client). Retained messages the
subscription matches are held (``SnClient.holding``) until the SUBACK is out, then
pumped. For a name without wildcards the SUBACK carries the topic id the gateway
will publish with (5.4.16), registered now.
"""

from __future__ import annotations

from gateway.mqtt.topics import has_wildcard
from gateway.mqttsn import delivery, output, registry, sessions
from gateway.mqttsn.addresses import log_source
from gateway.mqttsn.context import Context
from gateway.mqttsn.packets import ReturnCode, SubAck, Subscribe, TopicIdType, UnsubAck, Unsubscribe
from gateway.mqttsn.state import RETURN_CODES, Key


def handle_subscribe(ctx: Context, key: Key, packet: Subscribe, now: float) -> None:
    client = sessions.connected(ctx, key, packet, now)
    msg_id = packet.msg_id
    if packet.qos < 0:
        output.send(ctx, client, SubAck(0, msg_id, ReturnCode.NOT_SUPPORTED))
        return
    topic_id = 0
    if packet.topic_id_type == TopicIdType.PREDEFINED:
        assert isinstance(packet.topic, int)
        name = ctx.predefined.get(packet.topic)
        if name is None:
            output.send(ctx, client, SubAck(packet.topic, msg_id, ReturnCode.INVALID_TOPIC_ID))
            return
        topic_filter, topic_id = name, packet.topic
    else:
        assert isinstance(packet.topic, str)
        topic_filter = packet.topic
    proxy = client.proxy
    assert proxy is not None
    client.holding = True  # retained messages go out after the SUBACK
    try:
        refused = proxy.subscribe_checked(topic_filter, packet.qos, now)
    finally:
        client.holding = False
    if refused is not None:
        ctx.message_refusals(
            now,
            log_source(client.key),
            "client %r: SUBSCRIBE %r refused: %s",
            client.client_id,
            topic_filter,
            refused.reason,
        )
        output.send(ctx, client, SubAck(topic_id, msg_id, RETURN_CODES[refused.kind]))
        return
    if packet.topic_id_type == TopicIdType.NORMAL and not has_wildcard(topic_filter):
        # 5.4.16: the id the gateway will use when it publishes on this topic.
        topic_id = registry.assign(ctx, client, topic_filter) or 0
    output.send(ctx, client, SubAck(topic_id, msg_id, ReturnCode.ACCEPTED, packet.qos))
    delivery.pump(ctx, client, now)


def handle_unsubscribe(ctx: Context, key: Key, packet: Unsubscribe, now: float) -> None:
    client = sessions.connected(ctx, key, packet, now)
    if packet.topic_id_type == TopicIdType.PREDEFINED:
        name = ctx.predefined.get(packet.topic) if isinstance(packet.topic, int) else None
    else:
        name = packet.topic if isinstance(packet.topic, str) else None
    if name is not None and client.proxy is not None:
        client.proxy.unsubscribe(name)
    output.send(ctx, client, UnsubAck(packet.msg_id))
