"""System updates of the SD-card image in QEMU, the whole story (``make update-test``;
the image's boot test in ``scripts/test`` does the short one: a bundle refused, one
kept).

One card: first boot on slot A with messages acknowledged to a persistent session; the
release bundle installed with ``ledge update``, tried once by the emulated firmware's
tryboot and kept; then, through the fleet play (``ansible/system-update.yml``), a bundle
whose gateway cannot start (the ``ledge`` command taken out of its system, signed again
with the same key), which the new system's ``ledge-update-commit`` finds unhealthy and
gives up: the device reboots into the system that worked, by itself, and the play stops
the rollout naming why. Across both, the store keeps every acknowledged message and the
device its identity.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ansible, imagebuild, update
from tests.support.clients import Paho
from tests.support.vm import SdCard, Vm, ssh_keypair
from tests.support.wait import wait_for

pytestmark = [pytest.mark.image, pytest.mark.update, pytest.mark.timeout(5400)]

BUILD_TIMEOUT = 45 * 60
BOOT_TIMEOUT = 600.0
MQTT_PORT = 1883
CONFIG = f"""\
[[listeners]]
host = "0.0.0.0"
port = {MQTT_PORT}

[gateway]
id = "gw-update-test"

[health]
timeout = 60
"""


@dataclass
class Device:
    card: SdCard
    vm: Vm
    key: Path
    image: Path


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    image = imagebuild.wait(BUILD_TIMEOUT)
    work = tmp_path_factory.mktemp("update-card")
    card = SdCard.flash(image, work / "card.img")
    os.truncate(card.path, card.path.stat().st_size + 512 * 1024 * 1024)
    key, public = ssh_keypair(work)
    card.boot.write("ledge.toml", CONFIG)
    card.boot.write("authorized_keys", public + "\n")
    vm = Vm(card, work, {"mqtt": MQTT_PORT, "ssh": 22})
    with vm:
        yield Device(card, vm, key, image)


def delivered(vm: Vm, count: int) -> list[bytes]:
    """What the persistent session "keeper" gets when it comes back."""
    keeper = Paho(vm.port("mqtt"), "keeper").connect(clean=False, session_expiry=86400)
    got = [m.payload for m in keeper.wait_messages(count, timeout=60)]
    keeper.disconnect()
    return got


def test_first_boot_takes_acknowledged_messages(device: Device) -> None:
    vm = device.vm
    vm.start()
    vm.wait_connack("mqtt", BOOT_TIMEOUT)
    keeper = Paho(vm.port("mqtt"), "keeper").connect(clean=False, session_expiry=86400)
    keeper.subscribe("plant/#", 1)
    keeper.disconnect()
    producer = Paho(vm.port("mqtt"), "producer").connect()
    for n in range(3):
        producer.publish(f"plant/{n}", f"before-{n}".encode(), 1)  # waits for PUBACK
    producer.disconnect()
    wait_for(
        lambda: vm.ssh(device.key, "true", timeout=60, check=False).returncode == 0,
        BOOT_TIMEOUT,
        "SSH",
    )
    assert update.slots(vm, device.key) == ("A", "A", "A")


def test_the_release_bundle_is_kept(device: Device) -> None:
    vm, key = device.vm, device.key
    update.push(vm, key, update.bundle_of(device.image), "/data/release.raucb")
    done = update.ledge_update(vm, key, "/data/release.raucb")
    assert "installed into slot B" in done.stderr, done.stdout + done.stderr
    update.reboot_into_trial(vm, "mqtt", key, BOOT_TIMEOUT)
    wait_for(lambda: update.slots(vm, key) == ("B", "B", "B"), 600, "slot B committed")
    assert update.last_update(vm, key)["outcome"] == "committed"
    vm.ssh(key, "rm /data/release.raucb")


class PowerSupply:
    """Starts the machine again whenever the guest stops it, as a Pi restarts after a
    reboot (QEMU runs with -no-reboot), while something else (Ansible) drives it."""

    def __init__(self, vm: Vm) -> None:
        self.vm = vm
        self.stopping = threading.Event()
        self.restarts = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.wait(0.5):
            proc = self.vm.proc
            if proc is not None and proc.poll() is not None:
                self.vm.wait_stopped(10)
                self.vm.start()
                self.restarts += 1

    def __enter__(self) -> PowerSupply:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)


def play(device: Device, work: Path, bundle: Path) -> tuple[int, str]:
    """``ansible-playbook system-update.yml`` for this one gateway."""
    inventory = {
        "ledge_gateways": {
            "hosts": {
                "gw-vm": {
                    "ansible_host": "127.0.0.1",
                    "ansible_port": device.vm.port("ssh"),
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(device.key),
                    "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null "
                    "-o StrictHostKeyChecking=no -o IdentitiesOnly=yes",
                }
            }
        }
    }
    path = work / "inventory.yml"
    path.write_text(json.dumps(inventory))  # JSON is YAML
    args = ["-i", str(path), "system-update.yml", "-e", f"ledge_bundle={bundle}"]
    done = ansible.run("ansible-playbook", args, work, 3600)
    output = done.stdout + done.stderr
    (work / "ansible.log").write_text(output)
    return done.returncode, output


def test_a_system_whose_gateway_cannot_start_is_given_up_and_stops_the_rollout(
    device: Device, tmp_path: Path
) -> None:
    vm, key = device.vm, device.key
    signing_key, cert = update.development_key()
    broken = update.broken_bundle(update.bundle_of(device.image), tmp_path, signing_key, cert)
    boots = len(vm.choices)
    started = time.monotonic()
    with PowerSupply(vm) as power:
        returncode, output = play(device, tmp_path, broken)
    back = time.monotonic() - started
    # Installed into A, tried once; there the gateway never started, ledge-update-commit
    # said so and rebooted; that boot was a normal one, into B.
    assert power.restarts == 2, output
    assert [c.config for c in vm.choices[boots:]] == ["tryboot.txt", "config.txt"]
    assert returncode != 0
    assert "The new system was not kept on gw-vm: outcome=rolled-back" in output
    assert "reason=not healthy" in output
    vm.wait_connack("mqtt", BOOT_TIMEOUT)
    assert update.slots(vm, key) == ("B", "B", "B")
    last = update.last_update(vm, key)
    assert (last["outcome"], last["slot"], last["from"]) == ("rolled-back", "A", "B")
    journal = vm.ssh(key, "journalctl -b -1 -u ledge-update-commit --no-pager").stdout
    assert "slot A NOT healthy, going back to slot B" in journal
    assert vm.ssh(key, "ls /data/update").stdout.split() == ["last"]  # the bundle removed
    imagebuild.REPORT["update: a broken system given up, through the play"] = f"{back:.0f} s"


def test_the_store_kept_every_acknowledged_message_across_both(device: Device) -> None:
    assert delivered(device.vm, 3) == [b"before-0", b"before-1", b"before-2"]
