"""CONNECT: validation, client identifiers, sessions, takeover, keep alive, refusals.

Pure-core tests: real encoded packets, a fake clock, no sockets.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.broker.auth import PasswordAuthenticator, hash_password
from gateway.mqtt import (
    MQTT_5,
    MQTT_31,
    MQTT_311,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    Publish,
    ReasonCode,
    Will,
)
from gateway.mqtt.packets import Packet
from tests.support.harness import FakeClient, Harness

CONNECT_311 = bytes.fromhex("101000044d5154540402003c000461626364")


def test_accepts_311_connect_bytes_and_answers_connack_accepted() -> None:
    h = Harness()
    c = h.client(MQTT_311)
    c.send_raw(CONNECT_311)
    assert c.take() == [ConnAck(False, 0)]
    assert c.conn.client_id == "abcd"


def test_first_packet_must_be_connect() -> None:
    """MQTT-3.1.0-1: anything else first closes the connection without a reply."""
    h = Harness()
    c = h.client(MQTT_311)
    c.send(PingReq())
    assert c.closed
    assert c.take() == []


def test_second_connect_is_a_protocol_error_v5() -> None:
    """MQTT-3.1.0-2."""
    h = Harness()
    c = h.client()
    c.connect("one")
    c.send(Connect("one", MQTT_5))
    disconnect = c.expect(Disconnect)
    assert disconnect.reason_code == ReasonCode.PROTOCOL_ERROR
    assert c.closed


def test_second_connect_closes_311_without_reply() -> None:
    h = Harness()
    c = h.client(MQTT_311)
    c.connect("one")
    c.send(Connect("one", MQTT_311))
    assert c.take() == []
    assert c.closed


def test_wrong_protocol_name_closes_without_connack() -> None:
    """MQTT-3.1.2-1."""
    h = Harness()
    c = h.client(MQTT_311)
    c.send(Connect("x", MQTT_311, protocol_name="hj"))
    assert c.take() == []
    assert c.closed


def test_unsupported_protocol_level_gets_311_connack_0x01() -> None:
    """MQTT-3.1.2-2: unacceptable protocol version, in a CONNACK every client can read."""
    h = Harness()
    c = h.client(MQTT_311)
    c.send(Connect("x", 6))
    assert c.take() == [ConnAck(False, 0x01)]
    assert c.closed


def _connect_31(c: FakeClient, client_id: str, clean: bool = True) -> list[Packet]:
    c.send(Connect(client_id, MQTT_31, clean, protocol_name="MQIsdp"))
    return c.take()


def test_mqtt_31_is_served_and_its_connack_has_no_session_present_flag() -> None:
    """MQTT 3.1 section 3.2: the CONNACK's first byte is reserved, even on resumption."""
    h = Harness()
    c = h.client(MQTT_31)
    assert _connect_31(c, "legacy", clean=False) == [ConnAck(False, 0)]
    c.subscribe("a/b", 1)
    c.drop()
    again = h.client(MQTT_31)
    assert _connect_31(again, "legacy", clean=False) == [ConnAck(False, 0)]
    pub = h.client()
    pub.connect("p")
    pub.publish("a/b", b"still subscribed", qos=1)
    assert [p.payload for p in again.publishes()] == [b"still subscribed"]


@pytest.mark.parametrize("client_id", ["", "x" * 24])
def test_mqtt_31_client_identifier_is_1_to_23_characters(client_id: str) -> None:
    """MQTT 3.1 section 3.1: otherwise CONNACK 2, identifier rejected."""
    h = Harness()
    c = h.client(MQTT_31)
    assert _connect_31(c, client_id) == [ConnAck(False, 2)]
    assert c.closed


def test_mqtt_31_longer_identifiers_when_configured() -> None:
    h = Harness(mqtt31_max_client_id=65535)
    c = h.client(MQTT_31)
    assert _connect_31(c, "x" * 40) == [ConnAck(False, 0)]


