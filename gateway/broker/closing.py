"""How connections end: the one error path, plain closes, and the deadlines.

Protocol violations are raised as ``MQTTError(message, reason_code)`` from anywhere
(the codec, a handler, the publish policy); a refused CONNECT is a ``Refused``.
``fail`` is the one place that turns either into what the client's protocol version
gets (mosquitto's ``do_disconnect``):

- before CONNACK: a refusal in the client's version (MQTT 5.0 CONNACK with the reason
  code and a reason string; MQTT 3.1.1 CONNACK with its return code), or -- for a
  CONNECT that could not be read -- CONNACK 0x01 for an unknown protocol level
  (MQTT-3.1.2-2), nothing for a wrong protocol name (MQTT-3.1.2-1);
- after CONNACK: DISCONNECT with the reason code on MQTT 5.0 (MQTT-4.13.1-1), a plain
  close on MQTT 3.1.1;

then ``close``: ``teardown`` now (the one path every ending takes, also when the
transport goes first), and the shell closes the transport once the output before it is
written.
"""

from __future__ import annotations

import logging

from gateway.broker.context import Context
from gateway.broker.output import drop_held, mark_closing, send, write
from gateway.broker.sessions import detach
from gateway.broker.state import Connection, State
from gateway.mqtt.codec import encode
from gateway.mqtt.errors import BadProtocolName, MQTTError, UnsupportedProtocolVersion
from gateway.mqtt.packets import MQTT_5, MQTT_311, ConnAck, Disconnect
from gateway.mqtt.properties import EMPTY, Properties
from gateway.mqtt.reason_codes import ConnackCode311, ReasonCode, connack_311, describe

log = logging.getLogger("ledge.broker")


class Refused(MQTTError):
    """A CONNECT refused for a reason that is not a malformed packet (credentials, a
    limit, the server going down): counted as a refused connection."""

    def __init__(self, message: str, reason_code: int) -> None:
        super().__init__(message, ReasonCode(reason_code))


def fail(ctx: Context, conn: Connection, error: MQTTError, now: float) -> None:
    """End ``conn`` because of ``error``, in the client's protocol version."""
    if conn.state >= State.CLOSING:
        return
    code = error.reason_code
    reason = error.message
    if conn.state is State.NEW:
        _refuse(ctx, conn, error, now)
        close(ctx, conn, now, reason)
        return
    if code >= 0x80:
        ctx.stats.protocol_errors += 1
        ctx.refusals(now, conn.source, "closing %s: %s (%s)", conn.label, reason, describe(code))
    else:
        log.info("closing %s: %s", conn.label, reason)
    if conn.version == MQTT_5 and conn.state is State.CONNECTED:
        props = _problem(conn, reason)
        drop_held(conn)  # the DISCONNECT goes out now; held acknowledgements do not
        send(ctx, conn, Disconnect(code, props))
    close(ctx, conn, now, reason)


def _refuse(ctx: Context, conn: Connection, error: MQTTError, now: float) -> None:
    """The answer to a CONNECT that is refused, or could not be read."""
    code = error.reason_code
    reason = error.message
    if isinstance(error, Refused):
        ctx.stats.connections_refused += 1
        ctx.refusals(
            now, conn.source, "refusing connection %s: %s (%s)", conn.label, reason, describe(code)
        )
        if conn.version == MQTT_5:
            send(ctx, conn, ConnAck(False, code, _problem(conn, reason)))
        else:
            send(ctx, conn, ConnAck(False, connack_311(code)))
        return
    ctx.stats.protocol_errors += 1
    ctx.refusals(now, conn.source, "refusing connection %s: %s", conn.label, reason)
    if isinstance(error, BadProtocolName):
        return  # MQTT-3.1.2-1: close without CONNACK
    if isinstance(error, UnsupportedProtocolVersion):
        # MQTT-3.1.2-2: CONNACK 0x01 in the 3.1.1 format, which every version reads.
        refusal = ConnAck(False, ConnackCode311.UNACCEPTABLE_PROTOCOL_VERSION)
        write(ctx, conn, encode(refusal, MQTT_311))
    elif error.protocol_version == MQTT_5:
        conn.version = MQTT_5
        send(ctx, conn, ConnAck(False, code, _problem(conn, reason)))


def _problem(conn: Connection, reason: str) -> Properties:
    """The reason string for a CONNACK or DISCONNECT: only for a client that did not
    set Request Problem Information to 0 (MQTT 5.0 3.1.2.11.7; the spec would allow it
    on these two packets, but the client said it does not want them)."""
    return Properties(reason_string=reason) if reason and conn.problem_info else EMPTY


