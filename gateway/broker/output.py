"""Output: every byte the core sends goes through ``write``, the one writer.

``write`` appends to the connection's output, or -- while the connection's output is
held for the store ("acknowledged means durable", ``gateway.broker.journal``) -- to
its held output, which ``release`` lets out in order once the store has committed.
A connection with output is listed in ``ctx.dirty`` once; the shell writes the dirty
connections when it is woken (``Context.wake``), at once when one has more than
``FLUSH_AT`` bytes waiting (``ctx.urgent``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Final

from gateway.broker.context import Context
from gateway.broker.state import Connection, State
from gateway.mqtt.codec import encode
from gateway.mqtt.fastpath import encode_packet_id
from gateway.mqtt.packets import MQTT_311, Packet
from gateway.mqtt.properties import EMPTY, Properties

log = logging.getLogger("ledge.broker")

#: Output waiting on one connection beyond which the shell writes at once instead of
#: at the end of the loop iteration (coalescing stays; memory and latency stay bounded).
FLUSH_AT: Final = 65_536


def write(ctx: Context, conn: Connection, data: bytes) -> None:
    """The one writer: ``data`` goes out on ``conn`` after what is already waiting."""
    ctx.stats.messages_sent += 1
    held = conn.held
    if held is not None:
        journal = ctx.journal
        assert journal is not None
        journal.held_append(conn, data)
        return
    _append(ctx, conn, data)


def _append(ctx: Context, conn: Connection, data: bytes) -> None:
    conn.out.append(data)
    size = conn.out_bytes = conn.out_bytes + len(data)
    if size > FLUSH_AT:
        ctx.urgent = True
    if not conn.in_dirty:
        conn.in_dirty = True
        ctx.dirty.append(conn)


def write_publish(ctx: Context, conn: Connection, parts: tuple[bytes, bytes], pid: int) -> None:
    """A QoS 1/2 PUBLISH from its template (``Message.encode``) and its packet id."""
    ctx.stats.publish_sent += 1
    write(ctx, conn, parts[0] + encode_packet_id(pid) + parts[1])


def fits(conn: Connection, size: int) -> bool:
    """May a packet of ``size`` bytes go to ``conn``? The one place that says: nothing
    larger than the client's Maximum Packet Size is sent to it (MQTT-3.1.2-24).

    What does not fit: a PUBLISH is discarded for that client (``publish_fits``); a
    control packet loses its problem details, or is not sent (``send``); a CONNACK
    that cannot fit refuses the CONNECT (``accept``). Callers on the hot path test
    ``conn.peer_max_packet is not None`` first, to skip the call for the clients (all
    on MQTT 3.1.1, most on 5.0) that set no limit."""
    limit = conn.peer_max_packet
    return limit is None or size <= limit


def publish_fits(ctx: Context, conn: Connection, topic: str, size: int) -> bool:
    """``fits`` for a PUBLISH: one that does not is not sent to ``conn`` -- it is
    discarded for that client as if it had been sent (MQTT-3.1.2-24, -25), counted."""
    if fits(conn, size):
        return True
    ctx.stats.dropped_too_large += 1
    log.debug("message on %r exceeds the maximum packet size of %s", topic, conn.label)
    return False


def send(ctx: Context, conn: Connection, packet: Packet) -> None:
    """Encode ``packet`` for ``conn``; drops problem details the client declined or
    cannot receive (MQTT-3.1.2-25, -29)."""
    data = encode(packet, conn.version or MQTT_311)
    if not fits(conn, len(data)):
        props = getattr(packet, "properties", EMPTY)
        if props is EMPTY or not (props.reason_string or props.user_properties):
            log.debug("not sending %s to %s: exceeds its maximum packet size", packet, conn.label)
            return
        packet = _strip_problem_details(packet)
        data = encode(packet, conn.version or MQTT_311)
        if not fits(conn, len(data)):
            log.debug("not sending %s to %s: exceeds its maximum packet size", packet, conn.label)
            return
    write(ctx, conn, data)


def mark_closing(ctx: Context, conn: Connection) -> None:
    """List ``conn`` for the shell even without output: it is to be closed."""
    if not conn.in_dirty:
        conn.in_dirty = True
        ctx.dirty.append(conn)


def drop_held(conn: Connection) -> None:
    """Output held for the store does not go out: the connection ends, or what it is
    told now (a DISCONNECT) must not wait behind it."""
    conn.held = None


def release(ctx: Context, upto: int) -> None:
    """The store committed every batch up to ``upto``: let the output held for them
    out, in order."""
    journal = ctx.journal
    if journal is None:
        return
    for conn, chunks in journal.release(upto):
        if conn.state is not State.CONNECTED:
            continue
        for data in chunks:
            _append(ctx, conn, data)


def take_dirty(ctx: Context) -> list[Connection]:
    dirty = ctx.dirty
    ctx.dirty = []
    ctx.urgent = False
    return dirty


def _strip_problem_details(packet: Packet) -> Packet:
    props: Properties = getattr(packet, "properties", EMPTY)
    changes: dict[str, Any] = {"properties": props.with_(reason_string=None, user_properties=())}
    stripped: Packet = replace(packet, **changes)
    return stripped