def test_mqtt_31_suback_has_no_failure_code() -> None:
    """A 3.1 SUBACK grants QoS 0-2 only: a refused subscription is not made, and the
    SUBACK grants what was asked (it cannot say otherwise)."""
    h = Harness(deny_subscriptions=("secret/#",))
    c = h.client(MQTT_31)
    _connect_31(c, "legacy")
    assert c.subscribe("secret/x", 1).reason_codes == (1,)
    assert h.broker.index.count == 0
    assert c.subscribe("open/x", 2).reason_codes == (2,)
    assert h.broker.index.count == 1


def test_reserved_connect_flag_is_malformed_v5_gets_connack_0x81() -> None:
    """MQTT-3.1.2-3."""
    h = Harness()
    c = h.client()
    # protocol name, level 5, flags 0x03 (clean start plus the reserved bit), keep alive,
    # empty properties, client id "a"
    c.send_raw(bytes.fromhex("100e00044d5154540503003c00000161"))
    ack = c.expect(ConnAck)
    assert ack.reason_code == ReasonCode.MALFORMED_PACKET
    assert c.closed


def test_zero_length_client_id_311_needs_clean_session() -> None:
    """MQTT-3.1.3-8: refused with 0x02 when CleanSession is 0."""
    h = Harness()
    c = h.client(MQTT_311)
    assert c.connect("", clean_start=False) == ConnAck(False, 0x02)
    assert c.closed
    c2 = h.client(MQTT_311)
    assert c2.connect("", clean_start=True) == ConnAck(False, 0)
    assert c2.conn.client_id  # assigned internally


def test_zero_length_client_id_v5_is_assigned_and_told() -> None:
    h = Harness()
    c = h.client()
    ack = c.connect("", clean_start=False)
    assert ack.reason_code == 0
    assigned = ack.properties.assigned_client_identifier
    assert assigned and assigned.startswith("ledge-")
    assert c.conn.client_id == assigned


def test_zero_length_client_id_refused_when_disabled() -> None:
    h = Harness(allow_zero_length_client_id=False)
    c = h.client()
    assert c.connect("").reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
    c311 = h.client(MQTT_311)
    assert c311.connect("").reason_code == 0x02


def test_session_present_follows_clean_start() -> None:
    """MQTT-3.2.2-2, -3: session present only when a session was resumed."""
    h = Harness()
    c = h.client()
    assert not c.connect("s", clean_start=False, session_expiry_interval=60).session_present
    c.send(Disconnect())
    c2 = h.client()
    assert c2.connect("s", clean_start=False, session_expiry_interval=60).session_present
    c2.send(Disconnect())
    c3 = h.client()
    assert not c3.connect("s", clean_start=True).session_present


def test_311_clean_session_0_resumes_session() -> None:
    h = Harness()
    c = h.client(MQTT_311)
    c.connect("p", clean_start=False)
    c.subscribe("t/#", 1)
    c.send(Disconnect())
    c2 = h.client(MQTT_311)
    assert c2.connect("p", clean_start=False).session_present
    assert "t/#" in h.broker.sessions["p"].subscriptions


def test_session_takeover_closes_old_connection_with_0x8e() -> None:
    """MQTT-3.1.4-3."""
    h = Harness()
    old = h.client()
    old.connect("dup", clean_start=False, session_expiry_interval=100)
    old.subscribe("a", 1)
    new = h.client()
    ack = new.connect("dup", clean_start=False, session_expiry_interval=100)
    assert ack.session_present
    assert old.expect(Disconnect).reason_code == ReasonCode.SESSION_TAKEN_OVER
    assert old.closed
    assert not new.closed
    assert h.broker.connected == 1
    # the subscription survived the takeover
    other = h.client()
    other.connect("pub")
    other.publish("a", b"hi", 1)
    assert [p.payload for p in new.publishes()] == [b"hi"]


def test_takeover_of_311_client_closes_it_silently() -> None:
    h = Harness()
    old = h.client(MQTT_311)
    old.connect("dup")
    new = h.client(MQTT_311)
    new.connect("dup")
    assert old.take() == []
    assert old.closed


