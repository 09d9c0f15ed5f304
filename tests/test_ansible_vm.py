"""The Ansible role ``ledge`` run as an operator runs it (``ansible-playbook site.yml``
from ansible/) against a gateway booted from the project's SD-card image in QEMU, over
SSH on a forwarded loopback port.

The tests are steps of one gateway's life and run in order: first converge, second
converge (nothing changes), a reloadable change (SIGHUP, same process), a change that
needs a restart, a broken value (refused, the gateway keeps serving), an upgrade, and an
upgrade to a build that cannot start (rolled back).

Marked ``provision`` (and ``image``): not in ``scripts/test`` (about 20 minutes of
emulation); ``make provision-test`` runs them, building the image first
(tests/support/imagebuild.py) unless ``LEDGE_IMAGE`` names one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import ansible, imagebuild
from tests.support.ansible import ANSIBLE
from tests.support.clients import Paho
from tests.support.procs import REPO
from tests.support.vm import SdCard, Vm, mqtt_answers, ssh_keypair
from tests.support.wait import wait_for

pytestmark = [pytest.mark.image, pytest.mark.provision, pytest.mark.timeout(3600)]

BUILD_TIMEOUT = 45 * 60
BOOT_TIMEOUT = 600.0
#: One ansible-playbook run (the first installs a venv under TCG).
RUN_TIMEOUT = 2400
VERSION = "0.1.0"
NEWER = "0.1.1"
BROKEN = "0.1.2"
NOT_AUTHORIZED = 135  # MQTT 5.0 SUBACK reason code 0x87

BASE_VARS: dict[str, object] = {
    "ledge_gateway_id": "gw-ansible-test",
    "ledge_listeners": [{"host": "0.0.0.0", "port": 1883}],
    "ledge_acl_lines": ["topic readwrite plant/#"],
    "ledge_health_timeout": 240,
}


def build_wheel(version: str, out: Path, work: Path, broken: bool = False) -> Path:
    """This checkout's wheel with another version number (and, ``broken``, a gateway
    process that exits at once: it passes check-config but never starts)."""
    src = work / f"src-{version}"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    src.mkdir()
    for name in ("gateway", "drivers", "pipeline"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name, pattern in (
        ("pyproject.toml", r'^version = "[^"]+"'),
        ("gateway/__init__.py", r'^__version__ = "[^"]+"'),
    ):
        path = src / name
        key = pattern.split(" ")[0][1:]
        path.write_text(re.sub(pattern, f'{key} = "{version}"', path.read_text(), flags=re.M))
    if broken:
        app = src / "gateway" / "app" / "root.py"
        # At import, before `python -m gateway.app` (gateway/app/__main__.py) runs it.
        head = "from __future__ import annotations\n"
        text = app.read_text()
        assert head in text
        app.write_text(
            text.replace(head, head + 'raise SystemExit("this build cannot start")\n', 1)
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        check=True,
        timeout=600,
    )
    [wheel] = out.glob(f"ledge-{version}-*.whl")
    return wheel


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float
    recap: dict[str, int] = field(default_factory=dict)


@dataclass
class Gateway:
    vm: Vm
    key: Path
    work: Path
    wheels: dict[str, Path]
    runs: int = 0

    def converge(self, version: str = VERSION, **changes: object) -> Run:
        """``ansible-playbook site.yml`` with an inventory holding this one gateway."""
        self.runs += 1
        group_vars = {
            **BASE_VARS,
            **changes,
            "ledge_version": version,
            "ledge_wheel_dir": str(self.wheels[version]),
        }
        inventory = {
            "ledge_gateways": {
                "hosts": {
                    "gw-vm": {
                        "ansible_host": "127.0.0.1",
                        "ansible_port": self.vm.port("ssh"),
                        "ansible_user": "root",
                        "ansible_ssh_private_key_file": str(self.key),
                        "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null "
                        "-o StrictHostKeyChecking=no -o IdentitiesOnly=yes",
                    }
                },
                "vars": group_vars,
            }
        }
        path = self.work / f"inventory-{self.runs}.yml"
        path.write_text(json.dumps(inventory))  # JSON is YAML
        started = time.monotonic()
        done = ansible.run(
            "ansible-playbook", ["-i", str(path), "site.yml"], self.work, RUN_TIMEOUT
        )
        seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        (self.work / f"ansible-{self.runs}.log").write_text(output)
        run = Run(done.returncode, output, seconds)
        recap = re.search(r"^gw-vm\s+:\s+(.*)$", output, re.M)
        if recap:
            run.recap = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))}
        return run

    def run(self, command: str) -> str:
        return self.vm.ssh(self.key, command).stdout.strip()

    def main_pid(self) -> str:
        return self.run("systemctl show -p MainPID --value ledge")

    def serves(self) -> bool:
        return mqtt_answers(self.vm.port("mqtt"))


def report(step: str, run: Run) -> None:
    imagebuild.REPORT[f"ansible: {step}"] = f"{run.seconds:.0f} s, {run.recap}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("ansible-vm")
    # The controller's wheels (while the image may still be building): Ledge and its
    # dependencies for aarch64, then the same with a newer and with a broken Ledge.
    base = work / f"wheels-{VERSION}"
    subprocess.run(
        [str(ANSIBLE / "wheelhouse"), "--arch", "aarch64", "--out", str(base)],
        check=True,
        timeout=900,
        env=dict(os.environ, PYTHON=sys.executable),
    )
    wheels = {VERSION: base}
    for version, broken in ((NEWER, False), (BROKEN, True)):
        out = work / f"wheels-{version}"
        shutil.copytree(base, out, ignore=shutil.ignore_patterns("ledge-*.whl"))
        build_wheel(version, out, work, broken)
        wheels[version] = out
    image = imagebuild.wait(BUILD_TIMEOUT)
    card = SdCard.flash(image, work / "card.img")
    key, public = ssh_keypair(work)
    card.boot.write("authorized_keys", public + "\n")
    vm = Vm(card, work, {"mqtt": 1883, "ssh": 22})
    with vm:
        vm.start()
        seconds = vm.wait_connack("mqtt", BOOT_TIMEOUT)
        imagebuild.REPORT["ansible: VM power-on to CONNACK"] = f"{seconds:.1f} s"

        # sshd may start after the gateway (its host keys are made on first boot): the
        # controller's first connection must not race it.
        def logged_in() -> bool:
            return vm.ssh(key, "true", timeout=60, check=False).returncode == 0

        wait_for(logged_in, BOOT_TIMEOUT, "SSH login with the key")
        yield Gateway(vm, key, work, wheels)


def test_first_converge_installs_the_pinned_release_and_configures_it(gateway: Gateway) -> None:
    run = gateway.converge()
    report("first converge", run)
    assert run.returncode == 0, run.output[-6000:]
    assert run.recap["changed"] > 0 and run.recap["failed"] == 0
    release = gateway.run("readlink /opt/ledge")
    assert release.startswith(f"/opt/ledge-releases/{VERSION}-"), release
    assert gateway.run("/opt/ledge/bin/ledge --version") == f"ledge {VERSION}"
    # The image's own venv was kept as a release to go back to.
    assert gateway.run("ls /opt/ledge-releases").count("preinstalled") == 1
    assert gateway.run("stat -c '%U %a' /etc/ledge/acl") == "ledge 600"
    assert gateway.run("stat -c '%U:%G %a' /etc/ledge/ledge.toml") == "root:ledge 640"
    assert 'id = "gw-ansible-test"' in gateway.run("cat /etc/ledge/ledge.toml")
    assert gateway.run("systemctl is-active ledge") == "active"
    assert gateway.serves()


def test_second_converge_changes_nothing(gateway: Gateway) -> None:
    pid = gateway.main_pid()
    run = gateway.converge()
    report("second converge", run)
    assert run.returncode == 0, run.output[-6000:]
    assert run.recap["changed"] == 0, run.output[-6000:]
    assert gateway.main_pid() == pid


def test_an_acl_line_is_applied_by_sighup_in_the_same_process(gateway: Gateway) -> None:
    port = gateway.vm.port("mqtt")
    client = Paho(port, "acl-before", version=5).connect()
    assert client.subscribe("hall/#", 1) == [NOT_AUTHORIZED]
    client.disconnect()
    pid = gateway.main_pid()
    run = gateway.converge(ledge_acl_lines=["topic readwrite plant/#", "topic readwrite hall/#"])
    report("reloadable change (ACL line)", run)
    assert run.returncode == 0, run.output[-6000:]
    assert "action: reload" in run.output
    assert gateway.main_pid() == pid  # not restarted
    client = Paho(port, "acl-after", version=5).connect()
    try:
        assert client.subscribe("hall/#", 1) == [1]
    finally:
        client.disconnect()
    assert "config reloaded" in gateway.run("journalctl -u ledge --no-pager -n 50")


def test_a_change_that_needs_a_restart_restarts_and_waits_for_health(gateway: Gateway) -> None:
    pid = gateway.main_pid()
    run = gateway.converge(
        ledge_acl_lines=["topic readwrite plant/#", "topic readwrite hall/#"],
        ledge_broker={"max_connections": 500},
    )
    report("restart-needing change (broker.max_connections)", run)
    assert run.returncode == 0, run.output[-6000:]
    assert "action: restart" in run.output
    assert "restart: needed for broker.max_connections" in run.output
    assert gateway.main_pid() not in (pid, "0")
    assert gateway.serves()


def test_a_broken_value_is_refused_and_the_gateway_keeps_serving(gateway: Gateway) -> None:
    pid = gateway.main_pid()
    run = gateway.converge(
        ledge_acl_lines=["topic readwrite plant/#", "topic readwrite hall/#"],
        ledge_broker={"max_connections": 0},
    )
    report("broken value (refused by validate)", run)
    assert run.returncode != 0
    assert run.recap["failed"] == 1
    assert "broker.max_connections" in run.output  # check-config's message, with the key
    assert gateway.main_pid() == pid
    assert "max_connections = 500" in gateway.run("cat /etc/ledge/ledge.toml")
    assert gateway.serves()


def test_an_upgrade_to_a_newer_wheel_restarts_on_it(gateway: Gateway) -> None:
    pid = gateway.main_pid()
    run = gateway.converge(
        NEWER,
        ledge_acl_lines=["topic readwrite plant/#", "topic readwrite hall/#"],
        ledge_broker={"max_connections": 500},
    )
    report(f"upgrade {VERSION} -> {NEWER}", run)
    assert run.returncode == 0, run.output[-6000:]
    assert gateway.run("/opt/ledge/bin/ledge --version") == f"ledge {NEWER}"
    assert gateway.main_pid() not in (pid, "0")
    assert gateway.serves()


def test_an_upgrade_that_cannot_start_is_rolled_back(gateway: Gateway) -> None:
    before = gateway.run("readlink /opt/ledge")
    run = gateway.converge(
        BROKEN,
        ledge_acl_lines=["topic readwrite plant/#", "topic readwrite hall/#"],
        ledge_broker={"max_connections": 500},
    )
    report(f"broken upgrade {NEWER} -> {BROKEN} (rolled back)", run)
    assert run.returncode != 0
    assert run.recap["failed"] == 1 and run.recap["rescued"] >= 1
    assert f"rolled back to {Path(before).name}" in run.output
    assert gateway.run("readlink /opt/ledge") == before
    assert gateway.run("/opt/ledge/bin/ledge --version") == f"ledge {NEWER}"
    assert gateway.run("systemctl is-active ledge") == "active"
    assert gateway.serves()
