"""``python -m bench.serial``: how many lines one serial device sustains into the broker.

A pseudo-terminal stands in for the device. A writer thread pushes lines into the
pty's far end as fast as the gateway drains it (the pty is not baud-limited, so the
gateway is the bottleneck), and an MQTT subscriber on loopback counts the readings
that come out. Per round it reports lines and readings per second, the gateway's CPU
time per reading, and whether every line written became its readings.

A ceiling row shows how fast a bare reader (``os.read`` in a loop, no parsing)
drains the same pty, so the writer is known not to be the limit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import socket
import statistics
import sys
import tempfile
import threading
import time
import tty
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import mqtt
from bench.procs import BROKER_NOFILE, BenchError, Broker, Pinning, cpu_seconds, kill_all, rss_kib
from drivers.parsers import jsonl, kv, nmea

#: One line per protocol; how many readings it yields is asked of the parser itself.
LINES: dict[str, bytes] = {
    "kv": b"temp=21.5 hum=40.1\n",
    "jsonl": b'{"temp": 21.5, "hum": 40.1}\n',
    # GGA: latitude, longitude, fix quality, satellites, hdop, altitude.
    "nmea": b"$GPGGA,123519,4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,*47\r\n",
}
PARSERS = {"kv": kv.parse, "jsonl": jsonl.parse, "nmea": nmea.parse}
BLOCK = 16 * 1024


@dataclass
class Round:
    lines_per_s: float
    readings_per_s: float
    cpu_us_per_reading: float
    cpu_share: float
    written: int
    expected: int
    received: int
    rss_kib: int | None
    drops: dict[str, int]


class Writer(threading.Thread):
    """Writes whole lines into the pty master until told to stop; counts them."""

    def __init__(self, fd: int, line: bytes) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.per_block = BLOCK // len(line)
        self.block = line * self.per_block
        self.lines = 0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        block = self.block
        while not self.stop_flag.is_set():
            view = memoryview(block)
            while view:  # a partial write must be finished so lines stay whole
                view = view[os.write(self.fd, view) :]
            self.lines += self.per_block


class Subscriber(threading.Thread):
    """A plain MQTT 3.1.1 subscriber on loopback counting reading messages.

    The device's status topic (``.../status``) is watched, not counted: ``online``
    says the gateway has opened the device.
    """

    def __init__(self, port: int, topic_filter: str) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.settimeout(None)
        self.sock.sendall(mqtt.connect("bench-serial-sub"))
        self.sock.sendall(
            mqtt.subscribe(1, [(topic_filter, 0), ("$SYS/broker/publish/messages/dropped/+", 0)])
        )
        self.count = 0
        self.online = threading.Event()
        #: The gateway's drop counters by reason, from $SYS.
        self.drops: dict[str, int] = {}

    def run(self) -> None:
        data = b""
        try:
            while True:
                chunk = self.sock.recv(1 << 18)
                if not chunk:
                    break
                data += chunk
                pos = 0
                for first, start, end in mqtt.frames(data):
                    pos = end
                    if first >> 4 != mqtt.PUBLISH:
                        continue
                    size = int.from_bytes(data[start : start + 2], "big")
                    topic = data[start + 2 : start + 2 + size]
                    if topic.startswith(b"$SYS/"):
                        reason = topic.rsplit(b"/", 1)[1].decode()
                        self.drops[reason] = int(data[start + 2 + size : end])
                    elif topic.endswith(b"/status"):
                        if data[start + 2 + size : end] == b"online":
                            self.online.set()
                    else:
                        self.count += 1
                data = data[pos:]
        except OSError:
            pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(mqtt.DISCONNECT_PACKET)
        self.sock.close()


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.01)


def ceiling(line: bytes, duration: float) -> float:
    """Lines per second a bare ``os.read`` loop drains from a pty (no parsing, no MQTT)."""
    master, slave = os.openpty()
    tty.setraw(slave)
    writer = Writer(master, line)
    drained = 0
    writer.start()
    start = time.monotonic()
    while time.monotonic() - start < duration:
        drained += len(os.read(slave, 65536))
    elapsed = time.monotonic() - start
    writer.stop_flag.set()
    while writer.is_alive():  # drain so a blocked write can finish and see the flag
        ready, _, _ = select.select([slave], [], [], 0.1)
        if ready:
            os.read(slave, 65536)
    os.close(slave)
    os.close(master)
    return drained / len(line) / elapsed


def one_round(workdir: Path, pinning: Pinning, protocol: str, duration: float, label: str) -> Round:
    line = LINES[protocol]
    per_line = len(PARSERS[protocol](line.rstrip(b"\r\n")))
    master, slave = os.openpty()
    link = workdir / f"{label}-serial-by-id"
    link.symlink_to(os.ttyname(slave))
    os.close(slave)  # the gateway opens it by the link, as /dev/serial/by-id/...
    extra = (
        '\n[gateway]\nid = "bench"\n'
        f'[[serial]]\nname = "dev"\npath = "{link}"\nprotocol = "{protocol}"\n'
    )
    # Drop counters on $SYS every second.
    broker = Broker(
        "ledge", workdir, label, extra_config=extra, broker_options="sys_interval = 1\n"
    )
    sub: Subscriber | None = None
    writer: Writer | None = None
    try:
        broker.start(pinning, BROKER_NOFILE)
        sub = Subscriber(broker.port, "ledge/bench/serial/dev/+")
        sub.start()
        wait(sub.online.is_set, 15, "the gateway to open the device")
        writer = Writer(master, line)
        writer.start()
        counted = sub
        wait(lambda: counted.count > 0, 15, "the first reading")
        warm = time.monotonic() + 1.0  # let the pipeline reach its steady state
        wait(lambda: time.monotonic() >= warm, 2, "warm-up")
        r0, c0, t0 = sub.count, cpu_seconds(broker.pid) or 0.0, time.monotonic()
        end = t0 + duration
        wait(lambda: time.monotonic() >= end, duration + 1, "the measured window")
        r1, c1, t1 = sub.count, cpu_seconds(broker.pid) or 0.0, time.monotonic()
        rss = rss_kib(broker.pid)
        writer.stop_flag.set()
        writer.join(15)
        if writer.is_alive():
            raise BenchError("the pty writer did not stop")
        expected = writer.lines * per_line
        with contextlib.suppress(BenchError):  # what is missing then is reported as lost
            wait(lambda: counted.count >= expected, 30, "all readings")
        readings = r1 - r0
        dt = t1 - t0
        return Round(
            lines_per_s=readings / per_line / dt,
            readings_per_s=readings / dt,
            cpu_us_per_reading=(c1 - c0) / readings * 1e6 if readings else float("nan"),
            cpu_share=(c1 - c0) / dt,
            written=writer.lines,
            expected=expected,
            received=sub.count,
            rss_kib=rss,
            drops=dict(sub.drops),
        )
    finally:
        if writer is not None:
            writer.stop_flag.set()
        if sub is not None:
            sub.close()
        broker.stop()
        os.close(master)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serial",
        description="Sustained line rate of one serial device (a pseudo-terminal, not "
        "baud-limited) into Ledge, and Ledge's CPU time per reading.",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per protocol (default 3)")
    parser.add_argument(
        "--duration", type=float, default=5.0, help="measured window in seconds (default 5)"
    )
    parser.add_argument(
        "--protocols",
        default=",".join(LINES),
        metavar="A,B",
        help=f"protocols to run (default all: {','.join(LINES)})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    unknown = sorted(set(protocols) - set(LINES))
    if unknown:
        print(f"bench.serial: unknown protocol(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    pinning = Pinning()
    pinning.pin_self()
    if pinning.note:
        print(f"note: {pinning.note}")
    print(
        f"{'protocol':<8} {'lines/s':>10} {'readings/s':>11} {'CPU µs/reading':>15} "
        f"{'gateway CPU':>12} {'RSS MiB':>8} {'lost':>6}  ceiling lines/s"
    )
    failed = False
    try:
        with tempfile.TemporaryDirectory(prefix="ledge-bench-serial-") as tmp:
            for protocol in protocols:
                rounds = []
                for n in range(args.rounds):
                    got = one_round(Path(tmp), pinning, protocol, args.duration, f"{protocol}{n}")
                    rounds.append(got)
                    lost = got.expected - got.received
                    if lost:
                        failed = True
                        print(
                            f"  round {n + 1}: {lost} of {got.expected} readings did not arrive "
                            f"(gateway drop counters: {got.drops})",
                            file=sys.stderr,
                        )
                top = ceiling(LINES[protocol], min(args.duration, 2.0))
                rss = [r.rss_kib for r in rounds if r.rss_kib is not None]
                print(
                    f"{protocol:<8} {statistics.median(r.lines_per_s for r in rounds):>10,.0f} "
                    f"{statistics.median(r.readings_per_s for r in rounds):>11,.0f} "
                    f"{statistics.median(r.cpu_us_per_reading for r in rounds):>15.1f} "
                    f"{statistics.median(r.cpu_share for r in rounds):>11.0%} "
                    f"{(max(rss) / 1024 if rss else float('nan')):>8.1f} "
                    f"{sum(r.expected - r.received for r in rounds):>6}  {top:,.0f}"
                )
    except BenchError as exc:
        print(f"bench.serial: {exc}", file=sys.stderr)
        return 1
    finally:
        kill_all()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
