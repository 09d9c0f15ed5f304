"""The image's sources, checked in seconds on every run (building and booting the image
is ``tests/test_image.py``): the build's own checks and the systemd units' syntax."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.procs import REPO
from tests.support.vm import firmware_choice

BUILD = REPO / "image" / "build"
UNITS = [
    REPO / "systemd" / "ledge.service",
    *sorted((REPO / "image" / "rootfs" / "etc" / "systemd" / "system").glob("ledge-*.service")),
]


def test_build_explains_itself() -> None:
    done = subprocess.run([BUILD, "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert "image/out/ledge-VERSION-arm64.img.xz" in done.stdout
    unknown = subprocess.run([BUILD, "--bogus"], capture_output=True, text=True, check=False)
    assert unknown.returncode == 2
    assert "unknown option --bogus" in unknown.stderr


def test_build_names_each_missing_tool_and_its_package(tmp_path: Path) -> None:
    # A PATH with only what the script needs before its checks: every tool is missing.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "id"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", BUILD], capture_output=True, text=True, env=env, check=False, timeout=60
    )
    assert done.returncode == 1
    if os.geteuid() != 0:
        assert "must run as root" in done.stderr
        return
    assert "error in step 1/7 (tools)" in done.stderr
    for tool, package in (
        ("mmdebstrap", "mmdebstrap"),
        ("mcopy", "mtools"),
        ("xz", "xz-utils"),
        ("bmaptool", "bmap-tools"),  # the release's .bmap is never silently left out
        ("rauc", "rauc"),
        ("mksquashfs", "squashfs-tools"),
    ):
        assert f"{tool} (Debian package {package})" in done.stderr
    assert "scripts/setup --test" in done.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_units_are_valid_for_systemd(unit: Path) -> None:
    """``systemd-analyze verify``: unknown keys, bad values, wrong sections. The programs
    the units start exist on the device only, so only that complaint is expected."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, SYSTEMD_LOG_COLOR="0"),
        timeout=60,
    )
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and "is not executable: No such file or directory" not in line
    ]
    assert not problems, "\n".join(problems)


#: The parts of Debian bookworm's bluetooth.service (bluez 5.66-1+deb12u2) that a
#: drop-in of ExecStart meets: the image's drop-in is checked against them.
BOOKWORM_BLUETOOTH_SERVICE = """\
[Unit]
Description=Bluetooth service
ConditionPathIsDirectory=/sys/class/bluetooth

[Service]
Type=dbus
BusName=org.bluez
ExecStart=/usr/libexec/bluetooth/bluetoothd
"""


def test_bluez_runs_with_the_experimental_interfaces_for_passive_scanning(
    tmp_path: Path,
) -> None:
    """scanning = "auto" picks passive scanning only where BlueZ offers
    AdvertisementMonitorManager1, which needs bluetoothd --experimental: the image's
    drop-in replaces Debian's ExecStart with one that has it, and systemd accepts the
    pair (a Type=dbus service with two ExecStart lines is refused)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    assert "bluez" in (REPO / "image" / "packages.txt").read_text().split()
    drop_in = REPO / "image/rootfs/etc/systemd/system/bluetooth.service.d/ledge.conf"
    starts = [
        line.split("=", 1)[1]
        for line in drop_in.read_text().splitlines()
        if line.startswith("ExecStart=")
    ]
    assert starts == ["", "/usr/libexec/bluetooth/bluetoothd --experimental"]
    unit = tmp_path / "bluetooth.service"
    unit.write_text(BOOKWORM_BLUETOOTH_SERVICE)
    (tmp_path / "bluetooth.service.d").mkdir()
    shutil.copy(drop_in, tmp_path / "bluetooth.service.d" / "ledge.conf")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, SYSTEMD_LOG_COLOR="0"),
        timeout=60,
    )
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and "is not executable: No such file or directory" not in line
    ]
    assert not problems, "\n".join(problems)


def test_the_image_opens_its_firewall_before_each_start_and_reload(tmp_path: Path) -> None:
    """The image's drop-in runs the firewall helper as root before the gateway starts and
    before it reloads (then sends SIGHUP as the unit does); systemd accepts the pair."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    drop_in = REPO / "image/rootfs/etc/systemd/system/ledge.service.d/firewall.conf"
    lines = drop_in.read_text().splitlines()
    assert "ExecStartPre=+/usr/local/sbin/ledge-firewall" in lines
    reloads = [line.split("=", 1)[1] for line in lines if line.startswith("ExecReload=")]
    assert reloads == ["", "+/usr/local/sbin/ledge-firewall", "/bin/kill -HUP $MAINPID"]
    shutil.copy(REPO / "systemd" / "ledge.service", tmp_path / "ledge.service")
    (tmp_path / "ledge.service.d").mkdir()
    shutil.copy(drop_in, tmp_path / "ledge.service.d" / "firewall.conf")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "ledge.service")],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, SYSTEMD_LOG_COLOR="0"),
        timeout=60,
    )
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and "is not executable: No such file or directory" not in line
    ]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------- system slots

