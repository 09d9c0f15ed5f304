"""Resumed and redispatched deliveries, and what the journal tells the store about them.

The pure core on a fake clock (``tests.support.harness``): a resumed session gets its
unacknowledged PUBREL and PUBLISH packets again -- each with its DUP, RETAIN, QoS and
remaining expiry, an expired one with a zero expiry, one now too large left out --; a
shared-subscription message of a member that went away goes to the next member (or
is dropped, counted and logged when none is left), and the shared group's round robin
picks members in a fixed order, skipping offline ones and queueing for them when no
member is online. With a journal, the operations are the store's rows: a message
shared by two stored sessions is forgotten only with the last of them, an unsubscribe
or an inbound QoS 2 flow is written and acknowledged once committed, and ``$SYS``
never reaches the store. Last, the refusal log's window edges and the subscription
tree's own operations.
"""

from __future__ import annotations

import logging

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.broker.journal import (
    AddEntry,
    AddIncoming,
    EndSession,
    ForgetMessage,
    Journal,
    Op,
    RemoveEntry,
    RemoveIncoming,
    RemoveSubscription,
    Retain,
    SaveSession,
    StoreMessage,
    Unretain,
)
from gateway.broker.ratelog import RateLimitedLog
from gateway.broker.state import Flow
from gateway.broker.subtree import SubTree
from gateway.mqtt import (
    MQTT_5,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    encode,
)
from tests.support.harness import FakeClient, Harness


def connected(h: Harness, client_id: str, **kw: object) -> FakeClient:
    c = h.client(MQTT_5)
    assert c.connect(client_id, **kw).reason_code == 0  # type: ignore[arg-type]
    return c


class Committed:
    """The journal of a harness broker, committed at once as the store would."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        h.broker.journal = Journal()
        self.ops: list[Op] = []

    def commit(self) -> list[Op]:
        """Seal and commit; returns the operations of this commit."""
        batch = self.h.broker.seal_batch()
        if batch is None:
            return []
        self.ops.extend(batch[1])
        self.h.broker.batch_committed(batch[0])
        return list(batch[1])


def broker_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ledge.broker"]


# --------------------------------------------------------------- resumption


def stored_subscriber(h: Harness, journal: Committed) -> FakeClient:
    """Session "s" (kept 600 s) subscribed to ``t/#`` at QoS 1, its SUBACK after the commit."""
    sub = h.client(MQTT_5)
    sub.connect("s", clean_start=False, session_expiry_interval=600)
    sub.send(Subscribe(sub.pid(), (SubscriptionRequest("t/#", 1),)))
    journal.commit()
    assert sub.expect(SubAck).reason_codes == (1,)
    return sub


def test_resumed_session_gets_pubrel_then_dup_publishes_with_retain_and_remaining_expiry() -> None:
    """Else a reconnecting client never completes a QoS 2 flow stuck at PUBREL, loses
    the messages behind it, sees a retained message lose its RETAIN flag, or gets a
    message's full (or a zero) expiry instead of what is left of it."""
    h = Harness()
    sub = connected(h, "s", clean_start=False, session_expiry_interval=600)
    sub.subscribe("t/#", 2, retain_as_published=True)
    pub = connected(h, "p")
    pub.publish("t/a", b"two", 2)
    [first] = sub.publishes()
    sub.send(PubRec(first.packet_id))
    assert sub.expect(PubRel).packet_id == first.packet_id  # PUBCOMP never sent
    pub.publish("t/b", b"kept", 1, retain=True, message_expiry_interval=100)
    pub.publish("t/c", b"plain", 1)
    assert [p.packet_id for p in sub.publishes()] == [2, 3]
    sub.drop()
    h.advance(30)
    back = h.client(MQTT_5)
    assert back.connect("s", clean_start=False, session_expiry_interval=600).session_present
    packets = back.take()
    assert packets[0] == PubRel(1)
    again = packets[1:]
    assert all(isinstance(p, Publish) for p in again)
    assert [
        (p.topic, p.packet_id, p.qos, p.dup, p.retain, p.properties.message_expiry_interval)
        for p in again
        if isinstance(p, Publish)
    ] == [("t/b", 2, 1, True, True, 70), ("t/c", 3, 1, True, False, None)]


