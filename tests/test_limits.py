"""Bounds and their policies: the connection pool, slow consumers, flooding."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from gateway.broker.core import OVERFLOW_SLOTS
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    Connect,
    Disconnect,
    Publish,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from tests.support.clients import Paho
from tests.support.harness import Harness
from tests.support.procs import LedgeProcess
from tests.support.wait import wait_for


def test_slots_are_preallocated_and_returned_to_the_pool() -> None:
    h = Harness(max_connections=3)
    free = h.broker.free
    assert len(free) == 3
    slots = {id(s) for s in free}
    clients = [h.client() for _ in range(3)]
    for i, c in enumerate(clients):
        c.connect(f"c{i}")
    assert not free
    for c in clients:
        c.drop()
    assert len(free) == 3
    assert {id(s) for s in free} == slots  # the same objects, reused


def test_a_reused_slot_carries_nothing_of_its_previous_connection() -> None:
    h = Harness(max_connections=1)
    a = h.client()
    a.connect("a", keep_alive=10)
    a.send_raw(b"\x30")  # half a packet left in the read buffer
    a.drop()
    b = h.client()
    assert b.conn is a.conn  # same slot
    b.connect("b", keep_alive=0)
    h.advance(60)  # a's keep-alive timer fires into the reused slot: it must not act
    assert not b.closed
    assert b.conn.client_id == "b"


@pytest.mark.parametrize(("version", "code"), [(MQTT_5, 0x97), (MQTT_311, 0x03)])
def test_beyond_the_pool_connect_is_refused_in_the_clients_version(version: int, code: int) -> None:
    h = Harness(max_connections=1)
    h.client().connect("inside")
    extra = h.client(version)
    assert extra.conn.overflow
    assert extra.connect("outside").reason_code == code
    assert extra.closed
    assert h.broker.stats.connections_refused == 1


def test_refusal_slots_are_bounded_too() -> None:
    h = Harness(max_connections=1)
    h.client().connect("inside")
    waiting = [h.broker.open_connection("x:1", "t", h.now) for _ in range(OVERFLOW_SLOTS)]
    assert all(c is not None for c in waiting)
    assert h.broker.open_connection("x:2", "t", h.now) is None
    assert h.broker.stats.connections_refused == 1


def test_slow_consumer_is_cut_off_after_the_deadline() -> None:
    h = Harness(slow_consumer_timeout=30)
    sub = h.client()
    sub.connect("slow")
    sub.subscribe("t", 1)
    h.broker.set_writable(sub.conn, False, h.now)
    h.advance(29)
    assert not sub.closed
    h.advance(2)
    assert sub.closed and sub.conn.abort


def test_a_consumer_that_resumes_in_time_is_kept() -> None:
    h = Harness(slow_consumer_timeout=30)
    sub = h.client()
    sub.connect("slowish")
    h.broker.set_writable(sub.conn, False, h.now)
    h.advance(20)
    h.broker.set_writable(sub.conn, True, h.now)
    h.advance(20)
    assert not sub.closed


# --------------------------------------------------------------------------- real sockets


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_subscriber_that_never_reads_cannot_grow_the_broker(tmp_path: Path) -> None:
    """Flood a subscriber that never reads: QoS 0 to it is dropped and counted, the
    broker's RSS stays within its bound, and the subscriber is cut off at its deadline."""
    config = tmp_path / "c.toml"
    config.write_text("[broker]\nmax_outbound_bytes = 262144\nslow_consumer_timeout = 3\n")
    proc = LedgeProcess(config=config).start()
    assert proc.proc is not None
    try:
        baseline = rss_kib(proc.proc.pid)
        stuck = socket.create_connection(("127.0.0.1", proc.port))
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(encode(Connect("stuck", MQTT_311), MQTT_311))
        stuck.sendall(encode(Subscribe(1, (SubscriptionRequest("flood/#", 0),)), MQTT_311))
        watcher = Paho(proc.port, "watcher").connect()
        watcher.subscribe("$SYS/broker/publish/messages/dropped/slow consumer")
        flood = socket.create_connection(("127.0.0.1", proc.port))
        flood.sendall(encode(Connect("flood", MQTT_311), MQTT_311))
        batch = encode(Publish("flood/x", b"\xaa" * 1000), MQTT_311) * 256
        sent = 0
        peak = baseline
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # ~250 kB per write, as fast as it is taken
            flood.sendall(batch)
            sent += len(batch)
            peak = max(peak, rss_kib(proc.proc.pid))
        assert sent > 50_000_000, f"only {sent} bytes flooded"
        # Bound: the outbound limit plus socket buffers and working memory, far below
        # the tens of megabytes the flood carried.
        assert peak - baseline < 40_000, f"RSS grew by {peak - baseline} KiB"
        proc.wait_log(r"closing .*'stuck'.*slow consumer", 10)

        def dropped() -> int:
            return max((int(m.payload) for m in watcher.messages), default=0)

        wait_for(lambda: dropped() > 1000, 15, "drops counted in $SYS")
        watcher.disconnect()
        flood.close()
        stuck.close()
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize(
    ("version", "expected"), [(5, "Quota exceeded"), (4, "Server unavailable")]
)
def test_connection_limit_over_real_sockets(tmp_path: Path, version: int, expected: str) -> None:
    """paho names 3.1.1 return code 3 "Server unavailable"."""
    config = tmp_path / "c.toml"
    config.write_text("[broker]\nmax_connections = 2\n")
    proc = LedgeProcess(config=config).start()
    try:
        a = Paho(proc.port, "a").connect()
        b = Paho(proc.port, "b").connect()
        c = Paho(proc.port, "c", version).connect()
        assert str(c.connack) == expected
        proc.wait_log("connection limit of 2 reached")
        a.disconnect()
        b.disconnect()
        c.client.loop_stop()
    finally:
        assert proc.stop() == 0


def test_timer_heap_stays_bounded_under_connection_churn() -> None:
    """Connect and keep-alive deadlines of closed connections are cancelled, and the heap
    is compacted: churn cannot grow it (this once grew by ~500 bytes per connection)."""
    h = Harness(max_connections=8)
    for i in range(5_000):
        c = h.client()
        c.connect(f"churn{i}", keep_alive=60)
        c.send(Disconnect())
        c.drop()
    assert len(h.broker.timers) == 0
    assert len(h.broker.timers._heap) <= 2 * 64


def test_timers_fire_in_order_and_cancelled_ones_never_fire() -> None:
    from gateway.broker.timers import Timers

    timers = Timers()
    fired: list[str] = []
    handles = {
        name: timers.at(t, lambda arg, now: fired.append(arg), name)
        for name, t in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("x", 1.5)]
    }
    timers.cancel(handles["x"])
    assert timers.next_deadline() == 1.0
    assert timers.run_due(2.5) == 2
    assert fired == ["a", "b"]
    timers.cancel(handles["a"])  # already fired: harmless
    assert len(timers) == 1
    assert timers.run_due(10) == 1 and fired == ["a", "b", "c"]
