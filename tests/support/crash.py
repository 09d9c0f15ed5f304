"""Crash harness: real clients publish QoS 1 and 2 while Ledge is SIGKILLed and restarted.

Publishers (paho-mqtt, MQTT 5.0 and 3.1.1, persistent sessions) send numbered
messages as fast as their in-flight windows allow -- plain ones, QoS 2 with properties
and retained ones, so every path to the store is killed under; persistent subscribers
at QoS 1 and QoS 2 record what arrives. At random moments the broker is killed with
SIGKILL and started again on the same port and data directory; the clients
reconnect by themselves. At the end every message a publisher saw acknowledged
must have reached every subscriber -- at least once at QoS 1, exactly once at
QoS 2 end to end, with its properties -- and, per publisher, first arrivals must be in
order; the retained store must hold the last acknowledged retained message (or a later
one).

    python -m tests.support.crash --iterations 200      # the long run (make crash-test)
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MessageState
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.procs import LedgeProcess, free_port
from tests.support.wait import wait_for

#: paho's state of a message it has still to send, or re-send after a reconnect. (Not
#: MQTT_MS_QUEUED: beyond the in-flight window, paho sends those in order as
#: acknowledgements come, and a new message queues behind them.)
_UNSENT = MessageState.MQTT_MS_PUBLISH
TOPIC = "crash"
#: The user property the publishers with properties send (name -> their own name).
PROPERTY = "crash-publisher"
#: Publishers that send properties, and the one that publishes retained messages.
WITH_PROPERTIES = ("p4",)
RETAINED = "r1"
#: The publisher of retained changes, and over how many topics (the power-cut rig).
CHANGES = "rc"
CHANGE_TOPICS = 4
#: The user property carrying the number of a clear (an empty payload has no room).
SEQ_PROPERTY = "crash-seq"


def _keep_pubrel_state_across_reconnect_attempts() -> None:
    """Work around a paho-mqtt 2.x client bug that would show up as broker duplicates.

    On every reconnect attempt paho maps a QoS 2 message waiting for PUBCOMP to
    "resend PUBREL". If the attempt fails before CONNACK (the broker is still
    restarting) and it tries again, the next mapping turns "resend PUBREL" into
    "publish": paho then sends the already-completed message again as a brand-new
    PUBLISH, which any broker must deliver again. Restore the state the mapping
    expects before each attempt.
    """
    original = mqtt.Client._messages_reconnect_reset_out
    if getattr(original, "_ledge_patched", False):
        return

    def reset_out(self: mqtt.Client) -> None:
        with self._out_message_mutex:
            for m in self._out_messages.values():
                if m.state == mqtt.mqtt_ms_resend_pubrel:
                    m.state = mqtt.mqtt_ms_wait_for_pubcomp
        original(self)

    reset_out._ledge_patched = True  # type: ignore[attr-defined]
    mqtt.Client._messages_reconnect_reset_out = reset_out  # type: ignore[method-assign]


_keep_pubrel_state_across_reconnect_attempts()


def _client(client_id: str, version: int) -> mqtt.Client:
    if version == 5:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    else:
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311,
            clean_session=False,
        )
    c.reconnect_delay_set(0.05, 0.5)  # type: ignore[arg-type]  # annotated int, takes float
    return c


def _connect(c: mqtt.Client, port: int, version: int) -> None:
    if version == 5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        c.connect("127.0.0.1", port, 30, clean_start=False, properties=props)
    else:
        c.connect("127.0.0.1", port, 30)


@dataclass
class Publisher:
    name: str
    qos: int
    version: int
    port: int
    #: Retained messages (the retained store is on the path to the disk).
    retain: bool = False
    #: MQTT 5.0 properties on every message (the general path, not the plain fast path).
    properties: bool = False
    #: Retained changes spread over this many topics (``crash/NAME/K``; 1: ``crash/NAME``)...
    topics: int = 1
    #: ... and every this many an empty payload: the topic's retained message cleared
    #: (0: never). A clear carries its number in the user property ``crash-seq``.
    clear_every: int = 0
    sent: int = 0
    acked: set[int] = field(default_factory=set)
    mids: dict[int, int] = field(default_factory=dict)
    early: set[int] = field(default_factory=set)
    #: When the last acknowledgement came (``time.monotonic``; 0: none yet).
    last_ack: float = 0.0
    #: How many of its messages the slowest subscriber still lacks (None: no pacing).
    #: Publishing waits while that exceeds ``max_behind``: the load then runs at the
    #: rate the gateway delivers, and the backlog in its store stays bounded.
    behind: Callable[[Publisher], int] | None = None
    max_behind: int = 2000
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def topic(self, seq: int) -> str:
        if self.topics == 1:
            return f"{TOPIC}/{self.name}"
        return f"{TOPIC}/{self.name}/{seq % self.topics}"

    @property
    def ack(self) -> str:
        """The packet that acknowledges this publisher's messages."""
        return "PUBCOMP" if self.qos == 2 else "PUBACK"

    def unacknowledged(self) -> int:
        """Messages sent and not yet answered."""
        with self.lock:
            return len(self.mids)

    def is_clear(self, seq: int) -> bool:
        return self.clear_every > 0 and seq % self.clear_every == 0

    def payload(self, seq: int) -> bytes:
        """What message ``seq`` carries (empty: it clears its topic's retained message)."""
        return b"" if self.is_clear(seq) else f"{self.name}:{seq}".encode()

    def start(self) -> None:
        self.client = _client(f"crash-{self.name}", self.version)
        self.client.on_publish = self._on_publish
        self.client.max_inflight_messages_set(20)
        _connect(self.client, self.port, self.version)
        self.client.loop_start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        # paho calls this holding its own lock: never call into paho under self.lock.
        ok = not (hasattr(rc, "is_failure") and rc.is_failure)
        with self.lock:
            seq = self.mids.pop(mid, None)
            if ok:
                self.last_ack = time.monotonic()
            if seq is None:
                if ok:
                    self.early.add(mid)  # acknowledged before publish() returned
            elif ok:
                self.acked.add(seq)

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                pending = len(self.mids)
            if pending >= 80 or (self.behind is not None and self.behind(self) > self.max_behind):
                # Bounded backlog in the client, and below Ledge's receive maximum of 100:
                # paho re-sends its whole backlog after a reconnect, ignoring its own
                # in-flight window, and more than 100 unacknowledged QoS 2 is a
                # protocol error (DISCONNECT 0x93). Paced: wait for the subscribers.
                self.stop.wait(0.005)
                continue
            seq = self.sent + 1
            props = None
            if self.properties:
                props = Properties(PacketTypes.PUBLISH)
                props.UserProperty = (PROPERTY, self.name)
                props.ContentType = "text/plain"
            elif self.is_clear(seq) and self.version == 5:
                props = Properties(PacketTypes.PUBLISH)
                props.UserProperty = (SEQ_PROPERTY, str(seq))
            # After a reconnect paho re-sends what is unacknowledged only once the
            # CONNACK comes, but sends a new message at once: published in between,
            # it would overtake the older ones, and a broker keeps the order it is
            # given (a retained topic would end on an older change). So nothing new
            # while an older message waits to be sent; paho's own lock (reentrant)
            # makes the look and the publish one step (the wait is outside it: paho's
            # thread needs the lock to re-send).
            with self.client._out_message_mutex:
                unsent = any(m.state == _UNSENT for m in self.client._out_messages.values())
                if not unsent:
                    info = self.client.publish(
                        self.topic(seq), self.payload(seq), self.qos, self.retain, properties=props
                    )
                    with self.lock:
                        if info.mid in self.early:
                            self.early.discard(info.mid)
                            self.acked.add(seq)
                        else:
                            self.mids[info.mid] = seq
                    self.sent = seq
            if unsent:
                self.stop.wait(0.005)

    def halt(self) -> None:
        """Publish no more; what is in flight may still be acknowledged."""
        self.stop.set()
        if hasattr(self, "thread"):
            self.thread.join(5)