SLOT_TOOL = REPO / "image" / "rootfs" / "usr" / "local" / "sbin" / "ledge-boot-slot"
DISK_ID = "1a2b3c4d"


def system_root(path: Path, *versions: str) -> Path:
    """A system slot's files as ``ledge-boot-slot`` reads them: Debian's kernels and
    initrds in ``/boot``, their device trees under ``/usr/lib/linux-image-VERSION``."""
    for version in versions:
        boot = path / "boot"
        boot.mkdir(parents=True, exist_ok=True)
        (boot / f"vmlinuz-{version}").write_text(f"kernel {version}")
        (boot / f"initrd.img-{version}").write_text(f"initrd {version}")
        dtbs = path / "usr" / "lib" / f"linux-image-{version}" / "broadcom"
        dtbs.mkdir(parents=True)
        (dtbs / "bcm2711-rpi-4-b.dtb").write_text(f"dtb {version}")
    return path


def slot_tool(boot: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LEDGE_BOOT_DIR=str(boot), LEDGE_DISK_ID=DISK_ID)
    return subprocess.run(
        ["sh", str(SLOT_TOOL), *args], capture_output=True, text=True, env=env, check=False
    )


def read_from(boot: Path) -> Callable[[str], bytes | None]:
    def read(name: str) -> bytes | None:
        path = boot / name
        return path.read_bytes() if path.is_file() else None

    return read


