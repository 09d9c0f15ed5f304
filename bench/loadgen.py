"""Load-generator worker: one process, one role, driven over stdin/stdout.

    python -m bench.loadgen ROLE PARAMS.json

Roles: ``sub`` (subscriber connections that count, acknowledge or time
messages), ``pub`` (a publisher that floods, keeps a QoS 1 window or paces) and
``idle`` (many connections that only connect). The process connects, prints
``READY {...}``, waits for ``GO t0 t1`` (``time.monotonic()`` values, which are
system-wide on Linux), runs, prints ``RESULT {...}`` and exits when stdin closes.

It talks MQTT through :mod:`bench.mqtt` only, so it measures any broker the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

from bench import mqtt

Params = dict[str, Any]

#: Publisher write-buffer high-water mark: beyond it the publisher waits for the socket.
WRITE_HIGH = 256 * 1024
#: Target size of one pre-encoded batch of QoS 0 PUBLISH frames.
BATCH_BYTES = 64 * 1024


#: Problems worth telling the user about, sent along with READY.
NOTES: list[str] = []


def emit(tag: str, payload: Params) -> None:
    if tag == "READY" and NOTES:
        payload = {**payload, "notes": NOTES}
    sys.stdout.write(f"{tag} {json.dumps(payload)}\n")
    sys.stdout.flush()


def setup_process(params: Params) -> None:
    """Pin to the load-generator core and raise the open-file limit as far as allowed."""
    cpu = params.get("cpu")
    if cpu is not None:
        os.sched_setaffinity(0, {int(cpu)})
    need = int(params.get("nofile", 1024))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, need + 256) if hard == resource.RLIM_INFINITY else hard
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    if soft < need:
        NOTES.append(
            f"the load generator's open-file limit is {soft}, below the {need} this scenario "
            "needs: raise it (ulimit -n) or some connections will fail"
        )


class Control:
    """The orchestrator's commands on stdin."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader()

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self.reader), os.fdopen(0, "rb", buffering=0)
        )

    async def go(self) -> tuple[float, float]:
        line = (await self.reader.readline()).decode().split()
        if len(line) != 3 or line[0] != "GO":
            raise SystemExit(f"loadgen: expected GO, got {line!r}")
        return float(line[1]), float(line[2])

    async def expected(self) -> int:
        """The count the orchestrator says was acknowledged to the publishers."""
        line = (await self.reader.readline()).decode().split()
        if len(line) != 2 or line[0] != "EXPECT":
            raise SystemExit(f"loadgen: expected EXPECT, got {line!r}")
        return int(line[1])

    async def end(self) -> None:
        await self.reader.read()


class Client(asyncio.Protocol):
    """One MQTT connection: sends its hello (CONNECT, maybe SUBSCRIBE), awaits the acks.

    After the handshake every chunk goes to the attached handler, unparsed.
    """

    def __init__(self, hello: bytes, expect: int) -> None:
        loop = asyncio.get_running_loop()
        self.hello = hello
        self.expect = expect
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.on_data: Callable[[bytes], None] | None = None
        self.resumed: asyncio.Future[None] | None = None
        self.sent_at = 0.0
        self.acked_at = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH)
        self.sent_at = time.monotonic()
        self.transport.write(self.hello)

    def data_received(self, data: bytes) -> None:
        handler = self.on_data
        if handler is not None:
            handler(data)
            return
        self.buf += data
        if self.ready.done():
            return
        for first, start, end in mqtt.frames(self.buf):
            kind = first >> 4
            if kind == mqtt.CONNACK:
                if self.buf[start + 1]:
                    self._fail(f"CONNACK return code {self.buf[start + 1]}")
                    return
            elif kind == mqtt.SUBACK:
                if 0x80 in self.buf[start + 2 : end]:
                    self._fail("SUBACK refused a filter (0x80)")
                    return
            else:
                continue
            self.expect -= 1
            if self.expect == 0:
                self.acked_at = time.monotonic()
                self.buf = self.buf[end:]
                self.ready.set_result(None)
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection lost: {exc or 'closed by the broker'}")
        if not self.lost.done():
            self.lost.set_result(None)
        if self.resumed is not None and not self.resumed.done():
            self.resumed.set_result(None)

    def pause_writing(self) -> None:
        self.resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.resumed is not None and not self.resumed.done():
            self.resumed.set_result(None)
        self.resumed = None

    # helpers
    def _fail(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(why))

    def attach(self, handler: Callable[[bytes], None]) -> None:
        self.on_data = handler
        if self.buf:
            data, self.buf = self.buf, b""
            handler(data)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(mqtt.DISCONNECT_PACKET)
            self.transport.close()