def test_keep_alive_timeout_after_one_and_a_half_periods() -> None:
    """MQTT-3.1.2-22: closed when nothing arrives for 1.5 x keep alive."""
    h = Harness()
    c = h.client()
    c.connect("k", keep_alive=10)
    h.advance(14.9)
    assert not c.closed
    h.advance(0.2)
    assert c.expect(Disconnect).reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    assert c.closed


def test_keep_alive_is_reset_by_any_packet() -> None:
    h = Harness()
    c = h.client(MQTT_311)
    c.connect("k", keep_alive=10)
    for _ in range(5):
        h.advance(10)
        c.send(PingReq())
        assert c.take() == [PingResp()]
    assert not c.closed
    h.advance(15.1)
    assert c.closed


def test_keep_alive_zero_never_times_out() -> None:
    h = Harness()
    c = h.client()
    c.connect("k", keep_alive=0)
    h.advance(100_000)
    assert not c.closed


def test_server_keep_alive_when_client_asks_more_than_maximum() -> None:
    h = Harness(max_keepalive=60)
    c = h.client()
    ack = c.connect("k", keep_alive=120)
    assert ack.properties.server_keep_alive == 60
    h.advance(89)
    assert not c.closed
    h.advance(2)
    assert c.closed


def test_server_keep_alive_absent_when_within_maximum() -> None:
    h = Harness(max_keepalive=60)
    c = h.client()
    assert c.connect("k", keep_alive=30).properties.server_keep_alive is None


def test_connect_timeout_closes_silent_connections() -> None:
    h = Harness(connect_timeout=5)
    c = h.client()
    h.advance(4.9)
    assert not c.closed
    h.advance(0.2)
    assert c.closed


def test_connack_announces_limits_v5() -> None:
    h = Harness(receive_maximum=20, max_packet_size=4096, topic_alias_maximum=8)
    props = h.client().connect("x").properties
    assert props.receive_maximum == 20
    assert props.maximum_packet_size == 4096
    assert props.topic_alias_maximum == 8
    assert props.retain_available is None  # available (absent means yes)


def test_connack_says_what_is_switched_off() -> None:
    h = Harness(
        retain_available=False,
        wildcard_subscriptions=False,
        shared_subscriptions=False,
        subscription_identifiers=False,
    )
    props = h.client().connect("x").properties
    assert props.retain_available == 0
    assert props.wildcard_subscription_available == 0
    assert props.shared_subscription_available == 0
    assert props.subscription_identifiers_available == 0


def test_session_expiry_capped_and_told() -> None:
    h = Harness(max_session_expiry_interval=300)
    ack = h.client().connect("x", clean_start=False, session_expiry_interval=9999)
    assert ack.properties.session_expiry_interval == 300


def test_response_information_on_request() -> None:
    h = Harness()
    ack = h.client().connect("dev1", request_response_information=1)
    assert ack.properties.response_information == "response/dev1"
    assert h.client().connect("dev2").properties.response_information is None


def test_unsupported_authentication_method_refused_0x8c() -> None:
    h = Harness()
    c = h.client()
    ack = c.connect("x", authentication_method="SCRAM-SHA-1")
    assert ack.reason_code == ReasonCode.BAD_AUTHENTICATION_METHOD
    assert c.closed


def test_auth_packet_without_method_is_protocol_error() -> None:
    h = Harness()
    c = h.client()
    c.connect("x")
    c.send(Auth(ReasonCode.RE_AUTHENTICATE))
    assert c.expect(Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("version", "expected"),
    [(MQTT_5, ReasonCode.BAD_USER_NAME_OR_PASSWORD), (MQTT_311, 0x04)],
)
def test_bad_password_refused(version: int, expected: int) -> None:
    h = Harness(failed_login_delay=0)
    h.broker.authenticator = PasswordAuthenticator(False, {"ann": hash_password("secret")})
    c = h.client(version)
    assert c.connect("x", username="ann", password=b"wrong").reason_code == expected
    assert c.closed
    ok = h.client(version)
    assert ok.connect("y", username="ann", password=b"secret").reason_code == 0