def test_each_slot_boots_its_own_kernel_and_root_and_tryboot_tries_the_other_once(
    tmp_path: Path,
) -> None:
    boot = tmp_path / "firmware"
    boot.mkdir()
    (boot / "start4.elf").write_text("firmware, shared by both slots")
    a = system_root(tmp_path / "a", "6.1.0-9-arm64", "6.1.0-10-arm64")
    b = system_root(tmp_path / "b", "6.1.0-28-arm64")
    for root, slot in ((a, "A"), (b, "B")):
        done = slot_tool(boot, "install", str(root), slot)
        assert done.returncode == 0, done.stderr
    done = slot_tool(boot, "select", "A", "B")
    assert done.returncode == 0, done.stderr

    # What the firmware boots normally: slot A, its newest kernel (by version, not by
    # name: 10 after 9), its own root partition (2) named by the disk id.
    normal = firmware_choice(read_from(boot), tryboot=False)
    assert normal.config == "config.txt"
    assert (boot / normal.kernel).read_text() == "kernel 6.1.0-10-arm64"
    assert (boot / normal.initramfs).read_text() == "initrd 6.1.0-10-arm64"
    assert f"root=PARTUUID={DISK_ID}-02" in normal.cmdline.split()
    assert "rauc.slot=A" in normal.cmdline.split()
    assert (boot / "slot-a" / "bcm2711-rpi-4-b.dtb").read_text() == "dtb 6.1.0-10-arm64"
    # After reboot '0 tryboot': slot B, partition 3.
    tried = firmware_choice(read_from(boot), tryboot=True)
    assert tried.config == "tryboot.txt"
    assert (boot / tried.kernel).read_text() == "kernel 6.1.0-28-arm64"
    assert f"root=PARTUUID={DISK_ID}-03" in tried.cmdline.split()
    assert "rauc.slot=B" in tried.cmdline.split()
    assert (boot / "start4.elf").exists()

    # Committing B: both files boot B; installing A again leaves B's files alone.
    assert slot_tool(boot, "select", "B").returncode == 0
    for tryboot in (False, True):
        assert "rauc.slot=B" in firmware_choice(read_from(boot), tryboot).cmdline.split()
    system_root(a, "6.1.0-11-arm64")
    assert slot_tool(boot, "install", str(a), "A").returncode == 0
    assert (boot / "slot-a" / "vmlinuz").read_text() == "kernel 6.1.0-11-arm64"
    assert (boot / "slot-b" / "vmlinuz").read_text() == "kernel 6.1.0-28-arm64"
    assert sorted(p.name for p in boot.iterdir()) == [
        "config.txt", "slot-a", "slot-b", "start4.elf", "tryboot.txt",
    ]  # fmt: skip


def test_the_slot_tool_refuses_what_would_not_boot(tmp_path: Path) -> None:
    boot = tmp_path / "firmware"
    boot.mkdir()
    no_kernel = slot_tool(boot, "install", str(tmp_path), "A")
    assert no_kernel.returncode == 1
    assert f"no kernel in {tmp_path}/boot" in no_kernel.stderr
    root = system_root(tmp_path / "a", "6.1.0-9-arm64")
    (root / "boot" / "initrd.img-6.1.0-9-arm64").unlink()
    no_initrd = slot_tool(boot, "install", str(root), "A")
    assert "no initrd for kernel 6.1.0-9-arm64" in no_initrd.stderr
    assert not (boot / "slot-a").exists()  # nothing half made
    bad_slot = slot_tool(boot, "install", str(root), "C")
    assert bad_slot.returncode == 1 and "no slot 'C' (A or B)" in bad_slot.stderr
    # Selecting a slot with no kernel on the boot partition would leave a card that
    # does not boot: refused, config.txt not written.
    empty = slot_tool(boot, "select", "B")
    assert empty.returncode == 1 and "slot B has no kernel" in empty.stderr
    assert not (boot / "config.txt").exists()


def test_the_firmware_choice_follows_the_documented_rules() -> None:
    files = {
        "config.txt": b"kernel=vmlinuz\nos_prefix=one/\n[pi5]\nos_prefix=five/\n[all]\n"
        b"initramfs initrd.img followkernel\nos_prefix=two/\n",
        "two/cmdline.txt": b"root=PARTUUID=00000000-02\n",
        "three/other.txt": b"root=PARTUUID=00000000-03\n",
        "tryboot.txt": b"os_prefix=three/\nkernel=k\ninitramfs i\ncmdline=other.txt\n",
    }
    normal = firmware_choice(files.get, tryboot=False)
    # The later os_prefix wins; a line under another model's filter does not apply.
    assert (normal.kernel, normal.initramfs) == ("two/vmlinuz", "two/initrd.img")
    assert normal.cmdline == "root=PARTUUID=00000000-02"
    tried = firmware_choice(files.get, tryboot=True)
    assert (tried.config, tried.kernel, tried.cmdline) == (
        "tryboot.txt", "three/k", "root=PARTUUID=00000000-03",
    )  # fmt: skip
    # Without a tryboot.txt, a tryboot reads config.txt.
    del files["tryboot.txt"]
    assert firmware_choice(files.get, tryboot=True).config == "config.txt"


