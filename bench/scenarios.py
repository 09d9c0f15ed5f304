"""The scenarios: what load each one puts on a broker and which figure it reports.

One call of :func:`run` starts a fresh broker, the scenario's load-generator
processes, measures, and stops everything again. Subscribers connect first;
when every worker is ready all get the same measured window ``[t0, t1)`` (a
warm-up before it), and figures are computed from what the subscribers received
inside it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.procs import (
    LEDGE_KINDS,
    BenchError,
    Broker,
    LoadGen,
    Pinning,
    RssSampler,
    checkout,
    core_busy,
    core_times,
    cpu_seconds,
    default_commit_interval,
    kill_all,
    rss_kib,
    tail,
    write_bytes,
)

PAYLOAD = 64
#: Counting subscribers are woken only when this much is queued (see loadgen.set_rcvlowat).
RCVLOWAT = 16 * 1024
#: Above this share of its core the load generator may be what limits a figure.
LOADGEN_BUSY = 0.75
#: At or above this share of its core the broker is taken to be the limit.
BROKER_BUSY = 0.95
FILTER_TOPICS = [f"bench/f/{a}/{b:02d}" for a in range(10) for b in range(100)]


@dataclass(frozen=True)
class Settings:
    """Scale and timing of a benchmark invocation."""

    workdir: Path
    pinning: Pinning
    nofile: int
    duration: float = 5.0
    warmup: float = 1.0
    quiet: float = 0.5
    fan_in_publishers: int = 4
    fan_out_subscribers: int = 50
    filter_connections: int = 100
    filters_per_connection: int = 100
    idle_connections: int = 5000
    latency_rate: int = 1000
    qos1_window: int = 100
    churn_cycles: int = 100_000

    @classmethod
    def quick(cls, workdir: Path, pinning: Pinning, nofile: int, duration: float) -> Settings:
        return cls(
            workdir=workdir,
            pinning=pinning,
            nofile=nofile,
            duration=duration,
            warmup=0.3,
            quiet=0.3,
            fan_out_subscribers=10,
            filter_connections=10,
            idle_connections=500,
            churn_cycles=5_000,
        )


@dataclass
class Outcome:
    """One run of one scenario against one broker."""

    scenario: str
    broker: str
    round: int
    figure: float | None = None
    unit: str = ""
    error: str = ""
    idle_rss_kib: int | None = None
    peak_rss_kib: int | None = None
    drops: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error and self.figure is not None


@dataclass(frozen=True)
class Scenario:
    name: str
    unit: str
    higher_is_better: bool
    title: str
    with_relay: bool
    run: Callable[[Settings, str, int], Outcome]
    #: The brokers it applies to (None: all). "base" (--base) goes wherever "ledge" goes.
    only: tuple[str, ...] | None = None

    def runs_on(self, broker: str) -> bool:
        """Whether a round runs this scenario on ``broker``."""
        if broker == "relay" and not self.with_relay:
            return False
        if self.only is None:
            return True
        return broker in self.only or (broker == "base" and "ledge" in self.only)


# ---------------------------------------------------------------- the load harness


@dataclass
class Measured:
    subs: list[dict[str, Any]]
    pubs: list[dict[str, Any]]
    seconds: float
    idle_rss_kib: int | None
    peak_rss_kib: int
    broker_cpu: float | None
    busy: dict[int, float]
    loadgen_cpu: dict[str, float]
    notes: list[str]
    written: int | None = None  # bytes the broker wrote to storage during the window


def _common(settings: Settings, broker: Broker) -> dict[str, Any]:
    return {
        "host": "127.0.0.1",
        "port": broker.port,
        "cpu": settings.pinning.loadgen_cpu,
        "nofile": 1024,
        "timeout": 30.0,
    }


def _sleep_until(t: float) -> None:
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


def _check_broker(broker: Broker, notes: list[str]) -> None:
    problems = broker.log_problems()
    if problems:
        notes.append(f"{broker.kind} logged errors: " + " | ".join(problems[:3]))
    warnings = broker.log_warnings()
    if warnings:
        notes.append(f"{broker.kind} logged {len(warnings)} warning(s), first: {warnings[0]}")


def measure(
    settings: Settings,
    kind: str,
    label: str,
    subs: list[dict[str, Any]],
    pubs: list[dict[str, Any]],
    connections: int,
    unbounded_queues: bool = False,
) -> Measured:
    """Start ``kind``, run subscriber then publisher workers over one window, stop all."""
    broker = Broker(kind, settings.workdir, label, unbounded_queues=unbounded_queues)
    gens: list[LoadGen] = []
    sampler: RssSampler | None = None
    notes: list[str] = []
    cpu0 = cpu1 = None
    written0 = written1 = None
    cores0: dict[int, tuple[int, int]] = {}
    cores1: dict[int, tuple[int, int]] = {}
    gen_cpu: dict[str, float] = {}
    try:
        broker.start(settings.pinning, settings.nofile, max_connections=connections + 1000)
        idle = rss_kib(broker.pid)
        sampler = RssSampler(broker.pid).start()
        common = _common(settings, broker)
        deadline = time.monotonic() + 60.0
        sub_gens = []
        for i, params in enumerate(subs):
            gen = LoadGen(
                "sub", {**common, **params}, settings.workdir / f"{label}-sub{i}.log", f"sub{i}"
            )
            sub_gens.append(gen)
            gens.append(gen)
        ready = [g.expect("READY", deadline) for g in sub_gens]
        pub_gens = []
        for i, params in enumerate(pubs):
            gen = LoadGen(
                "pub", {**common, **params}, settings.workdir / f"{label}-pub{i}.log", f"pub{i}"
            )
            pub_gens.append(gen)
            gens.append(gen)
        ready += [g.expect("READY", deadline) for g in pub_gens]
        for r in ready:
            notes.extend(r.get("notes", []))
        t0 = time.monotonic() + settings.warmup
        t1 = t0 + settings.duration
        for g in gens:
            g.send(f"GO {t0!r} {t1!r}")
        _sleep_until(t0)
        written0 = write_bytes(broker.pid)
        cpu0, cores0 = cpu_seconds(broker.pid), core_times()
        gen0 = [cpu_seconds(g.proc.pid) for g in gens]
        _sleep_until(t1)
        cpu1, cores1 = cpu_seconds(broker.pid), core_times()
        written1 = write_bytes(broker.pid)
        gen1 = [cpu_seconds(g.proc.pid) for g in gens]
        for g, a, b in zip(gens, gen0, gen1, strict=True):
            if a is not None and b is not None:
                gen_cpu[g.name] = round((b - a) / settings.duration, 3)
        deadline = t1 + 60.0
        pub_results = [g.expect("RESULT", deadline) for g in pub_gens]
        if any(params.get("mode") == "qos1" for params in subs):
            acked = sum(int(r.get("acked", 0)) for r in pub_results)
            for g in sub_gens:
                g.send(f"EXPECT {acked}")
        sub_results = [g.expect("RESULT", deadline) for g in sub_gens]
        if not broker.alive():
            raise BenchError(f"{kind} exited during the run:\n{tail(broker.log_path)}")
    except KeyboardInterrupt:
        kill_all()  # interrupted: no graceful stops
        raise
    finally:
        for g in gens:
            g.stop()
        peak = sampler.stop() if sampler is not None else 0
        alive = broker.alive()
        code = broker.stop()
        _check_broker(broker, notes)
        if not alive and code not in (0, None):
            notes.append(f"{kind} exited with code {code}")
    broker_cpu = None
    if cpu0 is not None and cpu1 is not None:
        broker_cpu = (cpu1 - cpu0) / settings.duration
    written = None
    if written0 is not None and written1 is not None:
        written = written1 - written0
    return Measured(
        written=written,
        subs=sub_results,
        pubs=pub_results,
        seconds=settings.duration,
        idle_rss_kib=idle,
        peak_rss_kib=peak,
        broker_cpu=broker_cpu,
        busy=core_busy(cores0, cores1),
        loadgen_cpu=gen_cpu,
        notes=notes,
    )


def _outcome(name: str, kind: str, rnd: int, unit: str, m: Measured) -> Outcome:
    out = Outcome(
        scenario=name,
        broker=kind,
        round=rnd,
        unit=unit,
        idle_rss_kib=m.idle_rss_kib,
        peak_rss_kib=m.peak_rss_kib,
        notes=list(m.notes),
    )
    out.details["broker_cpu"] = m.broker_cpu
    out.details["core_busy"] = {str(k): round(v, 3) for k, v in m.busy.items()}
    out.details["loadgen_cpu"] = m.loadgen_cpu
    out.details["subscribers"] = m.subs
    out.details["publishers"] = m.pubs
    used = sum(m.loadgen_cpu.values())
    # Against the relay the load generator is meant to be the limit; against a broker
    # that itself uses its whole core, the broker is.
    saturated = m.broker_cpu is not None and m.broker_cpu >= BROKER_BUSY
    if used >= LOADGEN_BUSY and kind != "relay" and not saturated:
        out.notes.append(
            f"{name}: the load generator used {used * 100:.0f}% of its core against {kind}; "
            "this figure may be limited by the load generator"
        )
    lost = sum(int(s.get("lost_conns", 0)) for s in m.subs)
    lost += sum(1 for p in m.pubs if p.get("lost"))
    if lost:
        out.notes.append(
            f"{lost} load-generator connection(s) were closed by {kind} during the run"
        )
    return out


def _sub(conns: list[dict[str, Any]], topic: str, settings: Settings, mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "sample_topic": topic,
        "payload": PAYLOAD,
        "conns": conns,
        "quiet": settings.quiet,
        "drain": 10.0,
        "rcvlowat": RCVLOWAT,
    }


def _label(name: str, kind: str, rnd: int) -> str:
    return f"r{rnd}-{name}-{kind}"


# ---------------------------------------------------------------- throughput scenarios


def run_fan_in(settings: Settings, kind: str, rnd: int) -> Outcome:
    n = settings.fan_in_publishers
    conns = [{"client_id": "bench-in-sub", "filters": [["#", 0]]}]
    subs = [_sub(conns, "bench/in/0", settings, "count")]
    pubs = [
        {
            "mode": "flood",
            "client_id": f"bench-in-pub-{i}",
            "topics": [f"bench/in/{i}"],
            "payload": PAYLOAD,
        }
        for i in range(n)
    ]
    m = measure(settings, kind, _label("fan-in", kind, rnd), subs, pubs, n + 1)
    out = _outcome("fan-in", kind, rnd, "msg/s", m)
    received = sum(int(s["total"]) for s in m.subs)
    sent = sum(int(p["sent"]) for p in m.pubs)
    out.figure = sum(int(s["window"]) for s in m.subs) / m.seconds
    out.drops = sent - received
    out.details.update(sent=sent, received=received)
    return out


def run_fan_out(settings: Settings, kind: str, rnd: int) -> Outcome:
    n = settings.fan_out_subscribers
    conns = [{"client_id": f"bench-out-sub-{i}", "filters": [["bench/out", 0]]} for i in range(n)]
    subs = [_sub(conns, "bench/out", settings, "count")]
    pubs = [
        {"mode": "flood", "client_id": "bench-out-pub", "topics": ["bench/out"], "payload": PAYLOAD}
    ]
    m = measure(settings, kind, _label("fan-out", kind, rnd), subs, pubs, n + 1)
    out = _outcome("fan-out", kind, rnd, "deliveries/s", m)
    received = sum(int(s["total"]) for s in m.subs)
    sent = int(m.pubs[0]["sent"])
    out.figure = sum(int(s["window"]) for s in m.subs) / m.seconds
    out.drops = sent * n - received
    out.details.update(
        sent=sent,
        received=received,
        min_sub_window=m.subs[0].get("min_conn_window"),
        max_sub_window=m.subs[0].get("max_conn_window"),
    )
    return out


def run_qos1(settings: Settings, kind: str, rnd: int) -> Outcome:
    conns = [{"client_id": "bench-q1-sub", "filters": [["bench/q1", 1]]}]
    subs = [_sub(conns, "bench/q1", settings, "qos1")]
    pubs = [
        {
            "mode": "qos1",
            "client_id": "bench-q1-pub",
            "topic": "bench/q1",
            "payload": PAYLOAD,
            "window": settings.qos1_window,
        }
    ]
    # Every acknowledged message must arrive: no queue limit to drop it by policy.
    m = measure(settings, kind, _label("qos1", kind, rnd), subs, pubs, 2, unbounded_queues=True)
    out = _outcome("qos1", kind, rnd, "msg/s", m)
    pub = m.pubs[0]
    received = int(m.subs[0]["total"])
    out.figure = int(m.subs[0]["window"]) / m.seconds
    out.drops = int(pub["acked"]) - received
    out.details.update(
        acked=pub["acked"],
        received=received,
        unacked=pub["unacked"],
        unknown_acks=pub["unknown_acks"],
    )
    if pub["unacked"]:
        out.notes.append(f"{pub['unacked']} QoS 1 message(s) never acknowledged to the publisher")
    if pub["unknown_acks"]:
        out.notes.append(f"{pub['unknown_acks']} PUBACK(s) for packet ids not in flight")
    return out


#: The persist scenario's runs, in order: (name in the details, durability, commit
#: interval). "" as the interval is the checkout's default config, what a user gets: with
#: group commit (store.commit_interval, 0.1 s) one commit per interval, so a publisher
#: keeping N messages in flight gets at most N per interval through, whatever the store
#: could do. commit_interval = 0 commits as soon as possible: the store's own speed.
PERSIST_RUNS: tuple[tuple[str, str, str], ...] = (
    ("memory", "", ""),
    ("process", "process", ""),
    ("power", "power", ""),
    ("process_interval0", "process", "0"),
    ("power_interval0", "power", "0"),
)


def persist_kind(kind: str, durability: str, interval: str) -> str:
    """The broker kind of one persist run ("ledge-power", "base-process-0"; see
    :func:`bench.procs.ledge_kind`)."""
    return "-".join(part for part in (kind, durability, interval) if part)


def run_persist(settings: Settings, kind: str, rnd: int) -> Outcome:
    """QoS 1 into a persistent session: Ledge in memory, then with its store under both
    durability settings, first on the default commit interval, then with
    ``commit_interval = 0``, in one run. The figure is the power-safe rate on the default
    config; the details hold every run's rate, its ratio to memory, and bytes written per
    1,000 messages, and the checkout's default commit interval (absent when it has none)."""
    if kind not in LEDGE_KINDS:
        raise BenchError("the persist scenario measures Ledge's own store")
    conns = [{"client_id": "bench-ps-sub", "filters": [["bench/ps", 1]], "clean_session": False}]
    pubs = [
        {
            "mode": "qos1",
            "client_id": "bench-ps-pub",
            "topic": "bench/ps",
            "payload": PAYLOAD,
            "window": settings.qos1_window,
        }
    ]
    rates: dict[str, float] = {}
    written: dict[str, float | None] = {}
    notes: list[str] = []
    measured: dict[str, Measured] = {}
    interval = default_commit_interval(kind)
    if interval is None:
        notes.append(
            f"{checkout(kind)} has no store.commit_interval (it predates group commit): it "
            "commits every change at once, so its commit_interval = 0 runs are its default "
            "config again"
        )
    # The same runs from the broker's own checkout ("base-power" for "base").
    for name, durability, commit_interval in PERSIST_RUNS:
        variant = persist_kind(kind, durability, commit_interval)
        subs = [_sub(conns, "bench/ps", settings, "qos1")]
        label = _label(f"persist-{variant}", kind, rnd)
        m = measure(settings, variant, label, subs, pubs, 2, unbounded_queues=True)
        measured[name] = m
        notes.extend(m.notes)
        received = int(m.subs[0]["window"])
        rates[name] = received / m.seconds
        lost = int(m.pubs[0]["acked"]) - int(m.subs[0]["total"])
        if lost:
            notes.append(f"{variant}: {lost} acknowledged message(s) not received")
        written[name] = None if m.written is None or not received else m.written * 1000 / received
    # RSS, CPU and load-generator notes of the run whose rate is the figure.
    out = _outcome("persist", kind, rnd, "msg/s", measured["power"])
    out.notes = notes
    out.figure = rates["power"]
    memory = rates["memory"] or 1.0
    out.details["memory_msgs"] = rates["memory"]
    for name, _, _ in PERSIST_RUNS[1:]:
        out.details[f"{name}_msgs"] = rates[name]
        out.details[f"{name}_ratio"] = rates[name] / memory
        out.details[f"{name}_bytes_per_1000"] = written[name]
    if interval is not None:
        out.details["commit_interval"] = interval
    return out


