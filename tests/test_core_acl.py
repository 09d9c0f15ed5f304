"""The ACL file (mosquitto's syntax and semantics) and how the core applies it:
PUBLISH, SUBSCRIBE, every delivery, retained messages, wills, reloads."""

from __future__ import annotations

import itertools

import pytest

from gateway.broker.acl import (
    DECISION_CACHE_SIZE,
    READ,
    WRITE,
    AclFileError,
    overlaps,
    parse_acl_file,
)
from gateway.broker.auth import ListenerPolicy, PasswordAuthenticator
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    ConnAck,
    Disconnect,
    Properties,
    PubAck,
    Publish,
    PubRec,
    Will,
)
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.topics import filter_error, matches
from tests.support.harness import FakeClient, Harness

# ----------------------------------------------------------------------- the file


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("topic read a\nsubscribe b\n", 2, "unknown keyword 'subscribe'"),
        ("# c\n\ntopic wirte a/b\n", 3, "unknown access 'wirte'"),
        ("topic read a/#/b\n", 1, "'#' must be the last level"),
        ("user\n", 1, "user without a user name"),
        ("pattern\n", 1, "pattern without a topic"),
    ],
)
def test_acl_file_errors_name_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(AclFileError) as info:
        parse_acl_file(text)
    assert info.value.line == line
    assert message in str(info.value)


ACL = """\
# anonymous clients: the lines before the first user line
topic read public/#

user ann
topic readwrite ann/#
topic sensors/+/temp
topic read #
topic deny secret/#

user bob
topic write bob/out
topic read $SYS/#

pattern readwrite dev/%c/#
pattern read users/%u/#
"""


@pytest.mark.parametrize(
    ("username", "client_id", "topic", "access", "allowed"),
    [
        # anonymous entries are for anonymous clients only
        (None, "x", "public/a", READ, True),
        (None, "x", "public/a", WRITE, False),
        ("bob", "x", "public/a", READ, False),
        # no access word: read and write
        ("ann", "x", "sensors/1/temp", WRITE, True),
        ("ann", "x", "sensors/1/temp", READ, True),
        # deny comes first, wherever it is written
        ("ann", "x", "secret/plans", READ, False),
        ("ann", "x", "anything/else", READ, True),
        ("ann", "x", "anything/else", WRITE, False),
        # '$' topics need an entry that starts with '$'
        ("ann", "x", "$SYS/broker/uptime", READ, False),
        ("bob", "x", "$SYS/broker/uptime", READ, True),
        # patterns apply to everyone, with whole-level substitution
        ("bob", "b1", "dev/b1/state", WRITE, True),
        ("bob", "b1", "dev/b2/state", WRITE, False),
        (None, "anon1", "dev/anon1/state", WRITE, True),
        ("bob", "b1", "users/bob/inbox", READ, True),
        (None, "anon1", "users/anon1/inbox", READ, False),  # %u needs a user name
        # an identity that is not a single level matches no pattern
        ("bob", "a/b", "dev/a/b/state", WRITE, False),
        # an identity with a wildcard gets nothing through patterns, its own entries stay
        ("bob", "b#", "dev/b#/x", WRITE, False),
        ("bob", "b+", "bob/out", WRITE, True),
        # an unknown user has no entries but the patterns
        ("carol", "c1", "public/a", READ, False),
        ("carol", "c1", "dev/c1/x", READ, True),
    ],
)
def test_acl_decisions_follow_mosquitto(
    username: str | None, client_id: str, topic: str, access: int, allowed: bool
) -> None:
    rules = parse_acl_file(ACL).rules_for(username, client_id)
    decide = rules.can_read if access == READ else rules.can_write
    assert decide(topic) is allowed


def test_a_users_own_grant_wins_over_a_pattern_deny() -> None:
    """Mosquitto consults the client's own entries before the patterns."""
    rules = parse_acl_file("pattern deny #\nuser ann\ntopic read a\n").rules_for("ann", "c")
    assert rules.can_read("a")
    assert not rules.can_read("b")


@pytest.mark.parametrize(
    ("acl", "topic_filter", "granted"),
    [
        ("topic read a/#", "a/b", True),
        ("topic read a/#", "#", True),  # overlaps: deliveries are filtered
        ("topic read a/#", "b/#", False),
        ("topic write a/#", "a/b", False),  # write does not let you read
        ("topic read #\ntopic deny secret/#", "secret/+", False),
        ("topic read #\ntopic deny secret/#", "+/x", True),
        ("topic read #", "$SYS/#", False),
        ("topic read $SYS/broker/#", "$SYS/#", True),
    ],
)
def test_subscribe_is_refused_only_when_nothing_could_be_delivered(
    acl: str, topic_filter: str, granted: bool
) -> None:
    rules = parse_acl_file(acl).rules_for(None, "c")
    assert rules.can_subscribe(topic_filter) is granted


