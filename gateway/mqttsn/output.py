"""The one writer: every datagram the gateway sends is appended to ``ctx.out`` here.

The shell takes ``out`` (``Gateway.take_output``) when ``kick`` tells it to. A client
behind a forwarder gets every answer encapsulated again (section 5.5). Output to a
client can wait for a store batch: "acknowledged means durable" (the broker's
``journal.py``) holds a PUBACK until the message it acknowledges is committed, and
everything after it to the same client waits too, keeping the order.
"""

from __future__ import annotations

from gateway.mqttsn.context import Context, SnClient
from gateway.mqttsn.encoding import encapsulate, encode
from gateway.mqttsn.packets import Packet
from gateway.mqttsn.state import BROADCAST, Key


def send_to(ctx: Context, key: Key, data: bytes) -> None:
    """Send ``data`` to ``key`` now, whoever is there (a client or not)."""
    transport, address, node_id = key
    if node_id:
        data = encapsulate(node_id, data)
    ctx.stats.messages_sent += 1
    ctx.out.append((transport, address, data))
    ctx.kick()


def send(ctx: Context, client: SnClient, packet: Packet) -> None:
    emit(ctx, client, encode(packet))


def emit(ctx: Context, client: SnClient, data: bytes, batch: int = 0) -> None:
    """Send to ``client``; with ``batch``, only once that store batch is committed
    (and everything after it to the same client waits too, keeping the order)."""
    if batch or client.held_batch:
        client.held_batch = max(client.held_batch, batch)
        if client.node_id:
            data = encapsulate(client.node_id, data)
        ctx.stats.messages_sent += 1
        ctx.held.append((client.held_batch, client, (client.transport, client.address, data)))
        return
    send_to(ctx, client.key, data)


def release(ctx: Context, upto: int) -> None:
    """The store committed every batch up to ``upto``: send what waited for them."""
    held = ctx.held
    released = False
    while held and held[0][0] <= upto:
        _batch, client, datagram = held.popleft()
        ctx.out.append(datagram)
        released = True
        if client.held_batch <= upto:
            client.held_batch = 0
    if released:
        ctx.kick()


def broadcast(ctx: Context, data: bytes) -> None:
    """Send ``data`` to everyone on each transport that can broadcast (ADVERTISE)."""
    for policy in ctx.transports.values():
        if policy.can_broadcast:
            ctx.stats.messages_sent += 1
            ctx.out.append((policy.label, BROADCAST, data))
    ctx.kick()
