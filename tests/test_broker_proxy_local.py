"""The broker's in-process API as its users see it: ``LocalClient`` (drivers, taps, the
cloud bridge), ``ProxyClient`` (the firmware bridge's MQTT-SN devices: counted clients,
refusals with their reason and kind, the store batch to wait for, checked subscriptions,
wills), a reload of authentication and ACLs (``policies.apply``) and the ACL file's
error messages and bounded decision cache. The pure core on a fake clock.
"""

from __future__ import annotations

import logging

import pytest

from gateway.broker.acl import DECISION_CACHE_SIZE, AclFileError, parse_acl_file
from gateway.broker.auth import ListenerPolicy, PasswordAuthenticator, hash_password
from gateway.broker.journal import Journal
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.broker.proxy import INVALID, NO_ROOM, NOT_AUTHORIZED, ProxyClient, Refusal
from gateway.broker.state import Session, Subscription
from gateway.mqtt import Disconnect, Properties, Publish
from gateway.mqtt.reason_codes import ReasonCode
from tests.support.harness import FakeClient, Harness

#: What a sink was handed: topic, payload, granted QoS, retain flag, subscription ids.
Got = list[tuple[str, bytes, int, bool, tuple[int, ...]]]


class Collector:
    """A sink that remembers what it was handed."""

    def __init__(self) -> None:
        self.got: Got = []

    def __call__(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
        self.got.append((msg.topic, msg.payload, qos, retain, sub_ids))

    def take(self) -> Got:
        out, self.got = self.got, []
        return out


def _sys(h: Harness, name: str) -> str:
    return h.broker.sys_values(h.now)["$SYS/broker/" + name]


def _connected(h: Harness, client_id: str) -> FakeClient:
    c = h.client()
    assert c.connect(client_id).reason_code == 0
    return c


def _received(c: FakeClient) -> list[tuple[str, bytes, int, bool]]:
    return [(p.topic, p.payload, p.qos, p.retain) for p in c.publishes()]


# ------------------------------------------------------------------ devices (ProxyClient)


def test_devices_count_as_connected_clients_once_each() -> None:
    """Else ``$SYS`` clients/connected, connections and clients/maximum lie about the
    MQTT-SN devices, and a device closed twice (lost, then its session ended) would
    make the connected count drift below the truth."""
    h = Harness()
    _connected(h, "mqtt1")
    assert (_sys(h, "clients/connected"), h.broker.stats.connections_total) == ("1", 1)
    dev1 = ProxyClient(h.broker, "dev1", Collector(), acl=None, now=h.now)
    dev2 = ProxyClient(h.broker, "dev2", Collector(), acl=None, now=h.now)
    ProxyClient(h.broker, "qos-1", Collector(), acl=None, now=h.now, counted=False)
    assert h.broker.stats.connections_total == 3
    assert _sys(h, "clients/connected") == "3"
    assert _sys(h, "clients/maximum") == "3"
    assert _sys(h, "clients/total") == "4"
    dev1.close(h.now)
    dev1.close(h.now)
    assert _sys(h, "clients/connected") == "2"
    assert _sys(h, "clients/total") == "3"
    assert _sys(h, "clients/maximum") == "3"  # the high-water mark stays
    dev2.close(h.now)
    assert _sys(h, "clients/connected") == "1"
    assert h.broker.stats.connections_total == 3


def test_a_device_publish_refusal_says_why_and_of_which_kind() -> None:
    """The firmware bridge picks the MQTT-SN return code from the kind and logs the
    reason: a wrong kind or a lost reason misleads the device and the operator."""
    h = Harness()
    acl = parse_acl_file("pattern readwrite dev/%c/#\n")
    dev = ProxyClient(h.broker, "dev1", Collector(), acl=acl, now=h.now)
    assert dev.refusal("dev/dev1/t", 1, True, 5) is None
    assert dev.refusal("$SYS/broker/uptime", 0, False, 3) == Refusal(
        "$SYS is read-only", NOT_AUTHORIZED
    )
    assert dev.refusal("$share/g/t", 0, False, 3) == Refusal("$share/ is not a topic", INVALID)
    assert dev.refusal("dev/dev2/t", 0, False, 3) == Refusal("not authorized", NOT_AUTHORIZED)
    # A full store refuses what it would have to keep: a retained message always.
    h.broker.store_full = True
    assert dev.refusal("dev/dev1/r", 1, True, 5) == Refusal(
        "store full: message on 'dev/dev1/r' for persistent sessions refused", NO_ROOM
    )
    assert dev.refusal("dev/dev1/r", 1, False, 5) is None  # no persistent subscriber
    h.broker.store_full = False
    # A bridge's outbox is asked with the message's size.
    h.broker.publish_gates.append(
        lambda topic, size: f"outbox full ({size} bytes)" if size > 8 else None
    )
    assert dev.refusal("dev/dev1/g", 1, False, 9) == Refusal("outbox full (9 bytes)", NO_ROOM)
    assert dev.refusal("dev/dev1/g", 1, False, 8) is None
    stats = h.broker.stats
    assert (stats.publish_received, stats.publish_denied) == (5, 5)


def test_publish_counted_returns_the_batch_only_when_something_was_stored() -> None:
    """A device acknowledged before its message is durable can lose it on a power cut;
    one made to wait for a batch that stores nothing waits for nothing (or forever)."""
    h = Harness()
    journal = Journal()
    journal.batch_id = 7
    h.broker.journal = journal
    sub = _connected(h, "sub")
    sub.subscribe("t/#", 1)
    dev = ProxyClient(h.broker, "dev1", Collector(), acl=None, now=h.now)
    # Without qos/retain: QoS 0, not retained, nothing stored.
    assert dev.publish_counted("t/a", b"1", h.now) is None
    assert _received(sub) == [("t/a", b"1", 0, False)]
    assert h.broker.retained.matching("t/#", h.now) == []
    assert journal.ops == []
    # A retained message is stored: the acknowledgement waits for batch 7.
    assert dev.publish_counted("t/r", b"2", h.now, qos=1, retain=True) == 7
    assert journal.ops
    # The batch is still open, but this message put nothing in it.
    assert dev.publish_counted("t/b", b"3", h.now, qos=1) is None
    received = sub.publishes()
    assert [(p.topic, p.qos) for p in received] == [("t/r", 1), ("t/b", 1)]
    assert h.broker.stats.publish_received == 3


def test_a_device_subscription_is_checked_as_an_mqtt_clients_is() -> None:
    """A device must not get around the broker's subscription rules, and the reason it
    is refused (logged by the firmware bridge) must say which rule refused it."""
    h = Harness(
        wildcard_subscriptions=False,
        deny_subscriptions=("secret/x",),
        max_subscriptions_per_client=2,
    )
    acl = parse_acl_file("pattern read dev/%c/#\npattern read secret/#\n")
    dev = ProxyClient(h.broker, "dev1", Collector(), acl=acl, now=h.now)
    assert dev.subscribe_checked("a/#/b", 0, h.now) == Refusal(
        "'#' must be the last level", INVALID
    )
    assert dev.subscribe_checked("dev/+/t", 0, h.now) == Refusal(
        "wildcard subscriptions are disabled", NOT_AUTHORIZED
    )
    assert dev.subscribe_checked("secret/x", 0, h.now) == Refusal(
        "denied by broker.deny_subscriptions ('secret/x')", NOT_AUTHORIZED
    )
    assert dev.subscribe_checked("other/t", 0, h.now) == Refusal(
        "not authorized by the ACL", NOT_AUTHORIZED
    )
    assert dev.subscribe_checked("dev/dev1/a", 0, h.now) is None
    assert dev.subscribe_checked("secret/y", 0, h.now) is None
    assert dev.subscribe_checked("dev/dev1/b", 0, h.now) == Refusal(
        "limit of 2 subscriptions per client", NO_ROOM
    )
    # Subscribing again to a filter it holds takes no new place.
    assert dev.subscribe_checked("dev/dev1/a", 1, h.now) is None
    assert sorted(dev.session.subscriptions) == ["dev/dev1/a", "secret/y"]
    assert _sys(h, "subscriptions/count") == "2"


def test_a_device_gets_the_retained_messages_it_may_read_once() -> None:
    """A device that subscribes must get each retained message it may read exactly once,
    at the QoS it asked for, and nothing the ACL keeps from it."""
    h = Harness()
    acl = parse_acl_file("pattern read dev/%c/#\npattern deny dev/%c/secret\n")
    sink = Collector()
    dev = ProxyClient(h.broker, "dev1", sink, acl=acl, now=h.now)
    expiring = Properties(message_expiry_interval=60)
    h.broker.publish_local("dev/dev1/state", b"on", h.now, qos=1, retain=True)
    h.broker.publish_local("dev/dev1/secret", b"pin", h.now, qos=1, retain=True)
    h.broker.publish_local("dev/dev1/cfg", b"c", h.now, retain=True, properties=expiring)
    h.broker.publish_local("dev/dev1/old", b"o", h.now - 70, retain=True, properties=expiring)
    assert dev.subscribe_checked("dev/dev1/#", 0, h.now) is None
    assert sorted(sink.take()) == [
        ("dev/dev1/cfg", b"c", 0, True, ()),
        ("dev/dev1/state", b"on", 0, True, ()),
    ]
    # Live messages arrive at the granted QoS 0, without the retain flag.
    h.broker.publish_local("dev/dev1/live", b"1", h.now, qos=1, retain=True)
    h.broker.publish_local("dev/dev1/secret", b"2", h.now, qos=1)
    assert sink.take() == [("dev/dev1/live", b"1", 0, False, ())]


def test_a_lost_devices_will_is_published_as_the_broker_publishes_wills(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A device's will must reach its subscribers under its client id, and a will it may
    not write ($SYS, $share/, the ACL) must be refused and counted."""
    caplog.set_level(logging.INFO, logger="ledge.broker")
    h = Harness()
    acl = parse_acl_file("pattern readwrite dev/%c/#\n")
    sub = _connected(h, "sub")
    sub.subscribe("#", 1)
    sub.subscribe("$SYS/#", 1)
    dev = ProxyClient(h.broker, "dev1", Collector(), acl=acl, now=h.now)
    assert dev.refusal("other/t", 0, False, 1) is not None
    assert h.broker.stats.publish_denied == 1
    dev.publish_will("$SYS/broker/uptime", b"0", 0, False, h.now)
    dev.publish_will("$share/g/t", b"0", 0, False, h.now)
    dev.publish_will("other/t", b"0", 0, False, h.now)
    assert h.broker.stats.publish_denied == 4
    assert sub.take() == []
    assert "not publishing will of 'dev1' on 'other/t': not authorized" in caplog.messages
    dev.publish_will("dev/dev1/status", b"lost", 1, True, h.now)
    assert "publishing will of 'dev1' on 'dev/dev1/status'" in caplog.messages
    [will] = sub.publishes()
    assert (will.topic, will.payload, will.qos, will.retain) == (
        "dev/dev1/status",
        b"lost",
        1,
        False,
    )
    sub.ack(will)
    [kept] = h.broker.retained.matching("dev/dev1/status", h.now)
    assert (kept.payload, kept.origin, kept.created) == (b"lost", "dev1", h.now)
    # A late subscriber gets it from the retained store, with the time it has been kept.
    h.advance(5)
    late = _connected(h, "late")
    late.subscribe("dev/#", 1)
    assert _received(late) == [("dev/dev1/status", b"lost", 1, True)]


# ------------------------------------------------------------------ in-process clients


def test_local_client_defaults_are_those_of_a_plain_subscriber_and_publisher() -> None:
    """A driver or tap that leaves the options out must get QoS 0, its own messages, no
    retain flag on live messages, and publish QoS 0 messages that are not retained."""
    h = Harness()
    sink = Collector()
    tap = LocalClient(h.broker, "tap", sink)
    tap.subscribe("t/#")
    sub = _connected(h, "sub")
    sub.subscribe("t/#", 2)
    tap.publish("t/own", b"1", h.now)
    h.broker.publish_local("t/r", b"2", h.now, qos=1, retain=True)
    assert sink.take() == [("t/own", b"1", 0, False, ()), ("t/r", b"2", 0, False, ())]
    received = sub.publishes()
    assert [(p.topic, p.qos, p.retain) for p in received] == [
        ("t/own", 0, False),
        ("t/r", 1, False),
    ]
    assert [m.topic for m in h.broker.retained.matching("t/#", h.now)] == ["t/r"]


def test_local_client_publishes_properties_and_names_bad_topics() -> None:
    """A driver's Message Expiry, content type and user properties must reach MQTT 5.0
    subscribers; a bad topic must be reported with the topic and what is wrong."""
    h = Harness()
    sub = _connected(h, "sub")
    sub.subscribe("t/#", 1)
    driver = LocalClient(h.broker, "driver")
    props = Properties(content_type="text/plain", user_properties=(("unit", "C"),))
    assert driver.publish("t/temp", b"21.5", h.now, qos=1, properties=props) == 1
    [msg] = sub.publishes()
    assert isinstance(msg, Publish)
    assert msg.properties.content_type == "text/plain"
    assert msg.properties.user_properties == (("unit", "C"),)
    with pytest.raises(ValueError) as bad_filter:
        driver.subscribe("a/#/b")
    assert str(bad_filter.value) == "topic filter 'a/#/b': '#' must be the last level"
    with pytest.raises(ValueError) as bad_topic:
        driver.publish("a/+", b"", h.now)
    assert str(bad_topic.value) == "topic 'a/+': topic name contains a wildcard"


def test_local_client_subscribing_again_replaces_its_subscription() -> None:
    """A tap that subscribes again with new options must get each message once, with the
    new QoS and identifier, not once per subscription it ever made."""
    h = Harness()
    sink = Collector()
    tap = LocalClient(h.broker, "tap", sink)
    tap.subscribe("t/#", 0, h.now, identifier=1)
    tap.subscribe("t/#", 1, h.now, identifier=2)
    assert h.broker.index.count == 1
    h.broker.publish_local("t/x", b"1", h.now, qos=1)
    assert sink.take() == [("t/x", b"1", 1, False, (2,))]
    assert tap.unsubscribe("t/#")
    h.broker.publish_local("t/x", b"2", h.now, qos=1)
    assert sink.take() == [] and h.broker.index.count == 0


def test_local_client_gets_retained_messages_on_subscription() -> None:
    """A tap must start from the current retained state: each unexpired message once, at
    the lower QoS, with its subscription identifier; a shared one gets none."""
    h = Harness()
    expiring = Properties(message_expiry_interval=10)
    h.broker.publish_local("r/a", b"A", h.now, qos=1, retain=True)
    h.broker.publish_local("r/b", b"B", h.now, qos=0, retain=True, properties=expiring)
    h.broker.publish_local("r/c", b"C", h.now - 20, qos=1, retain=True, properties=expiring)
    with_id = Collector()
    LocalClient(h.broker, "with-id", with_id).subscribe("r/#", 1, h.now, identifier=5)
    assert sorted(with_id.take()) == [("r/a", b"A", 1, True, (5,)), ("r/b", b"B", 0, True, (5,))]
    plain = Collector()
    LocalClient(h.broker, "plain", plain).subscribe("r/a", 0, h.now)
    assert plain.take() == [("r/a", b"A", 0, True, ())]
    shared = Collector()
    LocalClient(h.broker, "shared", shared).subscribe("$share/g/r/#", 1, h.now)
    assert shared.take() == []
    skipped = Collector()
    LocalClient(h.broker, "skip", skipped).subscribe("r/#", 1, h.now, retained=False)
    assert skipped.take() == []


# ------------------------------------------------------------------ reloads


def test_a_reload_gives_each_connected_client_its_listeners_rules() -> None:
    """After a reload each client must be held to its own listener's ACL (or the default
    one), in-process subscribers to none, and new clients to the new ones."""
    h = Harness()
    open_policy = ListenerPolicy(PasswordAuthenticator(True))
    h.broker.policies.update({"a": open_policy, "b": open_policy})
    tap_sink = Collector()
    tap = LocalClient(h.broker, "tap", tap_sink)  # the first session of all
    tap.subscribe("t/#", 0, h.now)
    ca = h.client(listener="a")
    ca.connect("ca")
    cb = h.client(listener="b")
    cb.connect("cb")
    cd = _connected(h, "cd")  # listener "test": no policy, the default ACL
    for c in (ca, cb, cd):
        assert c.subscribe("t/#").reason_codes == (0,)
    h.broker.set_policies(
        {
            "a": ListenerPolicy(PasswordAuthenticator(True), parse_acl_file("topic read t/a\n")),
            "b": ListenerPolicy(PasswordAuthenticator(True)),
        },
        parse_acl_file("pattern read t/%c\n"),
        h.now,
    )
    topics = ["t/a", "t/cd", "t/ce", "t/x"]
    for topic in topics:
        tap.publish(topic, b"1", h.now)
    assert [p.topic for p in ca.publishes()] == ["t/a"]
    assert [p.topic for p in cb.publishes()] == topics
    assert [p.topic for p in cd.publishes()] == ["t/cd"]
    assert [m[0] for m in tap_sink.take()] == topics
    ce = _connected(h, "ce")
    assert ce.subscribe("t/#").reason_codes == (0,)
    new_a = h.client(listener="a")
    new_a.connect("new-a")
    assert new_a.subscribe("t/x").reason_codes == (ReasonCode.NOT_AUTHORIZED,)
    for topic in topics:
        tap.publish(topic, b"2", h.now)
    assert [p.topic for p in ce.publishes()] == ["t/ce"]


def test_a_reload_leaves_sessions_restored_from_the_store_to_their_next_connect() -> None:
    """A restored session's listener is unknown until its client is back: held to the
    default ACL by a reload, it would lose messages its own listener lets it read."""
    h = Harness()
    restored = Session("s", expiry_interval=600)
    restored.subscriptions["q/#"] = Subscription("q/#", 1)
    h.broker.adopt_session(restored, h.now)
    own_acl = parse_acl_file("topic read q/#\n")
    h.broker.set_policies(
        {"p": ListenerPolicy(PasswordAuthenticator(True), own_acl)},
        parse_acl_file("topic read q/ok\n"),
        h.now,
    )
    h.broker.publish_local("q/ok", b"1", h.now, qos=1)
    h.broker.publish_local("q/no", b"2", h.now, qos=1)
    back = h.client(listener="p")
    assert back.connect("s", clean_start=False, session_expiry_interval=600).session_present
    assert sorted(p.topic for p in back.publishes()) == ["q/no", "q/ok"]


def test_a_reload_disconnects_exactly_who_the_password_file_no_longer_lets_in() -> None:
    """A reload must end the sessions of removed users and of anonymous clients when
    they are no longer allowed (0x98, saying why), and leave everyone else alone."""
    h = Harness(max_connections=3)
    h.broker.policies["l"] = ListenerPolicy(PasswordAuthenticator(True))
    ann = h.client(listener="l")
    ann.connect("ann-1", username="ann", password=b"pw")
    bob = h.client(listener="l")
    bob.connect("bob-1", username="bob", password=b"pw")
    tmp = h.client(listener="l")
    tmp.connect("tmp")
    spare = h.client(listener="l")  # every slot in use: a refusal slot
    assert spare.conn.overflow
    tmp.drop()
    anon = h.client(listener="l")  # opened after the refusal slot
    anon.connect("anon")
    users = {"ann": hash_password("pw", 1)}
    h.broker.set_policies({"l": ListenerPolicy(PasswordAuthenticator(False, users))}, None, h.now)
    gone = {c.conn.client_id: c.expect(Disconnect) for c in (bob, anon)}
    assert {k: (d.reason_code, d.properties.reason_string) for k, d in gone.items()} == {
        "bob-1": (
            ReasonCode.ADMINISTRATIVE_ACTION,
            "user 'bob' is no longer in the password file",
        ),
        "anon": (ReasonCode.ADMINISTRATIVE_ACTION, "anonymous clients are no longer allowed"),
    }
    assert bob.closed and anon.closed
    assert not ann.closed and ann.take() == []
    assert _sys(h, "clients/connected") == "1"


# ------------------------------------------------------------------ the ACL file


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("user\n", "line 1: user without a user name"),
        (
            "topic read a\nsubscribe b\n",
            "line 2: unknown keyword 'subscribe' (expected topic, pattern or user)",
        ),
        (
            "k" * 32 + " a\n",
            f"line 1: unknown keyword {'k' * 32!r} (expected topic, pattern or user)",
        ),
        ("k" * 33 + " a\n", "line 1: unknown keyword (expected topic, pattern or user)"),
        (
            "$7$101$c2FsdA==$aGFzaA== a\n",
            "line 1: unknown keyword (expected topic, pattern or user)",
        ),
        ("ann:pw\n", "line 1: unknown keyword (expected topic, pattern or user)"),
        (
            "topic wirte a/b\n",
            "line 1: unknown access 'wirte' (expected read, write, readwrite or deny)",
        ),
        (
            "topic $6$salt a/b\n",
            "line 1: unknown access (expected read, write, readwrite or deny)",
        ),
    ],
)
def test_acl_file_errors_quote_only_what_looks_like_a_word(text: str, message: str) -> None:
    """An operator must see which word is wrong, but a password file given by mistake
    must not have its hashes copied into the log."""
    with pytest.raises(AclFileError) as info:
        parse_acl_file(text)
    assert str(info.value) == message


def test_patterns_apply_to_every_identity_without_a_wildcard() -> None:
    """Only ``+`` and ``#`` in a client id or user name take the patterns away: any other
    character (a capital X included) must keep them, or devices lose their topics."""
    acl = parse_acl_file("pattern readwrite dev/%c/#\npattern readwrite users/%u/#\n")
    rules = acl.rules_for("Xavier", "X1")
    assert rules.can_write("dev/X1/t") and rules.can_read("users/Xavier/t")
    assert not rules.can_read("dev/X2/t")
    wild = acl.rules_for("a+b", "c1")
    assert not wild.can_read("dev/c1/t") and not wild.can_write("users/a+b/t")


def test_the_decision_caches_never_hold_more_than_their_bound() -> None:
    """A client that touches ever new topics must not grow its ACL caches without
    bound: the bound is ``DECISION_CACHE_SIZE`` decisions per direction."""
    rules = parse_acl_file("topic readwrite a/#").rules_for(None, "c")
    for i in range(DECISION_CACHE_SIZE + 1):
        assert rules.can_read(f"a/{i}") and rules.can_write(f"a/{i}")
        assert len(rules._read) <= DECISION_CACHE_SIZE
        assert len(rules._write) <= DECISION_CACHE_SIZE
    assert not rules.can_read("b") and not rules.can_write("b")