LEVELS = ["a", "b", "$x", ""]
FILTER_LEVELS = ["a", "b", "$x", "+", "#"]


def _all(levels: list[str], most: int) -> list[str]:
    out: list[str] = []
    for n in range(1, most + 1):
        out.extend("/".join(p) for p in itertools.product(levels, repeat=n))
    return out


def test_overlaps_agrees_with_an_exhaustive_search() -> None:
    """Two filters overlap exactly when some topic matches both (checked over every
    topic of up to four levels from a small alphabet)."""
    topics = [t for t in _all(LEVELS, 4) if t]
    filters = [f for f in _all(FILTER_LEVELS, 3) if filter_error(f) is None]
    for a in filters:
        hits_a = {t for t in topics if matches(a, t)}
        for b in filters:
            expected = any(matches(b, t) for t in hits_a)
            assert overlaps(a, b) is expected, (a, b)


def test_decisions_are_cached_and_the_cache_is_bounded() -> None:
    rules = parse_acl_file("topic read a/#").rules_for(None, "c")
    for i in range(DECISION_CACHE_SIZE * 3):
        assert rules.can_read(f"a/{i}")
    assert 0 < len(rules._read) <= DECISION_CACHE_SIZE


# ----------------------------------------------------------------------- the core


def _harness(acl: str, **settings: object) -> Harness:
    h = Harness(**settings)
    h.broker.acl = parse_acl_file(acl)
    return h


def _as(h: Harness, username: str | None, client_id: str, version: int = MQTT_5) -> FakeClient:
    c = h.client(version)
    assert c.connect(client_id, username=username, password=b"x").reason_code == 0
    return c


PUBSUB = """\
user pub
topic write allowed/#
topic write stuff/#
user sub
topic read #
"""


@pytest.mark.parametrize("qos", [1, 2])
def test_unauthorized_publish_gets_0x87_and_is_not_delivered_v5(qos: int) -> None:
    h = _harness(PUBSUB)
    sub = _as(h, "sub", "s")
    sub.subscribe("#", 2)
    pub = _as(h, "pub", "p")
    pid = pub.pid()
    pub.send(Publish("forbidden/x", b"no", qos, packet_id=pid))
    kind: type[PubAck] | type[PubRec] = PubAck if qos == 1 else PubRec
    assert pub.expect_ack(kind, pid).reason_code == ReasonCode.NOT_AUTHORIZED
    pub.publish("allowed/x", b"yes", qos)
    assert [p.topic for p in sub.publishes()] == ["allowed/x"]
    assert h.broker.stats.publish_denied == 1
    assert not pub.closed


def test_unauthorized_publish_is_dropped_silently_on_311_and_qos_0() -> None:
    h = _harness(PUBSUB)
    sub = _as(h, "sub", "s")
    sub.subscribe("#", 1)
    pub3 = _as(h, "pub", "p3", MQTT_311)
    pub3.publish("forbidden/a", b"1", 1)  # acknowledged: 3.1.1 has no refusal code
    pub3.publish("forbidden/b", b"2", 0)
    pub3.publish("forbidden/c", b"3", 0, retain=True)  # the general (decoding) path
    pub5 = _as(h, "pub", "p5")
    pub5.publish("forbidden/d", b"4", 0)
    pub5.publish("allowed/e", b"5", 0)
    assert [p.topic for p in sub.publishes()] == ["allowed/e"]
    assert h.broker.stats.publish_denied == 4
    assert not pub3.closed and not pub5.closed
    assert "forbidden/c" not in {m.topic for m in h.broker.retained.matching("#", h.now)}


@pytest.mark.parametrize(("version", "code"), [(MQTT_5, 0x87), (MQTT_311, 0x80)])
def test_subscription_nothing_could_be_delivered_to_is_refused(version: int, code: int) -> None:
    h = _harness("user ann\ntopic read ann/#\n")
    c = _as(h, "ann", "a", version)
    assert c.subscribe("bob/#").reason_codes == (code,)
    assert c.subscribe("ann/#", 1).reason_codes == (1,)


def test_a_wide_subscription_receives_only_what_the_client_may_read() -> None:
    h = _harness("user sub\ntopic read a/#\ntopic deny a/secret\nuser pub\ntopic write #\n")
    sub = _as(h, "sub", "s")
    assert sub.subscribe("#").reason_codes == (0,)
    pub = _as(h, "pub", "p")
    for t in ("a/1", "b/1", "a/secret", "a/2"):
        pub.publish(t, b"x")
    assert [p.topic for p in sub.publishes()] == ["a/1", "a/2"]


def test_retained_messages_are_filtered_on_subscription() -> None:
    h = _harness("user sub\ntopic read keep/+/ok\nuser pub\ntopic write #\n")
    pub = _as(h, "pub", "p")
    pub.publish("keep/1/ok", b"1", retain=True)
    pub.publish("keep/1/no", b"2", retain=True)
    sub = _as(h, "sub", "s")
    sub.subscribe("keep/#")
    assert [(p.topic, p.retain) for p in sub.publishes()] == [("keep/1/ok", True)]


