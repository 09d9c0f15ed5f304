"""How connections end and how password logins are decided, as a client and an operator
see it: the CONNACK or DISCONNECT (reason code, reason string, session present), the
log lines (client label, reason, address), the counters, and the exact times at which
deadlines and per-address login delays fire.

Pure-core tests (``tests.support.harness``): real encoded packets, a fake clock.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re

import pytest

from gateway.broker import auth
from gateway.broker.acl import parse_acl_file
from gateway.broker.auth import (
    DEFAULT_ITERATIONS,
    PasswordAuthenticator,
    PasswordCheck,
    PasswordFileError,
    hash_password,
    parse_hash,
    parse_password_file,
)
from gateway.broker.core import Broker
from gateway.broker.logins import LoginThrottle
from gateway.broker.state import LoginAttempt, State
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    ReasonCode,
    Will,
    encode,
)
from tests.support.harness import FakeClient, Harness

LOGGER = "ledge.broker"
USERS = {"ann": hash_password("secret", iterations=1)}


def _harness(**settings: object) -> Harness:
    """A broker that wants ann's password and lets nobody in anonymously."""
    h = Harness(**settings)
    h.broker.authenticator = PasswordAuthenticator(False, dict(USERS))
    return h


def _booted(**settings: object) -> Harness:
    """The same, on a gateway whose monotonic clock started a moment ago."""
    h = _harness(**settings)
    h.now = 0.0
    h.broker = Broker(h.broker.settings, now=0.0)
    h.broker.authenticator = PasswordAuthenticator(False, dict(USERS))
    return h


def _offload(h: Harness) -> list[LoginAttempt]:
    """Hand password checks to a list instead of running them, as the shell's worker."""
    handed: list[LoginAttempt] = []
    h.broker.verifier = handed.append
    return handed


def _login(c: FakeClient, password: bytes, client_id: str, will: Will | None = None) -> None:
    c.send(Connect(client_id, c.version, will=will, username="ann", password=password))


def _connack(c: FakeClient) -> ConnAck | None:
    acks = [p for p in c.take() if isinstance(p, ConnAck)]
    assert len(acks) <= 1, acks
    return acks[0] if acks else None


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


# ------------------------------------------------------------------ refusals and errors


def test_a_refused_login_is_answered_counted_and_logged_per_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without this an operator could not tell who was refused and why, and a client
    would read a refusal as a resumed session (MQTT-3.2.2-6)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    h = _harness(failed_login_delay=0.0)
    v5 = h.client(peer="10.0.0.1:1000")
    _login(v5, b"wrong", "a")
    ack = _connack(v5)
    assert ack is not None and v5.closed
    assert (ack.reason_code, ack.session_present) == (ReasonCode.BAD_USER_NAME_OR_PASSWORD, False)
    assert ack.properties.reason_string == "bad user name or password"
    v3 = h.client(MQTT_311, peer="10.0.0.2:1000")
    _login(v3, b"wrong", "b")
    ack = _connack(v3)
    assert ack is not None and (ack.reason_code, ack.session_present) == (4, False)
    assert h.broker.stats.connections_refused == 2
    assert h.broker.stats.protocol_errors == 0
    assert _lines(caplog) == [
        "failed login as 'ann' from 10.0.0.1 (1 in a row from this address; next check in 0 s)",
        "refusing connection 'a' (10.0.0.1:1000): bad user name or password"
        " (bad user name or password)",
        "failed login as 'ann' from 10.0.0.2 (1 in a row from this address; next check in 0 s)",
        "refusing connection 'b' (10.0.0.2:1000): bad user name or password"
        " (bad user name or password)",
    ]


