"""Gateway discovery (section 6.1): ADVERTISE every ``advertise_interval``, GWINFO.

ADVERTISE goes to every transport that can broadcast (``TransportPolicy``); a client's
SEARCHGW is answered with GWINFO to it alone.
"""

from __future__ import annotations

from typing import Final

from gateway.mqttsn import output
from gateway.mqttsn.context import Context
from gateway.mqttsn.encoding import encode
from gateway.mqttsn.packets import Advertise, GwInfo, SearchGw
from gateway.mqttsn.state import Key

#: The largest Duration an ADVERTISE can carry (two octets).
_MAX_DURATION: Final = 0xFFFF


def start(ctx: Context, now: float) -> None:
    """ADVERTISE now and every ``advertise_interval``, if anyone can hear it."""
    if ctx.settings.advertise_interval > 0 and any(
        t.can_broadcast for t in ctx.transports.values()
    ):
        ctx.timers.at(now, _advertise, ctx)


def handle_searchgw(ctx: Context, key: Key, packet: SearchGw, now: float) -> None:
    output.send_to(ctx, key, encode(GwInfo(ctx.settings.gateway_id)))


def _advertise(ctx: Context, now: float) -> None:
    interval = ctx.settings.advertise_interval
    data = encode(Advertise(ctx.settings.gateway_id, min(int(interval), _MAX_DURATION)))
    output.broadcast(ctx, data)
    ctx.timers.at(now + interval, _advertise, ctx)
