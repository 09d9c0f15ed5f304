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


def send(ctx: Context, conn: Connection, packet: Packet) -> None:
    """Encode ``packet`` for ``conn``; drops problem details the client declined or
    cannot receive (MQTT-3.1.2-25, -29)."""
    data = encode(packet, conn.version or MQTT_311)
    limit = conn.peer_max_packet
    if limit is not None and len(data) > limit:
        props = getattr(packet, "properties", EMPTY)
        if props is EMPTY or not (props.reason_string or props.user_properties):
            log.debug("not sending %s to %s: exceeds its maximum packet size", packet, conn.label)
            return
        packet = _strip_problem_details(packet)
        data = encode(packet, conn.version or MQTT_311)
        if len(data) > limit:
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