def test_an_unreadable_connect_is_a_protocol_error_explained_in_its_connack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client sending a broken CONNECT must learn why in its CONNACK; the operator
    must see one log line per address and an exact protocol-error count."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    h = Harness()
    labels = []
    for n in (1, 2):
        c = h.client(peer=f"10.0.0.{n}:1000")
        labels.append(f"#{c.conn.id} (10.0.0.{n}:1000)")
        # level 5, flags 0x03: clean start plus the reserved bit (MQTT-3.1.2-3)
        c.send_raw(bytes.fromhex("100e00044d5154540503003c00000161"))
        ack = _connack(c)
        assert ack is not None and c.closed
        assert (ack.reason_code, ack.session_present) == (ReasonCode.MALFORMED_PACKET, False)
        assert ack.properties.reason_string == "CONNECT reserved flag is set"
    assert (h.broker.stats.protocol_errors, h.broker.stats.connections_refused) == (2, 0)
    assert _lines(caplog) == [
        f"refusing connection {label}: CONNECT reserved flag is set" for label in labels
    ]


def test_a_violation_after_connack_is_counted_logged_and_explained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connected client breaking the protocol gets a DISCONNECT saying why, counted
    once each and logged once per address with its label and the reason code's name."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = Harness()
    for n in (1, 2):
        c = h.client(peer=f"10.0.0.{n}:1000")
        c.connect(f"c{n}")
        c.send(Connect("again", MQTT_5))  # MQTT-3.1.0-2
        disconnect = c.expect(Disconnect)
        assert disconnect.reason_code == ReasonCode.PROTOCOL_ERROR
        assert disconnect.properties.reason_string == "second CONNECT on a connection"
        assert c.closed
        assert h.broker.stats.protocol_errors == n
    assert _lines(caplog) == [
        f"closing 'c{n}' (10.0.0.{n}:1000): second CONNECT on a connection (protocol error)"
        for n in (1, 2)
    ]


def test_keep_alive_timeout_says_how_long_nothing_was_heard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client and the operator are told the silence that ended the connection."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = Harness()
    c = h.client()
    c.connect("k", keep_alive=10)
    h.advance(15)
    disconnect = c.expect(Disconnect)
    assert disconnect.reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    assert disconnect.properties.reason_string == "keep alive timeout: nothing received for 15 s"
    assert _lines(caplog) == [
        "closing 'k' (127.0.0.1:9): keep alive timeout: nothing received for 15 s"
        " (keep alive timeout)"
    ]


def test_a_connection_without_connect_is_closed_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator sees which silent connection was dropped and after how long."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    h = Harness(connect_timeout=2.5)
    c = h.client(peer="10.0.0.9:77")
    h.advance(2.5)
    assert c.closed and c.take() == []
    assert _lines(caplog) == [f"closing #{c.conn.id} (10.0.0.9:77): no CONNECT within 2.5 s"]


# -------------------------------------------------------------------- slow consumers


def test_a_slow_consumer_is_cut_off_at_its_timeout_and_its_session_expires_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that stops reading is cut off after exactly slow_consumer_timeout, the
    log says for how long, and its session then lives its expiry interval."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = Harness(slow_consumer_timeout=0.5)
    c = h.client()
    c.connect("c", session_expiry_interval=60)
    h.broker.set_writable(c.conn, False, h.now)
    h.advance(0.25)
    assert not c.closed
    h.advance(0.25)
    assert c.closed and c.conn.abort
    assert _lines(caplog) == [
        "closing 'c' (127.0.0.1:9): slow consumer, not reading for 0.5 s (0 QoS 0 messages dropped)"
    ]
    h.advance(59.75)
    assert "c" in h.broker.sessions
    h.advance(0.25)
    assert "c" not in h.broker.sessions


