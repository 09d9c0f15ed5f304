"""Delivery: a message to every matching session, and each session's window and queue.

``publish`` stores (or deletes) a retained message, finds the route (direct
subscribers and shared groups) and hands the message to each session with
``deliver``: at once to an in-process client's sink, written to a connection that may
take it (within its Receive Maximum and our ``max_inflight``), else queued under the
session's bounds. ``pump`` moves queued messages into flight as the window opens.
"""

from __future__ import annotations

import logging

from gateway.broker.context import Context
from gateway.broker.message import Message
from gateway.broker.output import publish_fits, send, write, write_publish
from gateway.broker.state import Connection, Flow, Outgoing, Session
from gateway.mqtt.fastpath import template_size
from gateway.mqtt.packets import MQTT_5, MQTT_311, PubRel

log = logging.getLogger("ledge.broker")


def publish(ctx: Context, msg: Message, now: float) -> int:
    """Route ``msg`` to every matching session; returns how many it went to.

    Retained messages are stored (or deleted) here first.
    """
    if msg.retain and ctx.retained.store(msg) and ctx.journal is not None:
        ctx.journal.retain(msg)
    route = ctx.index.route(msg.topic)
    count = 0
    origin = msg.origin
    msg_qos = msg.qos
    for session, subs in route.direct:
        if len(subs) == 1:
            sub = subs[0]
            if sub.no_local and session.client_id == origin:
                continue
            qos = sub.qos if sub.qos < msg_qos else msg_qos
            ident = sub.identifier
            sub_ids: tuple[int, ...] = (ident,) if ident else ()
            retain = msg.retain and sub.retain_as_published
        else:
            qos = -1
            ids: list[int] = []
            retain = False
            for sub in subs:
                if sub.no_local and session.client_id == origin:
                    continue
                granted = sub.qos if sub.qos < msg_qos else msg_qos
                qos = max(qos, granted)
                if sub.identifier:
                    ids.append(sub.identifier)
                if sub.retain_as_published and msg.retain:
                    retain = True
            if qos < 0:
                continue
            sub_ids = tuple(sorted(ids))
        deliver(ctx, session, msg, qos, retain, sub_ids, None, now)
        count += 1
    for group in route.shared:
        picked = group.pick(msg.topic)
        if picked is None:
            continue
        session, sub = picked
        qos = sub.qos if sub.qos < msg_qos else msg_qos
        ident = sub.identifier
        share = (group.name, group.topic_filter)
        deliver(ctx, session, msg, qos, False, (ident,) if ident else (), share, now)
        count += 1
    return count


def deliver(
    ctx: Context,
    session: Session,
    msg: Message,
    qos: int,
    retain: bool,
    sub_ids: tuple[int, ...],
    share: tuple[str, str] | None,
    now: float,
) -> None:
    """Hand one message to one session: send now, or queue under its bounds."""
    sink = session.sink
    if sink is not None:  # an in-process client
        ctx.stats.publish_sent += 1
        sink(msg, qos, retain, sub_ids)
        return
    conn = session.conn
    if qos == 0:
        if conn is None:
            if ctx.settings.queue_qos0_offline and session.expiry_interval:
                enqueue(ctx, session, Outgoing(msg, 0, retain, sub_ids, share))
            else:
                ctx.stats.dropped_offline_qos0 += 1
            return
        if not conn.writable or conn.out_bytes > ctx.settings.max_outbound_bytes:
            # Slow-consumer policy for QoS 0: drop, count, never grow past the bound.
            conn.dropped += 1
            ctx.stats.dropped_slow_consumer += 1
            return
        data = msg.raw
        if (
            data is None
            or retain
            or sub_ids
            or conn.version != msg.raw_version
            or conn.peer_alias_max
        ):
            parts = encode_for(ctx, conn, msg, 0, retain, sub_ids, False, now)
            if parts is None:
                return
            data = parts[0]
        elif conn.peer_max_packet is not None and not publish_fits(ctx, conn, msg.topic, len(data)):
            return  # the forwarded bytes are checked like encoded ones
        ctx.stats.publish_sent += 1
        write(ctx, conn, data)
        return
    entry = Outgoing(msg, qos, retain, sub_ids, share)
    if (
        conn is not None
        and conn.writable
        and not session.queue
        and len(session.inflight) < window(ctx, conn)
    ):
        send_new(ctx, session, conn, entry, now)
    else:
        enqueue(ctx, session, entry)


def window(ctx: Context, conn: Connection) -> int:
    """QoS 1/2 messages that may be in flight to ``conn``."""
    limit = conn.peer_receive_max
    cap = ctx.settings.max_inflight
    return limit if limit < cap else cap


def enqueue(ctx: Context, session: Session, entry: Outgoing) -> bool:
    settings = ctx.settings
    size = entry.message.size
    if (
        len(session.queue) >= settings.max_queued_messages
        or session.queued_bytes + size > settings.max_queued_bytes
    ):
        # Queue-full policy: the new message is dropped for this session and counted.
        stats = ctx.stats
        stats.dropped_queue_full += 1
        if stats.dropped_queue_full & (stats.dropped_queue_full - 1) == 0:
            log.warning(
                "queue of %r full (%d messages, %d bytes): dropping new messages "
                "(%d dropped so far)",
                session.client_id,
                len(session.queue),
                session.queued_bytes,
                stats.dropped_queue_full,
            )
        return False
    session.queue.append(entry)
    session.queued_bytes += size
    if ctx.journal is not None:
        ctx.journal.entry(session, entry)
    return True


