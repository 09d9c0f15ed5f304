"""Sessions restored, wills, ACL reloads, the retained store's bounds and ``$SYS``.

The pure core on a fake clock (``tests.support.harness``): a session taken in from
the store keeps its will and expiry deadlines to the second, a will is published
with its properties, its Message Expiry and its origin whichever way it goes out
(Will Delay, session end, takeover) and refused after an ACL reload, a reload
drops the queued messages a session may no longer read (counted, its queue bytes
freed, the store told), the retained store holds exactly up to its byte bound, and
``$SYS`` shows every counter under its name, republishing only what changed, with
load averages that follow mosquitto's exponential smoothing.
"""

from __future__ import annotations

import logging
import math

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.broker.journal import ForgetMessage, Journal, Op, RemoveEntry, Retain, SaveSession
from gateway.broker.state import Session
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    Connect,
    Packet,
    Properties,
    PubAck,
    Publish,
    ReasonCode,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    Will,
    encode,
)
from tests.support.harness import FakeClient, Harness

SYS = "$SYS/broker/"


def connected(h: Harness, client_id: str, version: int = MQTT_5, **kw: object) -> FakeClient:
    c = h.client(version)
    assert c.connect(client_id, **kw).reason_code == 0  # type: ignore[arg-type]
    return c


def watcher(h: Harness, topic_filter: str = "will/#") -> FakeClient:
    w = connected(h, "watcher")
    w.subscribe(topic_filter, 1)
    return w


def messages(log: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in log.records]


class Committed:
    """The journal of a harness broker, committed at once as the store would."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        h.broker.journal = Journal()
        self.ops: list[Op] = []

    def commit(self) -> None:
        batch = self.h.broker.seal_batch()
        if batch is not None:
            self.ops.extend(batch[1])
            self.h.broker.batch_committed(batch[0])


# --------------------------------------------------------------- sessions from the store


def restored(h: Harness, client_id: str, will_in: float, expires_in: float) -> Session:
    """A session as ``store.restore`` rebuilds it: a delayed will and an expiry pending."""
    s = Session(client_id, 600)
    s.will = Will("will/" + client_id, b"lost", 1, False, Properties(will_delay_interval=30))
    s.will_due = h.now + will_in
    s.expires_at = h.now + expires_in
    h.broker.adopt_session(s, h.now)
    return s


def test_a_restored_session_publishes_its_will_and_expires_at_their_deadlines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Else a gateway restarted with a device offline never announces it lost, or
    keeps its session (and queue) for ever."""
    h = Harness()
    w = watcher(h)
    restored(h, "dev", will_in=5, expires_in=10)
    caplog.set_level(logging.INFO, logger="ledge.broker")
    h.advance(4.9)
    assert w.publishes() == []
    h.advance(0.1)
    [msg] = w.publishes()
    assert (msg.topic, msg.payload, msg.qos) == ("will/dev", b"lost", 1)
    assert messages(caplog) == ["publishing will of 'dev' on 'will/dev'"]
    w.ack(msg)
    h.advance(4.9)
    assert "dev" in h.broker.sessions
    caplog.clear()
    h.advance(0.1)
    assert "dev" not in h.broker.sessions
    assert messages(caplog) == ["session 'dev' expired"]
    assert w.publishes() == []  # the will went out once


def test_a_restored_session_whose_deadlines_passed_meanwhile_acts_at_once() -> None:
    """Deadlines that passed while the gateway was down take effect on restore, not a
    tick later: a will due is out, an expired session (and its pending will) gone,
    before the first client connects."""
    h = Harness()
    w = watcher(h)
    restored(h, "due", will_in=0, expires_in=10)
    assert [(p.topic, p.payload) for p in w.publishes()] == [("will/due", b"lost")]
    assert "due" in h.broker.sessions
    restored(h, "gone", will_in=20, expires_in=0)
    assert [(p.topic, p.payload) for p in w.publishes()] == [("will/gone", b"lost")]
    assert "gone" not in h.broker.sessions


# --------------------------------------------------------------- wills


