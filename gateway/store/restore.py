"""Rebuild the broker's state from a store snapshot at start-up."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.broker.core import Broker
from gateway.broker.journal import ForgetMessage, Journal, Unretain
from gateway.broker.message import Message
from gateway.broker.settings import NEVER_EXPIRES
from gateway.broker.state import Flow, Outgoing, Session, Subscription
from gateway.mqtt.properties import Where, decode_properties
from gateway.store.sqlite import Snapshot, StoredMessage

log = logging.getLogger("ledge.store")


@dataclass(frozen=True, slots=True)
class Restored:
    sessions: int
    subscriptions: int
    queued: int
    inflight: int
    retained: int


def _message(stored: StoredMessage, offset: float) -> Message:
    props, _ = decode_properties(stored.properties, 0, len(stored.properties), Where.PUBLISH)
    msg = Message(
        stored.topic,
        stored.payload,
        stored.qos,
        stored.retain,
        props,
        expiry_interval=stored.expiry_interval,
        origin=stored.origin,
        created=stored.created - offset,
    )
    return msg


def restore(broker: Broker, snapshot: Snapshot, now: float, wall_now: float) -> Restored:
    """Load ``snapshot`` into ``broker`` (whose clock reads ``now`` while the wall clock
    reads ``wall_now``) and switch its journal on. Time kept running while the broker
    was down: expiry deadlines and will delays that passed meanwhile take effect now."""
    offset = wall_now - now  # wall = monotonic + offset
    journal = Journal(snapshot.next_seq, snapshot.next_message_id)
    broker.journal = journal
    messages: dict[int, Message] = {}
    for stored in snapshot.messages.values():
        msg = _message(stored, offset)
        msg.store_id = stored.id
        messages[stored.id] = msg
    subscriptions = queued = inflight = 0
    for stored_session in snapshot.sessions:
        session = Session(stored_session.client_id, stored_session.expiry_interval)
        session.protocol_version = stored_session.protocol
        session.persisted = True
        for ss in stored_session.subscriptions:
            session.subscriptions[ss.key] = Subscription(
                ss.topic_filter,
                ss.qos,
                ss.no_local,
                ss.retain_as_published,
                ss.retain_handling,
                ss.identifier,
                ss.share_name,
            )
            subscriptions += 1
        top_pid = 0
        for se in stored_session.entries:
            msg = messages[se.message_id]
            entry = Outgoing(msg, se.qos, se.retain, se.sub_ids, se.share)
            entry.seq = se.seq
            entry.packet_id = se.packet_id
            entry.state = Flow(se.state)
            msg.refs += 1
            if entry.state is Flow.QUEUED:
                session.queue.append(entry)
                session.queued_bytes += msg.size
                queued += 1
            else:
                session.inflight[se.packet_id] = entry
                top_pid = max(top_pid, se.packet_id)
                inflight += 1
        session.next_packet_id = top_pid % 65_535 + 1
        session.incoming_qos2 = set(stored_session.incoming_qos2)
        if stored_session.will is not None and stored_session.will_due is not None:
            session.will = stored_session.will
            session.will_due = stored_session.will_due - offset
        if stored_session.expires_at is not None:
            session.expires_at = stored_session.expires_at - offset
        elif session.expiry_interval != NEVER_EXPIRES:
            # It was connected when the broker stopped: its expiry starts now.
            session.expires_at = now + session.expiry_interval
            journal.session(session)
        broker.adopt_session(session, now)
    for msg in messages.values():
        if msg.refs == 0:
            journal.ops.append(ForgetMessage(msg.store_id))  # left by an old crash
    for stored in snapshot.retained:
        msg = _message(stored, offset)
        if not msg.expired(now):
            broker.retained.store(msg)
        else:
            journal.ops.append(Unretain(msg.topic))
    result = Restored(len(snapshot.sessions), subscriptions, queued, inflight, len(broker.retained))
    if snapshot.sessions or snapshot.retained:
        log.info(
            "restored %d session(s), %d subscription(s), %d queued and %d in-flight "
            "message(s), %d retained message(s)",
            result.sessions,
            result.subscriptions,
            result.queued,
            result.inflight,
            result.retained,
        )
    return result
