"""``python -m bench.metrics``: what a scrape costs the gateway at 1,000 clients and
10,000 subscriptions.

Two measurements in one run:

1. **End to end.** ``ledge run`` with ``[http]``; 1,000 MQTT connections (our codec over
   raw sockets), each with 10 subscriptions. A client then fetches ``/metrics``,
   ``/api/status`` and ``/`` many times over one keep-alive connection. The gateway's
   CPU time (``/proc/<pid>/stat``) over those requests divided by their number is the
   gateway time per request; the client's wall time per request is shown beside it.
2. **In process.** The same population in a broker core driven by fake clients: the
   collector and the view alone (no HTTP), timed with ``perf_counter``. The anchor is
   what the broker already does every ``sys_interval``: ``Broker.sys_values``, the
   ``$SYS`` values Mosquitto's names give (measured at the same size, same run).
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.procs import BROKER_NOFILE, cpu_seconds, kill_all, raise_nofile
from gateway.mqtt import (
    MQTT_5,
    ConnAck,
    Connect,
    NeedData,
    PacketReader,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    encode,
)

CLIENTS = 1000
SUBSCRIPTIONS_EACH = 10


def connect_clients(port: int, count: int, subs: int) -> list[socket.socket]:
    """``count`` MQTT 5.0 clients with ``subs`` subscriptions each, connected and idle."""
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), 10)
        reader = PacketReader(version=MQTT_5)
        requests = tuple(SubscriptionRequest(f"site/{i}/sensor/{j}/#", 1) for j in range(subs))
        sock.sendall(
            encode(Connect(f"bench-{i}", MQTT_5, True, 0), MQTT_5)
            + encode(Subscribe(1, requests), MQTT_5)
        )
        got: list[object] = []
        while len(got) < 2:
            reader.receive_data(sock.recv(65536))
            while not isinstance(packet := reader.next_packet(), NeedData):
                got.append(packet)
        assert isinstance(got[0], ConnAck) and isinstance(got[1], SubAck), got
        socks.append(sock)
    return socks


def end_to_end(requests: int) -> dict[str, tuple[float, float, int]]:
    """path -> (gateway CPU ms per request, client wall ms per request, bytes)."""
    from tests.support.procs import LedgeProcess

    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "ledge.toml"
        config.write_text(
            '[gateway]\nid = "bench"\n[http]\nenabled = true\nport = 0\nmax_requests = 100000\n'
        )
        proc = LedgeProcess(config=config).start(listeners=2)
        assert proc.proc is not None
        pid = proc.proc.pid
        try:
            socks = connect_clients(proc.port, CLIENTS, SUBSCRIPTIONS_EACH)
            conn = http.client.HTTPConnection("127.0.0.1", proc.ports[1], timeout=10)
            out = {}
            for path in ("/metrics", "/api/status", "/"):
                for _ in range(5):  # warm up
                    conn.request("GET", path)
                    conn.getresponse().read()
                before = cpu_seconds(pid) or 0.0
                started = time.perf_counter()
                size = 0
                for _ in range(requests):
                    conn.request("GET", path)
                    response = conn.getresponse()
                    body = response.read()
                    assert response.status == 200
                    size = len(body)
                wall = time.perf_counter() - started
                cpu = (cpu_seconds(pid) or 0.0) - before
                out[path] = (cpu * 1000 / requests, wall * 1000 / requests, size)
            conn.request("GET", "/metrics")
            text = conn.getresponse().read()
            assert b"ledge_subscriptions 10000" in text, "the population is not there"
            assert f'protocol="5.0"}} {CLIENTS}'.encode() in text
            conn.close()
            for sock in socks:
                sock.close()
        finally:
            proc.stop()
    return out


def in_process(rounds: int) -> dict[str, float]:
    """What -> median milliseconds per call, at the same population, in this process."""
    from gateway.metrics import page
    from gateway.metrics.collect import BrokerSource, Collector, ProcessSource
    from gateway.metrics.view import ListenerStatus
    from tests.support.harness import Harness

    h = Harness(max_connections=CLIENTS + 10)
    for i in range(CLIENTS):
        client = h.client(MQTT_5, listener="lan")
        client.connect(f"bench-{i}")
        client.send(
            Subscribe(
                1,
                tuple(
                    SubscriptionRequest(f"site/{i}/sensor/{j}/#", 1)
                    for j in range(SUBSCRIPTIONS_EACH)
                ),
            )
        )
        client.take()
    assert h.broker.index.count == CLIENTS * SUBSCRIPTIONS_EACH
    collector = Collector(h.broker, "bench", lambda: h.now, (ListenerStatus("lan", "tcp", "x"),))
    collector.register(BrokerSource(h.broker, lambda: h.now))
    collector.register(ProcessSource(time.time()))
    jobs: dict[str, Callable[[], object]] = {
        "/metrics (collect + exposition)": collector.metrics,
        "/api/status (collect + document)": collector.status,
        "/ (collect + document + page)": lambda: page.render(collector.status()),
        "anchor: Broker.sys_values ($SYS)": lambda: h.broker.sys_values(h.now),
    }
    out = {}
    for name, job in jobs.items():
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            job()
            times.append((time.perf_counter() - started) * 1000)
        out[name] = statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="requests per path")
    parser.add_argument("--rounds", type=int, default=200, help="in-process calls per job")
    args = parser.parse_args(argv)
    raise_nofile(BROKER_NOFILE)
    try:
        local = in_process(args.rounds)
        anchor = local["anchor: Broker.sys_values ($SYS)"]
        print(f"in process, {CLIENTS} clients, {CLIENTS * SUBSCRIPTIONS_EACH} subscriptions")
        print(f"  {'what':<40} {'median ms':>10} {'x $SYS':>8}")
        for name, ms in local.items():
            print(f"  {name:<40} {ms:>10.3f} {ms / anchor:>8.2f}")
        remote = end_to_end(args.requests)
        print(
            f"ledge run, {CLIENTS} MQTT connections, {CLIENTS * SUBSCRIPTIONS_EACH} subscriptions"
        )
        print(f"  {'path':<14} {'gateway CPU ms':>15} {'client wall ms':>15} {'bytes':>8}")
        for path, (cpu, wall, size) in remote.items():
            print(f"  {path:<14} {cpu:>15.3f} {wall:>15.3f} {size:>8}")
    finally:
        kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