@pytest.mark.parametrize(
    ("expiry", "clean_start", "delay", "published"),
    [
        (0, False, 0, True),  # not persistent: the session ends with the takeover
        (0, True, 0, True),
        (100, True, 0, True),  # Clean Start ends it
        (100, False, 0, False),  # the session carries on into the new connection
        (1, False, 0, False),
        (0, False, 5, False),  # MQTT-3.1.3-9: a delayed will waits, and is cancelled
        (100, True, 5, False),
    ],
)
def test_the_will_of_a_taken_over_connection(
    expiry: int, clean_start: bool, delay: int, published: bool
) -> None:
    """Else a device reconnecting over a half-open link is announced dead to everyone
    watching its status while it is in fact back, or a dead one is never announced."""
    h = Harness()
    w = watcher(h)
    props = Properties(will_delay_interval=delay) if delay else Properties()
    old = h.client()
    old.connect(
        "dev", session_expiry_interval=expiry, will=Will("will/dev", b"gone", 1, False, props)
    )
    new = h.client()
    assert new.connect("dev", clean_start=clean_start, session_expiry_interval=100).reason_code == 0
    h.advance(10)
    got = [p.payload for p in w.publishes()]
    assert got == ([b"gone"] if published else [])


def test_a_311_clean_session_taken_over_by_a_persistent_connect_publishes_its_will() -> None:
    """MQTT 3.1.1 the same way: CleanSession 1 ended the old session."""
    h = Harness()
    w = watcher(h)
    old = h.client(MQTT_311)
    old.connect("dev", will=Will("will/dev", b"gone"))
    connected(h, "dev", MQTT_311, clean_start=False)
    assert [p.payload for p in w.publishes()] == [b"gone"]


WILL_PROPS = Properties(
    will_delay_interval=3,
    message_expiry_interval=60,
    content_type="text/plain",
    user_properties=(("site", "barn"),),
)


def test_a_delayed_will_goes_out_whole_once_and_not_to_its_own_no_local_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Else subscribers lose the will's properties, get it without (or with a wrong)
    Message Expiry, get it twice, or the dying client gets its own will back."""
    h = Harness()
    w = watcher(h)
    c = h.client()
    c.connect(
        "dev",
        clean_start=False,
        session_expiry_interval=10,
        will=Will("will/dev", b"gone", 1, False, WILL_PROPS),
    )
    c.subscribe("will/#", 1, no_local=True)
    c.drop()
    caplog.set_level(logging.INFO, logger="ledge.broker")
    h.advance(3)
    [msg] = w.publishes()
    assert (msg.topic, msg.payload, msg.qos) == ("will/dev", b"gone", 1)
    assert msg.properties.message_expiry_interval == 60
    assert msg.properties.content_type == "text/plain"
    assert msg.properties.user_properties == (("site", "barn"),)
    assert msg.properties.will_delay_interval is None
    assert messages(caplog) == ["publishing will of 'dev' on 'will/dev'"]
    w.ack(msg)
    back = h.client()
    assert back.connect("dev", clean_start=False, session_expiry_interval=10).session_present
    assert back.publishes() == []  # No Local: its own will is not queued for it
    back.drop()  # no will this time
    h.advance(20)  # the session expires: nothing more goes out
    assert "dev" not in h.broker.sessions
    assert w.publishes() == []


def test_the_store_records_a_delayed_will_pending_then_gone() -> None:
    """Else a restart re-publishes a will that already went out, or the store cannot
    write the session (its will deadline is not a time)."""
    h = Harness()
    journal = Committed(h)
    c = h.client()
    props = Properties(will_delay_interval=3)
    will = Will("will/dev", b"gone", 0, False, props)
    c.connect("dev", session_expiry_interval=60, will=will)
    c.drop()
    due = h.now + 3
    h.advance(3)
    journal.commit()
    saved = [(op.will, op.will_due) for op in journal.ops if isinstance(op, SaveSession)]
    assert saved[-2:] == [(will, due), (None, None)]


def test_a_will_longer_than_the_session_goes_out_when_the_session_expires(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The flip side of MQTT-3.1.3-9: the will comes at the session's end, whole, with
    its Message Expiry counted from then."""
    h = Harness()
    w = watcher(h)
    offline = h.client()
    offline.connect("late", clean_start=False, session_expiry_interval=600)
    offline.subscribe("will/#", 1)
    offline.drop()
    c = h.client()
    props = WILL_PROPS.with_(will_delay_interval=50)
    c.connect("dev", session_expiry_interval=5, will=Will("will/dev", b"gone", 1, False, props))
    c.drop()
    caplog.set_level(logging.INFO, logger="ledge.broker")
    h.advance(5)
    [msg] = w.publishes()
    assert msg.payload == b"gone"
    assert msg.properties.message_expiry_interval == 60
    assert msg.properties.user_properties == (("site", "barn"),)
    assert messages(caplog) == [
        "session 'dev' expired",
        "publishing will of 'dev' on 'will/dev'",
    ]
    h.advance(20)
    late = h.client()
    assert late.connect("late", clean_start=False, session_expiry_interval=600).session_present
    [queued] = late.publishes()
    assert queued.payload == b"gone"
    assert queued.properties.message_expiry_interval == 40  # 60 s from the session's end