def backend(boot: Path, *args: str) -> str:
    done = slot_tool(boot, "rauc", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def boots(boot: Path) -> tuple[str, str]:
    """(the slot a normal boot starts, the slot a tryboot starts), by the firmware's rules."""
    slots = []
    for tryboot in (False, True):
        words = firmware_choice(read_from(boot), tryboot).cmdline.split()
        slots.append(next(w.removeprefix("rauc.slot=") for w in words if "rauc.slot=" in w))
    return slots[0], slots[1]


def rauc_installs(boot: Path, root: Path, slot: str) -> None:
    """What RAUC does to the bootloader around writing ``slot``: marks it bad, writes it
    (the bundle's hook installs its kernel), makes it primary."""
    backend(boot, "set-state", slot, "bad")
    assert slot_tool(boot, "install", str(root), slot).returncode == 0
    backend(boot, "set-primary", slot)


def test_an_update_is_tried_once_then_committed_or_given_up(tmp_path: Path) -> None:
    boot = tmp_path / "firmware"
    boot.mkdir()
    old = system_root(tmp_path / "old", "6.1.0-9-arm64")
    new = system_root(tmp_path / "new", "6.1.0-10-arm64")
    assert slot_tool(boot, "install", str(old), "A").returncode == 0
    assert slot_tool(boot, "select", "A").returncode == 0
    assert backend(boot, "get-primary") == "A"
    assert backend(boot, "get-state", "A") == "good"

    # Installed into B: tried by the next tryboot only; a power cut (a normal boot)
    # still starts A.
    rauc_installs(boot, new, "B")
    assert boots(boot) == ("A", "B")
    assert backend(boot, "get-primary") == "B"
    assert backend(boot, "get-state", "B") == "good"
    # B healthy: committed, every boot starts it.
    backend(boot, "set-state", "B", "good")
    assert boots(boot) == ("B", "B")
    assert slot_tool(boot, "committed").stdout.strip() == "B"

    # The next update goes to A; RAUC's "bad" before writing keeps A from being tried
    # half written.
    backend(boot, "set-state", "A", "bad")
    assert backend(boot, "get-state", "A") == "bad"
    assert boots(boot) == ("B", "B")
    rauc_installs(boot, new, "A")
    assert boots(boot) == ("B", "A")
    # Not healthy: given up, not tried again, B stays.
    backend(boot, "set-state", "A", "bad")
    assert boots(boot) == ("B", "B")
    assert backend(boot, "get-primary") == "B"
    assert backend(boot, "get-state", "A") == "bad"
    assert (
        slot_tool(boot, "committed").stdout.strip(),
        slot_tool(boot, "trial").stdout.strip(),
    ) == ("B", "B")

    # Made primary again by hand (rauc status mark-active other): tried again.
    backend(boot, "set-primary", "A")
    assert backend(boot, "get-state", "A") == "good"
    assert boots(boot) == ("B", "A")

    wrong = slot_tool(boot, "rauc", "set-state", "B", "fine")
    assert wrong.returncode == 1 and "no state 'fine' (good or bad)" in wrong.stderr
    unknown = slot_tool(boot, "rauc", "get-current")
    assert unknown.returncode == 1 and "no RAUC backend operation 'get-current'" in unknown.stderr


COMMIT_TOOL = REPO / "image" / "rootfs" / "usr" / "local" / "sbin" / "ledge-update-commit"


def commit_run(tmp_path: Path, boot: Path, booted: str, healthy: bool) -> tuple[str, list[str]]:
    """``ledge-update-commit`` at a boot of slot ``booted``, with stand-ins for what the
    device has: ``ledge health`` (healthy or not), ``rauc status mark-*`` (RAUC's own
    translation into the bootloader backend: ``booted`` and ``other``) and
    ``systemctl``. Its log, and the commands it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    calls.write_text("")
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(
        f"console=tty0 root=PARTUUID={DISK_ID}-0{2 if booted == 'A' else 3} rauc.slot={booted}\n"
    )
    other = "B" if booted == "A" else "A"
    stand_ins = {
        "ledge": f'echo "ledge $*" >>{calls}\n'
        + (
            "echo 'healthy (3 of 3 checks pass)'\n"
            if healthy
            else "echo 'NOT healthy (2 of 3 checks pass): bridge cloud: connecting'\nexit 1\n"
        ),
        "rauc": f'echo "rauc $*" >>{calls}\n'
        f'case "$3" in booted) slot={booted} ;; other) slot={other} ;; esac\n'
        f'exec sh {SLOT_TOOL} rauc set-state "$slot" "${{2#mark-}}"\n',
        "systemctl": f'echo "systemctl $*" >>{calls}\n',
        "ledge-boot-slot": f'exec sh {SLOT_TOOL} "$@"\n',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        LEDGE_BOOT_DIR=str(boot),
        LEDGE_DISK_ID=DISK_ID,
        LEDGE_KERNEL_CMDLINE=str(cmdline),
        LEDGE_UPDATE_DIR=str(tmp_path / "update"),
        LEDGE_BIN=str(bin_dir / "ledge"),
    )
    done = subprocess.run(
        ["sh", str(COMMIT_TOOL)], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, calls.read_text().splitlines()


def last_update(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "update" / "last"
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_a_tried_system_is_kept_only_when_the_gateway_is_healthy(tmp_path: Path) -> None:
    boot = tmp_path / "firmware"
    boot.mkdir()
    system = system_root(tmp_path / "system", "6.1.0-9-arm64")
    assert slot_tool(boot, "install", str(system), "A").returncode == 0
    assert slot_tool(boot, "select", "A").returncode == 0

    # A normal boot with no update: nothing asked, nothing run.
    log, calls = commit_run(tmp_path, boot, "A", healthy=True)
    assert calls == [] and last_update(tmp_path) == {}

    # Tried and healthy: committed.
    rauc_installs(boot, system, "B")
    log, calls = commit_run(tmp_path, boot, "B", healthy=True)
    assert calls == [
        "ledge health --config /etc/ledge/ledge.toml --wait",
        "rauc status mark-good booted",
        "systemctl reload ledge.service",  # the gateway reports the record
    ]
    assert boots(boot) == ("B", "B")
    assert "slot B committed: the gateway is healthy" in log
    assert last_update(tmp_path) | {"at": ""} == {
        "outcome": "committed", "slot": "B", "from": "A", "at": "", "reason": "healthy",
    }  # fmt: skip

    # Tried and not healthy: given up, rebooted into B, the reason kept.
    rauc_installs(boot, system, "A")
    log, calls = commit_run(tmp_path, boot, "A", healthy=False)
    assert calls[1:] == ["rauc status mark-bad booted", "systemctl reboot"]
    assert boots(boot) == ("B", "B")
    assert "slot A NOT healthy, going back to slot B" in log
    last = last_update(tmp_path)
    assert (last["outcome"], last["slot"], last["from"]) == ("rolled-back", "A", "B")
    assert "bridge cloud: connecting" in last["reason"]
    # The next boot (B) has nothing left to settle.
    assert commit_run(tmp_path, boot, "B", healthy=True)[1] == []

    # Tried but the committed system started instead (the trial hung and the watchdog
    # reset it, or the power went): given up, said so.
    rauc_installs(boot, system, "A")
    log, calls = commit_run(tmp_path, boot, "B", healthy=True)
    assert calls == ["rauc status mark-bad other", "systemctl reload ledge.service"]
    assert boots(boot) == ("B", "B")
    last = last_update(tmp_path)
    assert (last["outcome"], last["slot"]) == ("rolled-back", "A")
    assert "did not come up healthy" in last["reason"]
    assert commit_run(tmp_path, boot, "B", healthy=True)[1] == []