@dataclass
class Subscriber:
    name: str
    qos: int
    version: int
    port: int
    #: What it subscribes to (the bridge's upstream subscriber: the remote prefix).
    topic_filter: str = f"{TOPIC}/#"
    received: list[tuple[str, int]] = field(default_factory=list)
    #: The highest number received per publisher (first arrivals come in order).
    highest: dict[str, int] = field(default_factory=dict)
    #: Messages that should have carried properties and came without them.
    stripped: list[tuple[str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    subscribed: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.client = _client(f"crash-{self.name}", self.version)
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        _connect(self.client, self.port, self.version)
        self.client.loop_start()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if not flags.session_present:
            client.subscribe(self.topic_filter, self.qos)

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:  # a clear: the publisher is named in the topic
            levels = msg.topic.split("/")
            name = levels[levels.index(TOPIC) + 1]
            users = getattr(getattr(msg, "properties", None), "UserProperty", None) or []
            seq = next((v for k, v in users if k == SEQ_PROPERTY), None)
            if seq is None:
                return  # MQTT 3.1.1: a clear cannot be told from another
        else:
            name, _, seq = bytes(msg.payload).decode().partition(":")
        with self.lock:
            self.received.append((name, int(seq)))
            if int(seq) > self.highest.get(name, 0):
                self.highest[name] = int(seq)
            if name in WITH_PROPERTIES and self.version == 5:
                props = getattr(msg, "properties", None)
                users = getattr(props, "UserProperty", None) or []
                if (PROPERTY, name) not in users or getattr(
                    props, "ContentType", None
                ) != "text/plain":
                    self.stripped.append((name, int(seq)))


def _retained_seq(port: int) -> int | None:
    """The sequence number of the retained message the broker holds now (None: none)."""
    got: list[int] = []
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="crash-retained", protocol=mqtt.MQTTv5)
    c.on_message = lambda client, userdata, msg: got.append(
        int(bytes(msg.payload).decode().partition(":")[2])
    )
    c.on_connect = lambda client, *args: client.subscribe(f"{TOPIC}/{RETAINED}", 1)
    c.connect("127.0.0.1", port, 30)
    c.loop_start()
    try:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: got, 10, "the retained message")
    finally:
        c.disconnect()
        c.loop_stop()
    return got[0] if got else None