def test_resumed_session_sends_expired_inflight_with_zero_expiry_and_leaves_out_too_large() -> None:
    """Else a message in flight that expired meanwhile breaks its QoS flow (never
    re-sent) or is re-sent without saying it expired, one now above the client's
    Maximum Packet Size is sent anyway or stays in flight for ever (and in the store),
    or the messages after a left-out one are not re-sent at all."""
    h = Harness()
    journal = Committed(h)
    sub = stored_subscriber(h, journal)
    pub = connected(h, "p")
    pub.send(Publish("t/big", b"B" * 200, 1, packet_id=pub.pid()))
    pub.send(
        Publish(
            "t/short",
            b"s",
            1,
            packet_id=pub.pid(),
            properties=Properties(message_expiry_interval=10),
        )
    )
    pub.send(Publish("t/ok", b"k", 1, packet_id=pub.pid()))
    journal.commit()
    assert [(p.topic, p.packet_id) for p in sub.publishes()] == [
        ("t/big", 1),
        ("t/short", 2),
        ("t/ok", 3),
    ]
    stored = [op for op in journal.ops if isinstance(op, AddEntry)]
    assert [(op.client_id, op.seq, op.message_id, op.packet_id) for op in stored] == [
        ("s", 1, 1, 1),
        ("s", 2, 2, 2),
        ("s", 3, 3, 3),
    ]
    sub.drop()
    journal.commit()
    h.advance(20)
    back = h.client(MQTT_5)
    back.connect("s", clean_start=False, session_expiry_interval=600, maximum_packet_size=100)
    ops = journal.commit()
    assert RemoveEntry("s", 1) in ops and ForgetMessage(1) in ops
    assert [op for op in ops if isinstance(op, (RemoveEntry, ForgetMessage))] == [
        RemoveEntry("s", 1),
        ForgetMessage(1),
    ]
    assert h.broker.stats.dropped_too_large == 1
    again = back.publishes()
    assert [
        (p.topic, p.packet_id, p.qos, p.dup, p.properties.message_expiry_interval) for p in again
    ] == [("t/short", 2, 1, True, 0), ("t/ok", 3, 1, True, None)]
    # The one left out is done: nothing of it is re-sent on the next resumption.
    for p in again:
        back.send(PubAck(p.packet_id))
    journal.commit()
    back.drop()
    third = h.client(MQTT_5)
    assert third.connect("s", clean_start=False, session_expiry_interval=600).session_present
    journal.commit()
    assert third.take() == []


# --------------------------------------------------------------- shared subscriptions


def test_shared_messages_of_a_last_member_gone_are_dropped_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Else the broker fails when the last member of a group goes away with messages
    in flight, a job is silently lost (no count, no log line saying which group and
    topic), or it is handed to another share name's group as a second copy."""
    caplog.set_level(logging.WARNING, logger="ledge.broker")
    h = Harness()
    gone = connected(h, "gone")
    gone.subscribe("$share/a/jobs", 1)
    gone.subscribe("$share/c/work", 1)
    other = connected(h, "other")
    other.subscribe("$share/b/jobs", 1)
    pub = connected(h, "p")
    pub.publish("jobs", b"j", 1)
    pub.publish("work", b"w", 1)
    assert [p.payload for p in gone.publishes()] == [b"j", b"w"]
    for p in other.publishes():
        other.ack(p)
    caplog.clear()
    gone.drop()  # never acknowledged; Session Expiry 0: its session ends now
    assert h.broker.stats.dropped_queue_full == 2
    assert broker_lines(caplog)[-2:] == [
        "shared subscription $share/a/jobs has no members left: message on 'jobs' dropped",
        "shared subscription $share/c/work has no members left: message on 'work' dropped",
    ]
    assert other.take() == []