def _matches(filt: str, topic: str) -> bool:
    fl = filt.split("/")
    tl = topic.split("/")
    for i, part in enumerate(fl):
        if part == "#":
            return True
        if i >= len(tl) or (part != "+" and part != tl[i]):
            return False
    return len(fl) == len(tl)


def filter_sets(connections: int, per_connection: int) -> list[list[str]]:
    """Each connection's filters: two broad wildcards plus single-topic filters in five forms.

    Connection ``c`` takes ``bench/f/<c%10>/+`` and ``bench/f/+/<c%100>`` and, for
    ``per_connection - 2`` consecutive topics, the exact topic or one of
    ``bench/+/a/b``, ``+/f/a/b``, ``bench/f/a/b/#``, ``+/+/a/b``. Over 100
    connections every topic is matched by about ten single-topic filters and by
    the broad ones.
    """
    single = max(0, per_connection - 2)
    out = []
    for c in range(connections):
        filters = [f"bench/f/{c % 10}/+", f"bench/f/+/{c % 100:02d}"][:per_connection]
        for k in range(single):
            topic = FILTER_TOPICS[(c * single + k) % len(FILTER_TOPICS)]
            _, _, a, b = topic.split("/")
            form = (c + k) % 8
            if form < 4:
                filters.append(topic)
            elif form == 4:
                filters.append(f"bench/+/{a}/{b}")
            elif form == 5:
                filters.append(f"+/f/{a}/{b}")
            elif form == 6:
                filters.append(f"{topic}/#")
            else:
                filters.append(f"+/+/{a}/{b}")
        out.append(filters)
    return out