def test_wills_the_acl_no_longer_allows_are_not_published_after_a_reload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Else a client whose write right was revoked still publishes there through its
    will, by Will Delay as by its session's end."""
    h = Harness()
    h.broker.acl = parse_acl_file("user w\ntopic write will/#\nuser sub\ntopic read #\n")
    sub = h.client()
    sub.connect("sub", username="sub")
    sub.subscribe("will/#", 1)
    timer = h.client()
    props = Properties(will_delay_interval=2)
    timer.connect(
        "w1", username="w", session_expiry_interval=60, will=Will("will/1", b"x", 1, False, props)
    )
    ending = h.client()
    props = Properties(will_delay_interval=50)
    ending.connect(
        "w2", username="w", session_expiry_interval=4, will=Will("will/2", b"x", 1, False, props)
    )
    ending.send(Publish("other", b"x", 1, False, False, 7))
    assert ending.expect_ack(PubAck, 7).reason_code == ReasonCode.NOT_AUTHORIZED
    assert h.broker.stats.publish_denied == 1
    h.broker.set_policies(
        {}, parse_acl_file("user w\ntopic write status/#\nuser sub\ntopic read #\n"), h.now
    )
    timer.drop()
    ending.drop()
    caplog.set_level(logging.INFO, logger="ledge.broker")
    h.advance(2)
    assert messages(caplog) == ["not publishing will of 'w1' on 'will/1': not authorized"]
    h.advance(2)
    assert messages(caplog)[1:] == [
        "session 'w2' expired",
        "not publishing will of 'w2' on 'will/2': not authorized",
    ]
    assert sub.publishes() == []
    assert h.broker.stats.publish_denied == 3


# --------------------------------------------------------------- the end of a session


def test_shared_messages_of_an_ended_session_go_to_the_next_member() -> None:
    """Else a shared-subscription job in flight or queued to a member that went away
    is lost, or the member's own (not shared) messages are handed to the group."""
    h = Harness()
    a = h.client()
    a.connect("a", receive_maximum=2)
    a.subscribe("$share/g/jobs", 1)
    a.subscribe("direct/#", 1)
    pub = connected(h, "pub")
    pub.publish("direct/1", b"n1", 1)  # in flight to a
    pub.publish("jobs", b"s1", 1, message_expiry_interval=30)  # in flight to a
    pub.publish("jobs", b"s2", 1)  # queued for a: its window is full
    pub.publish("direct/2", b"n2", 1)  # queued
    assert [p.payload for p in a.publishes()] == [b"n1", b"s1"]
    b = connected(h, "b")
    b.subscribe("$share/g/jobs", 1)
    h.advance(10)
    a.drop()  # Session Expiry 0: the session ends now
    got = b.publishes()
    assert [(p.topic, p.payload) for p in got] == [("jobs", b"s1"), ("jobs", b"s2")]
    assert got[0].properties.message_expiry_interval == 20
    assert h.broker.stats.drops() == 0


# --------------------------------------------------------------- ACL reloads