def test_slow_consumer_deadlines_are_only_armed_when_due(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Timeout 0 disables the cut-off; a client that reads again leaves no deadline
    behind; a connection already closing is not reported as a slow consumer."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    off = Harness(slow_consumer_timeout=0)
    c = off.client()
    c.connect("c")
    off.broker.set_writable(c.conn, False, off.now)
    off.advance(100_000)
    assert not c.closed

    h = Harness(slow_consumer_timeout=60)
    c = h.client()
    c.connect("c")
    h.broker.set_writable(c.conn, False, h.now)
    h.advance(30)
    h.broker.set_writable(c.conn, True, h.now)
    assert h.broker.next_deadline() is None  # nothing left to wake the shell for
    h.advance(60)
    assert not c.closed
    c.drop()

    leaving = h.client()
    leaving.connect("leaving")
    leaving.send(Disconnect())
    assert leaving.closed
    h.broker.set_writable(leaving.conn, False, h.now)  # its last bytes do not drain
    h.advance(120)
    assert not leaving.conn.abort
    assert not any("slow consumer" in line for line in _lines(caplog))


# ------------------------------------------------------------------ login decisions


def test_a_failed_login_is_refused_after_its_delay_even_past_the_connect_deadline() -> None:
    """The refusal waits out the whole delay (a guesser cannot go faster) and is the
    real one, 0x86 with its reason, not a connect-timeout 0x9F."""
    h = _harness(failed_login_delay=4.0, connect_timeout=2.0)
    c = h.client()
    _login(c, b"wrong", "x")
    h.advance(3.99)
    assert _connack(c) is None and not c.closed
    h.advance(0.01)
    ack = _connack(c)
    assert ack is not None and ack.reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert ack.properties.reason_string == "bad user name or password"


def test_waiting_logins_refused_for_rate_say_why(caplog: pytest.LogCaptureFixture) -> None:
    """A client refused for crowding (queue full, or deadline passed while waiting) is
    told which in its reason string; the operator sees the address."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = _harness(failed_login_delay=30.0, failed_login_delay_max=30.0, connect_timeout=10.0)
    _login(h.client(), b"wrong", "first")
    late = h.client()
    _login(late, b"secret", "late")
    for i in range(7):
        _login(h.client(), b"secret", f"w{i}")
    extra = h.client()
    _login(extra, b"secret", "extra")
    ack = _connack(extra)
    assert ack is not None and ack.reason_code == ReasonCode.CONNECTION_RATE_EXCEEDED
    assert ack.properties.reason_string == "too many logins from 127.0.0.1 waiting"
    h.advance(10)
    ack = _connack(late)
    assert ack is not None and ack.reason_code == ReasonCode.CONNECTION_RATE_EXCEEDED
    assert ack.properties.reason_string == (
        "login not decided in time: too many logins from this address"
    )
    assert _lines(caplog)[:2] == [
        "failed login as 'ann' from 127.0.0.1 (1 in a row from this address; next check in 30 s)",
        "refusing connection 'extra' (127.0.0.1:9): too many logins from 127.0.0.1 waiting"
        " (connection rate exceeded)",
    ]


def test_logins_waiting_behind_a_delay_are_checked_each_time_it_passes() -> None:
    """A login that queues after an earlier wait was served is still checked when the
    next delay passes, not left to time out."""
    h = _harness(failed_login_delay=1.0, failed_login_delay_max=30.0)
    first = h.client()
    _login(first, b"wrong", "a1")
    second = h.client()
    _login(second, b"wrong", "a2")
    h.advance(1)
    ack = _connack(first)
    assert ack is not None and ack.reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    third = h.client()
    _login(third, b"secret", "a3")  # waits for a2's doubled delay
    h.advance(1.99)
    assert _connack(second) is None and _connack(third) is None
    h.advance(0.01)
    ack = _connack(second)
    assert ack is not None and ack.reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    ack = _connack(third)
    assert ack is not None and ack.reason_code == ReasonCode.SUCCESS


def test_one_check_at_a_time_per_address_and_the_queue_moves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While a check runs, the next login of that address waits; each decision starts
    the next check at once, or when the delay it earned has passed."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = _harness(failed_login_delay=2.0)
    handed = _offload(h)
    a1, a2, a3 = h.client(), h.client(), h.client()
    _login(a1, b"secret", "a1")
    _login(a2, b"wrong", "a2")
    _login(a3, b"secret", "a3")
    assert len(handed) == 1
    h.broker.password_checked(handed[0], True, h.now)
    ack = _connack(a1)
    assert ack is not None and ack.reason_code == ReasonCode.SUCCESS
    assert len(handed) == 2 and handed[1].conn is a2.conn
    h.broker.password_checked(handed[1], False, h.now)
    h.advance(1.99)
    assert len(handed) == 2 and _connack(a2) is None
    h.advance(0.01)
    assert len(handed) == 3 and handed[2].conn is a3.conn
    ack = _connack(a2)
    assert ack is not None and ack.reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    h.broker.password_checked(handed[2], True, h.now)
    ack = _connack(a3)
    assert ack is not None and ack.reason_code == ReasonCode.SUCCESS
    assert _lines(caplog)[0] == (
        "failed login as 'ann' from 127.0.0.1 (1 in a row from this address; next check in 2 s)"
    )


def test_right_after_boot_logins_are_neither_held_back_nor_doubled() -> None:
    """On a gateway whose clock started seconds ago, the first login is checked at
    once, a success frees the address at once, and a first failure costs the base
    delay."""
    h = _booted(failed_login_delay=1.0)
    handed = _offload(h)
    good, nxt = h.client(), h.client()
    _login(good, b"secret", "good")
    assert len(handed) == 1
    _login(nxt, b"secret", "next")
    h.broker.password_checked(handed[0], True, h.now)
    assert len(handed) == 2
    h.broker.password_checked(handed[1], True, h.now)
    ack = _connack(nxt)
    assert ack is not None and ack.reason_code == ReasonCode.SUCCESS

    bad = h.client(peer="10.0.0.2:1")
    _login(bad, b"wrong", "bad")
    h.broker.password_checked(handed[2], False, h.now)
    h.advance(0.5)
    assert _connack(bad) is None
    h.advance(0.5)
    ack = _connack(bad)
    assert ack is not None and ack.reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD


def test_failures_are_forgotten_only_after_ten_quiet_minutes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An address that failed exactly 600 s ago still has its count; one quiet for
    longer starts again from the first delay."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = _harness(failed_login_delay=1.0, failed_login_delay_max=30.0)

    def refused_after(delay: float, client_id: str) -> None:
        c = h.client()
        _login(c, b"wrong", client_id)
        h.advance(delay - 0.25)
        assert _connack(c) is None, client_id
        h.advance(0.25)
        ack = _connack(c)
        assert ack is not None and ack.reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD

    refused_after(1.0, "first")
    h.advance(599)  # exactly 600 s after the first failure
    refused_after(2.0, "second")
    h.advance(600.5)  # 600.5 s after the second failure
    refused_after(1.0, "afresh")
    assert [line for line in _lines(caplog) if line.startswith("failed")] == [
        f"failed login as 'ann' from 127.0.0.1 ({n} in a row from this address;"
        f" next check in {d} s)"
        for n, d in ((1, 1), (2, 2), (1, 1))
    ]


def test_an_evicted_address_has_its_waiting_logins_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When the table of addresses is full, the logins waiting for an evicted address
    are refused with 0x9F and told why, not stranded until their deadline."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h = _harness(failed_login_delay=5.0)
    h.broker.login_throttle = LoginThrottle(size=1)
    first = h.client(peer="10.0.0.1:1")
    _login(first, b"wrong", "a1")
    waiting = h.client(peer="10.0.0.1:2")
    _login(waiting, b"secret", "a2")
    other = h.client(peer="10.0.0.2:1")
    _login(other, b"secret", "b")
    ack = _connack(waiting)
    assert ack is not None and waiting.closed
    assert ack.reason_code == ReasonCode.CONNECTION_RATE_EXCEEDED
    assert ack.properties.reason_string == "too many addresses logging in"
    ack = _connack(other)
    assert ack is not None and ack.reason_code == ReasonCode.SUCCESS
    assert (
        "refusing connection 'a2' (10.0.0.1:2): too many addresses logging in"
        " (connection rate exceeded)"
    ) in _lines(caplog)
    h.advance(5)
    ack = _connack(first)
    assert ack is not None and ack.reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD


def test_a_decision_reaches_only_the_connection_that_asked() -> None:
    """A check that ends after its client left must not answer a newcomer reusing the
    slot, nor cost a check for the departed; an overloaded checker says so."""
    h = _harness(failed_login_delay=0.0)
    handed = _offload(h)
    first = h.client()
    _login(first, b"secret", "first")
    gone = h.client()
    _login(gone, b"wrong", "gone")  # waits behind first's check
    gone.drop()
    newcomer = h.client()
    assert newcomer.conn is gone.conn, "premise: the pool reuses the freed slot"
    h.broker.password_checked(handed[0], True, h.now)
    assert len(handed) == 1  # the departed login is not checked
    ack = _connack(first)
    assert ack is not None and ack.reason_code == ReasonCode.SUCCESS

    leaver = h.client()
    _login(leaver, b"secret", "leaver")
    assert len(handed) == 2
    leaver.drop()
    stranger = h.client()
    assert stranger.conn is leaver.conn, "premise: the pool reuses the freed slot"
    h.broker.password_checked(handed[1], True, h.now)
    assert stranger.take() == [] and stranger.conn.state is State.NEW

    busy = h.client(peer="10.0.0.3:1")
    _login(busy, b"secret", "busy")
    h.broker.password_checked(handed[2], None, h.now)
    ack = _connack(busy)
    assert ack is not None and ack.reason_code == ReasonCode.SERVER_BUSY
    assert ack.properties.reason_string == "too many password checks waiting"


def test_a_login_decided_later_serves_the_user_and_what_was_pipelined() -> None:
    """The accepted client is its user (the ACL applies), its pipelined packets are
    handled at the decision and keep it alive from then; a CONNECT that fails in
    accept after a good password is still refused properly."""
    h = _harness(retain_available=False)
    h.broker.acl = parse_acl_file("user ann\ntopic readwrite ann/#\n")
    handed = _offload(h)
    c = h.client()
    c.send_raw(
        encode(Connect("p", MQTT_5, keep_alive=10, username="ann", password=b"secret"), MQTT_5)
        + encode(Publish("ann/t", b"1", 1, packet_id=7), MQTT_5)
        + encode(PingReq(), MQTT_5)
    )
    assert c.take() == []
    h.advance(3)
    h.broker.password_checked(handed[0], True, h.now)
    packets = c.take()
    assert [type(p) for p in packets] == [ConnAck, PubAck, PingResp]
    assert isinstance(packets[1], PubAck)
    assert packets[1].reason_code == ReasonCode.NO_MATCHING_SUBSCRIBERS  # allowed for ann
    h.advance(14.75)
    assert not c.closed
    h.advance(0.25)
    assert c.expect(Disconnect).reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT

    w = h.client()
    _login(w, b"secret", "w", will=Will("ann/will", b"x", retain=True))
    h.broker.password_checked(handed[1], True, h.now)
    ack = _connack(w)
    assert ack is not None and ack.reason_code == ReasonCode.RETAIN_NOT_SUPPORTED
    assert w.closed


# ------------------------------------------------------------------- password hashes


def test_written_hashes_have_the_shape_mosquitto_reads() -> None:
    """Mosquitto accepts a $7$ line only with a 12-byte salt and a 64-byte digest: a
    file written by Ledge must stay readable when copied to a Mosquitto broker."""
    hashed = hash_password("pw")
    line = hashed.encode()
    assert re.fullmatch(r"\$7\$10000\$[A-Za-z0-9+/]{16}\$[A-Za-z0-9+/]{86}==", line), line
    assert parse_hash(line).verify(b"pw") and not parse_hash(line).verify(b"pX")


def test_a_pbkdf2_hash_is_verified_at_its_own_length() -> None:
    """A readable $7$ line whose digest is not 64 bytes must still let its user in."""
    salt = b"0123456789ab"
    digest = hashlib.pbkdf2_hmac("sha512", b"pw", salt, 3, 32)
    line = f"$7$3${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"
    hashed = parse_hash(line)
    assert hashed.verify(b"pw")
    assert not hashed.verify(b"px")


def test_unknown_users_are_checked_against_one_dummy_hash_of_full_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Probing user names must cost the same PBKDF2 work as a real login, and the
    dummy hash is made once, not per probe."""
    monkeypatch.setattr(auth, "_DUMMY", [])
    authenticator = PasswordAuthenticator(False, dict(USERS))
    probes = [authenticator.check("c", name, b"secret") for name in ("nobody", "root")]
    assert all(isinstance(p, PasswordCheck) for p in probes)
    checks = [p for p in probes if isinstance(p, PasswordCheck)]
    assert checks[0].hash is checks[1].hash
    assert (checks[0].hash.scheme, checks[0].hash.iterations) == ("7", DEFAULT_ITERATIONS)
    assert not checks[0].run()


def test_password_file_lines_are_read_or_reported_with_their_number() -> None:
    """Comments and blank lines are ignored; every bad line (not base64 included) is
    reported with its line number and what is wrong, and that user cannot log in; a
    user name ends at the first colon, as in Mosquitto."""
    ann = hash_password("a", iterations=1).encode()
    bob = hash_password("b", iterations=1).encode()
    text = "\n".join(
        [
            "# users of the gateway: not a line to read",
            "",
            f"#old:{ann}",
            f"ann:{ann}",
            f":{ann}",
            "nocolon",
            "bad:$7$0$c2FsdA==$ZGlnZXN0",
            "four:$7$101$c2FsdA==",
            "six:$6$a$b$c",
            f"eve:x:{ann}",
            f"bob:{bob}",
            "s7salt:$7$101$c2Fs!dA==$ZGlnZXN0",
            "s7digest:$7$101$c2FsdA==$ZGln!ZXN0",
            "s6salt:$6$c2Fs!dA==$ZGlnZXN0",
            "s6digest:$6$c2FsdA==$ZGln!ZXN0",
        ]
    )
    skipped: list[PasswordFileError] = []
    users = parse_password_file(text, skipped)
    assert sorted(users) == ["ann", "bob"]
    assert users["ann"].iterations == 1 and users["ann"].verify(b"a")
    unknown = "unknown hash format (expected $7$... or $6$...)"
    assert [(e.line, str(e)) for e in skipped] == [
        (5, "line 5: expected user:hash"),
        (6, "line 6: expected user:hash"),
        (7, "line 7: user 'bad': unreadable hash: iteration count must be positive"),
        (8, f"line 8: user 'four': {unknown}"),
        (9, f"line 9: user 'six': {unknown}"),
        (10, f"line 10: user 'eve': {unknown}"),
        *(
            (n, f"line {n}: user {user!r}: unreadable hash: Only base64 data is allowed")
            for n, user in enumerate(["s7salt", "s7digest", "s6salt", "s6digest"], start=12)
        ),
    ]


def test_every_close_names_its_reason_in_the_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    """With debug logging on, an operator chasing a dropped client sees why the gateway
    closed it, also where nothing is logged at info (first packet not CONNECT, too slow to
    CONNECT, a clean DISCONNECT)."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    h = Harness(connect_timeout=5.0)
    wrong = h.client(peer="10.0.0.3:1")
    wrong.send(PingReq())
    slow = h.client(peer="10.0.0.4:1")
    h.advance(5.0)
    done = h.client(peer="10.0.0.5:1")
    done.connect("done")
    done.send(Disconnect())
    assert wrong.closed and slow.closed and done.closed
    closing = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG
    ]
    assert closing == [
        f"closing {wrong.conn.label}: first packet was not CONNECT",
        f"closing {slow.conn.label}: no CONNECT in time",
        "closing 'done' (10.0.0.5:1): client disconnected",
    ]