def expected_deliveries(sets: list[list[str]]) -> int:
    """Deliveries per publish of every topic once, one copy per matching connection."""
    by_a: dict[str, list[str]] = {}
    by_b: dict[str, list[str]] = {}
    for t in FILTER_TOPICS:
        _, _, a, b = t.split("/")
        by_a.setdefault(a, []).append(t)
        by_b.setdefault(b, []).append(t)
    total = 0
    for filters in sets:
        matched: set[str] = set()
        for f in filters:
            parts = f.split("/")
            a = parts[2] if len(parts) > 2 else "#"
            b = parts[3] if len(parts) > 3 else "#"
            if a not in "+#" and b not in "+#":
                candidates = [f"bench/f/{a}/{b}"]
            elif a not in "+#":
                candidates = by_a.get(a, [])
            elif b not in "+#" and a == "+":
                candidates = by_b.get(b, [])
            else:
                candidates = FILTER_TOPICS
            matched.update(t for t in candidates if _matches(f, t))
        total += len(matched)
    return total


def run_filters(settings: Settings, kind: str, rnd: int) -> Outcome:
    sets = filter_sets(settings.filter_connections, settings.filters_per_connection)
    conns = [
        {"client_id": f"bench-f-sub-{i}", "filters": [[f, 0] for f in fs]}
        for i, fs in enumerate(sets)
    ]
    subs = [_sub(conns, FILTER_TOPICS[0], settings, "count")]
    pubs = [
        {"mode": "flood", "client_id": "bench-f-pub", "topics": FILTER_TOPICS, "payload": PAYLOAD}
    ]
    m = measure(settings, kind, _label("filters", kind, rnd), subs, pubs, len(conns) + 1)
    out = _outcome("filters", kind, rnd, "deliveries/s", m)
    # The relay forwards every message to every connection; brokers send one copy per
    # connection with at least one matching filter.
    per_cycle = len(FILTER_TOPICS) * len(sets) if kind == "relay" else expected_deliveries(sets)
    received = sum(int(s["total"]) for s in m.subs)
    cycles = int(m.pubs[0]["sent"]) // len(FILTER_TOPICS)
    out.figure = sum(int(s["window"]) for s in m.subs) / m.seconds
    out.drops = cycles * per_cycle - received
    out.details.update(
        subscriptions=sum(len(s) for s in sets),
        deliveries_per_topic_cycle=per_cycle,
        published=int(m.pubs[0]["sent"]),
        received=received,
    )
    if out.drops < 0:
        out.notes.append(
            f"{kind} delivered {-out.drops} more messages than one copy per matching connection "
            "(copies for overlapping subscriptions)"
        )
    return out


