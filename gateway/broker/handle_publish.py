"""PUBLISH and its acknowledgement flows, both directions (MQTT 5.0 3.3 - 3.7, 4.3).

What is checked on an inbound PUBLISH, and in which order, is ``publish_policy``.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from gateway.broker.context import Context
from gateway.broker.delivery import pump
from gateway.broker.output import send, write
from gateway.broker.publish_policy import receive
from gateway.broker.qos import Ack, after
from gateway.broker.state import Connection, Flow, Outgoing, Session
from gateway.mqtt.errors import ProtocolError
from gateway.mqtt.fastpath import encode_ack
from gateway.mqtt.packets import MQTT_5, PacketType, PubAck, PubComp, Publish, PubRec, PubRel
from gateway.mqtt.reason_codes import ReasonCode

log = logging.getLogger("ledge.broker")


def handle_publish(ctx: Context, conn: Connection, packet: Publish, now: float) -> None:
    """A decoded PUBLISH: the one policy (``publish_policy.receive``)."""
    receive(
        ctx,
        conn,
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.packet_id,
        packet.properties,
        now,
    )


def handle_puback(ctx: Context, conn: Connection, packet: PubAck, now: float) -> None:
    session = conn.session
    assert session is not None
    entry = session.inflight.get(packet.packet_id)
    if entry is not None and entry.qos == 2:
        _wrong_kind("PUBACK", entry)
    if entry is None or after(entry.qos, entry.state, Ack.PUBACK) is None:
        log.debug("PUBACK from %s for unknown packet id %d", conn.label, packet.packet_id)
        return
    _done(ctx, session, entry, now)


def handle_pubrec(ctx: Context, conn: Connection, packet: PubRec, now: float) -> None:
    session = conn.session
    assert session is not None
    pid = packet.packet_id
    entry = session.inflight.get(pid)
    if entry is not None and entry.qos == 1:
        _wrong_kind("PUBREC", entry)
    ack = Ack.PUBREC_ERROR if packet.reason_code >= 0x80 else Ack.PUBREC
    state = after(entry.qos, entry.state, ack) if entry is not None else None
    if entry is None or state is None:
        code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if conn.version == MQTT_5 else 0
        send(ctx, conn, PubRel(pid, code))
        return
    if state is Flow.DONE:
        _done(ctx, session, entry, now)
        return
    journal = ctx.journal
    if entry.state != state:
        entry.state = state
        if journal is not None and session.persisted:
            journal.entry(session, entry)
    if journal is not None and session.persisted:
        # No PUBREL before the PUBREC stage is stored (also for a repeated PUBREC: the
        # first may still be waiting), or a restart would send the PUBLISH again.
        journal.hold(conn)
    write(ctx, conn, encode_ack(PacketType.PUBREL, pid))


def handle_pubrel(ctx: Context, conn: Connection, packet: PubRel, now: float) -> None:
    session = conn.session
    assert session is not None
    pid = packet.packet_id
    journal = ctx.journal
    if pid in session.incoming_qos2:
        session.incoming_qos2.discard(pid)
        if journal is not None and session.persisted:
            journal.incoming_done(session, pid)
            journal.hold(conn)  # no PUBCOMP before the identifier is released in the store
        write(ctx, conn, encode_ack(PacketType.PUBCOMP, pid))
    else:
        # Unknown, or released by a change still waiting for the store: the PUBCOMP waits
        # too, or after a restart the identifier would be known again while the client
        # has already reused it for a new message.
        if journal is not None and session.persisted:
            journal.hold(conn)
        code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if conn.version == MQTT_5 else 0
        send(ctx, conn, PubComp(pid, code))


def handle_pubcomp(ctx: Context, conn: Connection, packet: PubComp, now: float) -> None:
    session = conn.session
    assert session is not None
    entry = session.inflight.get(packet.packet_id)
    if entry is not None and (entry.qos == 1 or entry.state is Flow.AWAIT_ACK):
        _wrong_kind("PUBCOMP", entry)  # QoS 1, or QoS 2 before its PUBREC: no PUBREL yet
    if entry is None or after(entry.qos, entry.state, Ack.PUBCOMP) is None:
        log.debug("PUBCOMP from %s for unknown packet id %d", conn.label, packet.packet_id)
        return
    _done(ctx, session, entry, now)


def _wrong_kind(ack: str, entry: Outgoing) -> NoReturn:
    """An acknowledgement of the other QoS's flow for a message in flight: the client
    breaks the flow of MQTT 5.0 4.3.2/4.3.3 (a QoS 1 PUBLISH is answered by PUBACK
    only, a QoS 2 one by PUBREC, and PUBCOMP answers our PUBREL), a Protocol Error
    (4.13): the connection is closed, with DISCONNECT 0x82 on MQTT 5.0 (Mosquitto
    closes too)."""
    raise ProtocolError(f"{ack} for packet id {entry.packet_id}, a QoS {entry.qos} message")


def _done(ctx: Context, session: Session, entry: Outgoing, now: float) -> None:
    """The flow of ``entry`` is over: its identifier is free, the window opens."""
    del session.inflight[entry.packet_id]
    if ctx.journal is not None:
        ctx.journal.entry_done(session, entry)
    if session.queue:
        pump(ctx, session, now)
