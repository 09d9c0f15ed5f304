"""The health verdict (``gateway.cli.verdict``): observed facts in, one check per
listener, bridge, sensor and MQTT-SN transport out, each rule pinned by a fact that
passes and one that fails."""

from __future__ import annotations

import json

import pytest

from gateway.cli.verdict import (
    BridgeFact,
    Check,
    ListenerFact,
    MqttSnFact,
    SensorFact,
    healthy,
    report,
    text,
    verdict,
)

TCP = ListenerFact("", "127.0.0.1:1883", 0)


def one(**facts: object) -> Check:
    checks = verdict(**facts)  # type: ignore[arg-type]
    assert len(checks) == 1
    return checks[0]


def test_a_listener_that_accepts_the_connect_is_healthy() -> None:
    check = one(listeners=[TCP])
    assert check == Check("listener 127.0.0.1:1883", True, "127.0.0.1:1883 accepted a CONNECT")


@pytest.mark.parametrize(("version", "code"), [(4, 4), (4, 5), (5, 0x86), (5, 0x87), (5, 0x9F)])
def test_a_refused_login_still_proves_the_listener_serves(version: int, code: int) -> None:
    check = one(listeners=[ListenerFact("lan", "127.0.0.1:1883", code, version)])  # type: ignore[arg-type]
    assert check.ok and check.name == "listener lan"
    assert f"CONNACK 0x{code:02X}" in check.detail and "LEDGE_HEALTH_USERNAME" in check.detail


@pytest.mark.parametrize(("version", "code"), [(4, 3), (5, 0x88), (5, 0x89)])
def test_a_server_unavailable_or_busy_does_not_serve(version: int, code: int) -> None:
    check = one(listeners=[ListenerFact("", "127.0.0.1:1883", code, version)])  # type: ignore[arg-type]
    assert not check.ok and "not serving" in check.detail


def test_no_connack_names_the_address_and_why() -> None:
    fact = ListenerFact("", "127.0.0.1:8883", None, error="nothing listens", via="TLS")
    check = one(listeners=[fact])
    assert check == Check(
        "listener 127.0.0.1:8883", False, "no CONNACK from 127.0.0.1:8883 (TLS): nothing listens"
    )


def test_a_completed_tls_handshake_is_enough_when_a_client_certificate_is_required() -> None:
    fact = ListenerFact("", "127.0.0.1:8883", None, via="TLS", handshake=True)
    assert one(listeners=[fact]).ok


def test_a_bridge_is_healthy_only_when_connected() -> None:
    assert one(listeners=[], bridges=[BridgeFact("cloud", "connected")]).ok
    down = one(listeners=[], bridges=[BridgeFact("cloud", "connecting")])
    assert down == Check("bridge cloud", False, "connecting, not connected")
    missing = one(listeners=[], bridges=[BridgeFact("cloud", None)])
    assert not missing.ok and "not reported" in missing.detail


def test_state_that_cannot_be_read_fails_bridges_and_sensors_with_the_reason() -> None:
    checks = verdict(
        [],
        [BridgeFact("cloud", "connected")],
        [SensorFact("serial", "env", 10, 1, True, True)],
        unreadable="login refused",
    )
    assert [c.ok for c in checks] == [False, False]
    assert all("login refused" in c.detail for c in checks)


def serial(silent: float | None, heard: bool = True, **kw: object) -> SensorFact:
    return SensorFact("serial", "env", 10, silent, heard, True, "serial[0].heard_within", **kw)  # type: ignore[arg-type]


def test_a_sensor_heard_within_its_interval_passes_and_one_silent_longer_fails() -> None:
    ok = one(listeners=[], sensors=[serial(9.6)])
    assert ok == Check("serial env", True, "heard 10 s ago (serial[0].heard_within 10 s)")
    late = one(listeners=[], sensors=[serial(10.5)])
    assert late == Check("serial env", False, "silent for 10 s (serial[0].heard_within 10 s)")


def test_the_grace_covers_how_stale_the_reported_silence_may_be() -> None:
    assert not one(listeners=[], sensors=[serial(11.5)]).ok
    assert one(listeners=[], sensors=[serial(11.5)], grace=2.0).ok


def test_a_sensor_never_heard_is_given_its_interval_from_the_start() -> None:
    young = one(listeners=[], sensors=[serial(4, heard=False)])
    assert young.ok and "not heard yet, 4 s since start" in young.detail
    old = one(listeners=[], sensors=[serial(40, heard=False)])
    assert not old.ok and "not heard since the gateway started 40 s ago" in old.detail


def test_a_closed_port_fails_whatever_the_interval() -> None:
    for interval in (0.0, 10.0):
        fact = SensorFact("serial", "env", interval, 0, True, connected=False)
        assert one(listeners=[], sensors=[fact]) == Check("serial env", False, "port not open")


def test_without_an_interval_an_open_port_is_enough() -> None:
    fact = SensorFact("serial", "env", 0, 5000, True, connected=True)
    assert one(listeners=[], sensors=[fact]).ok


def test_unknown_silence_fails_with_why() -> None:
    check = one(listeners=[], sensors=[serial(None, missing="broker.sys_interval = 0")])
    assert not check.ok and "broker.sys_interval = 0" in check.detail


def test_an_unchecked_sensor_passes_saying_why() -> None:
    fact = SensorFact("ble", "keys", 0, None, False, unchecked="a beacon reports presence")
    assert one(listeners=[], sensors=[fact], unreadable="x") == Check(
        "ble keys", True, "not checked: a beacon reports presence"
    )


def test_mqttsn_answers_searchgw_or_fails() -> None:
    assert one(listeners=[], mqttsn=[MqttSnFact("127.0.0.1:1884", True)]).ok
    check = one(listeners=[], mqttsn=[MqttSnFact("127.0.0.1:1884", False, "nothing listens")])
    assert check == Check(
        "mqttsn 127.0.0.1:1884", False, "no GWINFO for a SEARCHGW: nothing listens"
    )


def test_the_order_is_listeners_bridges_sensors_mqttsn_and_all_must_pass() -> None:
    checks = verdict(
        [TCP],
        [BridgeFact("cloud", "connected")],
        [serial(1)],
        [MqttSnFact("127.0.0.1:1884", True)],
    )
    assert [c.name.split()[0] for c in checks] == ["listener", "bridge", "serial", "mqttsn"]
    assert healthy(checks)
    assert not healthy([*checks, Check("bridge b", False, "down")])
    assert healthy([])


def test_text_and_json_say_the_same() -> None:
    checks = [Check("listener a", True, "fine"), Check("bridge b", False, "connecting")]
    assert text(checks) == "ok     listener a: fine\nFAILED bridge b: connecting\n"
    doc = json.loads(json.dumps(report(checks, 1.234)))
    assert doc == {
        "healthy": False,
        "elapsed_seconds": 1.2,
        "checks": [
            {"name": "listener a", "ok": True, "detail": "fine"},
            {"name": "bridge b", "ok": False, "detail": "connecting"},
        ],
    }
