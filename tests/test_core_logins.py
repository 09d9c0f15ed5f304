"""Password checks off the event loop, and failed logins slowed down per address."""

from __future__ import annotations

import pytest

from gateway.broker.auth import (
    ListenerPolicy,
    PasswordAuthenticator,
    PasswordCheck,
    hash_password,
)
from gateway.broker.logins import (
    WAITING_PER_ADDRESS,
    LoginThrottle,
    address_key,
)
from gateway.broker.state import LoginAttempt
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    ConnAck,
    Connect,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from gateway.mqtt.reason_codes import ReasonCode
from tests.support.harness import FakeClient, Harness

USERS = {"ann": hash_password("secret", iterations=1)}


def _harness(**settings: object) -> Harness:
    h = Harness(**settings)
    h.broker.authenticator = PasswordAuthenticator(False, dict(USERS))
    return h


def _login(c: FakeClient, password: bytes, client_id: str = "x") -> None:
    c.send(Connect(client_id, c.version, username="ann", password=password))


def _connack(c: FakeClient) -> int | None:
    packets = c.take()
    acks = [p for p in packets if isinstance(p, ConnAck)]
    return acks[0].reason_code if acks else None


def test_failed_login_is_answered_only_after_the_delay_which_doubles() -> None:
    h = _harness(failed_login_delay=1.0, failed_login_delay_max=4.0)
    for expected_delay in (1.0, 2.0, 4.0, 4.0):
        c = h.client()
        _login(c, b"wrong")
        h.advance(expected_delay - 0.01)
        assert _connack(c) is None, expected_delay
        assert not c.closed
        h.advance(0.01)
        assert _connack(c) == ReasonCode.BAD_USER_NAME_OR_PASSWORD
        assert c.closed


def test_logins_from_the_same_address_wait_their_turn() -> None:
    """A second attempt while the first one's delay runs is checked only afterwards:
    however many connections an address opens, it gets one guess per delay."""
    h = _harness(failed_login_delay=2.0)
    bad = h.client()
    _login(bad, b"wrong")
    good = h.client(MQTT_311)
    _login(good, b"secret", "y")
    h.advance(1.9)
    assert _connack(bad) is None and _connack(good) is None
    h.advance(0.1)
    assert _connack(bad) == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert _connack(good) == 0  # its turn came, and its password was right


def test_other_addresses_are_not_slowed_down() -> None:
    h = _harness(failed_login_delay=5.0)
    _login(h.client(peer="10.0.0.1:1000"), b"wrong")
    other = h.client(peer="10.0.0.2:1000")
    _login(other, b"secret")
    assert _connack(other) == 0


def test_too_many_waiting_logins_from_one_address_are_refused_at_once() -> None:
    h = _harness(failed_login_delay=5.0)
    _login(h.client(), b"wrong")
    waiting = [h.client() for _ in range(WAITING_PER_ADDRESS)]
    for i, c in enumerate(waiting):
        _login(c, b"wrong", f"w{i}")
    extra = h.client(MQTT_311)
    _login(extra, b"secret", "extra")
    assert _connack(extra) == 3  # 3.1.1's server unavailable for 0x9F
    v5 = h.client()
    _login(v5, b"secret", "v5")
    assert _connack(v5) == ReasonCode.CONNECTION_RATE_EXCEEDED
    assert all(_connack(c) is None for c in waiting)


def test_a_login_waiting_past_its_connect_deadline_is_refused_0x9f() -> None:
    h = _harness(failed_login_delay=30.0, failed_login_delay_max=30.0, connect_timeout=10.0)
    _login(h.client(), b"wrong")
    late = h.client()
    _login(late, b"secret", "late")
    h.advance(10)
    assert _connack(late) == ReasonCode.CONNECTION_RATE_EXCEEDED


def test_a_success_clears_the_address() -> None:
    h = _harness(failed_login_delay=1.0)
    _login(h.client(), b"wrong")
    h.advance(1)
    _login(h.client(), b"secret", "ok")
    assert len(h.broker.logins) == 0
    again = h.client()
    _login(again, b"wrong", "again")
    h.advance(0.99)
    assert _connack(again) is None  # back to the first delay, not the second
    h.advance(0.01)
    assert _connack(again) == ReasonCode.BAD_USER_NAME_OR_PASSWORD


