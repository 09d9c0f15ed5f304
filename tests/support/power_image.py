"""Power-cut rig for the SD-card image: the booted device, its card losing what it had
not flushed.

The released image is flashed onto a file standing for a card; QEMU (arm64 virt, TCG)
boots it with the card behind ``tests.support.nbdcache``, a disk with a volatile write
cache: what the guest wrote is kept apart until it flushes. The boot partition's
``ledge.toml`` bridges ``crash/#`` to Debian's Mosquitto on this machine (through the
rig's relay, which goes down and comes back) with ``durability = "power"``; the load is
the power-cut rig's (``tests.support.power``: persistent subscribers and publishers at
QoS 1 and 2, retained changes and clears), on the forwarded MQTT port.

At each cut, at a random moment, QEMU is SIGKILLed and the card at once loses every
unflushed page, or a random half of them. Then, before the power comes back, a copy of
the root file system as the cut left it is checked with ``e2fsck -fy`` (clean, or
repaired; anything worse is a problem) and the store read out of it with ``debugfs``
must pass ``PRAGMA integrity_check``. The device boots again from the card: the time
from power-on to the first CONNACK is measured, the retained state checked. At the end
nothing acknowledged may be missing at the subscribers or the cloud.

    python -m tests.support.power_image --cuts 20      # make power-test-image
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

from tests.support import imagebuild, power
from tests.support.crash import TOPIC
from tests.support.nbdcache import PAGE, CachedDisk
from tests.support.power import REMOTE_PREFIX, Cut, store_integrity
from tests.support.procs import free_port
from tests.support.vm import SdCard, Vm

#: Power-on to CONNACK under TCG: about a minute and a half here, more under load.
BOOT_TIMEOUT = 600.0
#: Where the image's service keeps the store.
#: The store on the data partition (bind-mounted on /var/lib/ledge on the device).
DATA_DIR = "/ledge"
#: The card's partitions that a running gateway writes: system slot A, data.
WRITTEN = {"root": 1, "data": 3}
#: How QEMU's guest reaches this machine's loopback (QEMU's user-mode network).
HOST = "10.0.2.2"
GATEWAY_ID = "gw-power"


def config(upstream_port: int) -> str:
    """The boot partition's ledge.toml: the image's listener, a store that syncs every
    commit, queues big enough for subscribers that fall behind while the device boots,
    and the bridge to the cloud relay."""
    return f"""\
[[listeners]]
host = "0.0.0.0"
port = 1883

[gateway]
id = "{GATEWAY_ID}"

[store]
durability = "power"

[broker]
max_queued_messages = 1000000
max_queued_bytes = 200000000

[[bridges]]
name = "cloud"
address = "{HOST}:{upstream_port}"
reconnect_min = 0.5
reconnect_max = 2.0
[[bridges.rules]]
filter = "{TOPIC}/#"
remote_prefix = "{REMOTE_PREFIX}"
"""


def fsck(card: SdCard, scratch: Path) -> tuple[str, str]:
    """``e2fsck -fy`` on a copy of each partition the gateway writes (the system slot and
    the data partition), as the cut left them: ("clean" | "repaired" | "failed", what it
    said); the worst of the two."""
    verdicts, said = [], []
    for name, index in WRITTEN.items():
        part = card.partitions()[index]
        copy = scratch / f"{name}.img"
        copy.unlink(missing_ok=True)
        subprocess.run(
            [
                "dd", f"if={card.path}", f"of={copy}", "bs=4M", "conv=sparse", "status=none",
                "iflag=skip_bytes,count_bytes", f"skip={part['start']}", f"count={part['size']}",
            ],
            check=True,
        )  # fmt: skip
        done = subprocess.run(
            ["e2fsck", "-fy", str(copy)], check=False, capture_output=True, text=True
        )
        said.append(f"{name}: {(done.stdout + done.stderr).strip()}")
        if done.returncode == 0:
            verdicts.append("clean")
        elif done.returncode in (1, 2):  # errors corrected (2: a mounted root would reboot)
            verdicts.append("repaired")
        else:
            verdicts.append("failed")
    worst = max(verdicts, key=("clean", "repaired", "failed").index)
    return worst, "\n".join(said)


def read_store(scratch: Path) -> Path:
    """The store's files out of the checked copy (``debugfs``, no mount)."""
    store = scratch / "store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir()
    for name in ("ledge.db", "ledge.db-wal"):
        subprocess.run(
            ["debugfs", "-R", f"dump {DATA_DIR}/{name} {store / name}", str(scratch / "data.img")],
            capture_output=True,
            check=True,
        )
        target = store / name
        if target.exists() and target.stat().st_size == 0:
            target.unlink()  # debugfs leaves an empty file for a missing one
    return store