async def open_client(params: Params, hello: bytes, expect: int) -> Client:
    """Connect, send the hello and wait for its acks, within the worker's timeout."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(float(params.get("timeout", 30.0))):
        _, proto = await loop.create_connection(
            lambda: Client(hello, expect), params["host"], int(params["port"])
        )
        await proto.ready
    return proto


def payload_bytes(size: int) -> bytes:
    return (b"ledge-bench-" * (size // 12 + 1))[:size]


# ---------------------------------------------------------------- subscribers


class Window:
    """Counts inside the measured window ``[t0, t1)`` and in total."""

    __slots__ = ("last", "t0", "t1", "total", "window")

    def __init__(self) -> None:
        self.t0 = float("inf")
        self.t1 = float("inf")
        self.total = 0
        self.window = 0
        self.last = 0.0

    def add(self, n: int, now: float) -> None:
        self.total += n
        self.last = now
        if self.t0 <= now < self.t1:
            self.window += n


async def role_sub(params: Params, control: Control) -> None:
    mode = params["mode"]  # count | qos1 | latency
    qos = 1 if mode == "qos1" else 0
    sample = mqtt.publish(
        params["sample_topic"], payload_bytes(int(params["payload"])), qos, packet_id=1
    )
    shape = mqtt.Shape(sample)
    conns: list[dict[str, Any]] = params["conns"]
    hellos = [
        mqtt.connect(
            c["client_id"],
            int(params.get("keepalive", 600)),
            clean_session=bool(c.get("clean_session", True)),
        )
        + mqtt.subscribe(1, [(f, int(q)) for f, q in c["filters"]])
        for c in conns
    ]
    clients = await asyncio.gather(*(open_client(params, h, 2) for h in hellos))
    emit("READY", {"conns": len(clients)})

    totals = Window()
    per_conn: list[Window] = []
    latencies: list[int] = []
    bounds = [0, 0]  # window in ns, for latency mode

    for client in clients:
        mine = Window()
        per_conn.append(mine)
        if mode == "count":
            counter = mqtt.PublishCounter(shape)
            client.attach(_count_handler(counter, mine, totals))
        elif mode == "qos1":
            client.attach(_qos1_handler(client, shape, sample, mine, totals))
        else:
            client.attach(_latency_handler(mine, totals, latencies, bounds))

    t0, t1 = await control.go()
    bounds[0], bounds[1] = int(t0 * 1e9), int(t1 * 1e9)
    for w in [totals, *per_conn]:
        w.t0, w.t1 = t0, t1
    lowat = int(params.get("rcvlowat", 0)) if mode == "count" else 0
    if lowat:
        set_rcvlowat(clients, lowat)
    quiet = float(params.get("quiet", 0.5))
    drain = float(params.get("drain", 10.0))
    # QoS 1 loss is counted against what the publishers had acknowledged: wait for
    # that many (or the drain deadline), not for a quiet gap, which a loaded
    # machine can open in the middle of a delivery.
    want = await control.expected() if mode == "qos1" else None
    until = max(t1, time.monotonic()) + drain
    while True:
        await asyncio.sleep(0.05)
        now = time.monotonic()
        if now >= t1 and lowat:
            set_rcvlowat(clients, 1)
            lowat = 0
        if now >= until:
            break
        if want is not None:
            if totals.total >= want:
                break
        elif now >= t1 and now - max(totals.last, t1) >= quiet:
            break
    lost_conns = sum(1 for c in clients if c.lost.done())
    result: Params = {
        "window": totals.window,
        "total": totals.total,
        "seconds": t1 - t0,
        "conns": len(clients),
        "lost_conns": lost_conns,
        "min_conn_window": min((w.window for w in per_conn), default=0),
        "max_conn_window": max((w.window for w in per_conn), default=0),
    }
    if mode == "latency":
        result.update(latency_summary(latencies))
    emit("RESULT", result)
    await control.end()
    for c in clients:
        c.close()


def set_rcvlowat(clients: list[Client], nbytes: int) -> None:
    """Wake the reader only once ``nbytes`` are queued (1 = any data).

    Brokers that write each packet on its own send many small segments; waking
    for each would cost the load generator more CPU than the broker spends. The
    measured window uses a large value; afterwards 1, and reading is restarted so
    the readiness of data already queued is re-evaluated.
    """
    for c in clients:
        transport = c.transport
        if transport is None or transport.is_closing():
            continue
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
        if nbytes == 1:
            transport.pause_reading()
            transport.resume_reading()


def _count_handler(
    counter: mqtt.PublishCounter, mine: Window, totals: Window
) -> Callable[[bytes], None]:
    feed = counter.feed

    def on_data(data: bytes) -> None:
        n = feed(data)
        if n:
            now = time.monotonic()
            mine.total += n
            totals.total += n
            mine.last = totals.last = now
            if mine.t0 <= now < mine.t1:
                mine.window += n
                totals.window += n

    return on_data


def _qos1_handler(
    client: Client, shape: mqtt.Shape, sample: bytes, mine: Window, totals: Window
) -> Callable[[bytes], None]:
    hl = len(shape.prefix)
    tlen = int.from_bytes(sample[hl : hl + 2], "big")
    pid_offset = hl + 2 + tlen
    carry = [b""]

    size = shape.size
    prefix = shape.prefix

    def on_data(data: bytes) -> None:
        if carry[0]:
            data = carry[0] + data
        elif len(data) == size and data.startswith(prefix):
            # One frame per segment: brokers that write each packet on its own.
            client.write(b"\x40\x02" + data[pid_offset : pid_offset + 2])
            now = time.monotonic()
            mine.add(1, now)
            totals.add(1, now)
            return
        used, n, acks = mqtt.acks_for(data, shape, pid_offset)
        carry[0] = data[used:]
        if acks:
            client.write(acks)
        if n:
            now = time.monotonic()
            mine.add(n, now)
            totals.add(n, now)

    return on_data


def _latency_handler(
    mine: Window, totals: Window, latencies: list[int], bounds: list[int]
) -> Callable[[bytes], None]:
    carry = [b""]

    def on_data(data: bytes) -> None:
        now_ns = time.monotonic_ns()
        if carry[0]:
            data = carry[0] + data
        pos = 0
        n = 0
        for first, start, end in mqtt.frames(data):
            pos = end
            if first >> 4 != mqtt.PUBLISH:
                continue
            n += 1
            tlen = int.from_bytes(data[start : start + 2], "big")
            body = start + 2 + tlen + (2 if first & 0x06 else 0)
            sent = int.from_bytes(data[body : body + 8], "big")
            if bounds[0] <= sent < bounds[1]:
                latencies.append(now_ns - sent)
        carry[0] = data[pos:]
        if n:
            now = time.monotonic()
            mine.add(n, now)
            totals.add(n, now)

    return on_data


def latency_summary(samples_ns: list[int]) -> Params:
    if not samples_ns:
        return {"samples": 0}
    ordered = sorted(samples_ns)

    def pct(p: float) -> float:
        i = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))
        return ordered[i] / 1e6

    return {
        "samples": len(ordered),
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        "p999_ms": pct(99.9),
        "max_ms": ordered[-1] / 1e6,
    }


# ---------------------------------------------------------------- publishers


async def role_pub(params: Params, control: Control) -> None:
    mode = params["mode"]  # flood | qos1 | paced | probe
    if mode == "probe":
        await role_probe(params, control)
        return
    hello = mqtt.connect(params["client_id"], int(params.get("keepalive", 600)))
    client = await open_client(params, hello, 1)
    emit("READY", {})
    if mode == "flood":
        await _flood(params, client, control)
    elif mode == "qos1":
        await _qos1_window(params, client, control)
    else:
        await _paced(params, client, control)
    await control.end()
    client.close()


async def _drain(client: Client, deadline: float) -> int:
    """Wait (bounded) for the write buffer to empty; returns the bytes left in it."""
    transport = client.transport
    while transport is not None and not transport.is_closing():
        left = transport.get_write_buffer_size()
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(0.01)
    return 0


async def _flood(params: Params, client: Client, control: Control) -> None:
    topics: list[str] = params["topics"]
    payload = payload_bytes(int(params["payload"]))
    frames = [mqtt.publish(t, payload) for t in topics]
    reps = max(1, BATCH_BYTES // sum(len(f) for f in frames))
    batch = b"".join(frames) * reps
    per_batch = len(frames) * reps
    t0, t1 = await control.go()
    transport = client.transport
    assert transport is not None
    write = transport.write
    sent = 0
    window = 0
    spins = 0
    while not client.lost.done():
        if client.resumed is not None:
            await client.resumed
            continue
        now = time.monotonic()
        if now >= t1:
            break
        write(batch)
        sent += per_batch
        if now >= t0:
            window += per_batch
        spins += 1
        if spins % 64 == 0:
            await asyncio.sleep(0)
    unflushed = await _drain(client, time.monotonic() + 10.0)
    emit(
        "RESULT",
        {
            "sent": sent,
            "window_sent": window,
            "per_batch": per_batch,
            "topics": len(topics),
            "unflushed_bytes": unflushed,
            "lost": client.lost.done(),
        },
    )


async def _qos1_window(params: Params, client: Client, control: Control) -> None:
    topic = params["topic"]
    window_size = int(params.get("window", 100))
    head, payload = mqtt.publish_parts(topic, payload_bytes(int(params["payload"])), 1)
    inflight: set[int] = set()
    state = {"next": 1, "acked": 0, "unknown": 0, "sent": 0, "window_acked": 0}
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    stop_at = [float("inf")]
    ack_shape = mqtt.Shape(mqtt.puback(1))
    bounds = [float("inf"), float("inf")]
    carry = [b""]

    def new_messages(k: int) -> bytes:
        out = []
        nxt = state["next"]
        for _ in range(k):
            while nxt in inflight:
                nxt = nxt % 65535 + 1
            inflight.add(nxt)
            out.append(head + nxt.to_bytes(2, "big") + payload)
            nxt = nxt % 65535 + 1
        state["next"] = nxt
        state["sent"] += k
        return b"".join(out)

    def on_data(data: bytes) -> None:
        if carry[0]:
            data = carry[0] + data
            carry[0] = b""
        if len(data) == 4 and data[0] == 0x40:
            # One PUBACK per segment: brokers that write each packet on its own.
            pid = data[2] << 8 | data[3]
            if pid not in inflight:
                state["unknown"] += 1
                return
            inflight.remove(pid)
            state["acked"] += 1
            now = time.monotonic()
            if bounds[0] <= now < bounds[1]:
                state["window_acked"] += 1
            if now < stop_at[0]:
                client.write(new_messages(1))
            elif not inflight and not done.done():
                done.set_result(None)
            return
        k = ack_shape.run(data, 0)
        pids: list[int] = []
        pos = 0
        if k:
            end = 4 * k
            pids = [hi << 8 | lo for hi, lo in zip(data[2:end:4], data[3:end:4], strict=True)]
            pos = end
        for first, start, end in mqtt.frames(data, pos):
            pos = end
            if first >> 4 == mqtt.PUBACK:
                pids.append(int.from_bytes(data[start : start + 2], "big"))
        carry[0] = data[pos:]
        acked = 0
        for pid in pids:
            if pid in inflight:
                inflight.remove(pid)
                acked += 1
            else:
                state["unknown"] += 1
        state["acked"] += acked
        now = time.monotonic()
        if bounds[0] <= now < bounds[1]:
            state["window_acked"] += acked
        if now < stop_at[0]:
            if acked:
                client.write(new_messages(acked))
        elif not inflight and not done.done():
            done.set_result(None)

    client.attach(on_data)
    t0, t1 = await control.go()
    bounds[0], bounds[1] = t0, t1
    stop_at[0] = t1
    client.write(new_messages(window_size))
    await asyncio.sleep(max(0.0, t1 - time.monotonic()))
    if not inflight and not done.done():
        done.set_result(None)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(done), 10.0)
    emit(
        "RESULT",
        {
            "sent": state["sent"],
            "acked": state["acked"],
            "window_acked": state["window_acked"],
            "unknown_acks": state["unknown"],
            "unacked": len(inflight),
            "lost": client.lost.done(),
        },
    )


async def _paced(params: Params, client: Client, control: Control) -> None:
    topic = params["topic"]
    size = max(8, int(params["payload"]))
    period_ns = int(1e9 / float(params["rate"]))
    prefix = mqtt.publish(topic, b"\x00" * size)[:-size]
    pad = payload_bytes(size - 8)
    _t0, t1 = await control.go()
    end_ns = int(t1 * 1e9)
    write = client.write
    sent = 0
    next_ns = time.monotonic_ns()
    while not client.lost.done():
        now = time.monotonic_ns()
        if now >= end_ns:
            break
        while next_ns <= now:
            write(prefix + time.monotonic_ns().to_bytes(8, "big") + pad)
            sent += 1
            next_ns += period_ns
        await asyncio.sleep((next_ns - time.monotonic_ns()) / 1e9)
    emit("RESULT", {"sent": sent})


def _blocking_client(params: Params, hello: bytes, expect: int) -> socket.socket:
    """A plain blocking connection that has sent ``hello`` and read ``expect`` acks."""
    sock = socket.create_connection((params["host"], int(params["port"])), timeout=10.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(hello)
    buf = b""
    while len(list(mqtt.frames(buf, 0))) < expect:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        buf += chunk
    return sock


async def role_probe(params: Params, control: Control) -> None:
    """Latency without a second process in the path: one thread publishes a time-stamped
    QoS 0 message on one connection and blocks on its own subscription for it, paced
    at ``rate`` per second (one message in flight at a time)."""
    topic = params["topic"]
    size = max(8, int(params["payload"]))
    keepalive = int(params.get("keepalive", 600))
    sub = _blocking_client(
        params,
        mqtt.connect(params["client_id"] + "-sub", keepalive) + mqtt.subscribe(1, [(topic, 0)]),
        2,
    )
    pub = _blocking_client(params, mqtt.connect(params["client_id"] + "-pub", keepalive), 1)
    prefix = mqtt.publish(topic, b"\x00" * size)[:-size]
    pad = payload_bytes(size - 8)
    frame_size = len(prefix) + size
    emit("READY", {})
    t0, t1 = await control.go()
    period_ns = int(1e9 / float(params["rate"]))
    start_ns, end_ns = int(t0 * 1e9), int(t1 * 1e9)
    samples: list[int] = []
    sent = received = 0
    buf = b""
    next_ns = time.monotonic_ns()
    sub.settimeout(1.0)
    while True:
        now = time.monotonic_ns()
        if now >= end_ns:
            break
        if next_ns > now:
            gap = next_ns - now
            if gap > 200_000:  # sleep most of the gap, spin the last 0.2 ms
                # Blocking on purpose: this process does nothing else meanwhile.
                time.sleep((gap - 200_000) / 1e9)  # noqa: ASYNC251
            while time.monotonic_ns() < next_ns:
                pass
        stamp = time.monotonic_ns()
        pub.sendall(prefix + stamp.to_bytes(8, "big") + pad)
        sent += 1
        next_ns += period_ns
        try:
            while len(buf) < frame_size:
                chunk = sub.recv(65536)
                if not chunk:
                    raise ConnectionError("subscriber connection closed")
                buf += chunk
        except TimeoutError:
            buf = b""
            continue  # lost or very late: counted by sent - received
        got = time.monotonic_ns()
        echoed = int.from_bytes(buf[len(prefix) : len(prefix) + 8], "big")
        buf = buf[frame_size:]
        received += 1
        if echoed == stamp and start_ns <= stamp:
            samples.append(got - stamp)
    result: Params = {"sent": sent, "total": received, **latency_summary(samples)}
    emit("RESULT", result)
    await control.end()
    for s in (pub, sub):
        s.close()


# ---------------------------------------------------------------- idle connections


async def role_idle(params: Params, control: Control) -> None:
    count = int(params["count"])
    prefix = params.get("client_prefix", "idle")
    keepalive = int(params.get("keepalive", 600))
    timeout = float(params.get("timeout", 60.0))
    loop = asyncio.get_running_loop()
    clients: list[Client] = []
    errors: dict[str, int] = {}

    async def one(i: int) -> None:
        hello = mqtt.connect(f"{prefix}-{i}", keepalive)
        try:
            _, proto = await loop.create_connection(
                lambda: Client(hello, 1), params["host"], int(params["port"])
            )
            clients.append(proto)
            await proto.ready
        except (OSError, ConnectionError) as exc:
            key = f"{type(exc).__name__}: {exc}"[:120]
            errors[key] = errors.get(key, 0) + 1

    started = time.monotonic()
    try:
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(count))), timeout)
    except TimeoutError:
        errors["timeout"] = errors.get("timeout", 0) + 1
    ok = [c for c in clients if c.ready.done() and not c.ready.exception()]
    first = min((c.sent_at for c in ok), default=started)
    last = max((c.acked_at for c in ok), default=started)
    emit(
        "READY",
        {
            "connected": len(ok),
            "failed": count - len(ok),
            "errors": errors,
            "accept_seconds": last - first,
            "open_seconds": time.monotonic() - started,
        },
    )
    await control.go()
    still = sum(1 for c in ok if not c.lost.done())
    emit("RESULT", {"connected": len(ok), "still_connected": still})
    await control.end()
    for c in clients:
        c.close()


async def role_churn(params: Params, control: Control) -> None:
    """Connect and disconnect ``cycles`` times, ``concurrency`` at once; says MARK after
    the warm-up share of cycles so the orchestrator can read the broker's RSS there."""
    cycles = int(params["cycles"])
    concurrency = int(params.get("concurrency", 50))
    mark_at = int(cycles * float(params.get("mark", 0.1)))
    prefix = params.get("client_prefix", "churn")
    emit("READY", {})
    await control.go()
    done = 0
    failed = 0
    marked = False
    started = time.monotonic()

    async def worker(w: int) -> None:
        nonlocal done, failed, marked
        i = 0
        while done + failed < cycles:
            i += 1
            try:
                client = await open_client(params, mqtt.connect(f"{prefix}-{w}-{i}", 60), 1)
                client.close()
                await client.lost
            except (OSError, ConnectionError, TimeoutError):
                failed += 1
                continue
            done += 1
            if not marked and done >= mark_at:
                marked = True
                emit("MARK", {"done": done, "seconds": time.monotonic() - started})

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    emit("RESULT", {"done": done, "failed": failed, "seconds": time.monotonic() - started})
    await control.end()


ROLES: dict[str, Callable[[Params, Control], Coroutine[Any, Any, None]]] = {
    "churn": role_churn,
    "sub": role_sub,
    "pub": role_pub,
    "idle": role_idle,
}


async def _main(role: str, params: Params) -> None:
    control = Control()
    await control.open()
    await ROLES[role](params, control)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ROLES:
        print(f"usage: python -m bench.loadgen {{{','.join(ROLES)}}} PARAMS.json", file=sys.stderr)
        return 2
    with open(args[1]) as f:
        params: Params = json.load(f)
    setup_process(params)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is installed by scripts/setup
        asyncio.run(_main(args[0], params))
    else:
        uvloop.run(_main(args[0], params))
    return 0


if __name__ == "__main__":
    sys.exit(main())