def test_shared_message_goes_on_with_the_next_members_identifier_qos_and_acl_not_retained() -> None:
    """Else the member that takes over a job sees another member's Subscription
    Identifier (its client routes the job to the wrong handler), a RETAIN flag on a
    live message, the full expiry of a message that waited, or the broker fails when
    that member has ACL rules."""
    h = Harness()
    h.broker.acl = parse_acl_file("user worker\ntopic read jobs\nuser pub\ntopic write #\n")
    first = connected(h, "first", username="worker")
    first.subscribe("$share/g/jobs", 2, sub_id=7)
    second = connected(h, "second", username="worker")
    second.subscribe("$share/g/jobs", 1, sub_id=9)
    pub = connected(h, "p", username="pub")
    pub.publish("jobs", b"job", 2, retain=True, message_expiry_interval=30)
    [took] = first.publishes()
    assert (took.qos, took.retain, took.properties.subscription_identifiers) == (2, False, (7,))
    assert second.take() == []
    h.advance(10)
    first.drop()
    [got] = second.publishes()
    assert (got.topic, got.payload, got.qos, got.retain, got.dup) == (
        "jobs",
        b"job",
        1,
        False,
        False,
    )
    assert got.properties.subscription_identifiers == (9,)
    assert got.properties.message_expiry_interval == 20
    assert h.broker.stats.drops() == 0


def test_a_redispatched_job_is_stored_again_for_the_member_that_takes_it() -> None:
    """Else a job handed from a stored session that expired to another stored member
    is not in the store (lost on a restart), points at a message row already
    forgotten, loses its group (never handed on again), or its message row stays in
    the store for ever after the job is acknowledged."""
    h = Harness()
    journal = Committed(h)
    members: list[FakeClient] = []
    for name, expiry in (("m1", 10), ("m2", 600)):
        m = h.client(MQTT_5)
        m.connect(name, clean_start=False, session_expiry_interval=expiry)
        m.send(Subscribe(m.pid(), (SubscriptionRequest("$share/g/jobs", 1),)))
        journal.commit()
        assert m.expect(SubAck).reason_codes == (1,)
        members.append(m)
    m1, m2 = members
    pub = connected(h, "p")
    pub.send(Publish("jobs", b"job", 1, packet_id=pub.pid()))
    ops = journal.commit()
    assert [op for op in ops if isinstance(op, (StoreMessage, AddEntry))] == [
        StoreMessage(1, "jobs", b"job", 1, 0, b"\x00", "p", None, h.now),
        AddEntry("m1", 1, 1, 1, 0, (), 1, Flow.AWAIT_ACK, ("g", "jobs")),
    ]
    assert [p.payload for p in m1.publishes()] == [b"job"]
    m1.drop()
    journal.commit()
    h.advance(10)  # m1's session expires: the job goes to m2
    ops = journal.commit()
    assert [op for op in ops if not isinstance(op, SaveSession)] == [
        EndSession("m1"),
        ForgetMessage(1),
        StoreMessage(2, "jobs", b"job", 1, 0, b"\x00", "p", None, h.now - 10),
        AddEntry("m2", 2, 2, 1, 0, (), 1, Flow.AWAIT_ACK, ("g", "jobs")),
    ]
    [got] = m2.publishes()
    m2.send(PubAck(got.packet_id))
    assert journal.commit() == [RemoveEntry("m2", 2), ForgetMessage(2)]


# --------------------------------------------------------------- the journal