def close(ctx: Context, conn: Connection, now: float, reason: str) -> None:
    """Close after flushing output: ``teardown`` now, then the shell closes the
    transport once the output before it is written. ``reason`` goes to the debug log
    (the callers that refuse or fail a client log it at their own level)."""
    if conn.state >= State.CLOSING:
        return
    log.debug("closing %s: %s", conn.label, reason)
    teardown(ctx, conn, now)
    conn.state = State.CLOSING
    mark_closing(ctx, conn)


def teardown(ctx: Context, conn: Connection, now: float) -> None:
    """What ending a connection does, however it ends (``close``, or the transport gone
    first, ``pool.connection_closed``); a second call does nothing more: output waiting
    for the store goes with the connection, its deadlines are cancelled, its session
    detaches (will, expiry) and it leaves the connecting budget."""
    drop_held(conn)
    cancel_timers(ctx, conn)
    detach(ctx, conn, now)
    ctx.connecting_over(conn)


def cancel_timers(ctx: Context, conn: Connection) -> None:
    ctx.timers.cancel(conn.timer)
    ctx.timers.cancel(conn.stuck_timer)
    conn.timer = conn.stuck_timer = None


# ---------------------------------------------------------------------------- deadlines


def arm_connect_deadline(ctx: Context, conn: Connection, now: float) -> None:
    """A new connection must send CONNECT within ``connect_timeout``."""
    conn.timer = ctx.timers.at(
        now + ctx.settings.connect_timeout, _connect_timer, (ctx, conn, conn.generation)
    )


def _connect_timer(arg: tuple[Context, Connection, int], now: float) -> None:
    ctx, conn, generation = arg
    if conn.generation != generation or conn.state is not State.NEW:
        return
    if conn.pending is not None:
        conn.pending = None
        reason = "login not decided in time: too many logins from this address"
        fail(ctx, conn, Refused(reason, ReasonCode.CONNECTION_RATE_EXCEEDED), now)
        return
    log.info("closing %s: no CONNECT within %g s", conn.label, ctx.settings.connect_timeout)
    close(ctx, conn, now, "no CONNECT in time")


def schedule_keepalive(ctx: Context, conn: Connection, now: float) -> None:
    """Replace the connect deadline by the keep-alive deadline (if any)."""
    ctx.timers.cancel(conn.timer)
    conn.timer = None
    if conn.keep_alive:
        conn.timer = ctx.timers.at(
            now + conn.keep_alive * 1.5, _keepalive_timer, (ctx, conn, conn.generation)
        )


def _keepalive_timer(arg: tuple[Context, Connection, int], now: float) -> None:
    ctx, conn, generation = arg
    if conn.generation != generation or conn.state is not State.CONNECTED:
        return
    if not conn.keep_alive:
        return
    due = conn.last_rx + conn.keep_alive * 1.5
    if now >= due:
        # MQTT-3.1.2-22 (3.1.1: MQTT-3.1.2-24): nothing heard for 1.5 x keep alive.
        reason = f"keep alive timeout: nothing received for {conn.keep_alive * 1.5:g} s"
        fail(ctx, conn, MQTTError(reason, ReasonCode.KEEP_ALIVE_TIMEOUT), now)
    else:
        conn.timer = ctx.timers.at(due, _keepalive_timer, arg)


def set_writable(ctx: Context, conn: Connection, writable: bool, now: float) -> None:
    """Flow control from the transport; a client not reading for ``slow_consumer_timeout``
    is cut off."""
    conn.writable = writable
    ctx.timers.cancel(conn.stuck_timer)
    conn.stuck_timer = None
    if not writable:
        conn.paused_at = now
        timeout = ctx.settings.slow_consumer_timeout
        if timeout > 0:
            conn.stuck_timer = ctx.timers.at(
                now + timeout, _stuck_timer, (ctx, conn, conn.generation, now)
            )


def _stuck_timer(arg: tuple[Context, Connection, int, float], now: float) -> None:
    """Slow-consumer deadline: a client that has not read for this long is cut off."""
    ctx, conn, generation, paused_at = arg
    if conn.generation != generation or conn.writable or conn.paused_at != paused_at:
        return
    if conn.state >= State.CLOSING:
        return
    log.warning(
        "closing %s: slow consumer, not reading for %g s (%d QoS 0 messages dropped)",
        conn.label,
        now - paused_at,
        conn.dropped,
    )
    conn.abort = True  # its buffers are full: do not wait to flush them
    close(ctx, conn, now, "slow consumer")
