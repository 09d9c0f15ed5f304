"""Differential tests: one client script against Debian's Mosquitto and against Ledge.

Only behaviour the specification pins down to one right answer is compared:
wildcard matching (with ``$`` topics), retained messages, QoS downgrade,
subscription options, queued messages of persistent sessions, wills.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.clients import Paho
from tests.support.procs import LedgeProcess, MosquittoProcess
from tests.support.wait import wait_for

Scenario = Callable[[int], Any]


def settle(clients: list[Paho], marker_topic: str, publisher: Paho) -> None:
    """Publish a QoS 1 marker each client subscribes to; once all have it, earlier
    messages have been delivered too (per-connection ordering)."""
    publisher.publish(marker_topic, b"marker", 1)
    for c in clients:
        wait_for(lambda: marker_topic in {m.topic for m in c.messages}, 5, "marker")  # noqa: B023


FILTERS = ["w/+/c", "w/#", "w/b/#", "+/b/c", "#", "+/#", "w//c", "w/+", "$w/#", "+/+/+"]
TOPICS = ["w/b/c", "w", "w/b", "w//c", "x/b/c", "$w/b/c", "w/b/c/d"]


def wildcard_matrix(port: int) -> dict[str, list[str]]:
    pub = Paho(port, "diff-w-pub").connect()
    subs = []
    for i, f in enumerate(FILTERS):
        s = Paho(port, f"diff-w-{i}").connect()
        s.subscribe(f, 1)
        s.subscribe("diffmark", 1)
        subs.append(s)
    for t in TOPICS:
        pub.publish(t, t.encode(), 1)
    settle(subs, "diffmark", pub)
    result = {
        f: sorted(m.topic for m in s.messages if m.topic != "diffmark")
        for f, s in zip(FILTERS, subs, strict=True)
    }
    for c in (pub, *subs):
        c.disconnect()
    return result


def retained(port: int) -> list[tuple[str, bytes, int, bool]]:
    pub = Paho(port, "diff-r-pub").connect()
    pub.publish("r/a", b"one", 1, retain=True)
    pub.publish("r/a", b"two", 2, retain=True)
    pub.publish("r/b", b"gone", 1, retain=True)
    pub.publish("r/b", b"", 1, retain=True)
    pub.publish("r/c/d", b"deep", 0, retain=True)
    pub.publish("r/e", b"live only", 1)
    sub = Paho(port, "diff-r-sub").connect()
    sub.subscribe("r/#", 1)
    sub.subscribe("diffmark", 1)
    settle([sub], "diffmark", pub)
    got = sorted(
        (m.topic, m.payload, m.qos, m.retain) for m in sub.messages if m.topic != "diffmark"
    )
    for t in ("r/a", "r/c/d"):
        pub.publish(t, b"", 1, retain=True)
    pub.disconnect()
    sub.disconnect()
    return got


def qos_downgrade(port: int) -> list[tuple[int, int, int]]:
    pub = Paho(port, "diff-q-pub").connect()
    subs = []
    for sq in range(3):
        s = Paho(port, f"diff-q-{sq}").connect()
        s.subscribe("q/x", sq)
        s.subscribe("diffmark", 1)
        subs.append(s)
    for pq in range(3):
        pub.publish("q/x", b"%d" % pq, pq)
    settle(subs, "diffmark", pub)
    # paho hands a QoS 2 message over only at PUBREL, which may come after the marker:
    # every subscriber gets all three (at a lower QoS or not), so wait for them.
    for s in subs:

        def all_three(s: Paho = s) -> bool:
            return sum(m.topic == "q/x" for m in s.messages) >= 3

        wait_for(all_three, 5, "all three messages")
    got = sorted(
        (sq, int(m.payload), m.qos)
        for sq, s in enumerate(subs)
        for m in s.messages
        if m.topic == "q/x"
    )
    for c in (pub, *subs):
        c.disconnect()
    return got


def subscription_options(port: int) -> dict[str, list[tuple[str, bytes, bool]]]:
    a = Paho(port, "diff-o-a").connect()
    b = Paho(port, "diff-o-b").connect()
    a.subscribe("o/nl", 1, noLocal=True)
    b.subscribe("o/nl", 1, noLocal=True)
    a.subscribe("o/rap", 1, retainAsPublished=True)
    b.subscribe("o/rap", 1)
    for c in (a, b):
        c.subscribe("diffmark", 1)
    a.publish("o/nl", b"from a", 1)
    b.publish("o/rap", b"kept flag", 1, retain=True)
    settle([a, b], "diffmark", b)
    out = {
        name: sorted((m.topic, m.payload, m.retain) for m in c.messages if m.topic != "diffmark")
        for name, c in (("a", a), ("b", b))
    }
    a.publish("o/rap", b"", 1, retain=True)
    h = Paho(port, "diff-o-h").connect()
    b.publish("o/rh", b"r", 1, retain=True)
    h.subscribe("o/rh", 1, retainHandling=1)
    h.subscribe("o/rh", 1, retainHandling=1)
    h.subscribe("diffmark", 1)
    settle([h], "diffmark", b)
    out["handling1"] = sorted(
        (m.topic, m.payload, m.retain) for m in h.messages if m.topic != "diffmark"
    )
    b.publish("o/rh", b"", 1, retain=True)
    for c in (a, b, h):
        c.disconnect()
    return out


def persistent_queue(port: int) -> list[bytes]:
    sub = Paho(port, "diff-p-sub")
    sub.connect(clean=False, session_expiry=600)
    sub.subscribe("p/#", 2)
    sub.disconnect()
    pub = Paho(port, "diff-p-pub").connect()
    for i in range(10):
        pub.publish("p/x", b"%d" % i, 1 + i % 2)
    sub.connect(clean=False, session_expiry=600)
    got = [m.payload for m in sub.wait_messages(10)]
    sub.disconnect()
    Paho(port, "diff-p-sub").connect(clean=True).disconnect()
    pub.disconnect()
    return got


def will(port: int) -> list[tuple[str, bytes, int]]:
    w = Paho(port, "diff-will-w", 4).connect()
    w.subscribe("will/#", 2)
    d = Paho(port, "diff-will-d", 4)
    d.connect(will=("will/d", b"bye", 2, False))
    d.kill()
    got = [(m.topic, m.payload, m.qos) for m in w.wait_messages(1)]
    w.disconnect()
    return got


def mqtt31(port: int) -> dict[str, Any]:
    """MQTT 3.1 (paho's MQTTv31, protocol name MQIsdp): QoS 0-2 from a 3.1.1 client, a
    persistent 3.1 session's queue, CONNACK flags (none in 3.1), a 3.1 client's will."""
    events: dict[str, list[Any]] = {}

    def client31(client_id: str, clean: bool = True, will: bool = False) -> mqtt.Client:
        log = events.setdefault(client_id, [])
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv31,
            clean_session=clean,
        )
        c.on_connect = lambda _c, _u, flags, rc, _p=None: log.append(
            ("connack", flags.session_present, rc.value)
        )
        c.on_message = lambda _c, _u, m: log.append((m.topic, bytes(m.payload), m.qos))
        if will:
            c.will_set("m31/will", b"gone", 1)
        c.connect("127.0.0.1", port, 30)
        c.loop_start()
        wait_for(lambda: any(e[0] == "connack" for e in log), 5, "CONNACK")
        return c

    old = client31("diff-31-sub", clean=False)
    old.subscribe([("m31/#", 2)])
    other = Paho(port, "diff-31-311", 4).connect()
    other.subscribe("m31/#", 2)
    other.subscribe("diffmark", 1)
    wait_for(lambda: old.want_write() is False, 5, "subscribe sent")
    for qos in (0, 1, 2):
        other.publish(f"m31/from311/q{qos}", b"%d" % qos, qos)
    settle([other], "diffmark", other)
    wait_for(lambda: len(events["diff-31-sub"]) >= 4, 5, "3.1 deliveries")
    # paho acknowledges after on_message, in its loop thread: a SUBACK read after the
    # last delivery means every PUBACK/PUBCOMP is queued before the DISCONNECT below.
    subacked: list[int] = []
    old.on_subscribe = lambda *_a: subacked.append(1)
    old.subscribe("m31-sync", 0)
    wait_for(lambda: subacked, 5, "SUBACK after the deliveries")
    old.disconnect()
    old.loop_stop()
    other.publish("m31/queued", b"while away", 1)
    again = client31("diff-31-sub", clean=False)
    wait_for(lambda: len(events["diff-31-sub"]) >= 6, 5, "queued message")
    dying = client31("diff-31-will", will=True)
    dying.loop_stop()
    sock = dying.socket()
    assert sock is not None
    sock.close()  # no DISCONNECT: the will goes out
    settle([other], "diffmark", other)
    wait_for(lambda: "m31/will" in {m.topic for m in other.messages}, 5, "will")
    wait_for(lambda: any(e[0] == "m31/will" for e in events["diff-31-sub"]), 5, "will on 3.1")
    out = {
        "31": sorted(map(str, events["diff-31-sub"])),
        "311": sorted((m.topic, m.payload, m.qos) for m in other.messages if m.topic != "diffmark"),
    }
    again.disconnect()
    again.loop_stop()
    other.disconnect()
    return out


SCENARIOS: list[Scenario] = [
    wildcard_matrix,
    retained,
    qos_downgrade,
    subscription_options,
    persistent_queue,
    will,
    mqtt31,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_same_deliveries_as_mosquitto(
    scenario: Scenario, ledge: LedgeProcess, mosquitto: MosquittoProcess
) -> None:
    reference = scenario(mosquitto.port)
    ours = scenario(ledge.port)
    assert ours == reference
    assert ours  # the scenario delivered something at all


def test_wildcard_matrix_is_what_the_spec_says(ledge: LedgeProcess) -> None:
    """A guard that the reference is right too (leading wildcards skip $ topics)."""
    result = wildcard_matrix(ledge.port)
    assert result["#"] == sorted(t for t in TOPICS if not t.startswith("$"))
    assert result["$w/#"] == ["$w/b/c"]
    assert result["w/#"] == ["w", "w//c", "w/b", "w/b/c", "w/b/c/d"]
