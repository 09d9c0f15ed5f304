"""Retained messages, wills (with delay), session expiry, $SYS."""

from __future__ import annotations

import pytest

from gateway.mqtt import MQTT_5, MQTT_311, Disconnect, Properties, PubAck, Publish, ReasonCode, Will
from tests.support.harness import FakeClient, Harness


def connected(h: Harness, client_id: str, version: int = MQTT_5, **kw: object) -> FakeClient:
    c = h.client(version)
    c.connect(client_id, **kw)  # type: ignore[arg-type]
    return c


# --------------------------------------------------------------------------- retained


def test_retained_delivered_on_subscribe_with_retain_flag_and_min_qos() -> None:
    """MQTT-3.3.1-9: RETAIN is 1 when sent because of a new subscription."""
    h = Harness()
    pub = connected(h, "p")
    pub.publish("r/0", b"zero", 0, retain=True)
    pub.publish("r/1", b"one", 1, retain=True)
    pub.publish("r/2", b"two", 2, retain=True)
    sub = connected(h, "s")
    sub.subscribe("r/+", 1)
    got = sorted((p.topic, p.payload, p.qos, p.retain) for p in sub.publishes())
    assert got == [
        ("r/0", b"zero", 0, True),
        ("r/1", b"one", 1, True),
        ("r/2", b"two", 1, True),
    ]


def test_retained_replaced_and_deleted_by_empty_payload() -> None:
    h = Harness()
    pub = connected(h, "p")
    pub.publish("r", b"old", retain=True)
    pub.publish("r", b"new", retain=True)
    s1 = connected(h, "s1")
    s1.subscribe("r")
    assert [p.payload for p in s1.publishes()] == [b"new"]
    pub.publish("r", b"", retain=True)
    s2 = connected(h, "s2")
    s2.subscribe("r")
    assert s2.publishes() == []
    assert len(h.broker.retained) == 0


def test_retained_keeps_v5_properties() -> None:
    h = Harness()
    pub = connected(h, "p")
    pub.publish("r", b"x", 1, retain=True, user_properties=(("a", "2"), ("c", "3")))
    sub = connected(h, "s")
    sub.subscribe("#")
    [msg] = sub.publishes()
    assert msg.properties.user_properties == (("a", "2"), ("c", "3"))


@pytest.mark.parametrize(("handling", "first", "again"), [(0, 1, 1), (1, 1, 0), (2, 0, 0)])
def test_retain_handling(handling: int, first: int, again: int) -> None:
    h = Harness()
    pub = connected(h, "p")
    pub.publish("rh", b"x", retain=True)
    sub = connected(h, "s")
    sub.subscribe("rh", 1, retain_handling=handling)
    assert len(sub.publishes()) == first
    sub.subscribe("rh", 1, retain_handling=handling)
    assert len(sub.publishes()) == again


def test_retained_not_sent_for_shared_subscriptions() -> None:
    h = Harness()
    connected(h, "p").publish("sr", b"x", retain=True)
    sub = connected(h, "s")
    sub.subscribe("$share/g/sr")
    assert sub.publishes() == []


def test_retained_expiry_applies() -> None:
    h = Harness()
    connected(h, "p").publish("re", b"x", 1, retain=True, message_expiry_interval=5)
    h.advance(3)
    s1 = connected(h, "s1")
    s1.subscribe("re", 1)
    [msg] = s1.publishes()
    assert msg.properties.message_expiry_interval == 2
    h.advance(3)
    s2 = connected(h, "s2")
    s2.subscribe("re", 1)
    assert s2.publishes() == []


def test_retained_wildcard_does_not_match_dollar_topics() -> None:
    h = Harness(sys_interval=10)
    h.advance(1)
    sub = connected(h, "s")
    sub.subscribe("#")
    assert sub.publishes() == []
    sys_sub = connected(h, "sys")
    sys_sub.subscribe("$SYS/broker/version")
    [msg] = sys_sub.publishes()
    assert msg.payload == b"ledge" and msg.retain