READ_ALL = "user sub\ntopic read q/#\nuser pub\ntopic write #\n"
READ_SOME = "user sub\ntopic read q/a\ntopic read q/b\ntopic read q/c\nuser pub\ntopic write #\n"


def test_a_reload_drops_queued_messages_the_session_may_no_longer_read() -> None:
    """Else an offline client whose read right was revoked still gets what queued
    before the reload, the messages after a dropped one are lost, its queue stays
    full of bytes it does not hold, or the store keeps (and restores) them."""
    h = Harness(max_queued_bytes=70)
    journal = Committed(h)
    h.broker.acl = parse_acl_file(READ_ALL)
    sub = h.client()
    sub.connect("s", username="sub", clean_start=False, session_expiry_interval=600)
    sub.send(Subscribe(sub.pid(), (SubscriptionRequest("q/#", 1),)))
    journal.commit()
    assert sub.expect(SubAck).reason_codes == (1,)
    sub.drop()
    online = h.client()
    online.connect("s2", username="sub")
    pub = h.client()
    pub.connect("p", username="pub")
    # Queue sizes (topic + payload): 10 + 20 + 10 + 30 = 70, the bound.
    for topic, size in (("q/a", 10), ("q/s1", 20), ("q/b", 10), ("q/s2", 30)):
        pub.send(Publish(topic, b"x" * (size - len(topic)), 1, False, False, pub.pid()))
        journal.commit()
    pub.take()
    journal.ops.clear()
    h.broker.set_policies({}, parse_acl_file(READ_SOME), h.now)
    journal.commit()
    assert h.broker.stats.publish_denied == 2
    dropped = [op for op in journal.ops if isinstance(op, (RemoveEntry, ForgetMessage))]
    assert dropped == [RemoveEntry("s", 2), ForgetMessage(2), RemoveEntry("s", 4), ForgetMessage(4)]
    # The connected client of the same user is held to the new rules too.
    assert online.subscribe("q/s1", 1).reason_codes == (ReasonCode.NOT_AUTHORIZED,)
    # 20 bytes left queued: a message of 50 fits the bound of 70 again.
    pub.send(Publish("q/c", b"x" * 47, 1, False, False, pub.pid()))
    journal.commit()
    assert h.broker.stats.dropped_queue_full == 0
    h.broker.set_policies({}, None, h.now)  # no ACL any more: nothing more to drop
    back = h.client()
    assert back.connect(
        "s", username="sub", clean_start=False, session_expiry_interval=600
    ).session_present
    journal.commit()
    assert [p.topic for p in back.publishes()] == ["q/a", "q/b", "q/c"]


# --------------------------------------------------------------- the retained store


def test_the_retained_store_holds_exactly_up_to_its_byte_bound() -> None:
    """Else retained messages are refused while there is room (a replacement of the
    same size, a message that fills the bound exactly, one after a deletion), or the
    bound is overrun: the store grows past what the operator allowed."""
    h = Harness(max_retained_bytes=10)
    pub = connected(h, "p")

    def retain(topic: str, payload: bytes) -> int:
        pid = pub.pid()
        pub.send(Publish(topic, payload, 1, True, False, pid))
        return pub.expect_ack(PubAck, pid).reason_code

    full = ReasonCode.QUOTA_EXCEEDED
    ok = ReasonCode.NO_MATCHING_SUBSCRIBERS  # stored; nobody subscribed yet
    # Sizes are topic + payload; the bound is 10 bytes.
    assert retain("a", b"1234") == ok  # 5
    assert retain("b", b"123") == ok  # 9
    assert retain("c", b"1") == full  # 11: one byte too many
    assert retain("a", b"12345") == ok  # replaces 5 with 6: exactly 10
    assert retain("e", b"1") == full
    assert retain("b", b"") == ok  # deleted: 6 left
    assert retain("d", b"123") == ok  # exactly 10 again
    assert retain("e", b"1") == full
    assert h.broker.retained.refused == 3
    sub = connected(h, "s")
    sub.subscribe("#")
    assert sorted((p.topic, p.payload) for p in sub.publishes()) == [
        ("a", b"12345"),
        ("d", b"123"),
    ]


