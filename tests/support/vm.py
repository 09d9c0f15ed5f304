"""The Ledge SD-card image booted in QEMU, reached from outside like a device on the LAN.

Reusable by any test that needs a real gateway (the image's boot test, the Ansible
role's tests):

- ``SdCard``: a writable copy of the image (from the ``.img.xz`` a user downloads or
  the ``.img`` the test run's build kept, its sha256 checked), optionally bigger than
  the image like a real card, and its boot partition written and read with mtools as a laptop would;
- ``Vm``: ``qemu-system-aarch64 -M virt -cpu cortex-a72`` (TCG), the card as a virtio
  disk, the kernel, initrd and command line chosen from the boot partition as the Pi
  firmware chooses them (``firmware_choice``: ``config.txt``, or ``tryboot.txt`` once
  after ``reboot '0 tryboot'``; ``os_prefix``), guest ports forwarded to free loopback
  ports, a hardware watchdog (an Intel 6300ESB on PCI, the
  one virt can have; the Pi has its SoC's) that resets the machine; stopped by a hard
  power-off (SIGKILL) at the latest when the ``with`` block ends;
- ``ssh_keypair`` and ``Vm.ssh``: an SSH key the test controls.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import free_port
from tests.support.raw import Raw
from tests.support.wait import wait_for

QEMU = "qemu-system-aarch64"
#: What the kernel prints when it restarts for a tryboot (``reboot '0 tryboot'``).
TRYBOOT_RESTART = "reboot: Restarting system with command '0 tryboot'"
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


def verify_and_write(image: Path, target: Path) -> None:
    """Check ``image`` (a released ``.img.xz``, or the ``.img`` a build kept) against its
    ``.sha256`` file, as a user would, then write it out onto ``target``, keeping runs of
    zeros as holes."""
    expected = (image.parent / f"{image.name}.sha256").read_text().split()[0]
    with image.open("rb") as f:
        assert sha256_hex(f) == expected, f"{image}: sha256 does not match {image.name}.sha256"
    zero = bytes(1 << 20)
    with read_image(image) as src, target.open("wb") as dst:
        while chunk := src.read(1 << 20):
            if chunk == zero[: len(chunk)]:
                dst.seek(len(chunk), os.SEEK_CUR)
            else:
                dst.write(chunk)
        dst.truncate()


def read_image(image: Path) -> io.BufferedIOBase:
    """The image's bytes, decompressed if it is an ``.xz``."""
    return lzma.open(image) if image.name.endswith(".xz") else image.open("rb")


def sha256_hex(stream: io.BufferedIOBase) -> str:
    """The sha256 of what is left to read of ``stream``."""
    digest = hashlib.sha256()
    while chunk := stream.read(1 << 22):
        digest.update(chunk)
    return digest.hexdigest()


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


@dataclass(frozen=True)
class FirmwareChoice:
    """What the Raspberry Pi firmware boots: files on the boot partition, and the kernel
    command line."""

    config: str  # config.txt, or tryboot.txt for a tryboot
    kernel: str
    initramfs: str
    cmdline: str


def firmware_choice(read: Callable[[str], bytes | None], tryboot: bool) -> FirmwareChoice:
    """The Raspberry Pi firmware's choice of what to boot, as its documentation states it:
    after ``reboot '0 tryboot'`` (a flag good for one boot) it reads ``tryboot.txt``
    instead of ``config.txt``; ``os_prefix`` is put before the names of the kernel, the
    initramfs and ``cmdline.txt`` (and the device trees, which ``-M virt`` does not use);
    a later setting overrides an earlier one. Only the ``[all]`` section (and lines before
    any section) apply: nothing on the card uses another filter. QEMU cannot run the
    Pi's firmware, so the image's tests boot what this chooses."""
    name = "tryboot.txt" if tryboot and read("tryboot.txt") is not None else "config.txt"
    text = (read(name) or b"").decode()
    settings: dict[str, str] = {}
    section = "all"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip().lower()
            continue
        if section != "all":
            continue
        if line.startswith("initramfs "):
            settings["initramfs"] = line.split()[1]
        elif "=" in line:
            key, value = line.split("=", 1)
            settings[key] = value
    prefix = settings.get("os_prefix", "")
    kernel, initramfs = settings.get("kernel"), settings.get("initramfs")
    assert kernel and initramfs, f"{name} names no kernel and initramfs:\n{text}"
    cmdline_name = prefix + settings.get("cmdline", "cmdline.txt")
    cmdline = (read(cmdline_name) or b"").decode().strip()
    assert "root=" in cmdline, f"{cmdline_name} has no root=: {cmdline!r}"
    return FirmwareChoice(name, prefix + kernel, prefix + initramfs, cmdline)


@dataclass
class SdCard:
    """A writable image file standing for an SD card."""

    path: Path

    @classmethod
    def flash(cls, image: Path, target: Path, size_mib: int | None = None) -> SdCard:
        """Write the image (``.img.xz`` or ``.img``) onto ``target``; a ``size_mib``
        larger than the image stands for a bigger card (the image grows into it)."""
        verify_and_write(image, target)
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

    def kernel(self, workdir: Path, tryboot: bool = False) -> tuple[Path, Path, str]:
        """The kernel, initrd and command line the Pi firmware would load from the boot
        partition (``firmware_choice``), copied into ``workdir``."""
        boot = self.boot
        choice = firmware_choice(boot.read, tryboot)
        files = []
        for name in (choice.kernel, choice.initramfs):
            data = boot.read(name)
            assert data, f"{name} is not on the boot partition"
            local = workdir / name.replace("/", "_")
            local.write_bytes(data)
            files.append(local)
        return files[0], files[1], choice.cmdline


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
    #: Niceness of QEMU: a VM's boots are the longest path of a test run, ahead of the
    #: other tests for the CPU (a higher priority needs root; otherwise it runs as is).
    nice: int = -5
    #: The loopback port of each guest port, kept from one boot to the next (clients
    #: reconnect to the same address, as on a LAN).
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    console: Path | None = None
    started: float = 0.0
    boots: int = 0
    #: The Pi's one-shot tryboot flag: set when the guest restarts with
    #: ``reboot '0 tryboot'`` (the kernel says so on the console), used by the next boot
    #: only, cleared by a power cut.
    tryboot: bool = False
    #: What the firmware chose at each boot, in order.
    choices: list[FirmwareChoice] = field(default_factory=list)

    def start(self) -> Vm:
        assert self.proc is None, "already running"
        if shutil.which(QEMU) is None:
            raise RuntimeError(f"{QEMU} is not installed: run scripts/setup --test")
        tryboot, self.tryboot = self.tryboot, False
        self.choices.append(firmware_choice(self.card.boot.read, tryboot))
        kernel, initrd, cmdline = self.card.kernel(self.workdir, tryboot)
        for name in self.guest_ports:
            self.ports.setdefault(name, free_port())
        forwards = ",".join(
            f"hostfwd=tcp:127.0.0.1:{self.ports[name]}-:{guest}"
            for name, guest in self.guest_ports.items()
        )
        self.boots += 1
        self.console = self.workdir / f"console-{self.boots}.log"
        cmd = [
            "nice", "-n", str(self.nice),
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
        self.tryboot = TRYBOOT_RESTART in self.console_text
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
        self.tryboot = False

    def __enter__(self) -> Vm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.power_off()
