"""PUBLISH and its acknowledgement flows, both directions (MQTT 5.0 3.3 - 3.7, 4.3).

Inbound QoS 2 uses the spec's method A: the message is routed on PUBLISH and its
packet identifier is remembered until PUBREL, so a re-sent PUBLISH (DUP) is
acknowledged again but never routed twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.broker.connection import Connection
from gateway.broker.message import Message
from gateway.broker.session import AWAIT_COMP
from gateway.mqtt.codec import decode
from gateway.mqtt.fastpath import encode_ack
from gateway.mqtt.packets import MQTT_5, PacketType, PubAck, PubComp, Publish, PubRec, PubRel
from gateway.mqtt.properties import EMPTY
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


def fast_publish(
    broker: Broker,
    conn: Connection,
    first: int,
    buf: bytes | bytearray,
    frame_start: int,
    start: int,
    end: int,
    now: float,
) -> None:
    """PUBLISH straight from the receive buffer, without building a packet value.

    Handles the common case -- QoS 0 or 1, no retain, no properties, an ordinary
    topic -- with exactly the checks ``handle_publish`` would make; anything else is
    decoded in full and handed to ``handle_publish``.
    """
    qos = (first >> 1) & 0x03
    version = conn.version
    if qos < 2 and not first & 0x09 and end - start > 2:  # 0x09: DUP and RETAIN
        size = (buf[start] << 8) | buf[start + 1]
        topic_end = start + 2 + size
        pos = topic_end + 2 if qos else topic_end
        if version == MQTT_5:
            if pos < end and buf[pos] == 0:
                pos += 1  # property length 0
            else:
                pos = end + 1  # properties (or a short packet): the general path
        if size and pos <= end and buf[start + 2] != 0x24:  # 0x24: a '$' topic
            pid = (buf[topic_end] << 8) | buf[topic_end + 1] if qos else 0
            if pid or not qos:
                try:
                    topic = str(buf[start + 2 : topic_end], "utf-8")
                except UnicodeDecodeError:
                    topic = ""
                if topic and "+" not in topic and "#" not in topic and "\x00" not in topic:
                    _publish_plain(broker, conn, buf, frame_start, pos, end, topic, qos, pid, now)
                    return
    packet = decode(first, buf[start:end], version)
    assert isinstance(packet, Publish)
    handle_publish(broker, conn, packet, now)


def _publish_plain(
    broker: Broker,
    conn: Connection,
    buf: bytes | bytearray,
    frame_start: int,
    pos: int,
    end: int,
    topic: str,
    qos: int,
    pid: int,
    now: float,
) -> None:
    """Route a PUBLISH without retain, properties or ``$`` topic, and acknowledge it."""
    rules = conn.rules
    if rules is not None and not rules.can_write(topic):
        _denied(broker, conn, topic)
        if qos:  # 0x87 on MQTT 5.0; a plain PUBACK on 3.1.1, which has no refusal
            broker.send_bytes(
                conn, encode_ack(PUBACK, pid, ReasonCode.NOT_AUTHORIZED, conn.version)
            )
        return
    payload = buf[pos:end]
    if type(payload) is not bytes:
        payload = bytes(payload)
    msg = Message(topic, payload, qos, False, origin=conn.client_id, created=now)
    if not qos:
        raw = buf[frame_start:end]
        msg.raw = raw if type(raw) is bytes else bytes(raw)
        msg.raw_version = conn.version
    broker.stats.publish_received += 1
    if qos and (broker.store_full or broker.publish_gates):
        why = broker.publish_refusal(topic, False, len(payload))
        if why is not None:
            code = broker.refuse_publish(conn, why, now)
            if code is not None:
                broker.send_bytes(conn, encode_ack(PUBACK, pid, code, conn.version))
            return
    journal = broker.journal
    mark = len(journal.ops) if journal is not None else 0
    delivered = broker.publish(msg, now)
    if qos:
        if journal is not None and len(journal.ops) != mark:
            journal.hold(conn)  # acknowledged means stored
        code = ReasonCode.SUCCESS if delivered else ReasonCode.NO_MATCHING_SUBSCRIBERS
        broker.send_bytes(conn, encode_ack(PUBACK, pid, code, conn.version))


def handle_publish(broker: Broker, conn: Connection, packet: Publish, now: float) -> None:
    settings = broker.settings
    session = conn.session
    assert session is not None
    topic = packet.topic
    props = packet.properties
    qos = packet.qos
    version = conn.version
    if props is not EMPTY:
        alias = props.topic_alias
        if alias is not None:
            if alias == 0 or alias > settings.topic_alias_maximum:
                # MQTT-3.3.2-8, -9
                broker.fail(
                    conn,
                    ReasonCode.TOPIC_ALIAS_INVALID,
                    f"topic alias {alias} is outside 1..{settings.topic_alias_maximum}",
                    now,
                )
                return
            if topic:
                if not conn.aliases_in:  # the shared empty map: this connection's own now
                    conn.aliases_in = {}
                conn.aliases_in[alias] = topic
            else:
                known = conn.aliases_in.get(alias)
                if known is None:
                    broker.fail(
                        conn, ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} was never set", now
                    )
                    return
                topic = known
        if props.subscription_identifiers:
            # MQTT-3.3.4-6
            broker.fail(
                conn,
                ReasonCode.PROTOCOL_ERROR,
                "a client's PUBLISH must not carry a subscription identifier",
                now,
            )
            return
    if not topic:
        broker.fail(conn, ReasonCode.PROTOCOL_ERROR, "PUBLISH without topic name or alias", now)
        return
    if packet.retain and not settings.retain_available:
        broker.fail(conn, ReasonCode.RETAIN_NOT_SUPPORTED, "retained messages are disabled", now)
        return
    broker.stats.publish_received += 1
    pid = packet.packet_id
    if qos == 2:
        incoming = session.incoming_qos2
        if pid in incoming:
            # A re-sent QoS 2 PUBLISH: acknowledge again, do not route again (MQTT-4.3.3-9).
            # The first PUBREC may still be waiting for its store batch: so must this one.
            journal = broker.journal
            if journal is not None and session.persisted:
                journal.hold(conn)
            broker.send_bytes(conn, encode_ack(PUBREC, pid, 0, version))
            return
        if len(incoming) >= settings.receive_maximum and version == MQTT_5:
            # MQTT-3.3.4-9: more unacknowledged QoS 2 than our Receive Maximum.
            broker.fail(
                conn,
                ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                f"more than {settings.receive_maximum} QoS 2 messages unacknowledged",
                now,
            )
            return

    journal = broker.journal
    mark = len(journal.ops) if journal is not None else 0
    code = _route(broker, conn, packet, topic, now)
    if code is None:
        return
    if qos == 2 and code < 0x80:
        session.incoming_qos2.add(pid)
        if journal is not None:
            journal.incoming(session, pid)
    if journal is not None and qos and len(journal.ops) != mark:
        journal.hold(conn)  # acknowledged means stored
    if qos == 1:
        broker.send_bytes(conn, encode_ack(PUBACK, pid, code, version))
    elif qos == 2:
        broker.send_bytes(conn, encode_ack(PUBREC, pid, code, version))


def _route(broker: Broker, conn: Connection, packet: Publish, topic: str, now: float) -> int | None:
    """Route the message; returns the reason code for the acknowledgement (None: closed)."""
    props = packet.properties
    qos = packet.qos
    if props is not EMPTY and props.payload_format_indicator == 1:
        try:
            packet.payload.decode("utf-8")
        except UnicodeDecodeError:
            reason = "payload format indicator says UTF-8 but the payload is not"
            if qos == 0:
                broker.fail(conn, ReasonCode.PAYLOAD_FORMAT_INVALID, reason, now)
                return None
            log.info("refusing PUBLISH from %s on %r: %s", conn.label, topic, reason)
            return ReasonCode.PAYLOAD_FORMAT_INVALID
    if qos and (broker.store_full or broker.publish_gates):
        why = broker.publish_refusal(topic, packet.retain, len(packet.payload))
        if why is not None:
            return broker.refuse_publish(conn, why, now)
    if topic.startswith("$SYS"):
        # $SYS belongs to the broker; a client's write is refused (3.1.1: silently dropped).
        broker.stats.publish_denied += 1
        log.info("refusing PUBLISH from %s to %r: $SYS is read-only", conn.label, topic)
        return ReasonCode.NOT_AUTHORIZED
    rules = conn.rules
    if rules is not None and not rules.can_write(topic):
        # Not authorized by the ACL: MQTT 5.0 acknowledges with 0x87, MQTT 3.1.1 has no
        # negative acknowledgement and the message is dropped (as mosquitto does).
        _denied(broker, conn, topic)
        return ReasonCode.NOT_AUTHORIZED
    expiry = props.message_expiry_interval
    msg = Message(
        topic,
        packet.payload,
        qos,
        packet.retain,
        props,
        expiry_interval=expiry,
        origin=conn.client_id,
        created=now,
    )
    if packet.retain and packet.payload and not broker.retained.has_room(msg):
        log.warning(
            "retained store full (%d messages, %d bytes): %r from %s not retained",
            len(broker.retained),
            broker.retained.bytes,
            topic,
            conn.label,
        )
        if qos and conn.version == MQTT_5:
            # Refuse-new policy, told to the publisher; nothing is forwarded.
            broker.retained.refused += 1
            return ReasonCode.QUOTA_EXCEEDED
    delivered = broker.publish(msg, now)
    return ReasonCode.SUCCESS if delivered else ReasonCode.NO_MATCHING_SUBSCRIBERS


def _denied(broker: Broker, conn: Connection, topic: str) -> None:
    """Count a PUBLISH the ACL refused; log the 1st, 2nd, 4th, 8th ... of them."""
    stats = broker.stats
    stats.publish_denied += 1
    if stats.publish_denied & (stats.publish_denied - 1) == 0:
        log.info(
            "refusing PUBLISH from %s to %r: not authorized (%d refused so far)",
            conn.label,
            topic,
            stats.publish_denied,
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
