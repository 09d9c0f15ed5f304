"""The connection pool: admission, the connecting budget, eviction, and slots coming back.

Every slot is allocated when the broker starts (``Context.free``) and reused for the
process's life. A new connection gets a slot here (``open_connection``) and gives it
back here when its transport is gone (``connection_closed``); in between it is the
dispatcher's. The policy, in one place:

- connections before their CONNACK have a budget of their own: ``max_connecting``
  slots, ``max_connecting_per_address`` of them from one address;
- a newcomer beyond either, or finding every slot taken, gets the slot of the oldest
  connection still connecting (from its address, or from anywhere), which is closed at
  once (policy: evict oldest; counted, logged at powers of two); connected clients are
  never evicted;
- only a connection that had its ``connecting_grace`` can be judged silent: when it
  is over, the budgets it was let past are enforced again (``trim_connecting``);
- when every slot is held by connected clients, or the listener has its own
  connection limit and is at it, up to ``OVERFLOW_SLOTS`` more connections get a
  temporary slot that only answers their CONNECT with a refusal in their own protocol
  version; beyond that, None: the shell closes the socket at once. Both are counted as
  refused.
"""

from __future__ import annotations

import logging
from typing import Final

from gateway.broker import closing
from gateway.broker.auth import ListenerPolicy
from gateway.broker.context import Context
from gateway.broker.logins import address_key
from gateway.broker.state import Connection, State

log = logging.getLogger("ledge.broker")

#: Connections beyond ``max_connections`` that may wait at once for their refusal.
OVERFLOW_SLOTS: Final = 64


def open_connection(
    ctx: Context, peer: str, listener: str, now: float, identity: str | None = None
) -> Connection | None:
    """A new network connection in a slot of the pool (None: refused, close the socket);
    it must send CONNECT within ``connect_timeout``. ``identity`` is the CN of a
    verified TLS client certificate."""
    policy = ctx.policies.get(listener)
    source = address_key(peer)
    conn = _take_slot(ctx, peer, source, listener, policy, now)
    if conn is None:
        return None
    conn.reset(ctx.next_conn_id, peer, listener, now, policy, identity)
    conn.source = source
    ctx.next_conn_id += 1
    ctx.connections[conn.id] = conn
    if not conn.overflow:
        ctx.connecting[conn.id] = conn
        ctx.connecting_by_address.setdefault(source, {})[conn.id] = conn
    ctx.stats.connections_total += 1
    grace = ctx.settings.connecting_grace
    if conn.overflow or grace >= ctx.settings.connect_timeout:
        closing.arm_connect_deadline(ctx, conn, now)
    else:
        conn.timer = ctx.timers.at(now + grace, _grace_over, (ctx, conn, conn.generation))
    return conn


def connection_closed(ctx: Context, conn: Connection, now: float) -> None:
    """The transport of ``conn`` is gone (peer closed, reset, or our close completed):
    it is torn down (``closing.teardown``: nothing more after ``closing.close``), and
    its slot goes back to the pool -- unless it was evicted (its slot was replaced at
    once) or was an overflow slot (those are not pooled)."""
    if conn.state is State.CLOSED:
        return
    if conn.state is State.CONNECTED:
        log.info("client %s disconnected: connection lost", conn.label)
    if conn.dropped:
        log.warning(
            "client %s was a slow consumer: %d QoS 0 messages dropped",
            conn.label,
            conn.dropped,
        )
    closing.teardown(ctx, conn, now)
    conn.state = State.CLOSED
    conn.handle = None
    ctx.connections.pop(conn.id, None)
    if conn.overflow:
        ctx.overflow -= 1
    elif not conn.evicted:
        ctx.listener_open[conn.listener] -= 1
        ctx.free.append(conn)  # the slot goes back to the pool