def test_retained_store_bound_refuses_new_topics_with_quota_exceeded() -> None:
    h = Harness(max_retained_messages=2)
    pub = connected(h, "p")
    pub.publish("r/1", b"x", 1, retain=True)
    pub.publish("r/2", b"x", 1, retain=True)
    pub.send(Publish("r/3", b"x", 1, retain=True, packet_id=50))
    assert pub.expect_ack(PubAck, 50).reason_code == ReasonCode.QUOTA_EXCEEDED
    pub.publish("r/1", b"replaced", 1, retain=True)  # replacing still works
    assert len(h.broker.retained) == 2
    assert h.broker.retained.refused == 1


# --------------------------------------------------------------------------- wills


def will_watcher(h: Harness, topic: str = "will/#") -> FakeClient:
    w = connected(h, "watcher")
    w.subscribe(topic, 2)
    return w


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_will_published_when_connection_drops(version: int) -> None:
    h = Harness()
    w = will_watcher(h)
    c = h.client(version)
    c.connect("dying", will=Will("will/dying", b"gone", 1, False))
    c.drop()
    [msg] = w.publishes()
    assert (msg.topic, msg.payload, msg.qos) == ("will/dying", b"gone", 1)


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_will_discarded_on_normal_disconnect(version: int) -> None:
    h = Harness()
    w = will_watcher(h)
    c = h.client(version)
    c.connect("polite", will=Will("will/polite", b"gone"))
    c.send(Disconnect())
    c.drop()
    assert w.publishes() == []


