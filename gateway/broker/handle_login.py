"""CONNECTs that carry a password: the check handed to the shell's verifier, and the
per-address slowdown of failed logins (``gateway.broker.logins`` keeps the table).

Imported the first time a password is checked: a broker without a password file
does not carry this code.
"""

from __future__ import annotations

import logging

from gateway.broker.accept import accept
from gateway.broker.closing import Refused, fail
from gateway.broker.context import Context
from gateway.broker.logins import WAITING_PER_ADDRESS, AddressRecord, address_key
from gateway.broker.state import Connection, LoginAttempt, State
from gateway.mqtt.errors import MQTTError
from gateway.mqtt.reason_codes import ReasonCode

log = logging.getLogger("ledge.broker")


def check_password(ctx: Context, conn: Connection, attempt: LoginAttempt, now: float) -> None:
    """Start the check now, or queue it behind the address's running check or delay."""
    attempt.key = address_key(conn.peer)
    conn.pending = attempt
    record = _record(ctx, attempt.key, now)
    if record.busy or now < record.until:
        if len(record.waiting) >= WAITING_PER_ADDRESS:
            conn.pending = None
            fail(
                ctx,
                conn,
                Refused(
                    f"too many logins from {attempt.key} waiting",
                    ReasonCode.CONNECTION_RATE_EXCEEDED,
                ),
                now,
            )
            return
        record.waiting.append(attempt)
        if not record.busy:
            _arm_wake(ctx, attempt.key, record)
        return
    _start_check(ctx, record, attempt, now)


def _record(ctx: Context, key: str, now: float) -> AddressRecord:
    record, evicted = ctx.logins.record(key, now)
    if evicted is not None:
        # Evicted to bound the table: whoever waited there is refused, not stranded.
        ctx.timers.cancel(evicted.wake)
        for attempt in evicted.waiting:
            if attempt.live:
                attempt.conn.pending = None
                fail(
                    ctx,
                    attempt.conn,
                    Refused("too many addresses logging in", ReasonCode.CONNECTION_RATE_EXCEEDED),
                    now,
                )
    return record


def _start_check(ctx: Context, record: AddressRecord, attempt: LoginAttempt, now: float) -> None:
    record.busy = True
    verifier = ctx.verifier
    if verifier is None:
        login_decided(ctx, attempt, attempt.check.run(), now)
    else:
        verifier(attempt)


def login_decided(ctx: Context, attempt: LoginAttempt, ok: bool | None, now: float) -> None:
    """A password check finished (``ok`` None: it could not run). A failure counts for
    the address even when the client has gone away meanwhile."""
    settings = ctx.settings
    record = _record(ctx, attempt.key, now)
    record.busy = False
    conn = attempt.conn
    live = attempt.live and conn.state is State.NEW
    if ok is None:
        if live:
            conn.pending = None
            fail(
                ctx, conn, Refused("too many password checks waiting", ReasonCode.SERVER_BUSY), now
            )
    elif ok:
        ctx.logins.succeeded(record)
        if live:
            conn.pending = None
            try:
                accept(ctx, conn, attempt.packet, attempt.username, now)
            except MQTTError as error:
                fail(ctx, conn, error, now)
            if conn.state is State.CONNECTED:
                ctx.resume(conn, now)  # what arrived meanwhile
    else:
        delay = ctx.logins.failed(
            record, now, settings.failed_login_delay, settings.failed_login_delay_max
        )
        log.warning(
            "failed login as %r from %s (%d in a row from this address; next check in %g s)",
            attempt.username,
            attempt.key,
            record.failures,
            delay,
        )
        if live:
            if delay > 0:
                # The refusal waits out the delay, so a client cannot guess faster.
                ctx.timers.cancel(conn.timer)
                conn.timer = ctx.timers.at(record.until, _refuse_late, (ctx, attempt))
            else:
                conn.pending = None
                fail(
                    ctx,
                    conn,
                    Refused("bad user name or password", ReasonCode.BAD_USER_NAME_OR_PASSWORD),
                    now,
                )
    _next_waiting(ctx, attempt.key, record, now)


def _refuse_late(arg: tuple[Context, LoginAttempt], now: float) -> None:
    ctx, attempt = arg
    conn = attempt.conn
    if attempt.live and conn.state is State.NEW:
        conn.pending = None
        conn.timer = None
        fail(
            ctx,
            conn,
            Refused("bad user name or password", ReasonCode.BAD_USER_NAME_OR_PASSWORD),
            now,
        )


def _next_waiting(ctx: Context, key: str, record: AddressRecord, now: float) -> None:
    """Start the next waiting login of ``key`` when its turn has come."""
    while record.waiting and not record.busy:
        if now < record.until:
            _arm_wake(ctx, key, record)
            return
        attempt = record.waiting.popleft()
        if attempt.live and attempt.conn.state is State.NEW:
            _start_check(ctx, record, attempt, now)
    if record.idle:
        ctx.logins.forget(key)


def _arm_wake(ctx: Context, key: str, record: AddressRecord) -> None:
    if record.wake is None:
        record.wake = ctx.timers.at(record.until, _wake, (ctx, key))


def _wake(arg: tuple[Context, str], now: float) -> None:
    ctx, key = arg
    record = ctx.logins.get(key)
    if record is not None:
        record.wake = None
        _next_waiting(ctx, key, record, now)