def _take_slot(
    ctx: Context,
    peer: str,
    source: str,
    listener: str,
    policy: ListenerPolicy | None,
    now: float,
) -> Connection | None:
    """A pool slot for a new connection (evicting to make one), or an overflow slot,
    or None."""
    settings = ctx.settings
    limit = policy.max_connections if policy is not None else 0
    # Only connections that had their grace can be judged silent (a burst of
    # clients is accepted before any of their CONNECTs is read).
    judged = now - settings.connecting_grace
    same = ctx.connecting_by_address.get(source)
    if same is not None and len(same) >= settings.max_connecting_per_address:
        oldest = next(iter(same.values()))
        if oldest.opened_at <= judged or not ctx.free:
            _evict(ctx, oldest, peer, now, by_address=True)
    at_limit = bool(limit) and ctx.listener_open.get(listener, 0) >= limit
    if at_limit:
        # Only a connection of the same listener can make room under its limit.
        victim = next((c for c in ctx.connecting.values() if c.listener == listener), None)
        if victim is not None:
            _evict(ctx, victim, peer, now, by_address=False)
            at_limit = False
    elif ctx.connecting:
        oldest = next(iter(ctx.connecting.values()))
        if not ctx.free or (
            len(ctx.connecting) >= settings.max_connecting and oldest.opened_at <= judged
        ):
            _evict(ctx, oldest, peer, now, by_address=False)
    if ctx.free and not at_limit:
        conn = ctx.free.pop()
        ctx.listener_open[listener] = ctx.listener_open.get(listener, 0) + 1
        return conn
    if ctx.overflow < OVERFLOW_SLOTS:
        conn = Connection(settings.max_packet_size)
        conn.overflow = True
        ctx.overflow += 1
        return conn
    ctx.stats.connections_refused += 1
    ctx.refusals(
        now,
        source,
        "connection from %s closed at once: all %d slots and %d refusal slots in use"
        " (%d refused so far)",
        peer,
        settings.max_connections,
        OVERFLOW_SLOTS,
        ctx.stats.connections_refused,
    )
    return None


def trim_connecting(ctx: Context, conn: Connection, now: float) -> None:
    """``conn``'s grace is over, still before its CONNACK: the budgets it was let past
    are enforced again, oldest first (those are at least as old as it)."""
    settings = ctx.settings
    same = ctx.connecting_by_address.get(conn.source)
    while same and len(same) > settings.max_connecting_per_address:
        _evict(ctx, next(iter(same.values())), None, now, by_address=True)
        same = ctx.connecting_by_address.get(conn.source)
    while len(ctx.connecting) > settings.max_connecting:
        _evict(ctx, next(iter(ctx.connecting.values())), None, now, by_address=False)


def _evict(
    ctx: Context, victim: Connection, peer: str | None, now: float, *, by_address: bool
) -> None:
    """Close ``victim``, still before its CONNACK, and hand its slot to ``peer``."""
    stats = ctx.stats
    settings = ctx.settings
    if by_address:
        stats.evicted_address_full += 1
        why = (
            f"{victim.source} has {settings.max_connecting_per_address} "
            "connections in CONNECT (max_connecting_per_address)"
        )
    else:
        stats.evicted_connecting_full += 1
        why = (
            f"{len(ctx.connecting)} connections in CONNECT hold "
            f"{settings.max_connecting} of {settings.max_connections} slots"
        )
    evicted = stats.evicted_address_full + stats.evicted_connecting_full
    if evicted & (evicted - 1) == 0:
        log.warning(
            "closing %s, without CONNACK after %.1f s, to admit %s: %s (%d evicted so far)",
            victim.label,
            now - victim.opened_at,
            peer or "no one (its grace is over)",
            why,
            evicted,
        )
    victim.evicted = True
    victim.abort = True  # nothing to say to it: free the socket at once
    victim.pending = None  # a login it waited for is decided for nobody
    ctx.listener_open[victim.listener] -= 1
    closing.close(ctx, victim, now, "evicted to admit a newer connection")
    # Its slot, for the newcomer: the evicted object stays with its transport until
    # the shell reports it closed, and is then dropped instead of pooled.
    ctx.free.append(Connection(settings.max_packet_size))


def _grace_over(arg: tuple[Context, Connection, int], now: float) -> None:
    """A connection's ``connecting_grace`` is over before its CONNACK: trim the budgets,
    then it has the rest of ``connect_timeout`` to finish."""
    ctx, conn, generation = arg
    if conn.generation != generation or conn.state is not State.NEW:
        return
    conn.timer = None
    with ctx.event:
        trim_connecting(ctx, conn, now)
        if not conn.evicted and conn.state is State.NEW:
            closing.arm_connect_deadline(ctx, conn, conn.opened_at)