def test_a_message_of_two_stored_sessions_is_forgotten_only_with_the_last() -> None:
    """Else a restart loses a message still queued for one session because another
    session that held it stopped being stored (or acknowledged it), or a session that
    is no longer stored keeps writing its subscriptions and holding its SUBACKs."""
    h = Harness()
    journal = Committed(h)
    clients: dict[str, FakeClient] = {}
    for name in ("online", "offline"):
        c = h.client(MQTT_5)
        c.connect(name, clean_start=False, session_expiry_interval=600)
        c.send(Subscribe(c.pid(), (SubscriptionRequest("t", 1),)))
        journal.commit()
        assert c.expect(SubAck).reason_codes == (1,)
        clients[name] = c
    clients["offline"].drop()
    journal.commit()
    pub = connected(h, "p")
    pub.send(Publish("t", b"m", 1, packet_id=pub.pid()))
    assert journal.commit() == [
        StoreMessage(1, "t", b"m", 1, 0, b"\x00", "p", None, h.now),
        AddEntry("online", 1, 1, 1, 0, (), 1, Flow.AWAIT_ACK, None),
        AddEntry("offline", 2, 1, 1, 0, (), 0, Flow.QUEUED, None),
    ]
    [held] = clients["online"].publishes()
    # The online session comes back with Session Expiry 0: no longer stored.
    clients["online"].drop()
    journal.commit()
    back = h.client(MQTT_5)
    assert back.connect("online", clean_start=False, session_expiry_interval=0).session_present
    assert journal.commit() == [EndSession("online")]
    [again] = back.publishes()
    assert (again.packet_id, again.dup) == (held.packet_id, True)
    back.send(PubAck(again.packet_id))
    back.send(Subscribe(back.pid(), (SubscriptionRequest("u", 1),)))
    assert back.expect(SubAck).reason_codes == (1,)  # not held: nothing to store
    assert journal.commit() == []
    # The stored session still holds the message; it leaves with its acknowledgement.
    late = h.client(MQTT_5)
    assert late.connect("offline", clean_start=False, session_expiry_interval=600).session_present
    journal.commit()
    [queued] = late.publishes()
    late.send(PubAck(queued.packet_id))
    ops = journal.commit()
    assert [op for op in ops if not isinstance(op, SaveSession)] == [
        RemoveEntry("offline", 2),
        ForgetMessage(1),
    ]


def test_unsubscribe_and_inbound_qos2_of_a_stored_session_are_written_before_acked() -> None:
    """Else after a restart a stored session gets messages again on a filter it had
    unsubscribed from (its UNSUBACK promised otherwise), or a QoS 2 packet identifier
    it had released is still known (its next message with that id is dropped as a
    duplicate); and a session kept in memory only must never wait for the store."""
    h = Harness()
    journal = Committed(h)
    stored = h.client(MQTT_5)
    stored.connect("c", clean_start=False, session_expiry_interval=600)
    stored.send(Subscribe(stored.pid(), (SubscriptionRequest("x", 1),)))
    journal.commit()
    stored.expect(SubAck)
    stored.send(Unsubscribe(stored.pid(), ("x", "never")))
    assert stored.take() == []
    assert journal.commit() == [RemoveSubscription("c", "x")]
    assert stored.expect(UnsubAck).reason_codes == (0, 0x11)
    stored.send(Publish("in", b"q2", 2, packet_id=5))
    assert stored.take() == []
    assert journal.commit() == [AddIncoming("c", 5)]
    assert stored.expect(PubRec).packet_id == 5
    stored.send(PubRel(5))
    assert stored.take() == []
    assert journal.commit() == [RemoveIncoming("c", 5)]
    assert stored.expect(PubComp).packet_id == 5

    memory = connected(h, "m")
    assert memory.subscribe("x", 1).reason_codes == (1,)
    assert memory.unsubscribe("x").reason_codes == (0,)  # answered at once
    assert journal.commit() == []


def test_retained_changes_reach_the_store_with_their_origin_and_expiry_but_never_sys() -> None:
    """Else a retained message restored after a restart goes back to its own
    publisher (No Local), lives for ever (or expires at once), or every ``$SYS``
    refresh writes to the SD card."""
    h = Harness()
    journal = Committed(h)
    pub = connected(h, "p")
    expiring = Properties(message_expiry_interval=60)
    pub.send(Publish("r/1", b"v", 1, True, packet_id=pub.pid(), properties=expiring))
    pub.send(Publish("r/2", b"w", 0, True))
    pub.send(Publish("r/2", b"", 0, True))
    h.broker.publish_local("$SYS/broker/uptime", b"5", h.now, retain=True)
    assert h.broker.retained.tree.get("$SYS/broker/uptime") is not None
    assert [op for op in journal.commit() if not isinstance(op, SaveSession)] == [
        Retain("r/1", b"v", 1, b"\x00", "p", 60, h.now),
        Retain("r/2", b"w", 0, b"\x00", "p", None, h.now),
        Unretain("r/2"),
    ]
    assert pub.expect(PubAck).packet_id == 1  # once stored