class ImageTarget:
    """The image booted in QEMU, its card behind a volatile write cache."""

    modes: tuple[str, ...] = ("all", "subset")
    run_for: tuple[float, float] = (5.0, 20.0)
    answer_timeout: float = 120.0
    label = 'the SD-card image in QEMU, durability "power"'

    def __init__(self, directory: Path, upstream_port: int, image: Path) -> None:
        self.directory = directory
        self.card = SdCard.flash(image, directory / "card.img")
        # A card bigger than the image, as in the image tests: the root grows at first boot.
        os.truncate(self.card.path, self.card.path.stat().st_size + 512 * 1024 * 1024)
        self.card.boot.write("ledge.toml", config(upstream_port))
        self.disk = CachedDisk(self.card.path, directory / "card.sock").start()
        self.vm = Vm(
            self.card,
            directory,
            {"mqtt": 1883},
            drive=f"nbd+unix:///?socket={self.disk.socket_path}",
        )
        self.port = self.vm.ports.setdefault("mqtt", free_port())
        self.scratch = directory / "check"
        self.scratch.mkdir(exist_ok=True)
        self.fsck_said: list[str] = []

    def power_on(self) -> float:
        self.vm.start()
        return self.vm.wait_connack("mqtt", BOOT_TIMEOUT)

    def power_cut(self, mode: str, seed: int) -> Cut:
        self.vm.power_off()
        lost = self.disk.cut(random.Random(seed), mode)
        if self.disk.error is not None:
            raise AssertionError(f"the card's NBD server failed: {self.disk.error!r}")
        cut = Cut((lost.dirty_pages - lost.kept_pages) * PAGE, lost.kept_pages * PAGE)
        verdict, said = fsck(self.card, self.scratch)
        cut.fsck = verdict
        if verdict == "repaired":
            self.fsck_said.append(said)
        if verdict == "failed":
            cut.problems.append(f"e2fsck could not repair a file system:\n{said}")
            return cut
        store = store_integrity(read_store(self.scratch), self.scratch / "db")
        if store != "ok":
            cut.problems.append(f"store corrupt: {store}")
        return cut

    def close(self) -> None:
        self.vm.power_off()
        self.disk.close()


def run(
    cuts: int, directory: Path, image: Path, seed: int | None, settle: float
) -> power.PowerReport:
    return power.run(
        cuts,
        directory,
        seed,
        settle=settle,
        progress=True,
        every=1,
        target=lambda where, upstream: ImageTarget(where, upstream, image),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--image",
        type=Path,
        help="the .img.xz (or .img) to flash (default: $LEDGE_IMAGE, else image/build builds one)",
    )
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    parser.add_argument(
        "--settle", type=float, default=600.0, help="seconds the end may wait for deliveries"
    )
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1)
    if args.image is None and imagebuild.prebuilt() is None:
        print(f"building the image (image/build, log {imagebuild.LOG}) ...", flush=True)
    image = args.image or imagebuild.wait(45 * 60)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"image {image}\nseed {seed}", flush=True)
    return power.report_on(args.keep, lambda where: run(args.cuts, where, image, seed, args.settle))


if __name__ == "__main__":
    raise SystemExit(main())
