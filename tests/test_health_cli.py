"""``ledge health`` against a running gateway: healthy when every listener answers a
CONNECT, the bridge to a real Mosquitto is connected and the serial sensor (a pty) was
heard within its interval; each failure named; ``--wait`` until it comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import REPO, LedgeProcess, MosquittoProcess, free_port
from tests.support.wait import wait_for
from tests.test_serial import FakeDevice


def ledge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def verdict(config: Path, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """The exit code and the checks of ``ledge health --json``, by name."""
    out = ledge("health", "-c", str(config), "--json", *args)
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    assert doc["healthy"] == (out.returncode == 0)
    return out.returncode, {c["name"]: c for c in doc["checks"]}


Checks = dict[str, dict[str, Any]]


def wait_verdict(
    config: Path, want: Callable[[int, Checks], bool], what: str
) -> tuple[int, Checks]:
    """Run ``ledge health --json`` until its verdict is what is wanted (with a deadline)."""

    def attempt() -> tuple[int, Checks] | None:
        code, checks = verdict(config)
        return (code, checks) if want(code, checks) else None

    got = wait_for(attempt, 20, what)
    assert got is not None
    return got


@pytest.fixture
def device(tmp_path: Path) -> Iterator[FakeDevice]:
    d = FakeDevice(tmp_path / "serial-by-id-usb-sensor")
    yield d
    d.close()


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[MosquittoProcess]:
    proc = MosquittoProcess(tmp_path).start()
    yield proc
    proc.stop()


def write_config(
    tmp_path: Path,
    device: FakeDevice,
    cloud_port: int,
    heard_within: float = 30,
    websocket_first: bool = False,
) -> tuple[Path, dict[str, int]]:
    ports = {"tcp": free_port(), "websocket": free_port(), "mqttsn": free_port()}
    config = tmp_path / "ledge.toml"
    listeners = [
        f'[[listeners]]\nhost = "127.0.0.1"\nport = {ports["tcp"]}\n',
        f'[[listeners]]\nhost = "127.0.0.1"\nport = {ports["websocket"]}\ntype = "websocket"\n',
    ]
    config.write_text(
        "[broker]\nsys_interval = 0.2\n"
        '[gateway]\nid = "gw1"\n'
        + "".join(reversed(listeners) if websocket_first else listeners)
        + f'[[serial]]\nname = "env"\npath = "{device.link}"\nprotocol = "kv"\n'
        f"heard_within = {heard_within}\n"
        f'[[bridges]]\nname = "cloud"\naddress = "127.0.0.1:{cloud_port}"\n'
        "reconnect_min = 0.05\nreconnect_max = 0.5\n"
        '[[bridges.rules]]\nfilter = "ledge/#"\n'
        f'[[mqttsn.udp]]\nhost = "127.0.0.1"\nport = {ports["mqttsn"]}\n'
    )
    return config, ports


def start(config: Path) -> LedgeProcess:
    proc = LedgeProcess(config=config, listen=False).start(listeners=2)
    proc.wait_log("bridge cloud: connected to")
    proc.wait_log("connected at")  # the serial port
    return proc


def test_healthy_then_the_bridge_down_is_named_and_wait_sees_it_back(
    tmp_path: Path, device: FakeDevice, cloud: MosquittoProcess
) -> None:
    config, ports = write_config(tmp_path, device, cloud.port)
    proc = start(config)
    try:
        device.send(b"temp=21.5\n")
        _, checks = wait_verdict(config, lambda code, _: code == 0, "a healthy verdict")
        assert set(checks) == {
            f"listener 127.0.0.1:{ports['tcp']}",
            f"listener 127.0.0.1:{ports['websocket']}",
            "bridge cloud",
            "serial env",
            f"mqttsn 127.0.0.1:{ports['mqttsn']}",
        }
        assert "WebSocket" in checks[f"listener 127.0.0.1:{ports['websocket']}"]["detail"]
        assert checks["serial env"]["detail"].startswith("heard ")
        text = ledge("health", "-c", str(config))
        assert text.returncode == 0, text.stdout + text.stderr
        assert text.stdout.splitlines()[-1] == "healthy (5 of 5 checks pass)"

        cloud.stop()  # the uplink drops
        proc.wait_log("bridge cloud: lost 127.0.0.1")
        down = ledge("health", "-c", str(config))
        assert down.returncode == 1
        failed = [line for line in down.stdout.splitlines() if line.startswith("FAILED")]
        assert len(failed) == 1 and failed[0].startswith("FAILED bridge cloud: "), down.stdout
        assert "not connected" in failed[0]

        waiting = subprocess.Popen(
            [sys.executable, "-m", "gateway", "health", "-c", str(config), "--wait", "60"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert waiting.stderr is not None
            progress = waiting.stderr.readline()  # it is waiting: the bridge is still down
            assert "not healthy after" in progress and "bridge cloud" in progress
            cloud.start(cloud.port)  # the cloud comes back on its port
            out, _ = waiting.communicate(timeout=60)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()
        assert waiting.returncode == 0, out
        assert "ok     bridge cloud: connected" in out
    finally:
        assert proc.stop() == 0


def test_sys_is_read_over_the_plain_tcp_listener_whichever_comes_first(
    tmp_path: Path, device: FakeDevice, cloud: MosquittoProcess
) -> None:
    """The bridge's and the sensors' checks come from ``$SYS``, read over a plain TCP
    listener: a WebSocket listener listed before it is passed over, not the end."""
    config, _ = write_config(tmp_path, device, cloud.port, websocket_first=True)
    proc = start(config)
    try:
        device.send(b"temp=21.5\n")
        _, checks = wait_verdict(config, lambda code, _: code == 0, "a healthy verdict")
        assert checks["bridge cloud"]["ok"] and checks["serial env"]["ok"]
    finally:
        assert proc.stop() == 0


def test_a_sensor_silent_past_its_interval_is_named(
    tmp_path: Path, device: FakeDevice, cloud: MosquittoProcess
) -> None:
    config, _ = write_config(tmp_path, device, cloud.port, heard_within=3)
    proc = start(config)
    try:
        # Never heard: failing once the interval has passed since the start.
        _, checks = wait_verdict(config, lambda code, _: code == 1, "the silent sensor")
        assert [n for n, c in checks.items() if not c["ok"]] == ["serial env"]
        assert "not heard since the gateway started" in checks["serial env"]["detail"]
        assert "(serial[0].heard_within 3 s)" in checks["serial env"]["detail"]

        # --wait keeps checking until the device speaks.
        waiting = subprocess.Popen(
            [sys.executable, "-m", "gateway", "health", "-c", str(config), "--wait", "60"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert waiting.stderr is not None
            progress = waiting.stderr.readline()
            assert "not healthy after" in progress and "(serial env)" in progress
            device.send(b"temp=21.5\n")
            out, _ = waiting.communicate(timeout=60)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()
        assert waiting.returncode == 0, out
        assert "ok     serial env: heard " in out

        # Heard, then silent again: now for how long since it was heard.
        _, checks = wait_verdict(config, lambda code, _: code == 1, "the sensor silent again")
        assert checks["serial env"]["detail"].startswith("silent for ")

        device.unplug()
        code, checks = wait_for(
            lambda: (got := verdict(config))[1]["serial env"]["detail"] == "port not open" and got,
            20,
            "the port closed",
        )
        assert code == 1
    finally:
        assert proc.stop() == 0


def test_nothing_listening_names_the_port(tmp_path: Path, device: FakeDevice) -> None:
    config, ports = write_config(tmp_path, device, free_port())
    out = ledge("health", "-c", str(config))
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert f"FAILED listener 127.0.0.1:{ports['tcp']}: no CONNACK from 127.0.0.1:" in out.stdout
    assert any("nothing listens" in line and str(ports["tcp"]) in line for line in lines)
    # With nothing to read them from, the bridge and the sensor are not known either.
    assert any(line.startswith("FAILED bridge cloud: state unknown") for line in lines)
    assert (
        f"FAILED mqttsn 127.0.0.1:{ports['mqttsn']}: no GWINFO for a SEARCHGW: nothing listens"
        in lines
    )
    assert lines[-1] == "NOT healthy (0 of 5 checks pass)"


def test_wait_gives_up_after_the_configured_timeout(tmp_path: Path, device: FakeDevice) -> None:
    config, _ = write_config(tmp_path, device, free_port())
    config.write_text(config.read_text() + "[health]\ntimeout = 1.5\n")
    out = ledge("health", "-c", str(config), "--wait", "--json")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["healthy"] is False and 1.5 <= doc["elapsed_seconds"] < 30
    assert "not healthy after" in out.stderr


def test_a_refused_login_still_proves_the_listener_serves(
    tmp_path: Path, device: FakeDevice, cloud: MosquittoProcess
) -> None:
    config, ports = write_config(tmp_path, device, cloud.port)
    passwords = tmp_path / "passwd"
    made = ledge("passwd", "-c", "-b", str(passwords), "ops", "s3cret-health")
    assert made.returncode == 0, made.stderr
    passwords.chmod(0o600)
    config.write_text(
        config.read_text() + f'[auth]\nallow_anonymous = false\npassword_file = "{passwords}"\n'
    )
    proc = start(config)
    try:
        device.send(b"temp=21.5\n")
        code, checks = verdict(config)
        assert code == 1
        tcp = checks[f"listener 127.0.0.1:{ports['tcp']}"]
        assert tcp["ok"] and "login refused, so it serves" in tcp["detail"]
        assert "LEDGE_HEALTH_USERNAME" in checks["bridge cloud"]["detail"]
        env = {
            **os.environ,
            "LEDGE_HEALTH_USERNAME": "ops",
            "LEDGE_HEALTH_PASSWORD": "s3cret-health",
        }
        out = ledge("health", "-c", str(config), "--wait", "30", env=env)
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        assert proc.stop() == 0


def test_a_config_that_cannot_be_used_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[health]\ntimeout = 0\n")
    out = ledge("health", "-c", str(config))
    assert out.returncode == 2
    assert "health.timeout" in out.stderr


def test_an_mqttsn_transport_that_answers_wrongly_or_not_at_all_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe's SEARCHGW to a socket of the test's: silence, garbage then silence,
    or another gateway's GWINFO; each a failed fact with its reason, never a crash."""
    import socket
    import threading

    from gateway.cli import health
    from gateway.mqttsn.encoding import encode
    from gateway.mqttsn.packets import GwInfo
    from gateway.mqttsn.settings import UdpSettings

    monkeypatch.setattr(health, "PROBE_TIMEOUT", 0.5)
    for answers, reason in (
        ([], "timed out"),
        ([b"\x00garbage"], "timed out"),
        ([encode(GwInfo(7))], "GWINFO from gateway 7"),
    ):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as fake:
            fake.bind(("127.0.0.1", 0))
            fake.settimeout(5)

            def answer(fake: socket.socket = fake, answers: list[bytes] = answers) -> None:
                _, peer = fake.recvfrom(64)  # the SEARCHGW
                for data in answers:
                    fake.sendto(data, peer)

            thread = threading.Thread(target=answer, daemon=True)
            thread.start()
            fact = health.probe_mqttsn(UdpSettings(port=fake.getsockname()[1]), 1)
            thread.join(5)
        assert (fact.answered, fact.error) == (False, reason)