def test_retained_messages_refused_by_the_count_bound_are_counted_and_not_stored() -> None:
    """Else ``$SYS`` under-reports the refusals, or the store writes (and restores after
    a restart) a retained message the broker refused."""
    h = Harness(max_retained_messages=1)
    journal = Committed(h)
    sub = connected(h, "s")
    sub.subscribe("r/#")
    pub = connected(h, "p", MQTT_311)
    pub.publish("r/1", b"kept", retain=True)
    pub.publish("r/2", b"refused", retain=True)  # QoS 0: no acknowledgement to refuse
    pub.publish("r/3", b"refused", 1, retain=True)  # MQTT 3.1.1: no refusal code
    journal.commit()
    # Each is still forwarded to the subscribers there are.
    assert [p.payload for p in sub.publishes()] == [b"kept", b"refused", b"refused"]
    assert [op.topic for op in journal.ops if isinstance(op, Retain)] == ["r/1"]
    assert h.broker.sys_values(h.now)[SYS + "retained messages/refused"] == "2"
    assert len(h.broker.retained) == 1


# --------------------------------------------------------------- $SYS


def test_sys_republishes_what_changed_every_interval_and_purges_expired_retained() -> None:
    """Else ``$SYS`` stops after its first publication, floods subscribers with every
    value every interval, shows a wrong uptime, or keeps counting (and holding)
    retained messages whose Message Expiry passed."""
    h = Harness(sys_interval=10)
    pub = connected(h, "p")
    pub.publish("r", b"short-lived", retain=True, message_expiry_interval=5)
    s = connected(h, "s")
    s.subscribe("$SYS/broker/#")
    h.advance(0)
    first = {p.topic: p.payload for p in s.publishes()}
    assert first[SYS + "uptime"] == b"0 seconds"
    assert first[SYS + "retained messages/count"] == b"1"
    h.advance(9.9)
    assert s.publishes() == []
    h.advance(0.1)
    second = {p.topic: p.payload for p in s.publishes()}
    assert second[SYS + "uptime"] == b"10 seconds"
    assert SYS + "version" not in second  # unchanged: not sent again
    assert SYS + "clients/connected" not in second
    # "r" expired: only the $SYS topics themselves are retained now.
    assert second[SYS + "retained messages/count"] == str(len(first)).encode()
    h.advance(10)
    third = {p.topic: p.payload for p in s.publishes()}
    assert third[SYS + "uptime"] == b"20 seconds"
    assert SYS + "retained messages/count" not in third


def test_sys_counts_clients_drops_by_reason_and_refusals() -> None:
    """Else an operator reading ``$SYS`` misses a topic (a misspelt name) or reads a
    wrong count: of clients, of the messages dropped and why, of refusals."""
    h = Harness(max_queued_messages=1, max_retained_messages=1)
    off = connected(h, "off", clean_start=False, session_expiry_interval=600)
    off.subscribe("d/#", 1)
    off.drop()
    pub = connected(h, "p")
    pub.publish("d/0", b"x")  # offline, QoS 0: dropped
    pub.publish("d/1", b"x", 1, message_expiry_interval=5)  # queued
    pub.publish("d/2", b"x", 1)  # the queue is full
    pub.publish("d/3", b"x", 1)  # and again
    h.advance(6)
    off = connected(h, "off", clean_start=False, session_expiry_interval=600)
    assert off.publishes() == []  # d/1 expired while queued
    small = connected(h, "small", maximum_packet_size=20)
    small.subscribe("big")
    pub.publish("big", b"x" * 50)  # larger than small may receive
    slow = connected(h, "slow")
    slow.subscribe("slow")
    h.broker.set_writable(slow.conn, False, h.now)
    pub.publish("slow", b"x")  # slow does not read: QoS 0 dropped
    pub.publish("$SYS/x", b"x")  # denied: $SYS is the broker's
    pub.publish("r/1", b"x", retain=True)
    pub.publish("r/2", b"x", retain=True)  # the retained store is full
    refused = h.client()
    will = Will("$SYS/broker/uptime", b"x")
    assert refused.connect("refused", will=will).reason_code == ReasonCode.NOT_AUTHORIZED
    bad = connected(h, "bad")
    bad.send(Connect("bad", MQTT_5))  # a second CONNECT: a protocol error
    assert bad.closed
    off.drop()
    values = h.broker.sys_values(h.now)
    expected = {
        "clients/connected": "3",  # p, small, slow
        "clients/disconnected": "1",  # off
        "clients/total": "4",
        "clients/maximum": "5",  # off, p, small, slow and bad
        "publish/messages/dropped": "6",
        "publish/messages/dropped/slow consumer": "1",
        "publish/messages/dropped/queue full": "2",
        "publish/messages/dropped/expired": "1",
        "publish/messages/dropped/too large": "1",
        "publish/messages/dropped/offline qos 0": "1",
        "publish/messages/denied": "1",
        "retained messages/count": "1",
        "retained messages/refused": "1",
        "clients/refused": "1",
        "clients/protocol errors": "1",
        "uptime": "6 seconds",
    }
    assert {k: values.get(SYS + k) for k in expected} == expected


