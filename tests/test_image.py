"""The SD-card image: built by ``image/build`` (in the background, see
``tests/support/imagebuild.py``), flashed onto a file standing for a card bigger than the
image, configured by writing its boot partition with mtools as a user would on a laptop,
booted twice in QEMU (arm64 virt, TCG) and checked only from outside: MQTT and SSH on
forwarded loopback ports, the boot partition read back after power-off.

The tests are steps of one device's life and run in order: first boot with a config and
no SSH key; a QoS 1 message acknowledged just before the plug is pulled; a second boot
with a key and a broken config; a reboot, after which the second boot's log is still
there. Then a second card, booted as flashed, without a config: its MQTT user's
password is on the boot partition, and no one else gets in.

Last, the build itself: building again from the same commit and cached root filesystem
(in the background while the VMs boot) gives the same bytes, and its ``.img.xz`` holds
them.

``scripts/test -m "not image"`` leaves them out.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.mqtt import MQTT_311, ConnAck, Connect, encode
from tests.support import imagebuild, update
from tests.support.clients import Paho
from tests.support.raw import Raw
from tests.support.vm import SdCard, Vm, mqtt_answers, read_image, sha256_hex, ssh_keypair
from tests.support.wait import wait_for

pytestmark = [pytest.mark.image, pytest.mark.timeout(3600)]

#: The build runs in the background from the start of the run; the first image test
#: waits for it at most this long.
BUILD_TIMEOUT = 45 * 60
#: Power-on to CONNACK under TCG (about 1.5 minutes here with a moderate load, 4-5 with a
#: heavy one).
BOOT_TIMEOUT = 600.0
CARD_EXTRA_MIB = 512

GATEWAY_ID = "gw-image-test"
HOSTNAME = "gw-hall-3"
MQTT_PORT = 2883  # not the default 1883: proves the boot partition's ledge.toml applies
CONFIG = f"""\
[[listeners]]
host = "0.0.0.0"
port = {MQTT_PORT}

[gateway]
id = "{GATEWAY_ID}"
health_interval = 2
"""
BROKEN_CONFIG = CONFIG.replace(f"port = {MQTT_PORT}", "port = 70000")
#: Something else listening on every interface of the device, behind the firewall.
PROBE_PORT = 8080
WIFI = 'country=DE\nnetwork={\n    ssid="plant-floor"\n    psk="not-a-real-secret"\n}\n'


@dataclass
class Device:
    card: SdCard
    vm: Vm
    key: Path
    public_key: str
    data_bytes: int  # the data partition as built


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    image = imagebuild.wait(BUILD_TIMEOUT)
    work = tmp_path_factory.mktemp("sdcard")
    card = SdCard.flash(image, work / "card.img")
    size = card.path.stat().st_size
    os.truncate(card.path, size + CARD_EXTRA_MIB * 1024 * 1024)  # a bigger card
    data_bytes = card.partitions()[3]["size"]
    # What a user writes on the boot partition before the first boot: a config, a
    # host name (with a Windows line end), no SSH key yet.
    card.boot.write("ledge.toml", CONFIG)
    card.boot.write("hostname", f"{HOSTNAME}\r\n")
    key, public = ssh_keypair(work)
    ports = {"mqtt": MQTT_PORT, "default": 1883, "ssh": 22, "probe": PROBE_PORT}
    vm = Vm(card, work, ports)
    with vm:
        yield Device(card, vm, key, public, data_bytes)


def banner(port: int, timeout: float = 10.0) -> bytes:
    """What a TCP server on the forwarded ``port`` says first (b"" if it closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout) as sock:
        sock.settimeout(timeout)
        try:
            return sock.recv(64)
        except (TimeoutError, ConnectionResetError):
            return b""


# ---------------------------------------------------------------------- first boot


def test_first_boot_serves_mqtt_on_the_port_of_the_boot_partitions_config(
    device: Device,
) -> None:
    vm = device.vm
    vm.start()
    seconds = vm.wait_connack("mqtt", BOOT_TIMEOUT)
    imagebuild.REPORT["first boot: power-on to CONNACK"] = f"{seconds:.1f} s"
    # The embedded default (1883) is not what runs.
    assert not mqtt_answers(vm.port("default"))