@pytest.mark.parametrize(("version", "code"), [(MQTT_5, 0x87), (MQTT_311, 0x05)])
def test_will_on_a_topic_the_client_may_not_write_is_refused_at_connect(
    version: int, code: int
) -> None:
    h = _harness("user w\ntopic write status/w\n")
    c = h.client(version)
    ack = c.connect("w1", username="w", password=b"x", will=Will("status/other", b"gone"))
    assert ack.reason_code == code
    assert c.closed
    ok = h.client(version)
    assert ok.connect("w2", username="w", will=Will("status/w", b"gone")).reason_code == 0


def test_will_is_checked_again_when_published_after_a_reload() -> None:
    h = _harness("user w\ntopic write status/w\nuser sub\ntopic read #\n")
    sub = _as(h, "sub", "s")
    sub.subscribe("status/#")
    w = h.client()
    w.connect("w", username="w", will=Will("status/w", b"gone"))
    h.broker.set_policies({}, parse_acl_file("user w\nuser sub\ntopic read #\n"), h.now)
    w.drop()
    assert sub.publishes() == []
    assert h.broker.stats.publish_denied == 1


def test_reload_changes_what_existing_subscriptions_receive() -> None:
    h = _harness("user sub\ntopic read #\nuser pub\ntopic write #\n")
    sub = _as(h, "sub", "s")
    sub.subscribe("t/#")
    pub = _as(h, "pub", "p")
    pub.publish("t/1")
    assert len(sub.publishes()) == 1  # the route is now cached
    h.broker.set_policies(
        {}, parse_acl_file("user sub\ntopic read t/2\nuser pub\ntopic write #\n"), h.now
    )
    pub.publish("t/1")
    pub.publish("t/2")
    assert [p.topic for p in sub.publishes()] == ["t/2"]


def test_shared_subscription_skips_members_that_may_not_read() -> None:
    h = _harness(
        "user a\ntopic read jobs/#\nuser b\ntopic read jobs/public\nuser pub\ntopic write #\n"
    )
    a = _as(h, "a", "a")
    b = _as(h, "b", "b")
    a.subscribe("$share/g/jobs/#")
    b.subscribe("$share/g/jobs/#")
    pub = _as(h, "pub", "p")
    for i in range(4):
        pub.publish("jobs/private", str(i).encode())
    assert len(a.publishes()) == 4
    assert b.publishes() == []


def test_queued_messages_a_resumed_session_may_not_read_are_dropped() -> None:
    """A session restored from the store has no ACL identity until its client connects
    again; what queued meanwhile is filtered then."""
    h = Harness()
    sub = h.client()
    sub.connect("s", clean_start=False, session_expiry_interval=600, username="sub")
    sub.subscribe("q/#", 1)
    sub.drop()
    pub = h.client()
    pub.connect("p")
    pub.publish("q/ok", b"1", 1)
    pub.publish("q/no", b"2", 1)
    h.broker.acl = parse_acl_file("user sub\ntopic read q/ok\n")
    again = h.client()
    assert again.connect("s", clean_start=False, session_expiry_interval=600, username="sub")
    assert [p.topic for p in again.publishes()] == ["q/ok"]


def test_each_listener_has_its_own_acl_and_anonymous_policy() -> None:
    h = Harness()
    h.broker.policies["open"] = ListenerPolicy(
        PasswordAuthenticator(True), parse_acl_file("topic read public/#\n")
    )
    h.broker.policies["closed"] = ListenerPolicy(PasswordAuthenticator(False))
    anon = h.client(listener="open")
    assert anon.connect("anon").reason_code == 0
    assert anon.subscribe("private/#").reason_codes == (0x87,)
    refused = h.client(listener="closed")
    assert refused.connect("x").reason_code == ReasonCode.NOT_AUTHORIZED
    plain = h.client()  # the "test" listener: no policy, no ACL
    plain.connect("plain")
    assert plain.subscribe("private/#").reason_codes == (0,)


def test_reload_disconnects_clients_the_listener_no_longer_lets_in() -> None:
    h = Harness()
    h.broker.policies["l"] = ListenerPolicy(PasswordAuthenticator(True))
    anon = h.client(listener="l")
    anon.connect("anon")
    h.broker.set_policies({"l": ListenerPolicy(PasswordAuthenticator(False))}, None, h.now)
    assert anon.expect(Disconnect).reason_code == ReasonCode.ADMINISTRATIVE_ACTION
    assert anon.closed


def test_connack_is_the_only_answer_to_a_refused_will_311() -> None:
    h = _harness("user w\ntopic write a\n")
    c = h.client(MQTT_311)
    c.send_raw(b"")
    ack = c.connect("w", username="w", will=Will("b", b"x", properties=Properties()))
    assert isinstance(ack, ConnAck) and ack.reason_code == 5
    assert c.take() == []