def test_disconnect_with_will_message_0x04_publishes_will() -> None:
    h = Harness()
    w = will_watcher(h)
    c = h.client()
    c.connect("x", will=Will("will/x", b"bye"))
    c.send(Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    assert [p.payload for p in w.publishes()] == [b"bye"]


def test_will_on_keep_alive_timeout_with_properties() -> None:
    h = Harness()
    w = will_watcher(h)
    c = h.client()
    props = Properties(user_properties=(("a", "2"), ("c", "3")), content_type="text/plain")
    c.connect("k", keep_alive=2, will=Will("will/k", b"timeout", 0, False, props))
    h.advance(3.1)
    [msg] = w.publishes()
    assert msg.properties.user_properties == (("a", "2"), ("c", "3"))
    assert msg.properties.content_type == "text/plain"


def test_retained_will() -> None:
    h = Harness()
    c = h.client()
    c.connect("x", will=Will("will/state", b"offline", 1, True))
    c.drop()
    later = connected(h, "later")
    later.subscribe("will/state", 1)
    [msg] = later.publishes()
    assert (msg.payload, msg.retain) == (b"offline", True)


def test_will_delay_publishes_after_delay() -> None:
    h = Harness()
    w = will_watcher(h)
    c = h.client()
    c.connect(
        "d",
        session_expiry_interval=5,
        will=Will("will/d", b"late", properties=Properties(will_delay_interval=3)),
    )
    c.drop()
    h.advance(2.9)
    assert w.publishes() == []
    h.advance(0.2)
    assert [p.payload for p in w.publishes()] == [b"late"]


def test_will_delay_capped_by_session_expiry() -> None:
    h = Harness()
    w = will_watcher(h)
    c = h.client()
    c.connect(
        "d",
        session_expiry_interval=2,
        will=Will("will/d", b"at expiry", properties=Properties(will_delay_interval=5)),
    )
    c.drop()
    h.advance(1.9)
    assert w.publishes() == []
    h.advance(0.2)
    assert [p.payload for p in w.publishes()] == [b"at expiry"]


def test_will_delay_with_session_expiry_zero_publishes_immediately() -> None:
    h = Harness()
    w = will_watcher(h)
    c = h.client()
    c.connect("d", will=Will("will/d", b"now", properties=Properties(will_delay_interval=5)))
    c.drop()
    assert [p.payload for p in w.publishes()] == [b"now"]


def test_delayed_will_cancelled_when_session_resumes() -> None:
    """MQTT-3.1.3-9."""
    h = Harness()
    w = will_watcher(h)
    c = h.client()
    c.connect(
        "d",
        clean_start=False,
        session_expiry_interval=100,
        will=Will("will/d", b"never", properties=Properties(will_delay_interval=10)),
    )
    c.drop()
    h.advance(5)
    back = h.client()
    assert back.connect("d", clean_start=False, session_expiry_interval=100).session_present
    h.advance(20)
    assert w.publishes() == []


def test_takeover_publishes_will_of_old_connection_without_delay() -> None:
    h = Harness()
    w = will_watcher(h)
    old = h.client(MQTT_311)
    old.connect("same", will=Will("will/same", b"taken over"))
    connected(h, "same", MQTT_311)
    assert [p.payload for p in w.publishes()] == [b"taken over"]


def test_will_respects_no_local_of_its_own_client() -> None:
    h = Harness()
    c = h.client()
    c.connect("self", clean_start=False, session_expiry_interval=100, will=Will("own/will", b"x"))
    c.subscribe("own/#", 1, no_local=True)
    c.drop()
    back = h.client()
    back.connect("self", clean_start=False, session_expiry_interval=100)
    assert back.publishes() == []


# --------------------------------------------------------------------------- session expiry


def test_session_expiry_zero_ends_at_disconnect() -> None:
    h = Harness()
    c = connected(h, "e", clean_start=False, session_expiry_interval=0)
    c.subscribe("x")
    c.send(Disconnect())
    assert "e" not in h.broker.sessions
    assert h.broker.index.count == 0


def test_session_expires_after_interval() -> None:
    h = Harness()
    c = connected(h, "e", clean_start=False, session_expiry_interval=5)
    c.subscribe("x")
    c.send(Disconnect())
    h.advance(4)
    assert "e" in h.broker.sessions
    h.advance(1.5)
    assert "e" not in h.broker.sessions
    assert h.broker.index.count == 0


def test_session_expiry_changed_at_disconnect() -> None:
    h = Harness()
    c = connected(h, "e", clean_start=False, session_expiry_interval=1)
    c.send(Disconnect(0, Properties(session_expiry_interval=5)))
    h.advance(3)
    back = h.client()
    assert back.connect("e", clean_start=False, session_expiry_interval=1).session_present
    back.send(Disconnect(0, Properties(session_expiry_interval=0)))
    assert "e" not in h.broker.sessions


def test_session_expiry_never_for_311_persistent_sessions() -> None:
    h = Harness()
    c = connected(h, "p", MQTT_311, clean_start=False)
    c.send(Disconnect())
    h.advance(10 * 365 * 86400)
    assert "p" in h.broker.sessions


def test_pruned_tree_after_session_churn() -> None:
    """Subscriptions of ended sessions leave no nodes behind."""
    h = Harness()
    for i in range(50):
        c = connected(h, f"c{i}")
        c.subscribe(f"churn/{i}/+/deep/#")
        c.subscribe(f"exact/{i}")
        c.drop()
    assert h.broker.index.count == 0
    assert h.broker.index.tree.node_count() == 0
    assert not h.broker.index.exact


# --------------------------------------------------------------------------- $SYS


def test_sys_topics_with_mosquitto_names() -> None:
    h = Harness(sys_interval=10)
    c = connected(h, "s")
    c.subscribe("$SYS/#")
    h.advance(10)
    topics = {p.topic: p.payload for p in c.publishes()}
    for name in (
        "$SYS/broker/version",
        "$SYS/broker/uptime",
        "$SYS/broker/clients/connected",
        "$SYS/broker/messages/received",
        "$SYS/broker/messages/sent",
        "$SYS/broker/bytes/received",
        "$SYS/broker/bytes/sent",
        "$SYS/broker/subscriptions/count",
        "$SYS/broker/retained messages/count",
        "$SYS/broker/load/messages/received/1min",
    ):
        assert name in topics, name
    assert topics["$SYS/broker/clients/connected"] == b"1"
    assert topics["$SYS/broker/subscriptions/count"] == b"1"


def test_sys_interval_zero_disables_sys() -> None:
    h = Harness(sys_interval=0)
    c = connected(h, "s")
    c.subscribe("$SYS/#")
    h.advance(100)
    assert c.publishes() == []


def test_wills_not_published_on_server_shutdown() -> None:
    h = Harness()
    w = will_watcher(h)
    c = h.client()
    c.connect("x", will=Will("will/x", b"gone"))
    h.broker.shutdown(h.now)
    assert w.take() == [
        Disconnect(
            ReasonCode.SERVER_SHUTTING_DOWN, Properties(reason_string="server shutting down")
        )
    ]
