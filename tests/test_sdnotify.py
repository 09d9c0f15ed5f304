"""The systemd notify protocol: Ledge tells the service manager when it is ready, feeds
its watchdog, and says when it reloads and stops -- checked on a real AF_UNIX datagram
socket standing where systemd's would be, with ``ledge run`` as systemd would start it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app.sdnotify import Notifier
from tests.support.procs import REPO, LedgeProcess, port_open
from tests.support.wait import wait_for


class ManagerSocket:
    """The service manager's side: a bound AF_UNIX datagram socket, recording messages
    with the time they arrived."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.05)
        self.messages: list[tuple[float, dict[str, str]]] = []

    def poll(self) -> list[tuple[float, dict[str, str]]]:
        while True:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                return self.messages
            fields = dict(line.split("=", 1) for line in data.decode().split("\n"))
            self.messages.append((time.monotonic(), fields))

    def wait(self, key: str, value: str = "1", after: int = 0, timeout: float = 15.0) -> int:
        """Index of the first message from ``after`` on with ``key=value``."""

        def found() -> int:
            for i, (_, fields) in enumerate(self.poll()[after:], after):
                if fields.get(key) == value:
                    return i + 1  # truthy even for the first message
            return 0

        return wait_for(found, timeout, f"{key}={value} on the notify socket") - 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ManagerSocket]:
    m = ManagerSocket(str(tmp_path / "notify"))
    yield m
    m.close()


# ---------------------------------------------------------------------- the protocol


def test_environment_names_the_socket_and_the_watchdog_and_is_consumed() -> None:
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000", "HOME": "/"}
    notifier = Notifier.from_environ(env)
    assert notifier is not None
    assert notifier.address == "/run/systemd/notify"
    assert notifier.watchdog_interval == 15.0  # half the timeout, as sd_watchdog_enabled(3) advises
    # Removed, so the reload's validator (a child process) does not inherit them.
    assert env == {"HOME": "/"}
    notifier.close()


def test_abstract_socket_and_foreign_watchdog_pid() -> None:
    env = {"NOTIFY_SOCKET": "@ledge-test", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}
    notifier = Notifier.from_environ(env)
    assert notifier is not None
    assert notifier.address == "\0ledge-test"
    assert notifier.watchdog_interval == 0  # the watchdog is meant for another process
    notifier.close()


def test_no_or_unusable_socket_means_no_notifier() -> None:
    assert Notifier.from_environ({}) is None
    assert Notifier.from_environ({"NOTIFY_SOCKET": "relative/path"}) is None


@pytest.mark.parametrize("address", ["path", "@abstract"])
def test_messages_arrive_as_newline_separated_assignments(tmp_path: Path, address: str) -> None:
    where = str(tmp_path / "notify") if address == "path" else f"@ledge-test-{os.getpid()}"
    manager = ManagerSocket(where)
    notifier = Notifier(where, 2_000_000)
    try:
        assert notifier.ready("serving MQTT on 127.0.0.1:1883")
        assert notifier.watchdog()
        assert notifier.reloading()
        assert notifier.stopping()
        manager.wait("STOPPING")
        assert [fields for _, fields in manager.messages] == [
            {"READY": "1", "STATUS": "serving MQTT on 127.0.0.1:1883"},
            {"WATCHDOG": "1"},
            {"RELOADING": "1", "STATUS": "reloading the configuration"},
            {"STOPPING": "1", "STATUS": "shutting down"},
        ]
    finally:
        notifier.close()
        manager.close()


def test_a_vanished_manager_is_reported_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier(str(tmp_path / "gone"))
    assert not notifier.watchdog()
    assert not notifier.watchdog()
    warnings = [r for r in caplog.records if "cannot notify the service manager" in r.message]
    assert len(warnings) == 1  # once, not per keep-alive
    notifier.close()


# ---------------------------------------------------------------------- the gateway


def test_ledge_run_is_ready_only_when_serving_and_feeds_the_watchdog(
    manager: ManagerSocket, tmp_path: Path
) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text("[log]\nlevel = 'info'\n")
    proc = LedgeProcess(
        config=config,
        env={"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "400000"},
    )
    proc.start()
    try:
        ready = manager.wait("READY")
        _, fields = manager.messages[ready]
        assert fields["STATUS"] == f"serving MQTT on 127.0.0.1:{proc.port}"
        assert port_open(proc.port)
        # No keep-alive before READY; then one every WATCHDOG_USEC / 2 (0.2 s).
        assert not any("WATCHDOG" in f for _, f in manager.messages[:ready])
        first = manager.wait("WATCHDOG", after=ready)
        start = manager.messages[first][0]
        wait_for(lambda: manager.poll()[-1][0] - start >= 1.6, 10, "1.6 s of keep-alives")
        pings = [t for t, f in manager.messages[first:] if "WATCHDOG" in f]
        span = pings[-1] - pings[0]
        rate = (len(pings) - 1) / span
        assert 2.5 <= rate <= 7.5, f"{len(pings)} keep-alives in {span:.2f} s"

        # SIGHUP: RELOADING=1, then READY=1 when the new config is in force.
        proc.signal(signal.SIGHUP)
        reloading = manager.wait("RELOADING", after=first)
        manager.wait("READY", after=reloading)
        proc.wait_log("config reloaded")

        # SIGTERM: STOPPING=1 first, then a clean exit.
        proc.signal(signal.SIGTERM)
        manager.wait("STOPPING", after=reloading)
        assert proc.stop() == 0
    finally:
        proc.stop()


def test_watchdog_meant_for_another_process_gets_no_keepalives(
    manager: ManagerSocket,
) -> None:
    proc = LedgeProcess(
        env={"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}
    )
    proc.start()
    try:
        ready = manager.wait("READY")
        # With keep-alives due every 0.1 s, a second holds about ten.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            manager.poll()
        assert not any("WATCHDOG" in f for _, f in manager.messages[ready:])
    finally:
        proc.stop()


PROBE = """
import asyncio, sys
from gateway.app.root import run
from gateway.app.runtime import RuntimeConfig

def ready(gateway):
    print("gateway.app.sdnotify" in sys.modules, flush=True)
    gateway.stop()

sys.exit(asyncio.run(run(RuntimeConfig.from_json(sys.stdin.read()), ready)))
"""


@pytest.mark.parametrize("under_systemd", [False, True])
def test_the_notify_module_is_loaded_only_under_a_service_manager(
    tmp_path: Path, under_systemd: bool
) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text("")
    check = ["check-config", str(config), "--print-runtime", "--listen", "127.0.0.1:0"]
    runtime = subprocess.run(
        [sys.executable, "-m", "gateway", *check],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    if under_systemd:
        env["NOTIFY_SOCKET"] = str(tmp_path / "notify")
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        check=False,
        input=runtime,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == str(under_systemd)
