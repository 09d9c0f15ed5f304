"""Real processes for tests: Ledge (``python -m gateway run``) and Debian's Mosquitto.

Both listen on a free loopback port and are stopped by the fixtures that start
them; every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"listening on ([0-9.]+):(\d+)")


#: Ports handed out by ``free_port``: below the kernel's ephemeral range (32768 up),
#: so no outgoing connection takes one, and a slice of its own per test worker
#: (pytest-xdist's gw0, gw1 ...), so two workers never hand out the same port.
_PORT_SLICE = 2000
_PORT_BASE = 12000 + _PORT_SLICE * int(os.environ.get("PYTEST_XDIST_WORKER", "gw-1")[2:])
_next_port = [0]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now, from this worker's slice."""
    for _ in range(_PORT_SLICE):
        port = _PORT_BASE + _PORT_SLICE + _next_port[0] % _PORT_SLICE
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or still in TIME_WAIT
            return port
    raise RuntimeError(f"no free port in {_PORT_BASE + _PORT_SLICE}+{_PORT_SLICE}")


@contextlib.contextmanager
def dead_port() -> Iterator[int]:
    """A port that refuses connections for as long as the block runs: bound, never
    listening, so no other process can start listening there meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
        yield s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class LedgeProcess:
    """``ledge run`` as a subprocess on a free loopback port; its log is kept.

    With ``listen=False`` the config's own listeners are used (give them port 0):
    ``ports`` lists their ports in the order they were opened."""

    def __init__(
        self,
        *args: str,
        config: Path | None = None,
        port: int = 0,
        listen: bool = True,
        env: dict[str, str] | None = None,
        open_files: tuple[int, int] | None = None,
        tracebacks: bool = False,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        cmd = [sys.executable, "-m", "gateway", "run"]
        if listen:
            cmd += ["--listen", f"127.0.0.1:{port}"]
        if config is not None:
            cmd += ["--config", str(config)]
        cmd += list(args)
        #: A command that execs the gateway in its place (same process id).
        self.cmd = [*wrapper, *cmd]
        self.env = env or {}
        self.lines: list[str] = []
        self.port = 0
        self.ports: list[int] = []
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._terminated = False
        #: A test that makes the gateway log a traceback on purpose (a tap that raises)
        #: says so; any other traceback fails ``stop``.
        self.tracebacks = tracebacks
        if open_files is not None:
            # util-linux's prlimit (Essential in Debian) sets the (soft, hard) open-file
            # limit, then execs the gateway in its place.
            soft, hard = open_files
            self.cmd = ["prlimit", f"--nofile={soft}:{hard}", "--", *self.cmd]

    def start(self, timeout: float = 15.0, listeners: int = 1) -> LedgeProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

        def bound() -> list[int]:
            ports = [int(m.group(2)) for m in map(_LISTENING.search, list(self.lines)) if m]
            if len(ports) >= listeners:
                return ports
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"ledge exited early:\n{self.log}")
            return []

        self.ports = wait_for(bound, timeout, "ledge to listen")
        self.port = self.ports[0]
        return self

    @property
    def rss_kib(self) -> int:
        """The gateway process's resident memory now."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_log(self, pattern: str, timeout: float = 5.0) -> str:
        rx = re.compile(pattern)

        def found() -> str:
            for line in list(self.lines):
                if rx.search(line):
                    return line
            return ""

        return wait_for(found, timeout, f"log line matching {pattern!r}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        if sig == signal.SIGTERM:
            self._terminated = True
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to write anything more."""
        proc = self.proc
        assert proc is not None
        proc.kill()
        proc.wait(10)
        if self._reader is not None:
            self._reader.join(5)
        if proc.stderr is not None:
            proc.stderr.close()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (unless already sent), then wait; returns the exit code. Fails when
        the gateway logged a traceback (unless the test expects one)."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            if not self._terminated:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                raise AssertionError(f"ledge did not stop on SIGTERM:\n{self.log}") from None
        if self._reader is not None:
            self._reader.join(5)
        if proc.stderr is not None:
            proc.stderr.close()
        if not self.tracebacks:
            assert "Traceback" not in self.log, f"a traceback in ledge's log:\n{self.log}"
        return proc.returncode


class MosquittoProcess:
    """Debian's mosquitto on a free loopback port, anonymous access allowed."""

    def __init__(
        self, workdir: Path, extra_config: str = "", open_files: tuple[int, int] | None = None
    ) -> None:
        self.workdir = workdir
        self.extra_config = extra_config
        #: (soft, hard) open-file limit to start with (prlimit), None: this process's.
        self.open_files = open_files
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("mosquitto") is not None or Path("/usr/sbin/mosquitto").exists()

    @classmethod
    def require(cls) -> None:
        """Fail loudly without Debian's mosquitto: the tests that need it are never
        skipped, so a machine without it cannot pass them by not running them."""
        if not cls.available():
            raise AssertionError(
                "Debian's mosquitto is not installed: run scripts/setup --test "
                "(apt-get install mosquitto mosquitto-clients)"
            )

    def start(self, port: int | None = None, timeout: float = 10.0) -> MosquittoProcess:
        self.require()
        self.port = port or free_port()
        conf = self.workdir / f"mosquitto-{self.port}.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence false\n{self.extra_config}\n"
        )
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        cmd = [binary, "-c", str(conf)]
        if self.open_files is not None:
            cmd = ["prlimit", f"--nofile={self.open_files[0]}:{self.open_files[1]}", "--", *cmd]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: port_open(self.port), timeout, "mosquitto to listen")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