def test_the_gateway_id_is_in_its_health_topic(device: Device) -> None:
    watcher = Paho(device.vm.port("mqtt"), "health-watch").connect()
    try:
        watcher.subscribe("ledge/+/health", 1)
        [health] = watcher.wait_messages(1, 30)[:1]
        assert health.topic == f"ledge/{GATEWAY_ID}/health"
        assert json.loads(health.payload)["uptime"] > 0
    finally:
        watcher.disconnect()


def test_the_host_name_applies_and_without_a_key_there_is_no_ssh(device: Device) -> None:
    vm = device.vm
    # The serial console's login prompt: the system is up, under the boot partition's name.
    vm.wait_console(rf"{HOSTNAME} login:", BOOT_TIMEOUT)
    said = banner(vm.port("ssh"))
    assert not said.startswith(b"SSH-"), f"an SSH server answered: {said!r}"


def test_a_message_acknowledged_just_before_power_loss_is_kept(device: Device) -> None:
    port = device.vm.port("mqtt")
    keeper = Paho(port, "keeper").connect(clean=False, session_expiry=86400)
    keeper.subscribe("plant/#", 1)
    keeper.disconnect()
    producer = Paho(port, "producer").connect()
    producer.publish("plant/boiler", b"acknowledged-then-unplugged", 1)  # waits for PUBACK
    device.vm.power_off()  # at once: no shutdown, no sync
    producer.kill()


# ---------------------------------------------------------------------- second boot


def test_second_boot_delivers_it_while_a_broken_config_is_refused(device: Device) -> None:
    # On the laptop: a key, Wi-Fi, and a config with a mistake in it.
    boot = device.card.boot
    boot.write("authorized_keys", device.public_key + "\n")
    boot.write("wpa_supplicant.conf", WIFI)
    boot.write("ledge.toml", BROKEN_CONFIG)
    vm = device.vm
    vm.start()
    # The previous config keeps serving, on its port.
    seconds = vm.wait_connack("mqtt", BOOT_TIMEOUT)
    imagebuild.REPORT["second boot: power-on to CONNACK"] = f"{seconds:.1f} s"
    keeper = Paho(vm.port("mqtt"), "keeper").connect(clean=False, session_expiry=86400)
    try:
        assert keeper.session_present
        [message] = keeper.wait_messages(1, 30)
        assert (message.topic, message.payload) == ("plant/boiler", b"acknowledged-then-unplugged")
    finally:
        keeper.disconnect()


