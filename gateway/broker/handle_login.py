"""CONNECTs that carry a password: the check handed to the shell's verifier, and the
per-address slowdown of failed logins (``gateway.broker.logins`` keeps the table).

Imported the first time a password is checked: a broker without a password file
does not carry this code.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.broker.connection import Connection, State
from gateway.broker.handle_connect import accept
from gateway.broker.logins import WAITING_PER_ADDRESS, AddressRecord, LoginAttempt, address_key
from gateway.mqtt.reason_codes import ReasonCode

if TYPE_CHECKING:
    from gateway.broker.core import Broker

log = logging.getLogger("ledge.broker")


def check_password(broker: Broker, conn: Connection, attempt: LoginAttempt, now: float) -> None:
    """Start the check now, or queue it behind the address's running check or delay."""
    attempt.key = address_key(conn.peer)
    conn.pending = attempt
    record = _record(broker, attempt.key, now)
    if record.busy or now < record.until:
        if len(record.waiting) >= WAITING_PER_ADDRESS:
            conn.pending = None
            broker.refuse_connect(
                conn,
                ReasonCode.CONNECTION_RATE_EXCEEDED,
                f"too many logins from {attempt.key} waiting",
                now,
            )
            return
        record.waiting.append(attempt)
        if not record.busy:
            _arm_wake(broker, attempt.key, record)
        return
    _start_check(broker, record, attempt, now)


def _record(broker: Broker, key: str, now: float) -> AddressRecord:
    record, evicted = broker.logins.record(key, now)
    if evicted is not None:
        # Evicted to bound the table: whoever waited there is refused, not stranded.
        broker.timers.cancel(evicted.wake)
        for attempt in evicted.waiting:
            if attempt.live:
                attempt.conn.pending = None
                broker.refuse_connect(
                    attempt.conn,
                    ReasonCode.CONNECTION_RATE_EXCEEDED,
                    "too many addresses logging in",
                    now,
                )
    return record


def _start_check(broker: Broker, record: AddressRecord, attempt: LoginAttempt, now: float) -> None:
    record.busy = True
    verifier = broker.verifier
    if verifier is None:
        login_decided(broker, attempt, attempt.check.run(), now)
    else:
        verifier(attempt)


def login_decided(broker: Broker, attempt: LoginAttempt, ok: bool | None, now: float) -> None:
    """A password check finished (``ok`` None: it could not run). A failure counts for
    the address even when the client has gone away meanwhile."""
    settings = broker.settings
    record = _record(broker, attempt.key, now)
    record.busy = False
    conn = attempt.conn
    live = attempt.live and conn.state is State.NEW
    if ok is None:
        if live:
            conn.pending = None
            broker.refuse_connect(
                conn, ReasonCode.SERVER_BUSY, "too many password checks waiting", now
            )
    elif ok:
        broker.logins.succeeded(record)
        if live:
            conn.pending = None
            accept(broker, conn, attempt.packet, attempt.username, now)
            if conn.state is State.CONNECTED:
                broker.data_received(conn, b"", now)  # what arrived meanwhile
    else:
        delay = broker.logins.failed(
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
                broker.timers.cancel(conn.timer)
                conn.timer = broker.timers.at(record.until, _refuse_late, (broker, attempt))
            else:
                conn.pending = None
                broker.refuse_connect(
                    conn, ReasonCode.BAD_USER_NAME_OR_PASSWORD, "bad user name or password", now
                )
    _next_waiting(broker, attempt.key, record, now)


def _refuse_late(arg: tuple[Broker, LoginAttempt], now: float) -> None:
    broker, attempt = arg
    conn = attempt.conn
    if attempt.live and conn.state is State.NEW:
        conn.pending = None
        conn.timer = None
        broker.refuse_connect(
            conn, ReasonCode.BAD_USER_NAME_OR_PASSWORD, "bad user name or password", now
        )


def _next_waiting(broker: Broker, key: str, record: AddressRecord, now: float) -> None:
    """Start the next waiting login of ``key`` when its turn has come."""
    while record.waiting and not record.busy:
        if now < record.until:
            _arm_wake(broker, key, record)
            return
        attempt = record.waiting.popleft()
        if attempt.live and attempt.conn.state is State.NEW:
            _start_check(broker, record, attempt, now)
    if record.idle:
        broker.logins.forget(key)


def _arm_wake(broker: Broker, key: str, record: AddressRecord) -> None:
    if record.wake is None:
        record.wake = broker.timers.at(record.until, _wake, (broker, key))


def _wake(arg: tuple[Broker, str], now: float) -> None:
    broker, key = arg
    record = broker.logins.get(key)
    if record is not None:
        record.wake = None
        _next_waiting(broker, key, record, now)
