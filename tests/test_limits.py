"""Bounds and their policies: the connection pool, slow consumers, flooding."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.broker.pool import OVERFLOW_SLOTS
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    Connect,
    Disconnect,
    NeedData,
    PacketReader,
    Publish,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from tests.support.clients import Paho
from tests.support.harness import Harness
from tests.support.procs import LedgeProcess
from tests.support.raw import Raw, round_trip
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


# --------------------------------------------------------------------------- connecting budget


def budget(**settings: Any) -> Harness:
    """A harness with the connecting budget of the gateway (the harness lifts it)."""
    settings.setdefault("connecting_share", 0.25)
    settings.setdefault("max_connecting_per_address", 32)
    # These tests open every connection at one instant: no grace unless a test sets it.
    settings.setdefault("connecting_grace", 0.0)
    return Harness(**settings)


def test_a_burst_younger_than_the_grace_is_admitted_then_trimmed_oldest_first() -> None:
    """A burst of clients is accepted before any CONNECT is read: none of it is evicted
    while the pool has room; when the grace is over, the budgets hold again."""
    h = budget(max_connections=64, max_connecting_per_address=4, connecting_grace=1.0)
    burst = [h.client(peer=f"10.0.0.1:{i}") for i in range(10)]
    assert not any(c.closed for c in burst)
    for i, c in enumerate(burst[:6]):  # most of the burst was only slow to be read
        assert c.connect(f"burst{i}").reason_code == 0
    h.advance(0.5)
    assert not any(c.closed for c in burst)
    h.advance(0.6)  # the grace is over: 4 still connecting from the address, within budget
    assert not any(c.closed for c in burst)
    silent = [h.client(peer=f"10.0.0.2:{i}") for i in range(10)]
    h.advance(1.1)
    assert [c.closed for c in silent] == [True] * 6 + [False] * 4  # the oldest went
    assert h.broker.stats.evicted_address_full == 6
    assert not any(c.closed for c in burst[:6])  # connected: never evicted
    h.advance(10)  # connect_timeout still counts from the start
    assert all(c.closed for c in silent + burst[6:])


def test_the_share_is_trimmed_when_the_grace_is_over_and_a_full_pool_ignores_it() -> None:
    h = budget(max_connections=8, connecting_share=0.5, connecting_grace=1.0)
    young = [h.client(peer=f"10.0.0.{i}:1") for i in range(8)]  # 4 over the share
    assert not any(c.closed for c in young)
    newcomer = h.client(peer="10.0.1.1:1")  # the pool is full: the oldest goes at once
    assert young[0].closed and not newcomer.conn.overflow
    assert newcomer.connect("newcomer").reason_code == 0
    h.advance(1.1)
    assert [c.closed for c in young] == [True] * 4 + [False] * 4
    assert h.broker.stats.evicted_connecting_full == 4


def test_connections_before_connack_hold_only_their_share_and_the_oldest_goes() -> None:
    h = budget(max_connections=8, connecting_share=0.5)  # 4 slots for connecting
    silent = [h.client(peer=f"10.0.0.{i}:1") for i in range(4)]
    assert not any(c.closed for c in silent)
    newcomer = h.client(peer="10.0.1.1:1")
    assert silent[0].closed and silent[0].conn.abort  # the oldest, closed at once
    assert not any(c.closed for c in silent[1:])
    assert newcomer.connect("newcomer").reason_code == 0
    assert h.broker.stats.evicted_connecting_full == 1
    assert h.broker.stats.evicted_address_full == 0
    values = h.broker.sys_values(h.now)
    assert values["$SYS/broker/clients/evicted/connecting full"] == "1"
    assert values["$SYS/broker/clients/connecting"] == "3"


def test_connected_clients_are_never_evicted_by_newcomers() -> None:
    h = budget(max_connections=6, connecting_share=0.5)
    inside = []
    for i in range(6):
        inside.append(h.client(peer=f"10.0.0.{i}:1"))
        assert inside[-1].connect(f"inside{i}").reason_code == 0
    flood = [h.client(peer=f"10.0.2.{i}:1") for i in range(20)]
    assert not any(c.closed for c in inside)
    assert all(c.conn.overflow for c in flood)  # refusal slots only
    assert h.broker.stats.evicted_connecting_full == 0


def test_a_full_pool_evicts_the_oldest_connecting_even_under_its_share() -> None:
    h = budget(max_connections=4, connecting_share=0.5)
    inside = []
    for i in range(3):
        inside.append(h.client(peer=f"10.0.0.{i}:1"))
        inside[-1].connect(f"inside{i}")
    waiting = h.client(peer="10.0.3.1:1")  # the last slot; 1 of 2 connecting slots
    newcomer = h.client(peer="10.0.3.2:1")
    assert waiting.closed and not newcomer.conn.overflow
    assert newcomer.connect("newcomer").reason_code == 0
    assert not any(c.closed for c in inside)


def test_one_address_holds_at_most_its_share_and_its_own_oldest_goes() -> None:
    h = budget(max_connecting_per_address=2)
    other = h.client(peer="10.0.0.2:1")  # older, from elsewhere
    a1 = h.client(peer="10.0.0.1:1")
    a2 = h.client(peer="10.0.0.1:2")
    a3 = h.client(peer="10.0.0.1:3")
    assert a1.closed and not a2.closed and not a3.closed and not other.closed
    assert h.broker.stats.evicted_address_full == 1
    assert h.broker.stats.evicted_connecting_full == 0
    assert h.broker.sys_values(h.now)["$SYS/broker/clients/evicted/address full"] == "1"
    # Connected clients of the address no longer count.
    assert a2.connect("a2").reason_code == 0
    h.client(peer="10.0.0.1:4")
    assert not a3.closed


def test_an_ipv6_slash_64_counts_as_one_address() -> None:
    h = budget(max_connecting_per_address=2)
    a = h.client(peer="2001:db8::1:1000")
    h.client(peer="2001:db8::ffff:1001")
    h.client(peer="2001:db8:0:1::1:1002")  # another /64
    assert not a.closed
    h.client(peer="2001:db8::2:1003")
    assert a.closed
    assert h.broker.stats.evicted_address_full == 1


def test_evicted_slots_keep_the_pool_at_its_size() -> None:
    h = budget(max_connections=4, connecting_share=0.5)
    clients = [h.client(peer=f"10.0.0.{i}:1") for i in range(40)]
    evicted = [c for c in clients if c.closed]
    assert len(evicted) == 38
    for c in clients:
        c.drop()
    assert len(h.broker.free) == 4  # nothing leaked, nothing grown
    assert not h.broker.connecting and not h.broker.connecting_by_address
    assert h.broker.listener_open["test"] == 0


def test_a_login_being_checked_is_evicted_and_its_outcome_goes_nowhere() -> None:
    from gateway.broker.auth import PasswordAuthenticator

    h = budget(max_connections=4, connecting_share=0.25)
    h.broker.authenticator = PasswordAuthenticator(allow_anonymous=False, users={})
    attempts: list[Any] = []
    h.broker.verifier = attempts.append
    guessing = h.client(peer="10.0.0.1:1")
    guessing.send(Connect("g", MQTT_5, username="u", password=b"p"))
    assert len(attempts) == 1
    newcomer = h.client(peer="10.0.0.2:1")
    assert guessing.closed
    h.broker.password_checked(attempts[0], True, h.now)
    assert guessing.take() == []  # no CONNACK for an evicted connection
    assert not newcomer.closed


def test_a_listener_at_its_own_limit_evicts_only_its_own_connecting() -> None:
    from gateway.broker.auth import ListenerPolicy, PasswordAuthenticator

    h = budget(max_connections=8, connecting_share=1.0)
    h.broker.policies = {"lan": ListenerPolicy(PasswordAuthenticator(), None, max_connections=2)}
    elsewhere = h.client(peer="10.0.0.9:1", listener="test")
    lan = [h.client(peer=f"10.0.0.{i}:1", listener="lan") for i in range(3)]
    assert lan[0].closed and not lan[1].closed and not elsewhere.closed
    assert h.broker.listener_open["lan"] == 2


def test_evictions_are_logged_at_powers_of_two(caplog: pytest.LogCaptureFixture) -> None:
    h = budget(max_connections=4, connecting_share=0.25)
    with caplog.at_level(logging.WARNING, "ledge.broker"):
        for i in range(9):
            h.client(peer=f"10.0.0.{i}:1")
    lines = [r.getMessage() for r in caplog.records if "to admit" in r.getMessage()]
    assert len(lines) == 4, lines  # evictions 1, 2, 4 and 8
    assert "(8 evicted so far)" in lines[-1]


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


def open_file_limit(pid: int) -> int:
    """The soft open-file limit of a running process."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit")


