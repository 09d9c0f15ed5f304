"""Topic ids (section 6.5): what a client registered, what the gateway assigned.

A client publishes on a *normal* topic id it registered (REGISTER/REGACK), on a
*predefined* one (``mqttsn.predefined_topics``) or on a *short* one (the two
characters of the name). Ids are assigned per client, 1 upwards, skipping the
reserved 0x0000 and 0xFFFF and, after a wrap, those in use; the table holds at most
``max_topics_per_client`` names (policy: refuse the new name, counted in
``publish/dropped/topic table full``). The gateway registers a topic with the client
(REGISTER, section 6.10) before it first publishes on it (``delivery``).
"""

from __future__ import annotations

from gateway.mqtt.topics import has_wildcard, topic_name_error
from gateway.mqttsn import output, sessions
from gateway.mqttsn.addresses import log_source
from gateway.mqttsn.context import Context, SnClient
from gateway.mqttsn.packets import (
    RESERVED_TOPIC_IDS,
    RegAck,
    Register,
    ReturnCode,
    TopicIdType,
    short_topic,
)
from gateway.mqttsn.state import Key, Outbound


def handle_register(ctx: Context, key: Key, packet: Register, now: float) -> None:
    """REGISTER from a client: the id it is to publish ``topic_name`` with."""
    client = sessions.connected(ctx, key, packet, now)
    name = packet.topic_name
    if topic_name_error(name):
        ctx.message_refusals(
            now,
            log_source(client.key),
            "client %r: REGISTER of bad topic %r refused",
            client.client_id,
            name,
        )
        output.send(ctx, client, RegAck(0, packet.msg_id, ReturnCode.NOT_SUPPORTED))
        return
    topic_id = assign(ctx, client, name)
    if topic_id is None:
        output.send(ctx, client, RegAck(0, packet.msg_id, ReturnCode.CONGESTION))
        return
    output.send(ctx, client, RegAck(topic_id, packet.msg_id, ReturnCode.ACCEPTED))


def assign(ctx: Context, client: SnClient, name: str) -> int | None:
    """The id of ``name`` for ``client``, assigned now if new (None: table full)."""
    ids = client.topic_ids
    if ids is None:
        ids = client.topic_ids = {}
    topic_id = ids.get(name)
    if topic_id is not None:
        return topic_id
    if len(ids) >= ctx.settings.max_topics_per_client:
        ctx.stats.dropped_topic_table += 1
        ctx.refusals(
            ctx.now,
            log_source(client.key),
            "client %r: topic table full (%d topics): %r not registered",
            client.client_id,
            len(ids),
            name,
        )
        return None
    topic_id = client.next_topic_id
    if topic_id in RESERVED_TOPIC_IDS:
        topic_id = 1
    if ids:
        # After a wrap (65,534 ids) every new id, not only the first, skips those still
        # in use; before one, ids only grow and none is. The table is smaller than the
        # id space (``max_topics_per_client``), so one is free.
        used = set(ids.values())
        while topic_id in used:
            topic_id = topic_id + 1 if topic_id < 0xFFFE else 1
    client.next_topic_id = topic_id + 1
    ids[name] = topic_id
    return topic_id


def forget(client: SnClient, name: str) -> None:
    """The client no longer knows ``name`` (it refused it, or lost its registration)."""
    if client.topic_ids is not None:
        client.topic_ids.pop(name, None)


def topic_of(ctx: Context, client: SnClient | None, id_type: int, topic_id: int) -> str | None:
    """The topic a client's PUBLISH names (None: no such id). ``client`` None: a QoS -1
    message, which may name only predefined and short ids."""
    if id_type == TopicIdType.NORMAL:
        ids = client.topic_ids if client is not None else None
        if ids:
            for name, known in ids.items():
                if known == topic_id:
                    return name
        return None
    if id_type == TopicIdType.PREDEFINED:
        return ctx.predefined.get(topic_id)
    if id_type == TopicIdType.SHORT:
        try:
            name = short_topic(topic_id)
        except ValueError:
            return None
        return None if has_wildcard(name) or "\x00" in name else name
    return None


def resolve(ctx: Context, client: SnClient, entry: Outbound) -> bool:
    """Pick the topic id to publish ``entry`` with: predefined, short, or registered;
    False when it must be registered first."""
    topic = entry.message.topic
    predefined = ctx.predefined_ids.get(topic)
    if predefined is not None:
        entry.topic_id, entry.id_type = predefined, TopicIdType.PREDEFINED
        return True
    raw = topic.encode("utf-8")
    if len(raw) == 2:
        entry.topic_id, entry.id_type = int.from_bytes(raw, "big"), TopicIdType.SHORT
        return True
    ids = client.topic_ids
    topic_id = ids.get(topic) if ids is not None else None
    if topic_id is None:
        return False
    entry.topic_id, entry.id_type = topic_id, TopicIdType.NORMAL
    return True
