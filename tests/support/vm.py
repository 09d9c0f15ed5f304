"""The Ledge SD-card image booted in QEMU, reached from outside like a device on the LAN.

Reusable by any test that needs a real gateway (the image's boot test, the Ansible
role's tests):

- ``SdCard``: a writable copy of the image (from the ``.img.xz`` a user downloads, its
  sha256 checked), optionally bigger than the image like a real card, and its boot
  partition written and read with mtools as a laptop would;
- ``Vm``: ``qemu-system-aarch64 -M virt -cpu cortex-a72`` (TCG), the card as a virtio
  disk, the kernel, initrd and command line taken from the boot partition, guest ports
  forwarded to free loopback ports, a hardware watchdog (an Intel 6300ESB on PCI, the
  one virt can have; the Pi has its SoC's) that resets the machine; stopped by a hard
  power-off (SIGKILL) at the latest when the ``with`` block ends;
- ``ssh_keypair`` and ``Vm.ssh``: an SSH key the test controls.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import free_port
from tests.support.raw import Raw
from tests.support.wait import wait_for

QEMU = "qemu-system-aarch64"
SECTOR = 512


def mqtt_answers(port: int) -> bool:
    """Whether an MQTT server behind the loopback ``port`` answers a CONNECT with a
    CONNACK (a forwarded port accepts connections even when nothing listens behind it)."""
    try:
        raw = Raw(port)
    except OSError:
        return False
    try:
        raw.connect("probe")
        return True
    except (OSError, AssertionError):
        return False
    finally:
        raw.sock.close()


def ssh_keypair(directory: Path, name: str = "id_ed25519") -> tuple[Path, str]:
    """A new passphrase-less ed25519 key: (private key file, public key line)."""
    key = directory / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ledge-test", "-f", str(key)],
        check=True,
    )
    return key, (directory / f"{name}.pub").read_text().strip()


def verify_and_decompress(xz: Path, target: Path) -> None:
    """Check ``xz`` against its ``.sha256`` file (as a user would), then decompress it,
    keeping runs of zeros as holes."""
    expected = (xz.parent / f"{xz.name}.sha256").read_text().split()[0]
    digest = hashlib.sha256()
    with xz.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == expected, f"{xz}: sha256 does not match {xz.name}.sha256"
    zero = bytes(1 << 20)
    with lzma.open(xz) as src, target.open("wb") as dst:
        while chunk := src.read(1 << 20):
            if chunk == zero[: len(chunk)]:
                dst.seek(len(chunk), os.SEEK_CUR)
            else:
                dst.write(chunk)
        dst.truncate()


@dataclass
class BootPartition:
    """The FAT boot partition inside an image file, through mtools (no mount)."""

    image: Path
    offset: int  # bytes from the start of the image

    @property
    def _target(self) -> str:
        return f"{self.image}@@{self.offset}"

    def _mtools(self, *args: str, data: bytes | None = None) -> bytes:
        env = dict(os.environ, MTOOLS_SKIP_CHECK="1")
        done = subprocess.run(
            args, input=data, capture_output=True, env=env, check=False, timeout=60
        )
        if done.returncode != 0:
            raise FileNotFoundError(f"{' '.join(args)}: {done.stderr.decode().strip()}")
        return done.stdout

    def write(self, name: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        self._mtools("mcopy", "-o", "-i", self._target, "-", f"::{name}", data=data)

    def read(self, name: str) -> bytes | None:
        try:
            return self._mtools("mtype", "-i", self._target, f"::{name}")
        except FileNotFoundError:
            return None

    def delete(self, name: str) -> None:
        self._mtools("mdel", "-i", self._target, f"::{name}")

    def names(self) -> list[str]:
        listing = self._mtools("mdir", "-b", "-i", self._target, "::/").decode()
        return [line.rsplit("/", 1)[-1] for line in listing.splitlines() if line.strip()]


@dataclass
class SdCard:
    """A writable image file standing for an SD card."""

    path: Path

    @classmethod
    def flash(cls, xz: Path, target: Path, size_mib: int | None = None) -> SdCard:
        """Decompress the released ``.img.xz`` onto ``target``; a ``size_mib`` larger
        than the image stands for a bigger card (the image grows into it)."""
        verify_and_decompress(xz, target)
        if size_mib is not None:
            assert size_mib * 1024 * 1024 >= target.stat().st_size
            os.truncate(target, size_mib * 1024 * 1024)
        return cls(target)

    def partitions(self) -> list[dict[str, int]]:
        table = json.loads(
            subprocess.run(
                ["sfdisk", "--json", str(self.path)], capture_output=True, check=True
            ).stdout
        )
        return [
            {"start": p["start"] * SECTOR, "size": p["size"] * SECTOR}
            for p in table["partitiontable"]["partitions"]
        ]

    @property
    def boot(self) -> BootPartition:
        return BootPartition(self.path, self.partitions()[0]["start"])

    def kernel(self, workdir: Path) -> tuple[Path, Path, str]:
        """The kernel, initrd and command line the Pi firmware would use, from
        ``config.txt`` and ``cmdline.txt`` on the boot partition."""
        boot = self.boot
        config = (boot.read("config.txt") or b"").decode()
        kernel = re.search(r"^kernel=(\S+)", config, re.M)
        initrd = re.search(r"^initramfs (\S+)", config, re.M)
        assert kernel and initrd, f"config.txt names no kernel and initramfs:\n{config}"
        files = []
        for name in (kernel.group(1), initrd.group(1)):
            data = boot.read(name)
            assert data, f"{name} is not on the boot partition"
            (workdir / name).write_bytes(data)
            files.append(workdir / name)
        cmdline = (boot.read("cmdline.txt") or b"").decode().strip()
        assert "root=" in cmdline, f"cmdline.txt has no root=: {cmdline!r}"
        return files[0], files[1], cmdline


@dataclass
class Vm:
    """One boot of ``card`` under qemu-system-aarch64 (virt, cortex-a72, TCG)."""

    card: SdCard
    workdir: Path
    #: Guest TCP ports to reach, by name: each gets a free loopback port on the host.
    guest_ports: dict[str, int]
    memory_mib: int = 1024
    cpus: int = 2
    #: What QEMU opens as the card (default: the image file itself); the power-cut rig
    #: puts a disk with a volatile write cache in front of it (``tests.support.nbdcache``).
    drive: str | None = None
    #: A hardware watchdog for systemd to arm (``-device i6300esb``: when it fires, the
    #: machine resets, and with ``-no-reboot`` QEMU exits).
    watchdog: bool = True
    #: The loopback port of each guest port, kept from one boot to the next (clients
    #: reconnect to the same address, as on a LAN).
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    console: Path | None = None
    started: float = 0.0
    boots: int = 0

    def start(self) -> Vm:
        assert self.proc is None, "already running"
        if shutil.which(QEMU) is None:
            raise RuntimeError(f"{QEMU} is not installed: run scripts/setup --test")
        kernel, initrd, cmdline = self.card.kernel(self.workdir)
        for name in self.guest_ports:
            self.ports.setdefault(name, free_port())
        forwards = ",".join(
            f"hostfwd=tcp:127.0.0.1:{self.ports[name]}-:{guest}"
            for name, guest in self.guest_ports.items()
        )
        self.boots += 1
        self.console = self.workdir / f"console-{self.boots}.log"
        cmd = [
            QEMU,
            "-M", "virt",
            "-cpu", "cortex-a72",  # -cpu max emulates pointer authentication: twice as slow
            "-smp", str(self.cpus),
            "-m", str(self.memory_mib),
            "-kernel", str(kernel),
            "-initrd", str(initrd),
            # The card's own command line; the last console= is the one systemd uses.
            "-append", f"{cmdline} console=ttyAMA0",
            "-drive", f"file={self.drive or self.card.path},format=raw,if=none,id=card,"
            "cache=writeback",
            "-device", "virtio-blk-pci,drive=card",
            "-netdev", f"user,id=net0,{forwards}",
            "-device", "virtio-net-pci,netdev=net0,romfile=",
            "-nographic", "-no-reboot", "-serial", f"file:{self.console}",
            "-monitor", "none",
        ]  # fmt: skip
        if self.watchdog:
            cmd += ["-device", "i6300esb"]
        self.started = time.monotonic()
        with (self.workdir / f"qemu-{self.boots}.err").open("wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        return self

    def port(self, name: str) -> int:
        return self.ports[name]

    @property
    def console_text(self) -> str:
        if self.console is None or not self.console.exists():
            return ""
        return self.console.read_text(errors="replace")

    def _check_running(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            err = (self.workdir / f"qemu-{self.boots}.err").read_text(errors="replace")
            raise AssertionError(
                f"qemu exited with {self.proc.returncode}: {err}\n{self.console_text[-3000:]}"
            )

    def wait_console(self, pattern: str, timeout: float) -> str:
        rx = re.compile(pattern)

        def found() -> str:
            self._check_running()
            m = rx.search(self.console_text)
            return m.group(0) if m else ""

        try:
            return wait_for(found, timeout, f"{pattern!r} on the console")
        except AssertionError:
            raise AssertionError(
                f"no {pattern!r} on the console within {timeout} s:\n{self.console_text[-3000:]}"
            ) from None

    def wait_connack(self, name: str, timeout: float) -> float:
        """Seconds from power-on until the MQTT listener forwarded as ``name`` answers a
        CONNECT with a CONNACK (the forward itself accepts at once: it must be the
        gateway that answers)."""

        def answered() -> bool:
            self._check_running()
            return mqtt_answers(self.port(name))

        try:
            wait_for(answered, timeout, f"CONNACK on guest port {self.guest_ports[name]}")
        except AssertionError:
            raise AssertionError(
                f"no CONNACK within {timeout} s:\n{self.console_text[-3000:]}"
            ) from None
        return time.monotonic() - self.started

    def ssh_argv(self, key: Path, user: str = "root") -> list[str]:
        return [
            "ssh",
            "-i", str(key),
            "-p", str(self.port("ssh")),
            "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=20",
            "-o", "BatchMode=yes",
            f"{user}@127.0.0.1",
        ]  # fmt: skip

    def ssh(
        self, key: Path, command: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.ssh_argv(key), command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"ssh {command!r} exited with {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done

    def wait_stopped(self, timeout: float) -> int:
        """Wait until the guest stops the machine itself (a reboot or a power-off:
        with ``-no-reboot`` QEMU exits on either); its exit status."""
        proc = self.proc
        assert proc is not None, "not running"
        try:
            status = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the guest did not stop within {timeout} s:\n{self.console_text[-3000:]}"
            ) from None
        self.proc = None
        return status

    def power_off(self) -> None:
        """Pull the plug: SIGKILL, no shutdown of any kind in the guest."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        self.proc = None

    def __enter__(self) -> Vm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.power_off()