def test_the_gateway_raises_its_open_file_limit_for_its_pool() -> None:
    """1024 slots, 64 refusal slots, one listener and the reserve need 1,153
    descriptors, and an accept burst of 1,024 is wanted on top."""
    proc = LedgeProcess(open_files=(256, 8192)).start()
    try:
        assert proc.proc is not None
        assert open_file_limit(proc.proc.pid) == 2177
        proc.wait_log(r"open-file limit raised from 256 to 2177 for 1024 connection slots")
        round_trip(proc.port)
    finally:
        assert proc.stop() == 0


def test_a_hard_limit_below_the_pool_is_named_and_the_pool_shrinks_to_fit(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[broker]\nmax_connections = 1024\n")
    proc = LedgeProcess(config=config, open_files=(300, 300)).start()
    try:
        proc.wait_log(
            r"max_connections = 1024 needs 1153 open files but the limit is 300 \(hard 300\): "
            r"serving at most 171 clients"
        )
        # The pool that fits refuses the rest with a reason code, not a failed accept.
        inside = []
        for i in range(171):
            inside.append(Raw(proc.port))
            assert inside[-1].connect(f"in{i}").reason_code == 0
        extra = Raw(proc.port)
        assert extra.connect("one-too-many").reason_code == 0x97
        for c in [*inside, extra]:
            c.close()
    finally:
        assert proc.stop() == 0


def test_rss_stays_flat_over_connect_disconnect_cycles() -> None:
    """README: RSS stays flat over connect/disconnect cycles (the bench runs 100,000; this
    runs 8,000 after a warm-up). Each cycle connects (3.1.1 and 5.0 in turn), subscribes
    to a wildcard filter and an exact one of its own, and leaves with DISCONNECT or by
    dropping the socket."""
    proc = LedgeProcess().start()
    assert proc.proc is not None
    pid = proc.proc.pid

    def cycles(first: int, count: int) -> None:
        for i in range(first, first + count):
            version = MQTT_5 if i % 2 else MQTT_311
            sock = socket.create_connection(("127.0.0.1", proc.port), 5)
            try:
                sock.sendall(
                    encode(Connect(f"cycle-{i}", version, keep_alive=30), version)
                    + encode(
                        Subscribe(
                            1,
                            (SubscriptionRequest(f"c/{i}/#", 1), SubscriptionRequest(f"e/{i}", 0)),
                        ),
                        version,
                    )
                )
                reader = PacketReader(version=version)
                answers: list[object] = []
                while len(answers) < 2:  # CONNACK, SUBACK
                    chunk = sock.recv(256)
                    assert chunk, f"closed in cycle {i}"
                    reader.receive_data(chunk)
                    while not isinstance(packet := reader.next_packet(), NeedData):
                        answers.append(packet)
                if i % 3:
                    sock.sendall(encode(Disconnect(), version))
            finally:
                sock.close()

    try:
        cycles(0, 2_000)  # warm-up: pools, caches and the allocator's arenas fill
        before = rss_kib(pid)
        cycles(2_000, 8_000)
        after = rss_kib(pid)
        assert after - before < 1024, f"RSS grew by {after - before} KiB over 8,000 cycles"
        round_trip(proc.port)
    finally:
        assert proc.stop() == 0