@dataclass
class Load:
    """The crash harness's clients on one broker port: persistent subscribers at QoS 1
    and 2 (MQTT 5.0 and 3.1.1) and publishers of every kind, with the accounting of
    what was acknowledged and what arrived. The power-cut rig (``tests.support.power``)
    runs the same load."""

    port: int
    #: Add a publisher of retained changes over several topics, a third of them clears.
    retained_changes: bool = False
    #: Pace every publisher to stay at most this many messages ahead of the slowest
    #: local subscriber (None: publish as fast as acknowledgements come).
    max_behind: int | None = None
    subscribers: list[Subscriber] = field(init=False)
    publishers: list[Publisher] = field(init=False)

    def __post_init__(self) -> None:
        port = self.port
        self.subscribers = [
            Subscriber("s1", 1, 5, port),
            Subscriber("s2", 2, 5, port),
            Subscriber("s3", 2, 4, port),
        ]
        self.publishers = [
            Publisher("p1", 1, 5, port),
            Publisher("p2", 2, 5, port),
            Publisher("p3", 2, 4, port),
            Publisher("p4", 2, 5, port, properties=True),
            Publisher(RETAINED, 1, 5, port, retain=True),
        ]
        if self.retained_changes:
            self.publishers.append(
                Publisher(CHANGES, 1, 5, port, retain=True, topics=CHANGE_TOPICS, clear_every=3)
            )
        if self.max_behind is not None:
            for p in self.publishers:
                p.behind, p.max_behind = self.behind, self.max_behind

    def behind(self, p: Publisher) -> int:
        """How many of ``p``'s messages the slowest local subscriber still lacks."""
        return p.sent - min(s.highest.get(p.name, 0) for s in self.subscribers)

    def start(self, *extra: Subscriber) -> None:
        """Subscribers first (``extra`` too), then the publishers."""
        for s in [*self.subscribers, *extra]:
            s.start()
        wait_for(
            lambda: all(s.subscribed.is_set() for s in [*self.subscribers, *extra]),
            10,
            "subscriptions",
        )
        for p in self.publishers:
            p.start()

    def finish(self, timeout: float) -> dict[str, set[int]]:
        """Stop publishing and wait (up to ``timeout`` s, for all of them together)
        until everything sent is acknowledged; returns the acknowledged numbers per
        publisher. AssertionError names each publisher still waiting and for how many.

        Every publisher stops first: one that the broker stopped answering must not
        leave the others flooding it for the rest of the run (each message they send
        then makes every later wait and check slower)."""
        for p in self.publishers:
            p.stop.set()
        for p in self.publishers:
            p.halt()
        try:
            wait_for(
                lambda: not any(p.unacknowledged() for p in self.publishers),
                timeout,
                "every message sent acknowledged",
            )
        except AssertionError:
            waiting = [
                f"{p.name} got no {p.ack} for {n} of its {p.sent} messages"
                for p in self.publishers
                if (n := p.unacknowledged())
            ]
            raise AssertionError(f"within {timeout:g} s: " + "; ".join(waiting)) from None
        return self.acknowledged()

    def acknowledged(self) -> dict[str, set[int]]:
        """The numbers each publisher saw acknowledged so far."""
        out = {}
        for p in self.publishers:
            with p.lock:
                out[p.name] = set(p.acked)
        return out

    def wait_delivered(
        self,
        subscribers: list[Subscriber],
        expected: dict[str, set[int]],
        timeout: float,
        limit: float | None = None,
    ) -> Delivery:
        """Wait until every acknowledged message reached every one of ``subscribers``,
        or until ``timeout`` s pass with none of the missing ones arriving (at most
        ``limit`` s in all; default ``timeout``): a backlog still draining is waited
        for, a stall is not. What is still missing then is reported by ``check``.

        Each poll looks only at what arrived since the last one, so a wait over
        hundreds of thousands of messages does not take the CPU from the gateway."""
        began = time.monotonic()
        limit = timeout if limit is None else max(limit, timeout)
        missing = {
            s.name: {
                (p.name, q)
                for p in self.publishers
                for q in expected[p.name]
                if self._identifiable(p, s, q)
            }
            for s in subscribers
        }
        seen = dict.fromkeys(missing, 0)
        delivery = Delivery(missing=sum(map(len, missing.values())))
        last_progress = began
        while True:
            left = 0
            for s in subscribers:
                with s.lock:
                    new = s.received[seen[s.name] :]
                seen[s.name] += len(new)
                gap = missing[s.name]
                if gap:
                    gap.difference_update(new)
                left += len(gap)
            now = time.monotonic()
            if left < delivery.missing:
                delivery.missing, delivery.last_arrival = left, now - began
                last_progress = now
            if not left or now - last_progress >= timeout or now - began >= limit:
                delivery.waited = now - began
                delivery.stalled = bool(left) and now - last_progress >= timeout
                return delivery
            time.sleep(0.2)

    @staticmethod
    def _identifiable(p: Publisher, s: Subscriber, seq: int) -> bool:
        """A clear reaches an MQTT 3.1.1 subscriber without its number (no properties)."""
        return s.version == 5 or not p.is_clear(seq)

    def check(
        self,
        subscribers: list[Subscriber],
        expected: dict[str, set[int]],
        exactly_once: bool = True,
    ) -> tuple[int, int, list[str]]:
        """``(deliveries checked, duplicates, problems)``: every acknowledged message
        at every subscriber, first arrivals in order per publisher, QoS 2 end to end
        exactly once (unless ``exactly_once`` is off: a QoS 1 hop in between)."""
        problems: list[str] = []
        checked = duplicates = 0
        for s in subscribers:
            with s.lock:
                received = list(s.received)
                problems.extend(
                    f"{s.name}: {n}:{q} arrived without its properties" for n, q in s.stripped
                )
            counts = Counter(received)
            firsts_all = list(dict.fromkeys(received))
            for p in self.publishers:
                firsts = [q for (n, q) in firsts_all if n == p.name]
                if firsts != sorted(firsts):
                    problems.append(f"{s.name}: messages of {p.name} out of order")
                once = exactly_once and p.qos == 2 and s.qos == 2
                lost: list[int] = []
                twice: list[tuple[int, int]] = []
                for q in sorted(expected[p.name]):
                    if not self._identifiable(p, s, q):
                        continue
                    checked += 1
                    n = counts[(p.name, q)]
                    duplicates += max(0, n - 1)
                    if n == 0:
                        lost.append(q)
                    elif once and n > 1:
                        twice.append((q, n))
                # One line per subscriber and publisher, so that thousands of lost
                # messages still leave a report one can read.
                if lost:
                    problems.append(
                        f"{s.name}: {len(lost)} of {p.name}'s {len(expected[p.name])} "
                        f"acknowledged messages never delivered: " + _numbers(p.name, lost)
                    )
                if twice:
                    problems.append(
                        f"{s.name}: {len(twice)} of {p.name}'s messages delivered more than "
                        "once at QoS 2: "
                        + ", ".join(f"{p.name}:{q} x{n}" for q, n in twice[:10])
                        + (", ..." if len(twice) > 10 else "")
                    )
        return checked, duplicates, problems

    def close(self, *extra: Subscriber) -> None:
        for p in self.publishers:
            p.stop.set()  # their threads, too, end with the clients
        clients = [p.client for p in self.publishers if hasattr(p, "client")]
        clients += [s.client for s in [*self.subscribers, *extra] if hasattr(s, "client")]
        for client in clients:
            # DISCONNECT first: paho's loop thread ends only once its queues are
            # empty or its connection is gone, and a QoS 2 flow the gateway never
            # completed keeps its queue full; loop_stop first then waits forever.
            client.disconnect()
            client.loop_stop()
            # paho's wake-up socket pair, closed now: each client sits in a reference
            # cycle (its callbacks are methods of the object holding it), and the
            # collector may finalize the pair before paho closes it ("unclosed socket")
            client._reset_sockets()