def run_latency(settings: Settings, kind: str, rnd: int) -> Outcome:
    # One process publishes and receives its own messages on two connections, so no
    # hand-over between load-generator processes adds to what is measured.
    probe = {
        "mode": "probe",
        "client_id": "bench-lat",
        "topic": "bench/lat",
        "payload": PAYLOAD,
        "rate": settings.latency_rate,
    }
    m = measure(settings, kind, _label("latency", kind, rnd), [], [probe], 2)
    out = _outcome("latency", kind, rnd, "ms p99", m)
    sub = m.pubs[0]
    if not sub.get("samples"):
        raise BenchError("no latency samples received")
    out.figure = float(sub["p99_ms"])
    out.drops = int(sub["sent"]) - int(sub["total"])
    out.details.update(
        p50_ms=sub["p50_ms"],
        p99_ms=sub["p99_ms"],
        p999_ms=sub["p999_ms"],
        max_ms=sub["max_ms"],
        samples=sub["samples"],
    )
    return out


# ---------------------------------------------------------------- memory and connections


@dataclass
class SoloRun:
    """A broker and one load-generator process, for the scenarios that are not a window
    of traffic (connections held open, connections churned)."""

    broker: Broker
    gen: LoadGen
    idle_rss: int | None
    peak_rss: int = 0
    notes: list[str] = field(default_factory=list)


