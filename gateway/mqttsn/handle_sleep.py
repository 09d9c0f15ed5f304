"""PINGREQ and DISCONNECT: keep-alive answers, going to sleep and waking (6.11, 6.14).

DISCONNECT with a duration puts a client to sleep (``keepalive.asleep``): its
messages wait in its queue. A PINGREQ naming it wakes it: what waited is sent, then
PINGRESP, and it sleeps again (``delivery.pump``). A sleeping device often wakes
with a new source port, so the PINGREQ may come from another address -- but only
from where it connected (the same IPv4 address or IPv6 /64, serial line and
forwarder node); from elsewhere the wake is refused (``clients/wake refused``), and
so is a CONNECT naming it (``handle_connect``): a device that moved connects again
once its sleep has run out.
"""

from __future__ import annotations

from gateway.mqttsn import delivery, keepalive, output, sessions
from gateway.mqttsn.addresses import log_source, origin, where
from gateway.mqttsn.context import Context, log
from gateway.mqttsn.encoding import encode
from gateway.mqttsn.errors import NotConnected
from gateway.mqttsn.packets import Disconnect, PingReq, PingResp
from gateway.mqttsn.state import SLEEPING_STATES, UNCONNECTED_STATES, Key, State


def handle_pingreq(ctx: Context, key: Key, packet: PingReq, now: float) -> None:
    client = ctx.by_key.get(key)
    if packet.client_id:
        named = ctx.by_id.get(packet.client_id)
        if named is None or named.state in UNCONNECTED_STATES:
            raise NotConnected
        if named.key != key:
            if named.state not in SLEEPING_STATES:
                raise NotConnected
            if origin(key) != named.origin:
                ctx.stats.wakes_refused += 1
                ctx.refusals(
                    now,
                    log_source(key),
                    "%s: PINGREQ waking %r refused: it connected from %s",
                    where(key),
                    named.client_id,
                    named.where,
                )
                raise NotConnected
            ctx.by_key.pop(named.key, None)
            other = ctx.by_key.get(key)
            if other is not None:
                why = f"address taken over by {named.client_id!r}"
                sessions.lost(ctx, other, now, why, will=False)
            ctx.by_key[key] = named
            named.move(key)
        client = named
    if client is None or client.state in UNCONNECTED_STATES:
        raise NotConnected
    sessions.heard(ctx, client, now)
    if client.state in SLEEPING_STATES:
        # 6.14: awake; send what was buffered, then PINGRESP, then asleep again.
        client.state = State.AWAKE
        delivery.resume(ctx, client, now)
        return
    output.send(ctx, client, PingResp())


def handle_disconnect(ctx: Context, key: Key, packet: Disconnect, now: float) -> None:
    client = ctx.by_key.get(key)
    if client is None or client.state in UNCONNECTED_STATES:
        # Nothing to end; confirm anyway so the device stops waiting.
        output.send_to(ctx, key, encode(Disconnect()))
        return
    sessions.heard(ctx, client, now)
    if packet.duration:
        # 6.14: asleep for ``duration`` seconds; its messages are buffered.
        client.sleep_duration = packet.duration
        keepalive.asleep(ctx, client, now)
        log.debug("client %r asleep for %d s", client.client_id, packet.duration)
        output.send(ctx, client, Disconnect())
        return
    output.send(ctx, client, Disconnect())
    log.info("client %r disconnected", client.client_id)
    sessions.end(ctx, client, now)