def send_new(ctx: Context, session: Session, conn: Connection, entry: Outgoing, now: float) -> None:
    """Put ``entry`` in flight: a packet identifier, then the PUBLISH."""
    parts = encode_for(ctx, conn, entry.message, entry.qos, entry.retain, entry.sub_ids, False, now)
    journal = ctx.journal
    pid = session.allocate_packet_id()
    if parts is None:
        # Too large or expired: counted, and discarded as if it had been sent and
        # acknowledged (MQTT-3.1.2-25) -- its packet identifier is used and freed at
        # once, the window stays open and the next message follows.
        if journal is not None:
            journal.entry_done(session, entry)
        return
    entry.packet_id = pid
    entry.state = Flow.AWAIT_ACK
    session.inflight[pid] = entry
    if journal is not None and session.persisted:
        # Write-ahead: the PUBLISH leaves only once its packet id is stored, so a
        # restart can never re-send it under another id (QoS 2 stays exactly once).
        journal.entry(session, entry)
        journal.hold(conn)
    write_publish(ctx, conn, parts, pid)


def encode_for(
    ctx: Context,
    conn: Connection,
    msg: Message,
    qos: int,
    retain: bool,
    sub_ids: tuple[int, ...],
    dup: bool,
    now: float,
) -> tuple[bytes, bytes] | None:
    """The packet parts for ``conn``, or None when it must not be sent (counted)."""
    expiry: int | None = None
    if msg.expires_at is not None:
        if msg.expired(now):
            ctx.stats.dropped_expired += 1
            return None
        expiry = msg.expiry_remaining(now)
    if conn.version != MQTT_5:
        return msg.encode(MQTT_311, qos, retain, dup=dup)
    alias = 0
    new_alias = False
    if conn.peer_alias_max:
        alias = conn.aliases_out.get(msg.topic, 0)
        if not alias and len(conn.aliases_out) < conn.peer_alias_max:
            alias = len(conn.aliases_out) + 1
            new_alias = True
    parts = msg.encode(
        MQTT_5,
        qos,
        retain,
        dup=dup,
        sub_ids=sub_ids,
        expiry=expiry,
        alias=alias,
        send_topic=new_alias or not alias,
    )
    if conn.peer_max_packet is not None and not publish_fits(
        ctx, conn, msg.topic, template_size(parts, qos)
    ):
        return None
    if new_alias:
        if not conn.aliases_out:  # the shared empty map: this connection's own now
            conn.aliases_out = {}
        conn.aliases_out[msg.topic] = alias
    return parts


def pump(ctx: Context, session: Session, now: float) -> None:
    """Move queued messages into flight while the window and the transport allow."""
    conn = session.conn
    if conn is None:
        return
    queue = session.queue
    limit = window(ctx, conn)
    inflight = session.inflight
    while queue and conn.writable and len(inflight) < limit:
        entry = queue.popleft()
        session.queued_bytes -= entry.message.size
        if entry.message.expired(now):
            # Expired while queued: discarded as if sent (its packet identifier is
            # used up like Mosquitto's, so identifiers follow the same sequence).
            ctx.stats.dropped_expired += 1
            if entry.qos:
                session.allocate_packet_id()
            if ctx.journal is not None:
                ctx.journal.entry_done(session, entry)
            continue
        if entry.qos == 0:
            parts = encode_for(ctx, conn, entry.message, 0, entry.retain, entry.sub_ids, False, now)
            if parts is not None:
                ctx.stats.publish_sent += 1
                write(ctx, conn, parts[0])
            continue
        send_new(ctx, session, conn, entry, now)


def resend_inflight(ctx: Context, session: Session, conn: Connection, now: float) -> None:
    """On session resumption, re-send unacknowledged PUBLISH (DUP) and PUBREL packets
    with their original packet identifiers (MQTT-4.4.0-1); nothing else is retried."""
    for pid, entry in list(session.inflight.items()):
        if entry.state == Flow.AWAIT_COMP:
            send(ctx, conn, PubRel(pid))
            continue
        msg = entry.message
        parts: tuple[bytes, bytes] | None
        if msg.expired(now):
            # Expired while in flight: onward delivery had started, so it goes anyway
            # with a zero expiry rather than break the QoS flow -- if it fits the
            # client's Maximum Packet Size, which it may have lowered (MQTT-3.1.2-24).
            parts = msg.encode(
                conn.version, entry.qos, entry.retain, dup=True, sub_ids=entry.sub_ids, expiry=0
            )
            if conn.peer_max_packet is not None and not publish_fits(
                ctx, conn, msg.topic, template_size(parts, entry.qos)
            ):
                parts = None
        else:
            parts = encode_for(ctx, conn, msg, entry.qos, entry.retain, entry.sub_ids, True, now)
        if parts is None:
            del session.inflight[pid]
            if ctx.journal is not None:
                ctx.journal.entry_done(session, entry)
            continue
        write_publish(ctx, conn, parts, pid)


def redispatch_shared(ctx: Context, entry: Outgoing, now: float) -> None:
    """A shared-subscription message whose member went away goes to the next member."""
    assert entry.share is not None
    name, topic_filter = entry.share
    groups = ctx.index.shared.get(topic_filter)
    group = groups.get(name) if groups else None
    picked = group.pick(entry.message.topic) if group is not None else None
    if picked is None:
        ctx.stats.dropped_queue_full += 1
        log.warning(
            "shared subscription $share/%s/%s has no members left: message on %r dropped",
            name,
            topic_filter,
            entry.message.topic,
        )
        return
    session, sub = picked
    qos = min(entry.qos, sub.qos)
    # The receiving member's own Subscription Identifier (MQTT-3.3.4-3), not the
    # one of the member that went away.
    ident = sub.identifier
    deliver(ctx, session, entry.message, qos, False, (ident,) if ident else (), entry.share, now)