@contextlib.contextmanager
def solo_run(
    settings: Settings,
    kind: str,
    label: str,
    role: str,
    params: dict[str, Any],
    max_connections: int | None = None,
) -> Iterator[SoloRun]:
    """Start ``kind``, then one ``role`` load generator; stop both and sample peak RSS."""
    broker = Broker(kind, settings.workdir, label)
    sampler: RssSampler | None = None
    run: SoloRun | None = None
    notes: list[str] = []
    try:
        if max_connections is None:
            broker.start(settings.pinning, settings.nofile)
        else:
            broker.start(settings.pinning, settings.nofile, max_connections=max_connections)
        time.sleep(0.2)
        idle = rss_kib(broker.pid)
        sampler = RssSampler(broker.pid).start()
        gen = LoadGen(
            role,
            {**_common(settings, broker), **params},
            settings.workdir / f"{label}-{role}.log",
            role,
        )
        run = SoloRun(broker, gen, idle, notes=notes)
        yield run
    except KeyboardInterrupt:
        kill_all()
        raise
    finally:
        if run is not None:
            run.gen.stop(grace=15.0)
        peak = sampler.stop() if sampler is not None else 0
        if run is not None:
            run.peak_rss = peak
        broker.stop()
        _check_broker(broker, notes)


def run_idle_conns(settings: Settings, kind: str, rnd: int) -> Outcome:
    n = settings.idle_connections
    params = {
        "nofile": n + 100,
        "count": n,
        "client_prefix": f"bench-idle-{rnd}",
        "keepalive": 600,
        "timeout": 60.0,
    }
    label = _label("idle-conns", kind, rnd)
    with solo_run(settings, kind, label, "idle", params, max_connections=n + 1000) as run:
        ready = run.gen.expect("READY", time.monotonic() + 90.0)
        run.notes.extend(ready.get("notes", []))
        time.sleep(1.0)
        connected_rss = rss_kib(run.broker.pid)
        run.gen.send("GO 0 0")
        result = run.gen.expect("RESULT", time.monotonic() + 30.0)
    notes = run.notes
    if settings.nofile < n + 100:
        notes.append(
            f"the broker's open-file limit is {settings.nofile}, below the {n + 100} that "
            f"{n} connections need"
        )
    connected = int(ready["connected"])
    idle = run.idle_rss
    out = Outcome(
        scenario="idle-conns",
        broker=kind,
        round=rnd,
        unit="ms to accept",
        idle_rss_kib=idle,
        peak_rss_kib=run.peak_rss,
        notes=notes,
    )
    if ready["failed"]:
        errors = ", ".join(f"{k} x{v}" for k, v in ready["errors"].items())
        out.notes.append(f"{ready['failed']} of {n} connections failed: {errors}")
    if result["still_connected"] != connected:
        out.notes.append(
            f"{connected - int(result['still_connected'])} connection(s) dropped while idle"
        )
    out.drops = n - connected
    if connected and idle is not None and connected_rss is not None:
        out.details["kib_per_conn"] = (connected_rss - idle) / connected
        out.details["connected_rss_kib"] = connected_rss
    out.details.update(
        connected=connected,
        accept_ms=float(ready["accept_seconds"]) * 1000,
        open_ms=float(ready["open_seconds"]) * 1000,
    )
    if connected == n:
        out.figure = float(ready["accept_seconds"]) * 1000
    else:
        out.error = f"only {connected} of {n} connections accepted"
    return out


