"""PUBLISH and its acknowledgement flows, both directions (MQTT 5.0 3.3 - 3.7, 4.3).

What is checked on an inbound PUBLISH, and in which order, is ``publish_policy``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.broker.connection import Connection
from gateway.broker.publish_policy import receive
from gateway.broker.session import AWAIT_COMP
from gateway.mqtt.fastpath import encode_ack
from gateway.mqtt.packets import MQTT_5, PacketType, PubAck, PubComp, Publish, PubRec, PubRel
from gateway.mqtt.reason_codes import ReasonCode

if TYPE_CHECKING:
    from gateway.broker.core import Broker

log = logging.getLogger("ledge.broker")

PUBACK, PUBREC, PUBREL, PUBCOMP = (
    PacketType.PUBACK,
    PacketType.PUBREC,
    PacketType.PUBREL,
    PacketType.PUBCOMP,
)


def handle_publish(broker: Broker, conn: Connection, packet: Publish, now: float) -> None:
    """A decoded PUBLISH: the one policy (``publish_policy.receive``)."""
    receive(
        broker,
        conn,
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.packet_id,
        packet.properties,
        now,
    )


def handle_puback(broker: Broker, conn: Connection, packet: PubAck, now: float) -> None:
    session = conn.session
    assert session is not None
    entry = session.inflight.get(packet.packet_id)
    if entry is None or entry.qos != 1:
        log.debug("PUBACK from %s for unknown packet id %d", conn.label, packet.packet_id)
        return
    del session.inflight[packet.packet_id]
    if broker.journal is not None:
        broker.journal.entry_done(session, entry)
    if session.queue:
        broker.pump(session, now)


def handle_pubrec(broker: Broker, conn: Connection, packet: PubRec, now: float) -> None:
    session = conn.session
    assert session is not None
    pid = packet.packet_id
    entry = session.inflight.get(pid)
    if entry is None or entry.qos != 2:
        code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if conn.version == MQTT_5 else 0
        broker.send(conn, PubRel(pid, code))
        return
    journal = broker.journal
    if packet.reason_code >= 0x80:
        # MQTT-4.3.3-4 note: an error PUBREC ends the flow; the identifier is free again.
        del session.inflight[pid]
        if journal is not None:
            journal.entry_done(session, entry)
        if session.queue:
            broker.pump(session, now)
        return
    if entry.state != AWAIT_COMP:
        entry.state = AWAIT_COMP
        if journal is not None and session.persisted:
            journal.entry(session, entry)
    if journal is not None and session.persisted:
        # No PUBREL before the PUBREC stage is stored (also for a repeated PUBREC: the
        # first may still be waiting), or a restart would send the PUBLISH again.
        journal.hold(conn)
    broker.send_bytes(conn, encode_ack(PUBREL, pid))


def handle_pubrel(broker: Broker, conn: Connection, packet: PubRel, now: float) -> None:
    session = conn.session
    assert session is not None
    pid = packet.packet_id
    if pid in session.incoming_qos2:
        session.incoming_qos2.discard(pid)
        journal = broker.journal
        if journal is not None and session.persisted:
            journal.incoming_done(session, pid)
            journal.hold(conn)  # no PUBCOMP before the identifier is released in the store
        broker.send_bytes(conn, encode_ack(PUBCOMP, pid))
    else:
        # Unknown, or released by a change still waiting for the store: the PUBCOMP waits
        # too, or after a restart the identifier would be known again while the client
        # has already reused it for a new message.
        journal = broker.journal
        if journal is not None and session.persisted:
            journal.hold(conn)
        code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if conn.version == MQTT_5 else 0
        broker.send(conn, PubComp(pid, code))


def handle_pubcomp(broker: Broker, conn: Connection, packet: PubComp, now: float) -> None:
    session = conn.session
    assert session is not None
    entry = session.inflight.get(packet.packet_id)
    if entry is None or entry.state != AWAIT_COMP:
        log.debug("PUBCOMP from %s for unknown packet id %d", conn.label, packet.packet_id)
        return
    del session.inflight[packet.packet_id]
    if broker.journal is not None:
        broker.journal.entry_done(session, entry)
    if session.queue:
        broker.pump(session, now)