@dataclass
class Delivery:
    """How ``Load.wait_delivered`` ended."""

    #: Acknowledged messages still missing at some subscriber (one per subscriber).
    missing: int
    #: Seconds waited, and when (since the start of the wait) the last missing one came.
    waited: float = 0.0
    last_arrival: float = 0.0
    #: Missing ones stopped arriving (False: the wait's limit ended a draining backlog).
    stalled: bool = False

    def describe(self) -> str:
        """What a report says when messages are still missing."""
        if self.stalled:
            why = f"none arrived after {self.last_arrival:.0f} s of the wait"
        else:
            why = f"still arriving when the {self.waited:.0f} s limit ended the wait"
        return f"{self.missing} deliveries missing after {self.waited:.0f} s ({why})"


def _numbers(name: str, seqs: list[int], show: int = 10) -> str:
    """``seqs`` (sorted) as ``name:a, name:b, ...``, the first ``show`` of them."""
    return ", ".join(f"{name}:{q}" for q in seqs[:show]) + (", ..." if len(seqs) > show else "")


@dataclass
class Report:
    iterations: int
    published: int
    acknowledged: int
    checked: int
    problems: list[str]


def write_config(path: Path, durability: str, extra: str = "") -> None:
    # Queues big enough for subscribers that fall behind while the broker restarts: the
    # guarantee holds within the queue bounds (beyond them the drop policy applies).
    path.write_text(
        f'[store]\ndurability = "{durability}"\n'
        "[broker]\nmax_queued_messages = 1000000\nmax_queued_bytes = 1000000000\n" + extra
    )


