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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.procs import LedgeProcess, free_port
from tests.support.wait import wait_for

TOPIC = "crash"
#: The user property the publishers with properties send (name -> their own name).
PROPERTY = "crash-publisher"
#: Publishers that send properties, and the one that publishes retained messages.
WITH_PROPERTIES = ("p4",)
RETAINED = "r1"


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
    sent: int = 0
    acked: set[int] = field(default_factory=set)
    mids: dict[int, int] = field(default_factory=dict)
    early: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

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
            if seq is None:
                if ok:
                    self.early.add(mid)  # acknowledged before publish() returned
            elif ok:
                self.acked.add(seq)

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                pending = len(self.mids)
            if pending >= 80:
                # Bounded backlog in the client, and below Ledge's receive maximum of 100:
                # paho re-sends its whole backlog after a reconnect, ignoring its own
                # in-flight window, and more than 100 unacknowledged QoS 2 is a
                # protocol error (DISCONNECT 0x93).
                self.stop.wait(0.005)
                continue
            seq = self.sent + 1
            props = None
            if self.properties:
                props = Properties(PacketTypes.PUBLISH)
                props.UserProperty = (PROPERTY, self.name)
                props.ContentType = "text/plain"
            info = self.client.publish(
                f"{TOPIC}/{self.name}",
                f"{self.name}:{seq}".encode(),
                self.qos,
                self.retain,
                properties=props,
            )
            with self.lock:
                if info.mid in self.early:
                    self.early.discard(info.mid)
                    self.acked.add(seq)
                else:
                    self.mids[info.mid] = seq
            self.sent = seq

    def finish(self, timeout: float) -> None:
        self.stop.set()
        self.thread.join(5)
        wait_for(lambda: not self.mids, timeout, f"{self.name}'s messages acknowledged")


@dataclass
class Subscriber:
    name: str
    qos: int
    version: int
    port: int
    received: list[tuple[str, int]] = field(default_factory=list)
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
            client.subscribe(f"{TOPIC}/#", self.qos)

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        name, _, seq = bytes(msg.payload).decode().partition(":")
        with self.lock:
            self.received.append((name, int(seq)))
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
class Report:
    iterations: int
    published: int
    acknowledged: int
    checked: int
    problems: list[str]


def run(
    iterations: int, directory: Path, seed: int | None = None, durability: str = "power"
) -> Report:
    rnd = random.Random(seed)
    port = free_port()
    data = directory / "data"
    config = directory / "crash.toml"
    # Queues big enough for subscribers that fall behind while the broker restarts: the
    # guarantee holds within the queue bounds (beyond them the drop policy applies).
    config.write_text(
        f'[store]\ndurability = "{durability}"\n'
        "[broker]\nmax_queued_messages = 1000000\nmax_queued_bytes = 1000000000\n"
    )
    args = ("--data-dir", str(data))

    def launch() -> LedgeProcess:
        return LedgeProcess(*args, config=config, port=port).start()

    broker = launch()
    subscribers = [
        Subscriber("s1", 1, 5, port),
        Subscriber("s2", 2, 5, port),
        Subscriber("s3", 2, 4, port),
    ]
    for s in subscribers:
        s.start()
    wait_for(lambda: all(s.subscribed.is_set() for s in subscribers), 10, "subscriptions")
    publishers = [
        Publisher("p1", 1, 5, port),
        Publisher("p2", 2, 5, port),
        Publisher("p3", 2, 4, port),
        Publisher("p4", 2, 5, port, properties=True),
        Publisher(RETAINED, 1, 5, port, retain=True),
    ]
    for p in publishers:
        p.start()
    try:
        for _ in range(iterations):
            time.sleep(rnd.uniform(0.2, 0.9))  # run for a while, then the kill at a random moment
            broker.kill()
            broker = launch()
        for p in publishers:
            p.finish(60)
        expected = {p.name: set(p.acked) for p in publishers}

        def complete() -> bool:
            for s in subscribers:
                with s.lock:
                    have = {(n, q) for n, q in s.received}
                for name, seqs in expected.items():
                    if any((name, q) not in have for q in seqs):
                        return False
            return True

        with contextlib.suppress(AssertionError):  # reported below, message by message
            wait_for(complete, 60, "every acknowledged message at every subscriber")
        kept = _retained_seq(port)
    finally:
        for client in [p.client for p in publishers] + [s.client for s in subscribers]:
            client.loop_stop()
            client.disconnect()
            # paho's wake-up socket pair, closed now: each client sits in a reference
            # cycle (its callbacks are methods of the object holding it), and the
            # collector may finalize the pair before paho closes it ("unclosed socket")
            client._reset_sockets()
        broker.stop()
    problems: list[str] = []
    last = max(expected[RETAINED], default=0)
    if kept is None or kept < last:
        problems.append(f"retained: the store holds {kept}, acknowledged up to {last}")
    checked = 0
    for s in subscribers:
        with s.lock:
            received = list(s.received)
            problems.extend(
                f"{s.name}: {n}:{q} arrived without its properties" for n, q in s.stripped
            )
        counts = Counter(received)
        for p in publishers:
            firsts = [q for (n, q) in dict.fromkeys(received) if n == p.name]
            if firsts != sorted(firsts):
                problems.append(f"{s.name}: messages of {p.name} out of order")
            exactly_once = p.qos == 2 and s.qos == 2
            for q in expected[p.name]:
                checked += 1
                n = counts[(p.name, q)]
                if n == 0:
                    problems.append(f"{s.name}: {p.name}:{q} acknowledged but never delivered")
                elif exactly_once and n > 1:
                    problems.append(f"{s.name}: {p.name}:{q} delivered {n} times at QoS 2")
    return Report(
        iterations=iterations,
        published=sum(p.sent for p in publishers),
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