def test_shared_group_round_robin_order_skips_offline_members_and_queues_when_all_are() -> None:
    """Else a group's members share its jobs unevenly (one takes two turns running,
    a member is skipped twice), an offline member gets jobs while others are online,
    or with every member offline the jobs are lost instead of queued in turn."""
    h = Harness()
    names = ("m1", "m2", "m3")
    members = {}
    for name in names:
        m = connected(h, name, clean_start=False, session_expiry_interval=600)
        m.subscribe("$share/g/job", 1)
        members[name] = m
    pub = connected(h, "p")

    def run(payloads: str) -> dict[str, bytes]:
        for payload in payloads:
            pub.publish("job", payload.encode(), 1)
        got = {}
        for name, m in members.items():
            received = m.publishes()
            for p in received:
                m.ack(p)
            got[name] = b"".join(p.payload for p in received)
        return got

    assert run("012") == {"m1": b"0", "m2": b"1", "m3": b"2"}
    members["m2"].drop()
    assert run("3456") == {"m1": b"35", "m2": b"", "m3": b"46"}
    members["m1"].drop()
    members["m3"].drop()
    assert run("789") == {"m1": b"", "m2": b"", "m3": b""}
    for name in names:
        back = h.client(MQTT_5)
        assert back.connect(name, clean_start=False, session_expiry_interval=600).session_present
        members[name] = back
    assert run("") == {"m1": b"7", "m2": b"8", "m3": b"9"}


# --------------------------------------------------------------- expiry, retained bytes


def test_a_message_delivered_at_its_very_expiry_second_says_zero_seconds_left() -> None:
    """Else a retained message handed out in the last instant of its life tells the
    subscriber it still has a second to live, and a forwarding client keeps it
    alive past its publisher's deadline."""
    h = Harness()
    pub = connected(h, "p")
    pub.publish("r", b"v", 1, retain=True, message_expiry_interval=10)
    h.advance(10)
    sub = connected(h, "s")
    sub.subscribe("r", 1)
    [got] = sub.publishes()
    assert (got.retain, got.properties.message_expiry_interval) == (True, 0)
    h.advance(0.5)
    late = connected(h, "late")
    late.subscribe("r", 1)
    assert late.publishes() == []


def test_deleting_a_retained_topic_below_another_frees_its_bytes() -> None:
    """Else deleting a retained message whose parent topic holds one too leaves its
    bytes counted: the retained store fills up with nothing in it and refuses new
    retained messages."""
    h = Harness(max_retained_bytes=20)
    pub = connected(h, "p")
    pub.publish("a", b"123456789", retain=True)  # 1 + 9 bytes
    pub.publish("a/b", b"1234567", retain=True)  # 3 + 7 bytes: the bound is reached
    pub.publish("a/b", b"", retain=True)  # deleted
    pub.publish("a/c", b"1234567", retain=True)  # fits in the bytes freed
    assert h.broker.retained.refused == 0
    sub = connected(h, "s")
    sub.subscribe("a/#")
    assert sorted(p.topic for p in sub.publishes()) == ["a", "a/c"]


# --------------------------------------------------------------- the refusal log, the tree

RATELOG = logging.getLogger("ledge.test.delivery_journal")


def ratelog_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == RATELOG.name]


def test_refusal_log_window_closes_exactly_one_interval_on_and_counts_sources_in_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Else during a flood the summary line comes an interval late (or never, when
    refusals arrive every interval on the dot), claims more sources than it tracks,
    or a hidden refusal is reported as logged."""
    caplog.set_level(logging.INFO, logger=RATELOG.name)
    refusals = RateLimitedLog(RATELOG, interval=60.0, max_lines=1, max_sources=1)
    assert refusals(0.0, "10.0.0.1", "refused %s", "a")
    assert not refusals(1.0, "10.0.0.2", "refused %s", "b")
    assert not refusals(2.0, "10.0.0.3", "refused %s", "c")
    assert refusals(60.0, "10.0.0.1", "refused %s", "d")
    assert ratelog_lines(caplog) == [
        "refused a",
        "2 more refusals from 1 sources in the last 60 s not logged",
        "refused d",
    ]


def test_refusal_log_restarts_a_sources_interval_and_count_at_each_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Else a source is logged again before its interval is over, or a line claims
    refusals left out that never happened (or breaks on a literal percent sign)."""
    caplog.set_level(logging.INFO, logger=RATELOG.name)
    refusals = RateLimitedLog(RATELOG, interval=60.0)
    message = "pool at 100% of its slots"
    assert refusals(0.0, "10.0.0.1", message)
    assert refusals(60.0, "10.0.0.1", message)
    assert not refusals(90.0, "10.0.0.1", message)
    assert refusals(150.0, "10.0.0.1", message)
    assert ratelog_lines(caplog) == [
        message,
        message,
        f"{message} (1 more from 10.0.0.1 in the last 60 s not logged)",
    ]