def run(
    iterations: int, directory: Path, seed: int | None = None, durability: str = "power"
) -> Report:
    rnd = random.Random(seed)
    port = free_port()
    data = directory / "data"
    config = directory / "crash.toml"
    write_config(config, durability)
    args = ("--data-dir", str(data))

    def launch() -> LedgeProcess:
        return LedgeProcess(*args, config=config, port=port).start()

    broker = launch()
    load = Load(port)
    try:
        load.start()
        for _ in range(iterations):
            time.sleep(rnd.uniform(0.2, 0.9))  # run for a while, then the kill at a random moment
            broker.kill()
            broker = launch()
        expected = load.finish(60)
        load.wait_delivered(load.subscribers, expected, 60)
        kept = _retained_seq(port)
    finally:
        load.close()
        broker.stop()
    problems: list[str] = []
    last = max(expected[RETAINED], default=0)
    if kept is None or kept < last:
        problems.append(f"retained: the store holds {kept}, acknowledged up to {last}")
    checked, _, found = load.check(load.subscribers, expected)
    problems += found
    return Report(
        iterations=iterations,
        published=sum(p.sent for p in load.publishers),
        acknowledged=sum(len(v) for v in expected.values()),
        checked=checked,
        problems=problems,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--durability", choices=["power", "process"], default="power")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ledge-crash-") as tmp:
        started = time.monotonic()
        report = run(args.iterations, Path(tmp), args.seed, args.durability)
    print(
        f"{report.iterations} kills in {time.monotonic() - started:.0f} s: "
        f"{report.published} messages published, {report.acknowledged} acknowledged, "
        f"{report.checked} deliveries checked, {len(report.problems)} problems"
    )
    for problem in report.problems[:50]:
        print("  " + problem)
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