@pytest.mark.parametrize(
    ("version", "expected"), [(MQTT_5, ReasonCode.NOT_AUTHORIZED), (MQTT_311, 0x05)]
)
def test_anonymous_refused_when_not_allowed(version: int, expected: int) -> None:
    h = Harness()
    h.broker.authenticator = PasswordAuthenticator(allow_anonymous=False)
    assert h.client(version).connect("x").reason_code == expected


@pytest.mark.parametrize(
    ("version", "expected"), [(MQTT_5, ReasonCode.QUOTA_EXCEEDED), (MQTT_311, 0x03)]
)
def test_connection_limit_refused(version: int, expected: int) -> None:
    h = Harness(max_connections=2)
    h.client().connect("a")
    h.client().connect("b")
    c = h.client(version)
    assert c.connect("c").reason_code == expected
    assert h.broker.stats.connections_refused == 1


def test_shutdown_sends_0x8b_to_v5_clients_and_closes_311_silently() -> None:
    h = Harness()
    v5 = h.client()
    v5.connect("five")
    v3 = h.client(MQTT_311)
    v3.connect("three")
    h.broker.shutdown(h.now)
    assert v5.expect(Disconnect).reason_code == ReasonCode.SERVER_SHUTTING_DOWN
    assert v3.take() == []
    assert v5.closed and v3.closed


def test_disconnect_cannot_raise_session_expiry_from_zero() -> None:
    """MQTT-3.14.2-2."""
    h = Harness()
    c = h.client()
    c.connect("z", session_expiry_interval=0)
    c.send(Disconnect(0, Properties(session_expiry_interval=30)))
    assert c.expect(Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR
    assert "z" not in h.broker.sessions


def test_publish_before_connack_is_never_processed() -> None:
    h = Harness()
    c = h.client(MQTT_311)
    c.send(Publish("t", b"x"))
    assert c.closed
    assert h.broker.stats.publish_received == 0


@pytest.mark.parametrize(
    ("will", "settings", "v5_code", "v3_code"),
    [
        (Will("state", b"x", retain=True), {"retain_available": False}, 0x9A, 0x03),
        (Will("$SYS/fake", b"x"), {}, ReasonCode.NOT_AUTHORIZED, 0x05),
        (Will("t", b"\xff", properties=Properties(payload_format_indicator=1)), {}, 0x99, None),
    ],
    ids=["retain-unavailable", "sys-topic", "payload-not-utf8"],
)
def test_unpublishable_will_refused_at_connect(
    will: Will, settings: dict[str, bool], v5_code: int, v3_code: int | None
) -> None:
    h = Harness(**settings)
    c = h.client()
    assert c.connect("w", will=will).reason_code == v5_code
    assert c.closed
    if v3_code is not None:
        c3 = h.client(MQTT_311)
        assert c3.connect("w3", will=will).reason_code == v3_code


@pytest.mark.parametrize(("asked", "has_reason"), [(None, True), (1, True), (0, False)])
def test_reason_strings_follow_request_problem_information(
    asked: int | None, has_reason: bool
) -> None:
    """MQTT 5.0 3.1.2.11.7: a client that sets Request Problem Information to 0 gets no
    reason strings, on its DISCONNECT and on a refusing CONNACK alike."""
    h = Harness()
    c = h.client()
    asks: dict[str, Any] = {} if asked is None else {"request_problem_information": asked}
    c.connect("c", **asks)
    c.send(Auth())  # AUTH without an authentication method: a protocol error
    disconnect = c.expect(Disconnect)
    assert disconnect.reason_code == ReasonCode.PROTOCOL_ERROR
    assert (disconnect.properties.reason_string is not None) is has_reason
    refused = Harness(allow_zero_length_client_id=False).client()
    refused.send(Connect("", MQTT_5, properties=Properties(**asks)))
    ack = refused.expect(ConnAck)
    assert ack.reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
    assert (ack.properties.reason_string is not None) is has_reason