def test_subtree_remove_count_lookup_flatten_merge_and_clear() -> None:
    """The tree under subscriptions and retained messages: a removal under a kept
    key returns what it removed (the retained store frees those bytes), nodes are
    counted, ``in`` and ``find_items`` follow the keys and MQTT matching, ``flatten``
    sorts by key, ``merge`` combines shared keys, and ``clear`` empties it."""
    tree = SubTree.from_items([("a", 1), ("a/b", 2), ("d/e", 3)])
    assert tree.node_count() == 4
    assert tree.remove("a/b") == 2  # pruning stops at "a", which keeps its value
    assert tree.node_count() == 3
    assert "a" in tree and "a/b" not in tree and "d" not in tree and "d/e" in tree
    assert repr(tree) in ("SubTree({'a': 1, 'd/e': 3})", "SubTree({'d/e': 3, 'a': 1})")
    filters = SubTree.from_items([("s/+", 1), ("s/#", 2), ("t", 3)])
    assert sorted(filters.find_items("s/x")) == [("s/#", 2), ("s/+", 1)]
    assert SubTree.from_items([("b", 1), ("a", 2)]).flatten() == [("a", 2), ("b", 1)]
    left = SubTree.from_items([("x", frozenset({1}))])
    right = SubTree.from_items([("x", frozenset({2})), ("y", frozenset({3}))])
    merged = left.merge(right, frozenset.union)
    assert merged.flatten() == [("x", frozenset({1, 2})), ("y", frozenset({3}))]
    tree.clear()
    assert (len(tree), tree.node_count(), list(tree.items())) == (0, 0, [])
    tree.add("z", 9)
    assert (len(tree), tree.flatten()) == (1, [("z", 9)])


def test_an_expired_message_in_flight_above_a_lowered_maximum_packet_size_is_left_out() -> None:
    """Else a client that comes back with a smaller Maximum Packet Size is sent a packet
    over its limit (MQTT-3.1.2-24), disconnects with Packet Too Large and gets it again at
    every resumption until its session expires; and the message counts as expired
    although it was sent."""
    h = Harness()
    journal = Committed(h)
    sub = stored_subscriber(h, journal)
    pub = connected(h, "p")
    expiring = Properties(message_expiry_interval=10)
    pub.send(Publish("t/big", b"B" * 200, 1, packet_id=pub.pid(), properties=expiring))
    pub.send(Publish("t/small", b"s", 1, packet_id=pub.pid(), properties=expiring))
    journal.commit()
    assert [p.topic for p in sub.publishes()] == ["t/big", "t/small"]
    sub.drop()
    journal.commit()
    h.advance(20)
    back = h.client(MQTT_5)
    back.connect("s", clean_start=False, session_expiry_interval=600, maximum_packet_size=100)
    ops = journal.commit()
    assert [op for op in ops if isinstance(op, (RemoveEntry, ForgetMessage))] == [
        RemoveEntry("s", 1),
        ForgetMessage(1),
    ]
    assert (h.broker.stats.dropped_too_large, h.broker.stats.dropped_expired) == (1, 0)
    again = back.publishes()
    assert [(p.topic, p.dup, p.properties.message_expiry_interval) for p in again] == [
        ("t/small", True, 0)
    ]
    assert all(len(encode(p, MQTT_5)) <= 100 for p in again)