def test_sys_counts_the_traffic_packet_by_packet_and_byte_by_byte() -> None:
    """Else the traffic ``$SYS`` reports (and its load averages) is not what went over
    the wire."""
    h = Harness()
    c = h.client()
    sent: list[Packet] = [
        Connect("c", MQTT_5, True, 0, None, None, None, Properties()),
        Subscribe(1, (SubscriptionRequest("t", 0),), Properties()),
        Publish("t", b"hello", 0, False, False, 0, Properties()),
    ]
    for packet in sent:
        c.send(packet)
    h.broker.stats.bytes_sent += c.conn.out_bytes  # as the shell counts what it writes
    received = c.take()
    assert [type(p).__name__ for p in received] == ["ConnAck", "SubAck", "Publish"]
    values = h.broker.sys_values(h.now)
    expected = {
        "messages/received": "3",  # CONNECT, SUBSCRIBE, PUBLISH
        "messages/sent": "3",  # CONNACK, SUBACK, PUBLISH
        "publish/messages/received": "1",
        "publish/messages/sent": "1",
        "bytes/received": str(sum(len(encode(p, MQTT_5)) for p in sent)),
        "bytes/sent": str(sum(len(encode(p, MQTT_5)) for p in received)),
    }
    assert {k: values.get(SYS + k) for k in expected} == expected


def test_sys_load_averages_smooth_the_per_minute_rate_over_1_5_and_15_minutes() -> None:
    """Else the ``load`` topics (mosquitto's, and dashboards built on them) show rates
    that are not the traffic's: stuck at zero, off by a factor, or never decaying."""
    h = Harness()
    c = connected(h, "c")
    rates = {1: 0.0, 5: 0.0, 15: 0.0}

    def load() -> dict[int, str]:
        values = h.broker.sys_values(h.now)  # as the metrics collector reads them
        return {m: values[f"{SYS}load/publish/received/{m}min"] for m in rates}

    def step(published: int, elapsed: float) -> dict[int, str]:
        """Mosquitto's smoothing: the rate over ``elapsed`` decays in with exp(-t/T)."""
        for _ in range(published):
            c.publish("t")
        h.advance(elapsed)
        per_minute = published * 60.0 / elapsed
        for m, rate in rates.items():
            decay = math.exp(-elapsed / (60.0 * m))
            rates[m] = rate * decay + per_minute * (1.0 - decay)
        return {m: f"{r:.2f}" for m, r in rates.items()}

    assert load() == {1: "0.00", 5: "0.00", 15: "0.00"}  # the first reading starts it
    # 120 a minute for a minute: 120 (1 - 1/e), 120 (1 - e^-1/5), 120 (1 - e^-1/15).
    assert step(120, 60) == {1: "75.85", 5: "21.75", 15: "7.74"}
    assert load() == {1: "75.85", 5: "21.75", 15: "7.74"}
    expected = step(30, 30)  # slower: the averages come down, the short one fastest
    assert load() == expected
    assert float(expected[1]) < 75.85 and float(expected[15]) > 7.74
    expected = step(1, 0.5)  # a reading half a second later counts as well
    assert load() == expected
