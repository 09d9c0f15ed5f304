"""``python -m bench.bridge``: the cloud bridge's outbox under an outage, and its replay.

Per durability setting (a fresh data directory each):

1. **Outbox writes.** The uplink is down (nothing listens at the bridge's address).
   A publisher keeps 100 QoS 1 messages in flight to a topic the bridge mirrors; each
   PUBACK means the message is committed to the outbox. Reported: messages per
   second, and bytes written to disk per 1,000 messages.
2. **Replay.** With N messages queued, Debian's Mosquitto (the cloud) starts with a
   subscriber on the mirrored branch. Reported: messages per second from the first
   to the last one arriving at that subscriber, the window the bridge used (the
   remote's Receive Maximum), and the gateway's CPU time per replayed message.

The same publisher also runs once against Ledge without a bridge (QoS 1 into a
subscriber-less topic, in memory) as the ceiling of the publishing side.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import mqtt
from bench.procs import (
    BROKER_NOFILE,
    BenchError,
    Broker,
    Pinning,
    cpu_seconds,
    free_port,
    kill_all,
    mosquitto_binary,
    port_open,
    rss_kib,
    write_bytes,
)
from gateway.cli.bridge import collect

WINDOW = 100


@dataclass
class Result:
    durability: str
    fill_rate: float
    bytes_per_1000: float | None
    replay_rate: float
    replay_window: str
    cpu_us_per_message: float
    rss_mib: float
    delivered: int
    expected: int


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.01)


def publish_qos1(port: int, topic: str, count: int, payload: bytes) -> float:
    """Publish ``count`` QoS 1 messages keeping ``WINDOW`` in flight; returns seconds."""
    head, body = mqtt.publish_parts(topic, payload, 1)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(mqtt.connect("bench-bridge-pub"))
        got = b""
        while len(got) < 4:
            got += sock.recv(4 - len(got))
        if got != mqtt.CONNACK_ACCEPTED:
            raise BenchError(f"CONNACK refused: {got!r}")
        sent = acked = 0
        pid = 0
        buffer = b""
        start = time.monotonic()

        def batch(k: int) -> bytes:
            nonlocal pid, sent
            out = []
            for _ in range(k):
                pid = pid % 65535 + 1
                out.append(head + pid.to_bytes(2, "big") + body)
            sent += k
            return b"".join(out)

        sock.sendall(batch(min(WINDOW, count)))
        while acked < count:
            data = sock.recv(1 << 16)
            if not data:
                raise BenchError(f"the gateway closed the connection after {acked} PUBACKs")
            buffer += data
            done = 0
            pos = 0
            for first, _start, end in mqtt.frames(buffer):
                pos = end
                if first >> 4 == mqtt.PUBACK:
                    done += 1
            buffer = buffer[pos:]
            acked += done
            more = min(done, count - sent)
            if more > 0:
                sock.sendall(batch(more))
        elapsed = time.monotonic() - start
        sock.sendall(mqtt.DISCONNECT_PACKET)
    return elapsed


class Consumer(threading.Thread):
    """Counts PUBLISH frames on a subscription; remembers when the first and the last came."""

    def __init__(self, port: int, topic_filter: str) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.settimeout(None)
        self.sock.sendall(mqtt.connect("bench-bridge-cloud-sub"))
        self.sock.sendall(mqtt.subscribe(1, [(topic_filter, 0)]))
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.subscribed = threading.Event()

    def run(self) -> None:
        data = b""
        try:
            while True:
                chunk = self.sock.recv(1 << 18)
                if not chunk:
                    return
                data += chunk
                pos = 0
                n = 0
                for first, _s, end in mqtt.frames(data):
                    pos = end
                    kind = first >> 4
                    if kind == mqtt.PUBLISH:
                        n += 1
                    elif kind == mqtt.SUBACK:
                        self.subscribed.set()
                data = data[pos:]
                if n:
                    now = time.monotonic()
                    if not self.count:
                        self.first = now
                    self.count += n
                    self.last = now
        except OSError:
            return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(mqtt.DISCONNECT_PACKET)
        self.sock.close()


def start_mosquitto(workdir: Path, port: int, pinning: Pinning) -> subprocess.Popen[bytes]:
    conf = workdir / f"cloud-{port}.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "max_queued_messages 1000000\nlog_type error\n"
    )
    binary = mosquitto_binary()
    if binary is None:
        raise BenchError("Debian's mosquitto is not installed (apt-get install mosquitto)")
    # The cloud runs on the load generator's core: the gateway keeps its own.
    prefix = ["taskset", "-c", str(pinning.loadgen_cpu)] if pinning.loadgen_cpu is not None else []
    proc = subprocess.Popen([*prefix, binary, "-c", str(conf)], stdout=subprocess.DEVNULL)
    wait(lambda: port_open(port), 10, "mosquitto to listen")
    return proc


def one_run(workdir: Path, pinning: Pinning, durability: str, count: int, payload: bytes) -> Result:
    cloud_port = free_port()
    label = f"bridge-{durability}"
    extra = (
        '\n[gateway]\nid = "bench"\nhealth_interval = 0\n'
        "[[bridges]]\n"
        'name = "cloud"\n'
        f'address = "127.0.0.1:{cloud_port}"\n'
        "reconnect_min = 0.05\nreconnect_max = 0.2\n"
        f"outbox = {{ max_messages = {count * 2}, max_bytes = {count * 1024} }}\n"
        '[[bridges.rules]]\nfilter = "bench/#"\n'
    )
    broker = Broker(
        f"ledge-{durability}",
        workdir,
        label,
        extra_config=extra,
        broker_options="sys_interval = 0.5\n",
    )
    broker.start(pinning, BROKER_NOFILE)
    cloud: subprocess.Popen[bytes] | None = None
    consumer: Consumer | None = None
    try:
        w0 = write_bytes(broker.pid)
        fill = publish_qos1(broker.port, "bench/x", count, payload)
        w1 = write_bytes(broker.pid)
        per_1000 = (w1 - w0) / count * 1000 if w0 is not None and w1 is not None else None
        cloud = start_mosquitto(workdir, cloud_port, pinning)
        consumer = Consumer(cloud_port, "bench/#")
        consumer.start()
        wait(consumer.subscribed.is_set, 10, "the cloud subscriber")
        c0 = cpu_seconds(broker.pid) or 0.0
        deadline = 30 + count / 1000
        wait(lambda: consumer is not None and consumer.count >= count, deadline, "the replay")
        c1 = cpu_seconds(broker.pid) or 0.0
        replay = consumer.last - consumer.first
        status = collect("127.0.0.1", broker.port)
        return Result(
            durability=durability,
            fill_rate=count / fill,
            bytes_per_1000=per_1000,
            replay_rate=(count - 1) / replay if replay > 0 else float("nan"),
            replay_window=status.get("$SYS/broker/bridge/cloud/window", "?"),
            cpu_us_per_message=(c1 - c0) / count * 1e6,
            rss_mib=(rss_kib(broker.pid) or 0) / 1024,
            delivered=consumer.count,
            expected=count,
        )
    finally:
        if consumer is not None:
            consumer.close()
        if cloud is not None:
            cloud.terminate()
            cloud.wait(10)
        broker.stop()


def ceiling(workdir: Path, pinning: Pinning, count: int, payload: bytes) -> float:
    """The publisher against Ledge in memory, no bridge: what the publishing side can do."""
    broker = Broker("ledge", workdir, "ceiling")
    broker.start(pinning, BROKER_NOFILE)
    try:
        return count / publish_qos1(broker.port, "nobody/listens", count, payload)
    finally:
        broker.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bridge",
        description="Fill a cloud bridge's outbox during an outage, then measure its replay "
        "to Debian's Mosquitto.",
    )
    parser.add_argument("--messages", type=int, default=100_000, help="default 100000")
    parser.add_argument("--payload", type=int, default=64, help="payload bytes (default 64)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per setting (default 1)")
    parser.add_argument(
        "--durability", default="power,process", help="store settings to run (default both)"
    )
    args = parser.parse_args(argv)
    pinning = Pinning()
    pinning.pin_self()
    if pinning.note:
        print(f"note: {pinning.note}")
    payload = os.urandom(args.payload // 2).hex().encode()[: args.payload]
    settings = [s.strip() for s in args.durability.split(",") if s.strip()]
    try:
        with tempfile.TemporaryDirectory(prefix="ledge-bench-bridge-") as tmp:
            top = ceiling(Path(tmp), pinning, min(args.messages, 50_000), payload)
            print(
                f"{args.messages:,} messages of {args.payload} B, QoS 1, {WINDOW} in flight; "
                f"publisher ceiling (Ledge in memory, no bridge): {top:,.0f} msg/s"
            )
            print(
                f"{'durability':<11} {'outbox writes/s':>16} {'KiB/1000 msgs':>14} "
                f"{'replay msg/s':>13} {'window':>7} {'CPU µs/msg':>11} {'RSS MiB':>8} "
                f"{'delivered':>10}"
            )
            failed = False
            for durability in settings:
                results = [
                    one_run(Path(tmp), pinning, durability, args.messages, payload)
                    for _ in range(args.rounds)
                ]
                med = statistics.median
                per_k = [r.bytes_per_1000 for r in results if r.bytes_per_1000 is not None]
                delivered = min(r.delivered for r in results)
                failed |= delivered < args.messages
                print(
                    f"{durability:<11} {med(r.fill_rate for r in results):>16,.0f} "
                    f"{(med(per_k) / 1024 if per_k else float('nan')):>14,.0f} "
                    f"{med(r.replay_rate for r in results):>13,.0f} "
                    f"{results[0].replay_window:>7} "
                    f"{med(r.cpu_us_per_message for r in results):>11.1f} "
                    f"{max(r.rss_mib for r in results):>8.1f} "
                    f"{delivered:>10,}"
                )
    except BenchError as exc:
        print(f"bench.bridge: {exc}", file=sys.stderr)
        return 1
    finally:
        kill_all()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
