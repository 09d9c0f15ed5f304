"""The firmware bridge's MicroPython client on the real MicroPython (WebAssembly port).

``MicroPythonDevice`` runs ``firmware-bridge/wasm/agent.py`` with the client library
(``firmware-bridge/micropython/``) under node (``firmware-bridge/wasm/run.mjs``). Its
UDP socket is a real one (node's dgram) and its UART a real pseudo-terminal (the
master's file descriptor is handed to node). The test sends commands; the device
answers with JSON lines. ``scripts/setup --test`` installs node's package (npm ci).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from tests.support.procs import REPO
from tests.support.wait import wait_for

BRIDGE = REPO / "firmware-bridge"
WASM = BRIDGE / "wasm"
LIBRARY = BRIDGE / "micropython"
RUNTIME = WASM / "node_modules" / "@micropython" / "micropython-webassembly-pyscript"


def available() -> bool:
    return shutil.which("node") is not None and (RUNTIME / "micropython.wasm").exists()


def run_script(script: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one script on MicroPython with the library importable; returns the process."""
    return subprocess.run(
        [
            "node",
            str(WASM / "run.mjs"),
            "--lib",
            str(LIBRARY),
            "--lib",
            str(WASM),
            *args,
            str(script),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class MicroPythonDevice:
    """One device running the client library, driven line by line."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        udp_port: int | None = None,
        pty_fd: int | None = None,
        drop_in: tuple[str, ...] = (),
    ) -> None:
        cmd = ["node", "--expose-gc", str(WASM / "run.mjs"), "--lib", str(LIBRARY)]
        cmd += ["--lib", str(WASM), "--config", json.dumps(config)]
        if udp_port is not None:
            cmd += ["--udp", f"127.0.0.1:{udp_port}"]
        if pty_fd is not None:
            cmd += ["--pty-fd", str(pty_fd)]
        for rule in drop_in:
            cmd += ["--drop-in", rule]
        cmd.append(str(WASM / "agent.py"))
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(pty_fd,) if pty_fd is not None else (),
        )
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._read_events, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()
        self.ready = self.wait_event("ready", timeout=30)

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.strip()
            if line.startswith("{"):
                self.events.append(json.loads(line))
            elif line:
                self.stderr.append(line)  # the library's own prints

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.stderr)

    def wait_event(self, kind: str, timeout: float = 10.0, after: int = 0) -> dict[str, Any]:
        def found() -> dict[str, Any]:
            for event in self.events[after:]:
                if event["event"] == kind:
                    return event
            if self.proc.poll() is not None:
                raise AssertionError(f"the device exited:\n{self.log}")
            return {}

        event: dict[str, Any] = wait_for(found, timeout, f"device event {kind!r}")
        return event

    def call(self, line: str, timeout: float = 15.0) -> dict[str, Any]:
        """Run one command; fails on its error event."""
        cmd = line.split(" ", 1)[0]
        start = len(self.events)
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

        def done() -> dict[str, Any]:
            for event in self.events[start:]:
                if event["event"] in ("ok", "error") and event.get("cmd") == cmd:
                    return event
            if self.proc.poll() is not None:
                raise AssertionError(f"the device exited:\n{self.log}")
            return {}

        event: dict[str, Any] = wait_for(done, timeout, f"device command {line!r}")
        assert event["event"] == "ok", f"{line}: {event.get('error')}\n{self.log}"
        return event

    def stats(self) -> dict[str, Any]:
        start = len(self.events)
        self.call("stats")
        return self.wait_event("stats", after=start)

    def messages(self) -> list[tuple[str, str]]:
        return [(e["topic"], e["payload"]) for e in self.events if e["event"] == "message"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("exit", timeout=5)
                self.proc.wait(5)
            except (AssertionError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
