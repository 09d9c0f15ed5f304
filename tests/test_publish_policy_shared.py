"""One PUBLISH policy for every publisher: MQTT clients (fast and general path) and
the firmware bridge's MQTT-SN devices get the same verdicts from the same function
(``publish_policy.authorize``); in-process publishers go through
``publish_policy.publish_local``, which skips the steps it names, for the reasons it
names, and keeps the retained store's bounds."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.broker import publish_policy
from gateway.broker.acl import parse_acl_file
from gateway.broker.local import LocalClient
from gateway.broker.proxy import INVALID, NO_ROOM, NOT_AUTHORIZED, ProxyClient
from gateway.mqtt import MQTT_5, PubAck, Publish
from gateway.mqtt.reason_codes import ReasonCode

from .support.harness import Harness

ACL = "topic readwrite open/#\ntopic readwrite $SYS/#\ntopic readwrite $share/#\n"


def refusing_gate(topic: str, size: int) -> str | None:
    return "outbox full" if topic.startswith("open/full") else None


#: topic, QoS -> the MQTT 5.0 PUBACK code and the MQTT-SN kind (None: accepted).
CASES = [
    ("$SYS/broker/uptime", 1, ReasonCode.NOT_AUTHORIZED, NOT_AUTHORIZED),
    ("$share/g/t", 1, ReasonCode.TOPIC_NAME_INVALID, INVALID),
    ("closed/t", 1, ReasonCode.NOT_AUTHORIZED, NOT_AUTHORIZED),
    ("open/full", 1, ReasonCode.QUOTA_EXCEEDED, NO_ROOM),
    ("open/full", 0, None, None),  # the gates are for QoS 1/2
    ("open/t", 1, None, None),
]


def _harness() -> Harness:
    h = Harness()
    h.broker.acl = parse_acl_file(ACL)
    h.broker.publish_gates.append(refusing_gate)
    return h


@pytest.mark.parametrize(("topic", "qos", "code", "kind"), CASES)
@pytest.mark.parametrize("retain", [False, True], ids=["fast path", "general path"])
def test_an_mqtt_client_and_a_device_get_the_same_verdict(
    topic: str, qos: int, code: int | None, kind: str | None, retain: bool
) -> None:
    mqtt = _harness()
    pub = mqtt.client(MQTT_5)
    pub.connect("pub")
    pub.send(Publish(topic, b"m", qos, retain, packet_id=qos))
    if qos:
        assert pub.take() == [
            PubAck(1, code if code is not None else ReasonCode.NO_MATCHING_SUBSCRIBERS)
        ]

    sn = _harness()
    acl = sn.broker.acl
    device = ProxyClient(sn.broker, "pub", lambda *a: None, acl=acl, now=sn.now)
    refusal = device.refusal(topic, qos, retain, 1)
    assert (refusal.kind if refusal is not None else None) == kind
    if refusal is None:
        device.publish_counted(topic, b"m", sn.now, qos=qos, retain=retain)
    counted = [(h.broker.stats.publish_received, h.broker.stats.publish_denied) for h in (mqtt, sn)]
    assert counted[0] == counted[1] == (1, 0 if code is None else 1)


def test_the_verdicts_come_from_one_function(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    real = publish_policy.authorize

    def spy(ctx: Any, client_id: str, *args: Any) -> Any:
        calls.append((client_id, args[1]))
        return real(ctx, client_id, *args)

    monkeypatch.setattr(publish_policy, "authorize", spy)
    h = _harness()
    pub = h.client(MQTT_5)
    pub.connect("pub")
    pub.send(Publish("open/a", b"m", 0))  # the fast path
    pub.send(Publish("open/b", b"m", 1, True, packet_id=1))  # decoded: the general path
    device = ProxyClient(h.broker, "dev", lambda *a: None, acl=None, now=h.now)
    device.refusal("open/c", 1, False, 1)
    assert calls == [("pub", "open/a"), ("pub", "open/b"), ("dev", "open/c")]


def test_in_process_publishers_share_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    origins: list[str | None] = []
    real = publish_policy.publish_local

    def spy(ctx: Any, topic: str, *args: Any, **kwargs: Any) -> int:
        origins.append(kwargs.get("origin"))
        return real(ctx, topic, *args, **kwargs)

    monkeypatch.setattr(publish_policy, "publish_local", spy)
    h = Harness(sys_interval=10)
    LocalClient(h.broker, "driver").publish("d", b"v", h.now)
    h.broker.publish_local("b", b"v", h.now, origin="bridge")
    assert origins == ["driver", "bridge"]
    h.advance(10)  # $SYS values, published by the broker itself
    assert len(origins) > 2 and set(origins[2:]) == {None}


def test_in_process_publishers_keep_the_retained_bounds_and_skip_the_rest() -> None:
    h = Harness(max_retained_messages=2)
    driver = LocalClient(h.broker, "driver")
    for i in range(3):
        driver.publish(f"r/{i}", b"v", h.now, retain=True)
    h.broker.publish_local("r/3", b"v", h.now, retain=True)
    assert len(h.broker.retained) == 2  # the same RetainedStore bound as for clients
    # Not counted as received PUBLISH packets, not refused by the gates or the ACL:
    h.broker.acl = parse_acl_file("topic read r/#\n")
    h.broker.publish_gates.append(lambda topic, size: "refused")
    watcher = LocalClient(h.broker, "watcher")
    got: list[str] = []
    watcher.session.sink = lambda msg, *_: got.append(msg.topic)
    watcher.subscribe("x/#", 1, h.now)
    assert driver.publish("x/1", b"v", h.now, qos=1) == 1
    assert got == ["x/1"]
    assert (h.broker.stats.publish_received, h.broker.stats.publish_denied) == (0, 0)


@pytest.mark.parametrize("acl", [None, "topic readwrite open/#\n"])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("store_full", [False, True])
def test_what_authorize_refuses_the_hot_path_guard_lets_through(
    acl: str | None, gated: bool, store_full: bool
) -> None:
    """``receive`` skips ``authorize`` when ``may_refuse`` (inlined) says it cannot
    refuse: every refusal must be one the guard lets through."""
    h = Harness()
    h.broker.store_full = store_full
    if gated:
        h.broker.publish_gates.append(lambda topic, size: "no")
    rules = parse_acl_file(acl).rules_for(None, "c") if acl else None
    h.client().connect("p", clean_start=False, session_expiry_interval=60)  # persisted
    h.broker.index.route("open/x")
    for topic in [
        "open/x",
        "closed/x",
        "$SYS/broker/x",
        "$SYS/broker/connection/c/state",
        "$share/g/t",
        "$x",
        "#x",
    ]:
        for qos in (0, 1, 2):
            for retain in (False, True):
                verdict = publish_policy.authorize(h.broker, "c", rules, topic, qos, retain, 1)
                if verdict is not None:
                    assert publish_policy.may_refuse(h.broker, rules, topic, qos), (topic, qos)