def test_unknown_users_cost_the_same_check_as_known_ones() -> None:
    """A refusal for an unknown user name runs a hash check too, so timing does not tell
    which user names exist."""
    auth = PasswordAuthenticator(False, dict(USERS))
    check = auth.check("c", "nobody", b"secret")
    assert isinstance(check, PasswordCheck) and not check.expected
    assert not check.run()
    assert isinstance(auth.check("c", "ann", None), PasswordCheck)


def test_the_table_of_addresses_is_bounded_lru() -> None:
    throttle = LoginThrottle(size=3)
    for i in range(5):
        record, _evicted = throttle.record(f"10.0.0.{i}", 0.0)
        throttle.failed(record, 0.0, 1.0, 30.0)
    assert len(throttle) == 3
    assert throttle.get("10.0.0.0") is None and throttle.get("10.0.0.4") is not None


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        ("192.0.2.7:5000", "192.0.2.7"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd:5000", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::1:443", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7:1", "192.0.2.7"),
    ],
)
def test_addresses_are_throttled_per_ipv4_address_or_ipv6_64(peer: str, key: str) -> None:
    assert address_key(peer) == key


# ----------------------------------------------------------------------- off the loop


def _offloaded(delay: float = 0) -> tuple[Harness, list[LoginAttempt]]:
    h = _harness(failed_login_delay=delay)
    handed: list[LoginAttempt] = []
    h.broker.verifier = handed.append
    return h, handed


def test_password_check_is_handed_off_and_pipelined_packets_wait_for_it() -> None:
    h, handed = _offloaded()
    c = h.client()
    c.send_raw(
        encode(Connect("x", MQTT_5, username="ann", password=b"secret"), MQTT_5)
        + encode(Subscribe(1, (SubscriptionRequest("t", 0),)), MQTT_5)
    )
    assert c.take() == [] and len(handed) == 1
    assert "secret" not in repr(handed[0]) and "secret" not in repr(handed[0].packet)
    h.broker.password_checked(handed[0], handed[0].check.run(), h.now)
    packets = c.take()
    assert [type(p) for p in packets] == [ConnAck, SubAck]


def test_an_overloaded_checker_refuses_with_server_busy() -> None:
    h, handed = _offloaded()
    c = h.client()
    _login(c, b"secret")
    h.broker.password_checked(handed[0], None, h.now)
    assert _connack(c) == ReasonCode.SERVER_BUSY


def test_a_failure_counts_even_when_the_client_left_before_the_answer() -> None:
    h, handed = _offloaded(delay=3.0)
    c = h.client()
    _login(c, b"wrong")
    c.drop()
    h.broker.password_checked(handed[0], False, h.now)
    nxt = h.client()
    _login(nxt, b"secret", "next")
    assert len(handed) == 1  # waits out the delay earned by the first attempt
    h.advance(3)
    assert len(handed) == 2


def test_input_piling_up_while_a_login_is_decided_is_bounded() -> None:
    h, _handed = _offloaded()
    c = h.client()
    _login(c, b"secret")
    c.send_raw(b"\x30" + b"\xff\xff\x7f" + b"x" * (h.broker.settings.max_packet_size + 70_000))
    assert c.closed


# ----------------------------------------------------------------------- identities


def test_certificate_identity_is_the_user_name() -> None:
    h = Harness()
    h.broker.policies["tls"] = ListenerPolicy(
        PasswordAuthenticator(False), use_identity_as_username=True
    )
    c = h.client(listener="tls", identity="sensor-7")
    assert c.connect("c", username="ignored", password=b"any").reason_code == 0
    assert c.conn.username == "sensor-7"
    no_cert = h.client(MQTT_311, listener="tls")
    assert no_cert.connect("d").reason_code == 5


def test_listener_connection_limit_refuses_in_the_clients_version() -> None:
    h = Harness()
    h.broker.policies["small"] = ListenerPolicy(PasswordAuthenticator(), max_connections=1)
    first = h.client(listener="small")
    first.connect("a")
    second = h.client(MQTT_311, listener="small")
    assert second.connect("b").reason_code == 3
    other = h.client()  # another listener is not affected
    assert other.connect("c").reason_code == 0
    first.drop()
    third = h.client(listener="small")
    assert third.connect("d").reason_code == 0
