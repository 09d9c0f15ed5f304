"""A client's connection from CONNACK to its end: heard from, lost, ended, forgotten.

A connected client (active, asleep or awake) is heard from with every message, which
also *proves* it (``MqttSnSettings.unproven_share``). It ends with its DISCONNECT, or
is lost without one (keep alive, sleep duration, retries) and then its Will is
published (6.11, 6.14). An ended clean session is forgotten; another is remembered,
disconnected, with its subscriptions, registrations and QoS 1/2 messages.
"""

from __future__ import annotations

from collections import deque

from gateway.mqttsn.context import Context, SnClient, log
from gateway.mqttsn.errors import NotConnected
from gateway.mqttsn.packets import Packet
from gateway.mqttsn.state import UNCONNECTED_STATES, Key, State


def connected(ctx: Context, key: Key, packet: Packet, now: float) -> SnClient:
    """The client at ``key``, which has a connection (active, awake or asleep) and
    is heard from now; ``NotConnected`` when there is none (``packet`` needs one)."""
    client = ctx.by_key.get(key)
    if client is None or client.state in UNCONNECTED_STATES:
        raise NotConnected
    heard(ctx, client, now)
    return client


def heard(ctx: Context, client: SnClient, now: float) -> None:
    """A message from ``client`` after its CONNACK: it is alive, and proven."""
    client.last_rx = now
    if not client.proven:
        client.proven = True
        if ctx.unproven.get(client.client_id) is client:
            del ctx.unproven[client.client_id]


def lost(ctx: Context, client: SnClient, now: float, reason: str, *, will: bool = True) -> None:
    """The client is gone without a DISCONNECT: its will is published (6.11, 6.14)."""
    ctx.stats.clients_lost += 1
    log.info("client %r at %s lost: %s", client.client_id, client.where, reason)
    if will:
        publish_will(client, now)
    end(ctx, client, now)


def publish_will(client: SnClient, now: float) -> None:
    if client.will is not None and client.proxy is not None:
        w = client.will
        client.proxy.publish_will(w.topic, w.message, w.qos, w.retain, now)


def end(ctx: Context, client: SnClient, now: float) -> None:
    """The connection ends: a clean session is forgotten, another is remembered."""
    if client.clean or client.proxy is None:
        forget(ctx, client, now)
        return
    _disconnected(ctx, client)
    ctx.by_key.pop(client.key, None)
    queue = client.queue
    if queue:
        kept = deque(e for e in queue if e.qos > 0)
        ctx.stats.dropped_offline_qos0 += len(queue) - len(kept)
        client.queue = kept or None


def forget(ctx: Context, client: SnClient, now: float) -> None:
    """The client and its session are gone (its broker session closes)."""
    _disconnected(ctx, client)
    if ctx.by_key.get(client.key) is client:
        del ctx.by_key[client.key]
    if ctx.by_id.get(client.client_id) is client:
        del ctx.by_id[client.client_id]
    clear_session(ctx, client, now)


def _disconnected(ctx: Context, client: SnClient) -> None:
    cancel_timers(ctx, client)
    if client.state is State.CONNECTING:
        ctx.connecting -= 1
    client.state = State.DISCONNECTED
    if ctx.unproven.get(client.client_id) is client:
        del ctx.unproven[client.client_id]


def clear_session(ctx: Context, client: SnClient, now: float) -> None:
    """6.3: subscriptions, registrations, messages and the Will are forgotten."""
    if client.proxy is not None:
        client.proxy.close(now)
        client.proxy = None
    client.topic_ids = None
    client.next_topic_id = 1
    client.inbound_qos2 = None
    client.queue = None
    client.inflight = None
    ctx.timers.cancel(client.retry_timer)
    client.retry_timer = None
    client.retries = 0
    client.will = None


def cancel_timers(ctx: Context, client: SnClient) -> None:
    ctx.timers.cancel(client.timer)
    ctx.timers.cancel(client.retry_timer)
    client.timer = client.retry_timer = None
