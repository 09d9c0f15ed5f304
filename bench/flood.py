"""A connection flood against Ledge and Mosquitto, each on its default config.

``python -m bench.flood`` (``make bench-flood``): 200 slowloris sockets (a CONNECT
header, then nothing) and 1,500 silent ones are held open against each broker, from
one loopback address and from sixteen; meanwhile a normal client does CONNECT,
SUBSCRIBE and a QoS 1 round trip, and 100 clients connected before the flood are
published to. Printed per broker: how long the normal client took, how many of the
100 got every message, how many flood sockets the broker still holds, its open
descriptors and RSS. The same code drives the flood test (``tests/support/flood.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.flood import Flood, Subscribers, probe, raise_open_files
from tests.support.procs import LedgeProcess, MosquittoProcess

SOURCES = {
    "one address": ("127.0.0.1",),
    "16 addresses": tuple(f"127.0.0.{i}" for i in range(2, 18)),
}


@dataclass
class Outcome:
    broker: str
    flood: str
    probe_s: float | None
    receiving: int
    held: int
    fds: int
    rss_kib: int
    error: str = ""


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def run_one(
    broker: str,
    sources: tuple[str, ...],
    label: str,
    args: argparse.Namespace,
) -> Outcome:
    workdir = Path(tempfile.mkdtemp(prefix="ledge-flood-"))
    limits = args.open_files
    if broker == "ledge":
        ledge = LedgeProcess(open_files=limits).start()
        port, pid = ledge.port, ledge.proc.pid if ledge.proc else 0
        stop = ledge.stop
    else:
        mosquitto = MosquittoProcess(workdir, open_files=limits).start()
        port, pid = mosquitto.port, mosquitto.proc.pid if mosquitto.proc else 0
        stop = mosquitto.stop  # type: ignore[assignment]
    subscribers = Subscribers(port, args.subscribers).connect()
    flood = Flood(port, sources)
    try:
        flood.open(args.silent, args.slowloris)
        try:
            took: float | None = probe(port)
            error = ""
        except (AssertionError, OSError) as exc:
            took, error = None, str(exc)[:80]
        try:
            receiving = subscribers.receiving()
        except (AssertionError, OSError) as exc:
            receiving, error = 0, error or f"publisher: {str(exc)[:70]}"
        return Outcome(
            broker,
            label,
            took,
            receiving,
            flood.still_open(),
            _fds(pid),
            _rss_kib(pid),
            error,
        )
    finally:
        flood.close()
        subscribers.close()
        stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__)
    parser.add_argument("--silent", type=int, default=1500)
    parser.add_argument("--slowloris", type=int, default=200)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--brokers", default="ledge,mosquitto")
    parser.add_argument(
        "--open-files",
        metavar="SOFT:HARD",
        type=lambda text: tuple(int(n) for n in text.split(":")),
        help="the brokers' open-file limit (default: this shell's); a soft limit of 1024 is "
        "what a systemd service gets unless its unit says otherwise",
    )
    args = parser.parse_args(argv)
    raise_open_files(args.silent + args.slowloris + args.subscribers + 256)
    outcomes = []
    for label, sources in SOURCES.items():
        for broker in args.brokers.split(","):
            outcomes.append(run_one(broker, sources, label, args))
    print(
        f"flood: {args.slowloris} slowloris + {args.silent} silent sockets held; "
        f"{args.subscribers} clients connected before it; each broker on its default config"
        + (
            f", open-file limit {args.open_files[0]}:{args.open_files[1]}"
            if args.open_files
            else ""
        )
    )
    print(
        f"{'broker':<10} {'flood from':<13} {'normal client':>14} {'receiving':>10} "
        f"{'flood held':>11} {'open fds':>9} {'RSS MiB':>8}"
    )
    for o in outcomes:
        took = f"{o.probe_s * 1000:.0f} ms" if o.probe_s is not None else "FAILED"
        print(
            f"{o.broker:<10} {o.flood:<13} {took:>14} {o.receiving:>6}/{args.subscribers:<3} "
            f"{o.held:>11} {o.fds:>9} {o.rss_kib / 1024:>8.1f}"
        )
        if o.error:
            print(f"    {o.error}")
    return 0 if all(o.probe_s is not None for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
