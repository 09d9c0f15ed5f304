"""The image's sources, checked in seconds on every run (building and booting the image
is ``tests/test_image.py``): the build's own checks and the systemd units' syntax."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.procs import REPO

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
    assert "error in step 1/6 (tools)" in done.stderr
    for tool, package in (
        ("mmdebstrap", "mmdebstrap"),
        ("mcopy", "mtools"),
        ("xz", "xz-utils"),
        ("bmaptool", "bmap-tools"),  # the release's .bmap is never silently left out
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
