"""``python -m bench.wear``: SD-card wear -- what the store writes per acknowledged message.

Ledge runs with its ``data_dir`` on the power-cut rig's lossy file system
(``tests.support.lossyfs``), which counts what reaches the disk: the bytes the syncs
write and the distinct 4 KiB pages they touch (a page written twice between two
syncs counts once, as the page cache writes it back once). One publisher (MQTT
3.1.1, QoS 1) sends 200-byte messages at a fixed rate to a persistent subscriber
(QoS 1, clean session 0); the window starts after a warm-up and ends when it has
run its time, each edge a ``sync`` of the file system (what the page cache holds
unsynced is counted as written at the edge, as the kernel would write it back
eventually -- the ``-shm`` file's mapped pages, and everything that ``process``
never fsyncs). Reported per (durability, rate): messages acknowledged per second,
fsyncs per second, and per acknowledged message the bytes written, the 4 KiB pages
written (as KiB), and those by file (database, WAL, shm).

    python -m bench.wear                       # 10, 100, 1,000 msg/s, power and process
    python -m bench.wear --rates 100 --durability power --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.lossyfs import KINDS, PAGE, LossyMount
from tests.support.procs import LedgeProcess, free_port
from tests.support.wait import wait_for

PAYLOAD = 200
TOPIC = "wear/x"
#: Seconds of each measured window per rate: long enough for a few hundred messages.
SECONDS = {10: 40.0, 100: 20.0, 1000: 10.0}
WARMUP = 3.0


@dataclass
class Point:
    durability: str
    rate: int
    acked: int
    seconds: float
    syncs: int
    bytes: int
    pages: dict[str, int]
    extra: str = ""

    @property
    def per_message_pages_kib(self) -> float:
        return sum(self.pages.values()) * PAGE / 1024 / max(1, self.acked)

    def row(self) -> str:
        n = max(1, self.acked)
        by_kind = " ".join(f"{self.pages[k] * PAGE / 1024 / n:>6.2f}" for k in ("db", "wal", "shm"))
        return (
            f"{self.durability:<8} {self.rate:>6} {self.acked / self.seconds:>8.0f} "
            f"{self.syncs / self.seconds:>8.1f} {self.bytes / 1024 / n:>9.2f} "
            f"{self.per_message_pages_kib:>9.2f}  {by_kind}"
        )


HEADER = (
    f"{'durability':<8} {'msg/s':>6} {'acked/s':>8} {'fsync/s':>8} {'KiB/msg':>9} "
    f"{'pg KiB/msg':>9}  {'db':>6} {'wal':>6} {'shm':>6}   (pages as KiB per message)"
)


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def add(self, *args: Any) -> None:
        with self.lock:
            self.n += 1


def one_point(workdir: Path, durability: str, rate: int, seconds: float) -> Point:
    label = f"{durability}-{rate}"
    mount = LossyMount(
        workdir / f"{label}-disk", workdir / f"{label}-mnt", workdir / f"{label}.sock"
    )
    config = workdir / f"{label}.toml"
    config.write_text(f'[store]\ndurability = "{durability}"\n')
    port = free_port()
    mount.mount()
    broker: LedgeProcess | None = None
    clients: list[mqtt.Client] = []
    try:
        broker = LedgeProcess(
            "--data-dir", str(workdir / f"{label}-mnt"), config=config, port=port
        ).start()
        received = Counter()
        sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="wear-sub", clean_session=False)
        subscribed = threading.Event()
        sub.on_message = received.add
        sub.on_subscribe = lambda *args: subscribed.set()
        sub.on_connect = lambda client, *args: client.subscribe(TOPIC, 1)
        sub.connect("127.0.0.1", port, 60)
        sub.loop_start()
        clients.append(sub)
        wait_for(subscribed.is_set, 10, "the subscription")
        acked = Counter()
        pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="wear-pub")
        pub.max_inflight_messages_set(100)
        pub.max_queued_messages_set(0)
        pub.on_publish = acked.add
        pub.connect("127.0.0.1", port, 60)
        pub.loop_start()
        clients.append(pub)
        payload = bytes(PAYLOAD)
        stop = threading.Event()

        def publish() -> None:
            next_at = time.monotonic()
            while not stop.is_set():
                pub.publish(TOPIC, payload, 1)
                next_at += 1.0 / rate
                delay = next_at - time.monotonic()
                if delay > 0:
                    stop.wait(delay)  # the pace, not a synchronisation

        sender = threading.Thread(target=publish, daemon=True)
        sender.start()
        stop.wait(WARMUP)
        first = mount.sync()
        with acked.lock:
            acked0 = acked.n
        t0 = time.monotonic()
        stop.wait(seconds)
        last = mount.sync()
        t1 = time.monotonic()
        with acked.lock:
            acked1 = acked.n
        stop.set()
        sender.join(5)
        return Point(
            durability,
            rate,
            acked1 - acked0,
            t1 - t0,
            last["syncs"] - first["syncs"],
            sum(last["bytes"].values()) - sum(first["bytes"].values()),
            {k: last["pages"][k] - first["pages"][k] for k in KINDS},
        )
    finally:
        for c in clients:
            c.disconnect()
            c.loop_stop()
        if broker is not None:
            broker.stop(30)
        mount.unmount()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10,100,1000", help="messages per second")
    parser.add_argument("--durability", default="power,process")
    parser.add_argument("--seconds", type=float, default=None, help="window (default by rate)")
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="ledge-wear-") as tmp:
        for durability in args.durability.split(","):
            for rate in rates:
                seconds = args.seconds or SECONDS.get(rate, 20.0)
                with contextlib.ExitStack():
                    point = one_point(Path(tmp), durability, rate, seconds)
                print(point.row(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
