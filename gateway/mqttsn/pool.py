"""The client pool: ``max_clients`` slots, and who makes room for a newcomer.

Devices are many and cheap to spoof over UDP, so the pool keeps three bounds:
``max_clients`` in all, ``max_clients_per_address`` per source (IPv4 address or IPv6
/64; a serial line is not limited) and ``unproven_share`` for clients not heard from
since their CONNACK (``Context.unproven``, oldest first). A newcomer is admitted by
evicting, in this order (policy "evict unproven, then longest silent"): unproven
clients beyond their share and past ``unproven_grace``; when the pool is full, the
oldest unproven client, the longest-disconnected remembered session, the connected
client without a keep-alive silent the longest. Never a proven client with a
keep-alive, or asleep: while it keeps to its Duration it is established (6.11,
6.14), and its own timer ends it when it stops.
"""

from __future__ import annotations

from gateway.mqttsn import output, sessions
from gateway.mqttsn.addresses import source
from gateway.mqttsn.context import Context, SnClient, log, sparse
from gateway.mqttsn.packets import Disconnect
from gateway.mqttsn.state import Key, State


def address_full(ctx: Context, key: Key, cid: str) -> bool:
    """``max_clients_per_address`` clients already hold a connection from the source
    of ``key`` (its IPv4 address or IPv6 /64, any port, any node behind a forwarder
    there), not counting the client ``cid`` itself or the one at ``key`` (this
    CONNECT replaces both). A serial line is one wired coordinator: not limited."""
    src = source(key[1])
    if src is None:
        return False
    limit = ctx.settings.max_clients_per_address
    count = 0
    for other_key, client in ctx.by_key.items():
        if client.source == src and other_key != key and client.client_id != cid:
            count += 1
            if count >= limit:
                return True
    return False


def evict_unproven_at(ctx: Context, key: Key, cid: str, now: float) -> bool:
    """The source of ``key`` is at ``max_clients_per_address``: the oldest unproven
    client from there (not ``cid`` itself) makes room, whatever its age (a source's
    own clients are all it can push out). False when there is none."""
    src = source(key[1])
    for client in ctx.unproven.values():
        if client.source == src and client.client_id != cid:
            why = f"{ctx.settings.max_clients_per_address} clients from {src}"
            _evict_unproven(ctx, client, cid, why, now)
            return True
    return False


def make_room(ctx: Context, cid: str, now: float) -> bool:
    """A slot for the new client ``cid`` (False: every slot is held by an established
    client, or one in the middle of its CONNECT -- ``max_connecting``,
    ``connect_timeout`` bound those). The order is the module's policy."""
    settings = ctx.settings
    unproven = ctx.unproven
    share = settings.max_unproven
    judged = now - settings.unproven_grace
    while len(unproven) - (cid in unproven) >= share:
        oldest = next(c for c in unproven.values() if c.client_id != cid)
        if oldest.last_rx > judged:
            break
        why = f"{len(unproven)} unproven clients (mqttsn.unproven_share of {share})"
        _evict_unproven(ctx, oldest, cid, why, now)
    if len(ctx.by_id) < settings.max_clients:
        return True
    victim = next((c for c in unproven.values() if c.client_id != cid), None)
    if victim is not None:
        _evict_unproven(ctx, victim, cid, f"all {settings.max_clients} slots in use", now)
        if len(ctx.by_id) < settings.max_clients:
            return True
    gone: SnClient | None = None
    idle: SnClient | None = None
    for client in ctx.by_id.values():
        if client.state is State.DISCONNECTED:
            if gone is None or client.last_rx < gone.last_rx:
                gone = client
        elif (
            client.state is State.ACTIVE
            and not client.duration
            and (idle is None or client.last_rx < idle.last_rx)
        ):
            idle = client
    if gone is not None:
        _forget_disconnected(ctx, gone)
        return True
    if idle is None:
        return False
    _evict_silent(ctx, idle, cid, now)
    return True


def _evict_unproven(ctx: Context, client: SnClient, cid: str, why: str, now: float) -> None:
    """End ``client``, silent since its CONNACK, to admit ``cid``. DISCONNECT tells a
    real device to connect again; no will is published (a spoofed CONNECT must not
    publish one); a persistent session is kept, disconnected."""
    st = ctx.stats
    st.clients_evicted_unproven += 1
    if sparse(st.clients_evicted_unproven):
        log.warning(
            "client %r at %s, silent for %.1f s since its CONNACK, evicted to admit %r:"
            " %s (%d evicted so far)",
            client.client_id,
            client.where,
            now - client.last_rx,
            cid,
            why,
            st.clients_evicted_unproven,
        )
    output.send(ctx, client, Disconnect())
    client.will = None
    sessions.end(ctx, client, now)


def _forget_disconnected(ctx: Context, gone: SnClient) -> None:
    """The longest-disconnected remembered session makes room."""
    st = ctx.stats
    st.clients_evicted += 1
    if sparse(st.clients_evicted):
        log.info(
            "forgetting the disconnected session of %r to make room (%d forgotten so far)",
            gone.client_id,
            st.clients_evicted,
        )
    sessions.forget(ctx, gone, gone.last_rx)


def _evict_silent(ctx: Context, idle: SnClient, cid: str, now: float) -> None:
    """The connected client without a keep-alive, silent the longest, makes room."""
    st = ctx.stats
    st.clients_evicted_silent += 1
    if sparse(st.clients_evicted_silent):
        log.warning(
            "client %r at %s evicted for %r: all %d client slots in use and it has no"
            " keep alive and was silent for %.0f s (%d evicted so far)",
            idle.client_id,
            idle.where,
            cid,
            ctx.settings.max_clients,
            now - idle.last_rx,
            st.clients_evicted_silent,
        )
    # The gateway ends the connection: DISCONNECT tells the device (5.4.21), and
    # its Will is published as for any connection ended without its DISCONNECT.
    output.send(ctx, idle, Disconnect())
    sessions.publish_will(idle, now)
    sessions.forget(ctx, idle, now)