def run_churn(settings: Settings, kind: str, rnd: int) -> Outcome:
    """RSS growth over many connect/disconnect cycles, after a 10 % warm-up."""
    params = {
        "cycles": settings.churn_cycles,
        "concurrency": 50,
        "client_prefix": f"bench-churn-{rnd}",
        "timeout": 30.0,
    }
    with solo_run(settings, kind, _label("churn", kind, rnd), "churn", params) as run:
        run.gen.expect("READY", time.monotonic() + 60.0)
        run.gen.send("GO 0 0")
        mark = run.gen.expect("MARK", time.monotonic() + 600.0)
        warm_rss = rss_kib(run.broker.pid)
        result = run.gen.expect("RESULT", time.monotonic() + 1200.0)
        time.sleep(0.5)
        end_rss = rss_kib(run.broker.pid)
    if warm_rss is None or end_rss is None:
        raise BenchError(f"could not read the RSS of {kind}")
    out = Outcome(
        scenario="churn",
        broker=kind,
        round=rnd,
        unit="KiB RSS growth",
        idle_rss_kib=run.idle_rss,
        peak_rss_kib=run.peak_rss,
        notes=run.notes,
        figure=float(end_rss - warm_rss),
    )
    out.drops = int(result["failed"])
    out.details.update(
        cycles=int(result["done"]),
        cycles_per_s=int(result["done"]) / float(result["seconds"]),
        rss_after_warmup_kib=warm_rss,
        rss_end_kib=end_rss,
        warmup_cycles=int(mark["done"]),
    )
    return out