def test_ssh_takes_the_key_and_refuses_passwords(device: Device) -> None:
    vm = device.vm
    started = time.monotonic()

    def logged_in() -> bool:
        return vm.ssh(device.key, "id -un", timeout=60, check=False).stdout.strip() == "root"

    wait_for(logged_in, BOOT_TIMEOUT, "SSH login with the key")
    imagebuild.REPORT["second boot: SSH login after CONNACK"] = (
        f"{time.monotonic() - started:.1f} s"
    )
    no_key = ["-o", "PubkeyAuthentication=no"]
    methods = ["-o", "PreferredAuthentications=password,keyboard-interactive"]
    password = subprocess.run(
        [*vm.ssh_argv(device.key), *no_key, *methods, "true"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert password.returncode == 255
    # The server offers nothing but public keys.
    assert "Permission denied (publickey)" in password.stderr
    assert vm.ssh(device.key, "passwd -S root").stdout.split()[1] == "L"


def test_the_refused_config_is_explained_on_the_boot_partition_and_in_the_log(
    device: Device,
) -> None:
    vm, key = device.vm, device.key
    error = vm.ssh(key, "cat /boot/firmware/ledge-config-error.txt").stdout
    assert "ledge.toml was not applied" in error
    assert "listeners[0].port (line 3): Input should be less than or equal to 65535" in error
    assert "keeps running on its previous configuration" in error
    log = vm.ssh(key, "journalctl -b -u ledge-boot-config --no-pager").stdout
    assert "ledge.toml on the boot partition NOT applied" in log
    assert "65535" in log
    # What runs is the config applied at the first boot.
    assert f"port = {MQTT_PORT}" in vm.ssh(key, "cat /etc/ledge/ledge.toml").stdout


def test_the_device_is_set_up_as_an_appliance(device: Device) -> None:
    vm, key = device.vm, device.key

    def run(command: str) -> str:
        return vm.ssh(key, command).stdout.strip()

    show = dict(
        line.split("=", 1)
        for line in run(
            "systemctl show ledge -p Type -p User -p ActiveState -p WatchdogUSec "
            "-p ProtectSystem -p NoNewPrivileges -p PrivateTmp -p RestrictAddressFamilies"
        ).splitlines()
    )
    assert show["Type"] == "notify"
    assert show["ActiveState"] == "active"
    assert show["User"] == "ledge"
    assert show["WatchdogUSec"] == "30s"
    assert show["ProtectSystem"] == "strict"
    assert show["NoNewPrivileges"] == "yes"
    assert show["PrivateTmp"] == "yes"
    families = set(show["RestrictAddressFamilies"].split())
    assert families == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    assert run("ps -o user= -p $(systemctl show -p MainPID --value ledge)") == "ledge"
    assert run("hostname") == HOSTNAME
    assert run("ledge --version").startswith("ledge ")  # on root's PATH
    assert "noatime" in run("findmnt -no OPTIONS /").split(",")
    assert run("swapon --noheadings --show") == ""
    assert run("findmnt -no FSTYPE /tmp") == "tmpfs"
    # The journal is on the card, bounded (what it keeps across a reboot: below).
    assert run("journalctl --header | grep -m1 '^File path:'").startswith(
        "File path: /var/log/journal/"
    )
    journald = run("systemd-analyze cat-config systemd/journald.conf")
    for setting in ("Storage=persistent", "SystemMaxUse=64M", "SyncIntervalSec=5min"):
        assert f"\n{setting}\n" in f"\n{journald}\n", setting
    assert run("systemctl is-active systemd-timesyncd") == "active"
    assert run("stat -c %a /etc/wpa_supplicant/wpa_supplicant-wlan0.conf") == "600"
    assert run("cat /etc/wpa_supplicant/wpa_supplicant-wlan0.conf") == WIFI.strip()
    # The data partition grew to the end of the bigger card; the store and the journal
    # are on it, the system runs from slot A.
    size = int(run("df -B1 --output=size /data | tail -1"))
    assert size > device.data_bytes + (CARD_EXTRA_MIB - 64) * 1024 * 1024
    assert run("findmnt -no SOURCE /data") == "/dev/vda4"
    for path in ("/var/lib/ledge", "/var/log/journal"):
        assert run(f"findmnt -no SOURCE {path}").startswith("/dev/vda4[/"), path
    assert run("findmnt -no SOURCE /") == "/dev/vda2"
    assert run("ledge-boot-slot current") == "A"
    assert run("ls /data/identity/etc/ssh/ssh_host_ed25519_key.pub")


def test_the_hardware_watchdog_is_armed_and_a_panic_restarts(device: Device) -> None:
    vm, key = device.vm, device.key

    def run(command: str) -> str:
        return vm.ssh(key, command).stdout.strip()

    show = run("systemctl show -p RuntimeWatchdogUSec -p RebootWatchdogUSec -p WatchdogDevice")
    settings = dict(line.split("=", 1) for line in show.splitlines())
    # The default device is the first watchdog: systemd names it /dev/watchdog0, or the
    # kernel's legacy alias /dev/watchdog of the same device when it opened that one
    # (which depends on the systemd point release and on when the driver came up).
    assert settings.pop("WatchdogDevice") in {"/dev/watchdog0", "/dev/watchdog"}
    assert settings == {"RuntimeWatchdogUSec": "15s", "RebootWatchdogUSec": "10min"}
    # systemd has the device open and running with its timeout: a hung kernel or PID 1
    # gets the machine reset.
    assert run("cat /sys/class/watchdog/watchdog0/state") == "active"
    assert run("cat /sys/class/watchdog/watchdog0/timeout") == "15"
    assert "/dev/watchdog0" in run("wdctl /dev/watchdog0")
    assert run("sysctl -n kernel.panic kernel.panic_on_oops").split() == ["10", "1"]


def test_the_firewall_lets_in_only_ssh_and_the_configured_listeners(device: Device) -> None:
    vm, key = device.vm, device.key
    # Something else listens on every interface: it answers on the device itself...
    vm.ssh(key, f"systemd-run --unit=probe python3 -m http.server {PROBE_PORT}")
    wait_for(
        lambda: f":{PROBE_PORT} " in vm.ssh(key, "ss -Hltn").stdout,
        60,
        "the probe server to listen",
    )
    local = vm.ssh(
        key,
        f"python3 -c 'import urllib.request as u; "
        f'print(u.urlopen("http://10.0.2.15:{PROBE_PORT}/", timeout=30).status)\'',
    ).stdout.strip()
    assert local == "200"
    # ...but not from the network.
    with socket.create_connection(("127.0.0.1", vm.port("probe")), 10) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        sock.settimeout(15)
        try:
            answer = sock.recv(64)
        except (TimeoutError, ConnectionResetError):
            answer = b""
    assert answer == b"", f"the probe answered through the firewall: {answer!r}"
    vm.ssh(key, "systemctl stop probe")
    # The gateway's port (from the boot partition's config, not the image's 1883) is
    # open, through the same kind of forward, and it is what the generated rules name.
    assert mqtt_answers(vm.port("mqtt"))
    chain = vm.ssh(key, "nft list chain inet filter ledge").stdout
    assert f"tcp dport {MQTT_PORT} accept" in chain
    assert "dport 1883" not in chain
    assert "policy drop" in vm.ssh(key, "nft list chain inet filter input").stdout


def test_security_updates_are_installed_unattended_without_rebooting(device: Device) -> None:
    vm, key = device.vm, device.key

    def run(command: str) -> str:
        return vm.ssh(key, command).stdout.strip()

    assert run("systemctl is-enabled apt-daily.timer apt-daily-upgrade.timer").split() == [
        "enabled",
        "enabled",
    ]
    assert run("systemctl is-active apt-daily-upgrade.timer") == "active"
    config = run(
        "apt-config dump Unattended-Upgrade::Origins-Pattern "
        "Unattended-Upgrade::Automatic-Reboot APT::Periodic::Unattended-Upgrade "
        "APT::Periodic::Update-Package-Lists"
    )
    patterns = [
        line.split(" ", 1)[1].strip('";')
        for line in config.splitlines()
        if line.startswith("Unattended-Upgrade::Origins-Pattern:: ")
    ]
    assert patterns == ["origin=Debian,codename=${distro_codename}-security,label=Debian-Security"]
    assert 'Unattended-Upgrade::Automatic-Reboot "false";' in config
    assert 'APT::Periodic::Unattended-Upgrade "1";' in config
    assert 'APT::Periodic::Update-Package-Lists "1";' in config
    # unattended-upgrades reads that configuration and would look only at the security
    # suite (its dry run says which origins it allows).
    dry = vm.ssh(key, "unattended-upgrade --dry-run --debug 2>&1 | head -40", timeout=300)
    assert (
        "Allowed origins are: origin=Debian,codename=bookworm-security,label=Debian-Security"
        in (dry.stdout)
    ), dry.stdout


def test_a_hung_gateway_is_restarted_by_the_watchdog(device: Device) -> None:
    vm, key = device.vm, device.key
    timeout = 30  # the unit's WatchdogSec

    def service() -> dict[str, str]:
        out = vm.ssh(
            key,
            "systemctl show -p MainPID -p NRestarts -p ActiveState "
            "-p ActiveEnterTimestampMonotonic ledge; echo Uptime=$(cut -d' ' -f1 /proc/uptime)",
            check=False,
        ).stdout
        return dict(line.split("=", 1) for line in out.split())

    def up_for() -> float:
        now = service()
        return float(now["Uptime"]) - int(now["ActiveEnterTimestampMonotonic"]) / 1e6

    # Fed by the running gateway, the watchdog has not fired: two timeouts have passed
    # (since the second boot, usually) without a restart.
    wait_for(lambda: up_for() > 2 * timeout, 3 * timeout, "two watchdog timeouts of uptime")
    before = service()
    assert before["NRestarts"] == "0" and before["ActiveState"] == "active", before
    pid = before["MainPID"]
    vm.ssh(key, f"kill -STOP {pid}")  # hung: the event loop stops

    def restarted() -> bool:
        now = service()
        return (
            now.get("MainPID") not in (pid, "0", None)
            and now.get("ActiveState") == "active"
            and int(now.get("NRestarts", "0")) >= 1
        )

    wait_for(restarted, 300, "systemd to restart the frozen gateway")
    log = vm.ssh(key, "journalctl -b -u ledge --no-pager").stdout
    assert "Watchdog timeout" in log
    vm.wait_connack("mqtt", 300)


def test_after_a_reboot_the_previous_boots_log_is_kept(device: Device) -> None:
    vm, key = device.vm, device.key
    vm.ssh(key, "systemctl reboot", check=False)
    vm.wait_stopped(300)  # QEMU runs with -no-reboot: a reboot stops it
    vm.start()
    vm.wait_connack("mqtt", BOOT_TIMEOUT)
    wait_for(
        lambda: vm.ssh(key, "true", timeout=60, check=False).returncode == 0,
        BOOT_TIMEOUT,
        "SSH after the reboot",
    )
    # Why the gateway restarted in the boot before (the hung gateway, above).
    before = vm.ssh(key, "journalctl -b -1 -u ledge --no-pager").stdout
    assert "Watchdog timeout" in before
    assert "Started ledge.service" in before or "Started Ledge" in before
    boots = vm.ssh(key, "journalctl --list-boots --no-pager").stdout.strip().splitlines()
    assert len(boots) >= 2


# ---------------------------------------------------------------------- a system update


def test_a_bundle_signed_by_a_key_the_device_does_not_trust_is_refused(
    device: Device, tmp_path: Path
) -> None:
    vm, key = device.vm, device.key
    untrusted = update.small_bundle(tmp_path, *update.new_key(tmp_path, "someone-else"))
    update.push(vm, key, untrusted, "/root/untrusted.raucb")
    done = update.ledge_update(vm, key, "/root/untrusted.raucb")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ledge update: not installed: " in done.stderr
    assert "signature verification failed" in done.stderr
    assert update.slots(vm, key) == ("A", "A", "A")  # nothing switched
    assert vm.proc is not None and vm.proc.poll() is None  # not rebooted


def test_a_signed_update_is_tried_once_and_kept_when_the_gateway_is_healthy(
    device: Device,
) -> None:
    vm, key = device.vm, device.key
    host_key_before = vm.ssh(key, "cat /data/identity/etc/ssh/ssh_host_ed25519_key.pub").stdout
    machine_id = vm.ssh(key, "cat /etc/machine-id").stdout.strip()
    # A message the gateway acknowledged before the update, kept in its store.
    before = Paho(vm.port("mqtt"), "before-update").connect()
    before.publish("plant/update/before", b"kept", qos=1, retain=True)  # waits for PUBACK
    before.disconnect()
    bundle = update.bundle_of(imagebuild.wait(BUILD_TIMEOUT))
    started = time.monotonic()
    update.push(vm, key, bundle, "/data/ledge-update.raucb")
    pushed = time.monotonic()
    done = update.ledge_update(vm, key, "/data/ledge-update.raucb")
    assert done.returncode in (0, 255), done.stdout + done.stderr  # 255: rebooted under SSH
    assert "ledge update: installed into slot B; rebooting to try it" in done.stderr
    installed = time.monotonic()
    update.reboot_into_trial(vm, "mqtt", key, BOOT_TIMEOUT)
    assert vm.choices[-1].config == "tryboot.txt"
    # Kept: the gateway was healthy, so every boot starts slot B from now on.
    wait_for(
        lambda: update.slots(vm, key) == ("B", "B", "B"),
        update.COMMIT_TIMEOUT,
        "slot B committed",
    )
    committed = time.monotonic()
    last = update.last_update(vm, key)
    assert (last["outcome"], last["slot"], last["from"]) == ("committed", "B", "A")
    assert vm.ssh(key, "findmnt -no SOURCE /").stdout.strip() == "/dev/vda3"
    # The device is still itself, with its store and configuration.
    assert vm.ssh(key, "hostname").stdout.strip() == HOSTNAME
    assert vm.ssh(key, "cat /etc/machine-id").stdout.strip() == machine_id
    assert vm.ssh(key, "cat /data/identity/etc/ssh/ssh_host_ed25519_key.pub").stdout == (
        host_key_before
    )
    after = Paho(vm.port("mqtt"), "after-update").connect()
    after.subscribe("plant/update/#", qos=1)
    (message,) = after.wait_messages(1, timeout=30)
    after.disconnect()
    assert (message.topic, message.payload) == ("plant/update/before", b"kept")
    assert message.retain
    imagebuild.REPORT["update: bundle"] = f"{bundle.stat().st_size / 1048576:.0f} MiB"
    imagebuild.REPORT["update: copy, install, boot and commit"] = (
        f"{pushed - started:.0f} s, {installed - pushed:.0f} s, "
        f"{committed - installed:.0f} s under QEMU"
    )


def test_after_power_off_the_card_tells_the_user(device: Device) -> None:
    device.vm.power_off()
    card = device.card
    error = card.boot.read("ledge-config-error.txt")
    assert error is not None and b"listeners[0].port" in error
    _boot, slot_a, slot_b, data = card.partitions()
    assert data["start"] + data["size"] == card.path.stat().st_size  # grown to the end
    assert slot_b["size"] == slot_a["size"]
    # Every boot but the one after the update started what config.txt says.
    assert [c.config for c in device.vm.choices].count("tryboot.txt") == 1
    assert "os_prefix=slot-b/" in (card.boot.read("config.txt") or b"").decode()


# ---------------------------------------------------------------------- a card as flashed


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    """A second card, booted as it comes from the image: nothing on the boot partition."""
    image = imagebuild.wait(BUILD_TIMEOUT)
    work = tmp_path_factory.mktemp("fresh")
    card = SdCard.flash(image, work / "card.img")
    with Vm(card, work, {"mqtt": 1883}) as vm:
        vm.start()
        yield vm


def test_as_flashed_mqtt_is_for_the_user_on_the_boot_partition_only(fresh: Vm) -> None:
    seconds = fresh.wait_connack("mqtt", BOOT_TIMEOUT)
    imagebuild.REPORT["card as flashed: power-on to CONNACK"] = f"{seconds:.1f} s"

    def credentials() -> str:
        return (fresh.card.boot.read("ledge-credentials.txt") or b"").decode()

    text = wait_for(credentials, 120, "ledge-credentials.txt on the boot partition")
    fields = dict(
        line.split()
        for line in text.splitlines()
        if line.startswith("  ") and len(line.split()) == 2
    )
    assert fields["user"] == "ledge"
    password = fields["password"]
    assert len(password) >= 20
    assert f"-u ledge -P '{password}'" in text  # how to use it
    port = fresh.port("mqtt")

    def connack(username: str | None = None, password: bytes | None = None) -> int:
        raw = Raw(port, version=MQTT_311)
        try:
            connect = Connect("fresh", MQTT_311, username=username, password=password)
            raw.send(encode(connect, MQTT_311))
            # Refusals come after the failed-login delay, which doubles with each.
            [answer] = raw.expect(1, within=90)
            assert isinstance(answer, ConnAck), answer
            return answer.reason_code
        finally:
            raw.sock.close()

    assert connack(username="ledge", password=password.encode()) == 0
    assert connack() == 5  # anonymous: not authorized
    assert connack(username="ledge", password=b"not-the-password") == 4  # bad password


# ---------------------------------------------------------------------- the build


@pytest.mark.rebuild
def test_building_again_gives_the_same_image() -> None:
    """The same commit, from the same cached root filesystem: the same bytes (the
    uncompressed image), and the released ``.img.xz`` holds exactly them. The second
    build started in the background when the first was done, with the ``.img.xz``."""
    first = imagebuild.wait(BUILD_TIMEOUT)
    assert first.name.endswith(".img"), f"{first}: the run's build keeps the .img"
    again, xz = imagebuild.wait_again(BUILD_TIMEOUT)
    assert again.name == first.name
    log = imagebuild.AGAIN.log.read_text()
    assert "reusing the cached root filesystem" in log
    first_sum = (first.parent / f"{first.name}.sha256").read_text().split()[0]
    again_sum = (again.parent / f"{again.name}.sha256").read_text().split()[0]
    if first_sum != again_sum:
        raise AssertionError(f"the two builds differ:\n{_differences(first, again)}")
    # What a user downloads: its sha256 file matches, and it decompresses to that image.
    with xz.open("rb") as packed:
        assert (xz.parent / f"{xz.name}.sha256").read_text().split()[0] == sha256_hex(packed)
    with read_image(xz) as unpacked:
        assert sha256_hex(unpacked) == first_sum, f"{xz} does not hold {first.name}"
    imagebuild.REPORT["second build (same commit, with xz)"] = log.strip().splitlines()[-1]


def _differences(a: Path, b: Path) -> str:
    """Where two images differ: the first differing byte offsets (cmp -l)."""
    cmp = subprocess.run(
        ["cmp", "-l", str(a), str(b)], capture_output=True, text=True, check=False, timeout=300
    )
    lines = cmp.stdout.splitlines()
    return f"{len(lines)} bytes differ; first: " + ", ".join(
        hex(int(line.split()[0]) - 1) for line in lines[:20]
    )
