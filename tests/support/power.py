"""Power-cut rig: the crash harness's load, with the power cut instead of a kill -9.

Ledge runs with its ``data_dir`` on the lossy file system (``tests.support.lossyfs``),
which keeps every write that was not fsynced apart from the disk. The load is the
crash harness's (``tests.support.crash.Load``: persistent subscribers at QoS 1 and 2,
MQTT 5.0 and 3.1.1, publishers at QoS 1 and 2, with properties, retained) plus a
publisher of retained changes on four topics, a third of them clears (an empty
payload). Ledge bridges ``crash/#`` to Debian's Mosquitto (the cloud, started here on
a free loopback port); the bridge reaches it through a relay that the rig takes down
and brings back at random, so that the outbox fills and drains; a subscriber on the
cloud broker counts what arrives.

At each cut, at a random moment: the gateway is SIGKILLed and at once the file system
loses what was not synced (all of it, or a random subset of 4 KiB pieces in order;
the mode is drawn per cut), is unmounted and mounted again on the same backing
directory -- the power is back. A copy of the store's files is checked with
``PRAGMA integrity_check``; Ledge starts on the store and the time from its start to
its first CONNACK is measured; the retained state is read and must be the last
acknowledged change of each topic (or a later change). At the end every message a
publisher saw acknowledged must have reached every persistent subscriber and the
cloud (duplicates allowed at QoS 1, and counted), QoS 2 exactly once locally, and the
retained state must be the last change of each topic. Every wait has a deadline, so a
run always ends with a verdict: a gateway that stops answering a publisher is named in
it (which publisher, for how many messages, after which cut it last answered), and what
never arrived is counted per subscriber and publisher.

    python -m tests.support.power --cuts 1000      # the long run (make power-test)
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import faulthandler
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from gateway.mqtt import MQTT_5
from tests.support import crash
from tests.support.crash import TOPIC, Load, Publisher, Subscriber
from tests.support.lossyfs import MODES, LossyMount
from tests.support.procs import LedgeProcess, MosquittoProcess, free_port
from tests.support.raw import Raw

#: A retained message set once before the load: the retained-state check subscribes to
#: it after the topics it reads, so its arrival means they have all arrived.
SENTINEL = "power/sentinel"
#: Where the bridge puts ``crash/#`` on the cloud.
REMOTE_PREFIX = "up/"


class Link:
    """The cloud's side of the network, which the rig takes down and brings back: a TCP
    relay on its own loopback port in front of the cloud broker. Down, it refuses
    connections and resets the ones it had, as a lost uplink does; the cloud broker
    itself (and its subscriber's session) stays up. (Stopping Debian's Mosquitto 2.0.11
    instead, even with persistence, lost its subscriber's session across restarts --
    the rig would have blamed Ledge for the cloud's own loss.)"""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.outages = 0
        self.down_seconds = 0.0
        self._down_since: float | None = None
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        if self._down_since is not None:
            self.down_seconds += time.monotonic() - self._down_since
            self._down_since = None

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self.outages += 1
        self._down_since = time.monotonic()

    def toggle(self) -> None:
        if self.running:
            self.stop()
        else:
            self.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                near, _ = listener.accept()
            except OSError:
                return  # taken down
            try:
                far = socket.create_connection(("127.0.0.1", self.target), 5)
            except OSError:
                near.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    near.close()
                    far.close()
                    return
                self._conns += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def write_config(path: Path, durability: str, upstream_port: int) -> None:
    crash.write_config(
        path,
        durability,
        "[[bridges]]\n"
        'name = "cloud"\n'
        f'address = "127.0.0.1:{upstream_port}"\n'
        "reconnect_min = 0.05\nreconnect_max = 0.5\n"
        "[[bridges.rules]]\n"
        f'filter = "{TOPIC}/#"\n'
        f'remote_prefix = "{REMOTE_PREFIX}"\n',
    )


def store_integrity(backing: Path, scratch: Path) -> str:
    """``PRAGMA integrity_check`` on a copy of the store as the power left it (the
    copy recovers the WAL, as Ledge will): "ok", or what is wrong."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for name in ("ledge.db", "ledge.db-wal"):
        if (backing / name).exists():
            shutil.copyfile(backing / name, scratch / name)
    if not (scratch / "ledge.db").exists():
        return "ok"  # cut before the store was made
    try:
        db = sqlite3.connect(scratch / "ledge.db")
        try:
            return str(db.execute("PRAGMA integrity_check").fetchone()[0])
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return f"{type(exc).__name__}: {exc}"


def publish_sentinel(port: int) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="power-sentinel", protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port, 30)
    c.loop_start()
    try:
        c.publish(SENTINEL, b"sentinel", 1, True).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


def retained_state(port: int, topics: list[str], timeout: float = 15.0) -> dict[str, bytes] | None:
    """The retained messages on ``topics`` now (a topic missing: none), or None when
    the sentinel never came (the broker lost it, or did not answer)."""
    got: dict[str, bytes] = {}
    done = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="power-check", protocol=mqtt.MQTTv5)

    def on_message(client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == SENTINEL:
            done.set()
        elif msg.retain:
            got[msg.topic] = bytes(msg.payload)

    def on_connect(client: Any, *args: Any) -> None:
        # One SUBSCRIBE each, in order: the broker answers them in order, so the
        # sentinel comes after every retained message of the topics.
        for topic in topics:
            client.subscribe(topic, 0)
        client.subscribe(SENTINEL, 0)

    c.on_message = on_message
    c.on_connect = on_connect
    c.connect("127.0.0.1", port, 30)
    c.loop_start()
    try:
        return got if done.wait(timeout) else None
    finally:
        c.disconnect()
        c.loop_stop()
        c._reset_sockets()


def check_retained(
    publishers: list[Publisher],
    acked: dict[str, set[int]],
    state: dict[str, bytes],
    upper: dict[str, int],
) -> list[str]:
    """Each retained topic holds its last acknowledged change or a later one (a change
    sent but not yet acknowledged may have been committed): never an older one, and
    never nothing where something acknowledged was set."""
    problems = []
    for p in publishers:
        if not p.retain:
            continue
        for k in range(p.topics):
            topic = p.topic(k)
            seqs = [q for q in acked[p.name] if p.topic(q) == topic]
            if not seqs:
                continue
            last = max(seqs)
            allowed = {
                p.payload(q) or None for q in range(last, upper[p.name] + 1) if p.topic(q) == topic
            }
            have = state.get(topic) or None
            if have not in allowed:
                problems.append(
                    f"retained {topic}: holds {have!r}, the last acknowledged change was "
                    f"{p.name}:{last} ({p.payload(last) or 'clear'!r})"
                )
    return problems


def unanswered(publishers: list[Publisher], waited: float, cut_at: list[float]) -> list[str]:
    """What each publisher still waits for after ``waited`` s, and after which of the
    cuts (at ``cut_at``) its last acknowledgement came: where the gateway stopped
    answering it."""
    problems = []
    for p in publishers:
        n = p.unacknowledged()
        if not n:
            continue
        if not p.last_ack:
            since = "it never got one"
        elif (k := bisect.bisect(cut_at, p.last_ack)) == 0:
            since = "its last one came before the first cut"
        else:
            since = f"its last one came after cut {k} of {len(cut_at)}"
        problems.append(
            f"publisher {p.name} (QoS {p.qos}) got no {p.ack} for {n} of its {p.sent} "
            f"messages within {waited:g} s once the load stopped; {since}"
        )
    return problems


def time_to_connack(port: int, started: float) -> float:
    """Seconds from ``started`` to the first CONNACK of a fresh client."""
    c = Raw(port, MQTT_5)
    try:
        assert c.connect(f"power-probe-{time.monotonic_ns()}").reason_code == 0
        return time.monotonic() - started
    finally:
        c.close()


@dataclass
class PowerReport:
    cuts: int
    #: What was cut: ``durability "power"``, the SD-card image.
    target: str
    seconds: float = 0.0
    modes: Counter[str] = field(default_factory=Counter)
    published: int = 0
    acknowledged: int = 0
    #: Deliveries checked at the local subscribers and at the cloud's subscriber.
    checked: int = 0
    checked_upstream: int = 0
    duplicates: int = 0
    duplicates_upstream: int = 0
    refused_starts: int = 0
    corrupt_stores: int = 0
    retained_checks: int = 0
    upstream_outages: int = 0
    upstream_down_seconds: float = 0.0
    dropped_bytes: int = 0  # unsynced bytes the cuts threw away
    kept_bytes: int = 0  # unsynced bytes random cuts let through
    connack: list[float] = field(default_factory=list)
    #: What fsck found after the cuts, when the target has a file system of its own.
    fsck: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    #: The end: seconds waited for every acknowledged message to be delivered everywhere.
    drained: float = 0.0

    def summary(self) -> str:
        c = sorted(self.connack) or [0.0]
        p95 = c[min(len(c) - 1, int(0.95 * len(c)))]
        return (
            f"{self.cuts} power cuts ({dict(self.modes)}) in {self.seconds:.0f} s, "
            f"{self.target}: {self.published} messages published, "
            f"{self.acknowledged} acknowledged; {self.checked} deliveries checked at the "
            f"subscribers ({self.duplicates} duplicates) and {self.checked_upstream} at the "
            f"cloud ({self.duplicates_upstream} duplicates); {self.retained_checks} "
            f"retained-state checks; {self.refused_starts} starts refused, "
            f"{self.corrupt_stores} corrupt stores; cloud down {self.upstream_outages} "
            f"times ({self.upstream_down_seconds:.0f} s); cuts dropped "
            f"{self.dropped_bytes / 1e6:.1f} MB unsynced, random cuts kept "
            f"{self.kept_bytes / 1e6:.1f} MB; start to first CONNACK: median "
            f"{statistics.median(c) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max "
            f"{c[-1] * 1000:.0f} ms; "
            + (f"fsck after the cuts: {dict(self.fsck)}; " if self.fsck else "")
            + f"end wait for deliveries {self.drained:.0f} s; "
            + f"{len(self.problems)} problems"
        )


@dataclass
class Cut:
    """What one cut left on the disk."""

    dropped: int  # unsynced bytes thrown away
    kept: int  # unsynced bytes a random cut let through
    #: What the disk as the power left it shows: a corrupt store, a file system that
    #: fsck could not repair.
    problems: list[str] = field(default_factory=list)
    #: ``e2fsck`` on the file system as the cut left it: "clean", "repaired" ("": none ran).
    fsck: str = ""


class Target(Protocol):
    """What the rig cuts the power of: a gateway whose MQTT listener is ``port`` on
    loopback, bridging ``crash/#`` to the cloud relay it was made with."""

    port: int
    #: How the disk may lose what was not synced (one drawn per cut).
    modes: tuple[str, ...]
    #: Seconds of load between two cuts (drawn uniformly).
    run_for: tuple[float, float]
    #: How long an answer to a check may take.
    answer_timeout: float
    label: str

    def power_on(self) -> float:
        """Power on; seconds until the first CONNACK (AssertionError: it refused to
        start)."""
        ...

    def power_cut(self, mode: str, seed: int) -> Cut:
        """The gateway dies and, at once, the disk loses what was not synced."""
        ...

    def close(self) -> None: ...


class LocalTarget:
    """``ledge run`` with its ``data_dir`` on the lossy file system."""

    modes: tuple[str, ...] = MODES
    run_for: tuple[float, float] = (0.2, 0.9)
    answer_timeout: float = 15.0

    def __init__(self, directory: Path, upstream_port: int, durability: str = "power") -> None:
        self.directory = directory
        self.label = f'durability "{durability}"'
        self.port = free_port()
        self.backing, self.data = directory / "disk", directory / "mnt"
        self.mount = LossyMount(self.backing, self.data, directory / "lossyfs.sock")
        self.config = directory / "power.toml"
        write_config(self.config, durability, upstream_port)
        self.proc: LedgeProcess | None = None

    def power_on(self) -> float:
        self.mount.mount()
        started = time.monotonic()
        self.proc = LedgeProcess(
            "--data-dir", str(self.data), config=self.config, port=self.port
        ).start()
        return time_to_connack(self.port, started)

    def power_cut(self, mode: str, seed: int) -> Cut:
        assert self.proc is not None
        self.proc.kill()
        self.proc = None
        lost = self.mount.cut(mode, seed)
        self.mount.unmount()
        cut = Cut(lost["dropped"], lost["kept"])
        verdict = store_integrity(self.backing, self.directory / "copy")
        if verdict != "ok":
            cut.problems.append(f"store corrupt: {verdict}")
        return cut

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stop(30)
            self.proc = None
        self.mount.unmount()


def run(
    cuts: int,
    directory: Path,
    seed: int | None = None,
    durability: str = "power",
    settle: float = 120.0,
    max_behind: int = 2000,
    progress: bool = False,
    target: Callable[[Path, int], Target] | None = None,
    every: int = 50,
) -> PowerReport:
    """``cuts`` power cuts under load; ``settle``: how long the end may wait for the
    last acknowledgements, and then for deliveries to go on arriving (what is still
    missing after ``settle`` s without one, or 10 x ``settle`` in all, is reported:
    the run always ends with a verdict). Publishers stay at most ``max_behind``
    messages ahead of the slowest local subscriber: the load runs at the rate the
    gateway delivers and the store's backlog stays bounded over a long run.
    ``target`` makes what is cut from the directory and the cloud relay's port (by
    default ``LocalTarget`` with ``durability``); ``every``: cuts between progress
    lines."""
    rnd = random.Random(seed)
    began = time.monotonic()
    cloud_broker = MosquittoProcess(directory, "max_queued_messages 0\n")
    cloud_broker.start()
    upstream = Link(cloud_broker.port)
    if target is None:
        device: Target = LocalTarget(directory, upstream.port, durability)
    else:
        device = target(directory, upstream.port)
    report = PowerReport(cuts=cuts, target=device.label)
    port = device.port
    load = Load(port, retained_changes=True, max_behind=max_behind)
    cloud = Subscriber("cloud", 1, 5, cloud_broker.port, topic_filter=f"{REMOTE_PREFIX}{TOPIC}/#")
    retained = [p for p in load.publishers if p.retain]
    topics = sorted({p.topic(k) for p in retained for k in range(p.topics)})
    #: When each cut came (``time.monotonic``), to tell after which one a publisher
    #: got its last acknowledgement.
    cut_at: list[float] = []
    try:
        upstream.start()
        device.power_on()  # the first boot: not a power back after a cut
        publish_sentinel(port)
        load.start(cloud)
        shown = 0
        for i in range(cuts):
            # Run for a while, the cloud going away or coming back at a random point
            # in between now and then; then the cut at a random moment.
            run_for = rnd.uniform(*device.run_for)
            if rnd.random() < 0.4:
                first = rnd.uniform(0, run_for)
                time.sleep(first)
                upstream.toggle()
                time.sleep(run_for - first)
            else:
                time.sleep(run_for)
            mode = rnd.choice(device.modes)
            cut_seed = rnd.getrandbits(32)
            # The power fails: the gateway dies and the disk loses what was not synced.
            cut_at.append(time.monotonic())
            cut = device.power_cut(mode, cut_seed)
            report.modes[mode] += 1
            report.dropped_bytes += cut.dropped
            report.kept_bytes += cut.kept
            if cut.fsck:
                report.fsck[cut.fsck] += 1
            acked = {}
            for p in retained:
                with p.lock:
                    acked[p.name] = set(p.acked)
            for problem in cut.problems:
                if problem.startswith("store corrupt"):
                    report.corrupt_stores += 1
                report.problems.append(f"cut {i + 1} ({mode}): {problem}")
            # The power is back.
            try:
                took = device.power_on()
            except (AssertionError, OSError) as exc:
                report.refused_starts += 1
                report.problems.append(f"cut {i + 1} ({mode}): start refused: {exc}")
                if progress:
                    print(f"  {report.problems[-1]}", flush=True)
                return report
            report.connack.append(took)
            state = retained_state(port, topics, device.answer_timeout)
            if state is None:
                report.problems.append(f"cut {i + 1} ({mode}): the retained sentinel is gone")
            else:
                upper = {p.name: p.sent + 1 for p in retained}
                found = check_retained(retained, acked, state, upper)
                report.problems += [f"cut {i + 1} ({mode}): {x}" for x in found]
            report.retained_checks += 1
            if progress:  # as they come: a rig that dies later has still said them
                for problem in report.problems[shown:]:
                    print(f"  {problem}", flush=True)
                shown = len(report.problems)
            if progress and (i + 1) % every == 0:
                print(
                    f"  {i + 1} cuts, {time.monotonic() - began:.0f} s, "
                    f"{len(report.problems)} problems so far",
                    flush=True,
                )
        if not upstream.running:
            upstream.start()
        try:
            expected = load.finish(settle)
        except AssertionError:  # some never acknowledged: reported, the rest checked
            report.problems += [
                f"at the end: {x}" for x in unanswered(load.publishers, settle, cut_at)
            ]
            expected = load.acknowledged()
        # The local subscribers and the cloud together, for as long as the missing
        # ones keep coming: what is missing then is reported by the checks below.
        delivery = load.wait_delivered(
            [*load.subscribers, cloud], expected, settle, limit=10 * settle
        )
        report.drained = delivery.waited
        if delivery.missing:
            report.problems.append(f"at the end: {delivery.describe()}")
        state = retained_state(port, topics, device.answer_timeout)
        if state is None:
            report.problems.append("at the end: the retained sentinel is gone")
        else:
            last = {p.name: p.sent for p in retained}
            report.problems += [
                f"at the end: {x}"
                for x in check_retained(
                    retained, {n: set(v) for n, v in expected.items()}, state, last
                )
            ]
        report.retained_checks += 1
        report.checked, report.duplicates, found = load.check(load.subscribers, expected)
        report.problems += found
        report.checked_upstream, report.duplicates_upstream, found = load.check(
            [cloud], expected, exactly_once=False
        )
        report.problems += found  # each line names the subscriber, "cloud"
    finally:
        report.published = sum(p.sent for p in load.publishers)
        report.acknowledged = sum(len(v) for v in load.acknowledged().values())
        load.close(cloud)
        try:
            device.close()
        except AssertionError as exc:  # it would not stop, or logged a traceback
            report.problems.append(f"at the end: {exc}")
        report.upstream_outages = upstream.outages
        report.upstream_down_seconds = upstream.down_seconds
        upstream.stop()
        cloud_broker.stop()
        report.seconds = time.monotonic() - began
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--durability", choices=["power", "process"], default="power")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID: where is it waiting?
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"seed {seed}", flush=True)
    return report_on(
        args.keep, lambda where: run(args.cuts, where, seed, args.durability, progress=True)
    )


def report_on(keep: Path | None, rig: Callable[[Path], PowerReport]) -> int:
    """Run ``rig`` in ``keep`` (kept) or a temporary directory; print its report; the
    exit status: 1 if it found problems."""
    with contextlib.ExitStack() as stack:
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            where = keep
        else:
            where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ledge-power-")))
        report = rig(where)
    print(report.summary())
    for problem in report.problems[:50]:
        print("  " + problem)
    if len(report.problems) > 50:
        print(f"  ... and {len(report.problems) - 50} more")
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