def run_idle_rss(settings: Settings, kind: str, rnd: int) -> Outcome:
    label = _label("idle-rss", kind, rnd)
    broker = Broker(kind, settings.workdir, label)
    notes: list[str] = []
    try:
        broker.start(settings.pinning, settings.nofile, default_config=True)
        time.sleep(1.0)
        rss = rss_kib(broker.pid)
    except KeyboardInterrupt:
        kill_all()
        raise
    finally:
        broker.stop()
        _check_broker(broker, notes)
    if rss is None:
        raise BenchError(f"could not read the RSS of {kind}")
    return Outcome(
        scenario="idle-rss",
        broker=kind,
        round=rnd,
        figure=rss / 1024,
        unit="MiB",
        idle_rss_kib=rss,
        peak_rss_kib=rss,
        notes=notes,
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("fan-in", "msg/s", True, "4 publishers -> 1 subscriber on #", True, run_fan_in),
        Scenario(
            "fan-out", "deliveries/s", True, "1 publisher -> N subscribers", True, run_fan_out
        ),
        Scenario("qos1", "msg/s", True, "QoS 1, 100 in flight, acked", True, run_qos1),
        Scenario(
            "persist",
            "msg/s",
            True,
            "QoS 1 into a persistent session, stored",
            False,
            run_persist,
            only=("ledge",),  # and "base": see Scenario.runs_on
        ),
        Scenario(
            "filters", "deliveries/s", True, "10,000 subscriptions, 1,000 topics", True, run_filters
        ),
        Scenario("idle-conns", "ms to accept", False, "idle connections", True, run_idle_conns),
        Scenario("idle-rss", "MiB", False, "RSS after start, no clients", False, run_idle_rss),
        Scenario("churn", "KiB RSS growth", False, "connect/disconnect cycles", False, run_churn),
        Scenario("latency", "ms p99", False, "QoS 0 at 1,000 msg/s", True, run_latency),
    ]
}
