"""System updates of the image booted in QEMU: bundles made with the real ``rauc`` on this
machine, pushed over SSH, installed with ``ledge update`` on the device; the reboot into
the new slot goes through the emulated firmware's tryboot (``tests.support.vm``).

Used by the image's boot test (an update kept, a bundle refused) and by the full update
test (``make update-test``: a broken system rolled back).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.vm import Vm
from tests.support.wait import wait_for

COMPATIBLE = "ledge-raspberrypi-arm64"
#: Power-on to the new system committed (its boot, then `ledge health --wait`).
COMMIT_TIMEOUT = 900.0


def bundle_of(image: Path) -> Path:
    """The update bundle ``image/build`` made beside ``image`` (``.img.xz`` or ``.img``)."""
    bundle = image.parent / (image.name.removesuffix(".xz").removesuffix(".img") + ".raucb")
    assert bundle.is_file(), f"{bundle}: image/build makes the bundle beside the image"
    return bundle


def development_key() -> tuple[Path, Path]:
    """The development signing key and certificate ``image/build`` signs with when given
    none (kept in its cache directory, like the root file system)."""
    cache = Path(
        os.environ.get("LEDGE_IMAGE_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ledge-image"
    )
    key = cache / "signing" / "development.key.pem"
    cert = cache / "signing" / "development.cert.pem"
    assert key.is_file() and cert.is_file(), f"no development signing key in {cache}/signing"
    return key, cert


def new_key(directory: Path, name: str) -> tuple[Path, Path]:
    """A signing key and self-signed certificate no device trusts."""
    key, cert = directory / f"{name}.key.pem", directory / f"{name}.cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "30", "-subj", f"/CN={name}",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


def make_bundle(content: Path, key: Path, cert: Path, out: Path) -> Path:
    """``rauc bundle`` of the directory ``content`` (manifest, images, hook), signed."""
    out.unlink(missing_ok=True)
    done = subprocess.run(
        [
            "rauc", "bundle", f"--cert={cert}", f"--key={key}", f"--keyring={cert}",
            "--mksquashfs-args=-comp gzip -Xcompression-level 1", str(content), str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"rauc bundle: {done.stdout}{done.stderr}"
    return out


def small_bundle(directory: Path, key: Path, cert: Path) -> Path:
    """A bundle for this device whose system is a small empty file system: what matters
    is who signed it."""
    content = directory / "small"
    (directory / "empty").mkdir()
    content.mkdir()
    subprocess.run(
        ["mkfs.ext4", "-q", "-d", str(directory / "empty"), str(content / "rootfs.ext4"), "8M"],
        check=True,
        capture_output=True,
    )
    # RAUC wants more than one 4 KiB block of squashfs: some bytes that do not compress.
    (content / "padding").write_bytes(os.urandom(64 * 1024))
    (content / "manifest.raucm").write_text(
        f"[update]\ncompatible={COMPATIBLE}\nversion=0.0.0\n\n[bundle]\nformat=verity\n\n"
        "[image.rootfs]\nfilename=rootfs.ext4\n"
    )
    return make_bundle(content, key, cert, directory / "small.raucb")


def broken_bundle(good: Path, directory: Path, key: Path, cert: Path) -> Path:
    """The bundle ``good`` with its system changed so that the gateway cannot start (the
    ``ledge`` command removed), signed again with ``key``: a system that boots but is not
    healthy."""
    content = directory / "broken"
    done = subprocess.run(
        ["rauc", "extract", f"--keyring={cert}", str(good), str(content)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"rauc extract: {done.stdout}{done.stderr}"
    subprocess.run(
        ["debugfs", "-w", "-R", "rm /opt/ledge/bin/ledge", str(content / "rootfs.ext4")],
        check=True,
        capture_output=True,
    )
    manifest = content / "manifest.raucm"
    manifest.write_text(manifest.read_text().replace("version=", "version=broken-", 1))
    return make_bundle(content, key, cert, directory / "broken.raucb")


def push(vm: Vm, key: Path, local: Path, remote: str) -> None:
    """Copy ``local`` to the device (scp over the forwarded SSH port)."""
    argv = vm.ssh_argv(key)
    options = [a for a in argv[1:-1] if a != "-p" and a != str(vm.port("ssh"))]
    subprocess.run(
        ["scp", "-q", "-P", str(vm.port("ssh")), *options, str(local), f"root@127.0.0.1:{remote}"],
        check=True,
        timeout=600,
    )


def ledge_update(vm: Vm, key: Path, remote: str) -> subprocess.CompletedProcess[str]:
    """``ledge update REMOTE`` on the device. When it installs, the device reboots
    under the SSH session (which may then end with 255)."""
    return vm.ssh(key, f"ledge update {remote}", timeout=1200, check=False)


def slots(vm: Vm, key: Path) -> tuple[str, str, str]:
    """(booted, committed, tried by the next tryboot), as the device says."""
    out = vm.ssh(
        key,
        "ledge-boot-slot current; ledge-boot-slot committed; ledge-boot-slot trial",
    ).stdout.split()
    assert len(out) == 3, out
    return out[0], out[1], out[2]


def last_update(vm: Vm, key: Path) -> dict[str, str]:
    text = vm.ssh(key, "cat /data/update/last 2>/dev/null || true").stdout
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def reboot_into_trial(vm: Vm, port_name: str, key: Path, timeout: float) -> None:
    """After ``ledge update`` rebooted the device: the firmware's one tryboot, the new
    system up and reachable over SSH."""
    vm.wait_stopped(300)
    assert vm.tryboot, "the device did not restart with reboot '0 tryboot'"
    vm.start()
    vm.wait_connack(port_name, timeout)
    wait_for(
        lambda: vm.ssh(key, "true", timeout=60, check=False).returncode == 0,
        timeout,
        "SSH on the new system",
    )
