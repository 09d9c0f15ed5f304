"""Keep alive (6.11) and sleep (6.14): the deadline of every connected client.

One timer a client (``SnClient.timer``): an active client must be heard from within
its Duration times ``keepalive_grace`` (without a Duration, within ``idle_timeout``),
a sleeping one within its sleep duration times the grace. The timer callback is a
plain function that gets the client; when it fires it checks the last message and
either re-arms itself or the client is lost (its Will is published).
"""

from __future__ import annotations

from gateway.mqttsn import sessions
from gateway.mqttsn.context import Context, SnClient
from gateway.mqttsn.state import SLEEPING_STATES, State


def arm(ctx: Context, client: SnClient, now: float) -> None:
    """An active client's deadline: its keep alive, or the gateway's ``idle_timeout``."""
    ctx.timers.cancel(client.timer)
    if client.duration:
        due = now + client.duration * ctx.settings.keepalive_grace
    else:
        # No keep-alive (Duration 0): the gateway's own bound, idle_timeout.
        due = now + ctx.settings.idle_timeout
    client.timer = ctx.timers.at(due, _silence, client)


def asleep(ctx: Context, client: SnClient, now: float) -> None:
    """``client`` sleeps (again) for its ``sleep_duration``; its messages wait."""
    client.state = State.ASLEEP
    sessions.cancel_timers(ctx, client)
    client.timer = ctx.timers.at(
        now + client.sleep_duration * ctx.settings.keepalive_grace, _silence, client
    )


def _silence(client: SnClient, now: float) -> None:
    """Keep alive (6.11) or the sleep duration (6.14) ran out without a word."""
    ctx = client.ctx
    client.timer = None
    if ctx.by_id.get(client.client_id) is not client:
        return
    settings = ctx.settings
    grace = settings.keepalive_grace
    if client.state is State.ACTIVE and client.duration:
        due = client.last_rx + client.duration * grace
        why = f"keep alive of {client.duration} s passed without a message"
    elif client.state is State.ACTIVE:
        due = client.last_rx + settings.idle_timeout
        why = f"no keep alive and silent for {settings.idle_timeout:g} s (idle_timeout)"
    elif client.state in SLEEPING_STATES:
        due = client.last_rx + client.sleep_duration * grace
        why = f"sleep duration of {client.sleep_duration} s passed without a message"
    else:
        return
    if now < due:
        client.timer = ctx.timers.at(due, _silence, client)
        return
    sessions.lost(ctx, client, now, why)
