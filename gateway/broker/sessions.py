"""Sessions: what outlives a connection -- wills, expiry, ACL rules, the end of a session.

``detach`` runs when a connection ends (its will is published or scheduled, the
session's expiry starts); ``end`` discards a session (a pending will goes out, its
shared-subscription messages go to the next member); ``adopt`` takes in a session
restored from the store. Will Delay and Session Expiry run on the core's timers.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from gateway.broker.context import Context
from gateway.broker.delivery import publish, redispatch_shared
from gateway.broker.message import Message
from gateway.broker.settings import NEVER_EXPIRES
from gateway.broker.state import Connection, Flow, Outgoing, Session
from gateway.mqtt.packets import Will
from gateway.mqtt.properties import EMPTY

if TYPE_CHECKING:
    from gateway.broker.acl import Rules

log = logging.getLogger("ledge.broker")


def detach(ctx: Context, conn: Connection, now: float) -> None:
    """The connection ends: publish or schedule its will; start session expiry."""
    session = conn.session
    if session is None:
        return
    conn.session = None
    if session.conn is not conn:
        return
    session.conn = None
    ctx.connected -= 1
    will = conn.will
    conn.will = None
    if will is not None and not conn.graceful:
        delay = will.properties.will_delay_interval or 0
        if delay <= 0:
            publish_will(ctx, will, session.client_id, now, session)
        else:
            session.will = will
            session.will_due = now + delay
            session.will_timer = ctx.timers.at(session.will_due, _will_timer, (ctx, session))
    if session.expiry_interval == 0:
        end(ctx, session, now)
        return
    if session.expiry_interval != NEVER_EXPIRES:
        session.expires_at = now + session.expiry_interval
        session.expiry_timer = ctx.timers.at(session.expires_at, _expiry_timer, (ctx, session))
    if ctx.journal is not None:
        ctx.journal.session(session)


def adopt(ctx: Context, session: Session, now: float) -> None:
    """Take in a session restored from the store (not connected). Its pending will and
    its expiry run from their deadlines; one already past fires now."""
    ctx.sessions[session.client_id] = session
    for sub in session.subscriptions.values():
        ctx.index.add(session, sub)
    if session.will is not None and session.will_due is not None:
        if session.will_due <= now:
            _will_timer((ctx, session), now)
        else:
            session.will_timer = ctx.timers.at(session.will_due, _will_timer, (ctx, session))
    if session.expires_at is not None:
        if session.expires_at <= now:
            _expiry_timer((ctx, session), now)
        else:
            session.expiry_timer = ctx.timers.at(session.expires_at, _expiry_timer, (ctx, session))


def will_survives_takeover(will: Will, session: Session, clean_start: bool) -> bool:
    """Whether the will of a connection that a new CONNECT takes over is published.

    The new Network Connection for the client is opened while the old one is still up,
    so a will with a Will Delay Interval is not sent (MQTT-3.1.3-9). A will without one
    is sent when the old session ends with the takeover -- it was not persistent
    (Session Expiry Interval 0; 3.1.1 CleanSession 1) or the new CONNECT has Clean
    Start -- and not when the session carries on into the new connection. One rule for
    both protocol versions, and Mosquitto's.
    """
    if will.properties.will_delay_interval:
        return False
    return session.expiry_interval == 0 or clean_start


def resume(ctx: Context, session: Session) -> None:
    """A client reconnected in time: no delayed will, no expiry (MQTT-3.1.3-9)."""
    session.will = None
    session.will_due = None
    session.expires_at = None
    cancel_timers(ctx, session)


def cancel_timers(ctx: Context, session: Session) -> None:
    ctx.timers.cancel(session.will_timer)
    ctx.timers.cancel(session.expiry_timer)
    session.will_timer = session.expiry_timer = None


def end(ctx: Context, session: Session, now: float) -> None:
    """Discard a session: a pending will is published now (MQTT-3.1.3-9's flip side)."""
    cancel_timers(ctx, session)
    if ctx.journal is not None:
        ctx.journal.session_end(session)
    if session.will is not None:
        will = session.will
        session.will = None
        session.will_due = None
        publish_will(ctx, will, session.client_id, now, session)
    for sub in list(session.subscriptions.values()):
        ctx.index.remove(session, sub)
    session.subscriptions.clear()
    orphans = [
        e for e in session.inflight.values() if e.share is not None and e.state == Flow.AWAIT_ACK
    ]
    orphans.extend(e for e in session.queue if e.share is not None)
    session.inflight.clear()
    session.queue.clear()
    session.queued_bytes = 0
    session.incoming_qos2.clear()
    if ctx.sessions.get(session.client_id) is session:
        del ctx.sessions[session.client_id]
    for entry in orphans:
        redispatch_shared(ctx, entry, now)


def publish_will(
    ctx: Context, will: Will, client_id: str, now: float, session: Session | None = None
) -> None:
    rules = session.rules if session is not None else None
    if rules is not None and not rules.can_write(will.topic):
        # The ACL changed since CONNECT (a reload): the will is not published.
        ctx.stats.publish_denied += 1
        log.info("not publishing will of %r on %r: not authorized", client_id, will.topic)
        return
    props = will.properties
    expiry = props.message_expiry_interval
    if props.will_delay_interval is not None:
        props = props.with_(will_delay_interval=None)
    msg = Message(
        will.topic,
        will.payload,
        will.qos,
        will.retain,
        props if props else EMPTY,
        expiry_interval=expiry,
        origin=client_id,
        created=now,
    )
    log.info("publishing will of %r on %r", client_id, will.topic)
    publish(ctx, msg, now)


def apply_rules(ctx: Context, session: Session, rules: Rules | None, now: float) -> None:
    """Give ``session`` new ACL rules: routes are worked out again, and queued
    messages it may no longer read are dropped (counted as denied)."""
    session.rules = rules
    if session.conn is not None:
        session.conn.rules = rules
    if rules is not None:
        ctx.index.acl = True
    if session.subscriptions:
        ctx.index.clear_cache()
    if rules is None or not session.queue:
        return
    kept: deque[Outgoing] = deque()
    for entry in session.queue:
        if rules.can_read(entry.message.topic):
            kept.append(entry)
            continue
        session.queued_bytes -= entry.message.size
        ctx.stats.publish_denied += 1
        if ctx.journal is not None:
            ctx.journal.entry_done(session, entry)
    session.queue = kept


def _will_timer(arg: tuple[Context, Session], now: float) -> None:
    ctx, session = arg
    due = session.will_due
    if session.will is None or due is None or now < due or session.conn is not None:
        return
    will = session.will
    session.will = None
    session.will_due = None
    publish_will(ctx, will, session.client_id, now, session)
    if ctx.journal is not None:
        ctx.journal.session(session)


def _expiry_timer(arg: tuple[Context, Session], now: float) -> None:
    ctx, session = arg
    expires_at = session.expires_at
    if session.conn is not None or expires_at is None or now < expires_at:
        return
    if ctx.sessions.get(session.client_id) is not session:
        return
    log.info("session %r expired", session.client_id)
    end(ctx, session, now)
