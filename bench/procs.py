"""Processes of a benchmark run: brokers (pinned to one core), load generators, samplers.

Every process started here is registered and killed by :func:`kill_all`, which
the command line calls on every exit path (including Ctrl-C). Every wait has a
deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, NamedTuple

REPO = Path(__file__).resolve().parents[1]
BROKER_CPU = 0
LOADGEN_CPU = 1
#: Open-file limit the brokers are started with.
BROKER_NOFILE = 20_000

_registry: list[subprocess.Popen[Any]] = []
_registry_lock = threading.Lock()


class BenchError(RuntimeError):
    """A run could not be completed; the message says why."""


def _register(proc: subprocess.Popen[Any]) -> None:
    with _registry_lock:
        _registry.append(proc)


def _stop(proc: subprocess.Popen[Any], grace: float) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
        except ProcessLookupError:
            pass


def kill_all() -> None:
    """Stop every process this module started that is still running."""
    with _registry_lock:
        procs = list(_registry)
        _registry.clear()
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


#: The Ledge brokers and the checkout whose ``gateway`` each runs, with this environment's
#: Python and packages: "ledge" runs this repository or ``--ledge-checkout``, "base" another
#: commit's worktree (``--base``), so that two commits run in the same rounds.
LEDGE_CHECKOUTS: dict[str, Path] = {"ledge": REPO}
LEDGE_KINDS = ("ledge", "base")


class LedgeKind(NamedTuple):
    """What a Ledge kind string asks for (see :func:`ledge_kind`)."""

    #: "ledge" or "base": which checkout it runs from.
    broker: str
    #: "" (everything in memory), "process" or "power".
    durability: str = ""
    #: "": the checkout's default ``store.commit_interval``; else that many seconds.
    commit_interval: str = ""


def ledge_kind(kind: str) -> LedgeKind | None:
    """What a Ledge kind runs with, None for any other broker.

    "ledge" and "base" keep everything in memory; a ``-process`` or ``-power`` suffix
    ("ledge-power", "base-process") runs that broker with a store and that durability,
    on the checkout's default ``store.commit_interval``; a further ``-SECONDS``
    ("ledge-power-0") sets ``store.commit_interval`` to that (0: commit as soon as
    possible).
    """
    name, _, rest = kind.partition("-")
    if name not in LEDGE_KINDS:
        return None
    durability, _, interval = rest.partition("-")
    if interval and not (durability and re.fullmatch(r"[0-9]+(\.[0-9]+)?", interval)):
        raise BenchError(f"{kind}: a commit interval is seconds after a durability")
    return LedgeKind(name, durability, interval)


def checkout(kind: str) -> Path:
    """The directory a broker of ``kind`` runs from (its ``gateway`` package for Ledge)."""
    ledge = ledge_kind(kind)
    if ledge is None:
        return REPO
    try:
        return LEDGE_CHECKOUTS[ledge.broker]
    except KeyError:
        raise BenchError(f"no checkout for the {ledge.broker!r} broker (--base DIR)") from None


#: ``store.commit_interval`` in a checkout's ``gateway/store/settings.py``, and its default.
_COMMIT_INTERVAL = re.compile(r"^\s*commit_interval\s*:")
_COMMIT_INTERVAL_DEFAULT = re.compile(r"^\s*commit_interval\s*:[^=\n]*=\s*option\(\s*([0-9.]+)")


def default_commit_interval(kind: str) -> float | None:
    """The default ``store.commit_interval`` (seconds) of the checkout a Ledge ``kind``
    runs from, read from its ``gateway/store/settings.py``.

    None when the checkout has no such option: a commit from before group commit
    (9566388, e.g. abe84bf), which commits every change as soon as it can and refuses
    ``commit_interval`` in its config as an unknown option.
    """
    path = checkout(kind) / "gateway" / "store" / "settings.py"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        if _COMMIT_INTERVAL.match(line):
            found = _COMMIT_INTERVAL_DEFAULT.match(line)
            if found is None:
                raise BenchError(
                    f"{path}: cannot read the default of commit_interval from {line.strip()!r}"
                    " (bench/procs.py expects 'commit_interval: float = option(SECONDS, ...')"
                )
            return float(found.group(1))
    return None


def child_env(root: Path = REPO) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return env


# ---------------------------------------------------------------- pinning


class Pinning:
    """Where brokers and load generators run; no pinning below two cores."""

    def __init__(self) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        self.enabled = len(cpus) >= 2 and shutil.which("taskset") is not None
        self.broker_cpu = cpus[0] if self.enabled else None
        self.loadgen_cpu = cpus[1] if self.enabled else None
        self.note = ""
        if len(cpus) < 2:
            self.note = (
                f"only {len(cpus)} core available: brokers and load generators are not pinned "
                "and share the CPU, so figures are lower and noisier"
            )
        elif not self.enabled:
            self.note = "taskset not found: processes are not pinned"

    def pin_self(self) -> None:
        if self.loadgen_cpu is not None:
            os.sched_setaffinity(0, {self.loadgen_cpu})

    def broker_prefix(self, nofile: int) -> list[str]:
        prefix: list[str] = []
        if shutil.which("prlimit"):
            prefix += ["prlimit", f"--nofile={nofile}:{nofile}"]
        if self.broker_cpu is not None:
            prefix += ["taskset", "-c", str(self.broker_cpu)]
        return prefix


def raise_nofile(target: int) -> tuple[int, str]:
    """Raise this process's open-file limit (inherited by children); returns (limit, note)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want_hard = hard if hard == resource.RLIM_INFINITY or hard >= target else target
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, want_hard))
        return target, ""
    except (ValueError, OSError):
        limit = hard if hard != resource.RLIM_INFINITY else target
        if soft < limit:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        return limit, (
            f"the open-file limit could not be raised to {target} (hard limit {hard}); brokers "
            f"and load generators run with {limit}, so the idle-connections scenario may fail: "
            f"run as root or raise the hard limit (ulimit -Hn {target})"
        )


# ---------------------------------------------------------------- /proc readings


def write_bytes(pid: int) -> int | None:
    """Bytes the process caused to be written to storage (``/proc/PID/io``)."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def core_times() -> dict[int, tuple[int, int]]:
    """Per core: (busy jiffies, total jiffies) from /proc/stat."""
    out: dict[int, tuple[int, int]] = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *vals = line.split()
                nums = [int(v) for v in vals]
                idle = nums[3] + (nums[4] if len(nums) > 4 else 0)
                out[int(name[3:])] = (sum(nums) - idle, sum(nums))
    return out


def core_busy(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]) -> dict[int, float]:
    busy: dict[int, float] = {}
    for cpu, (b_busy, b_total) in b.items():
        if cpu in a:
            total = b_total - a[cpu][1]
            busy[cpu] = (b_busy - a[cpu][0]) / total if total > 0 else 0.0
    return busy


class RssSampler:
    """Samples a process's VmRSS every 50 ms in a thread; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def _sample(self) -> None:
        rss = rss_kib(self.pid)
        if rss is not None and rss > self.peak:
            self.peak = rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(2.0)
        self._sample()
        return self.peak


# ---------------------------------------------------------------- brokers


#: The largest value a Ledge queue limit takes (no limit, in effect).
INT31 = 2**31 - 1


class Broker:
    """One broker process on a fresh loopback port."""

    def __init__(
        self,
        kind: str,
        workdir: Path,
        label: str,
        extra_config: str = "",
        broker_options: str = "",
        unbounded_queues: bool = False,
    ) -> None:
        self.kind = kind
        self.workdir = workdir
        self.label = label
        #: TOML appended to a Ledge broker's config (e.g. ``[[serial]]`` devices) ...
        self.extra_config = extra_config
        #: ... and lines for its [broker] table.
        self.broker_options = broker_options
        #: No limit on a session's queue (both brokers drop new messages for a session
        #: whose queue is full, by design): for the QoS 1 scenarios, where a subscriber
        #: slowed by a busy machine would otherwise see drops that are the queue's
        #: policy, not a loss, and the figure counts every acknowledged message.
        self.unbounded_queues = unbounded_queues
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{label}.log"
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self, max_connections: int, default_config: bool) -> list[str]:
        port = self.port
        ledge = ledge_kind(self.kind)
        if ledge is not None:
            # Whichever checkout it runs from (see checkout()), every Ledge kind gets the
            # same command line and config; with a durability, a store under a fresh data
            # directory.
            durability = ledge.durability
            cmd = [sys.executable, "-m", "gateway", "run", "--listen", f"127.0.0.1:{port}"]
            if not default_config:
                conf = self.workdir / f"{self.label}.toml"
                text = f"[broker]\nmax_connections = {max(1024, max_connections)}\n"
                text += self.broker_options
                if self.unbounded_queues:
                    text += f"max_queued_messages = {INT31}\nmax_queued_bytes = {INT31}\n"
                if durability:
                    text += f'[store]\ndurability = "{durability}"\n'
                    text += self._commit_interval(ledge.commit_interval)
                    cmd += ["--data-dir", str(self.workdir / f"{self.label}-data")]
                conf.write_text(text + self.extra_config)
                cmd += ["--config", str(conf)]
            return [*cmd, "--log-level", "warning"]
        if self.kind == "mosquitto":
            conf = self.workdir / f"{self.label}.conf"
            conf.write_text(
                f"listener {port} 127.0.0.1\n"
                "allow_anonymous true\n"
                "persistence false\n"
                "max_connections -1\n"
                "max_inflight_messages 100\n"
                # 0: no limit (Mosquitto's max_queued_bytes is unlimited by default).
                f"max_queued_messages {0 if self.unbounded_queues else 1000}\n"
                "log_type error\n"
            )
            return [mosquitto_binary() or "mosquitto", "-c", str(conf)]
        if self.kind == "amqtt":
            return [sys.executable, "-m", "bench.amqtt_broker", "--port", str(port)]
        if self.kind == "relay":
            return [sys.executable, "-m", "bench.relay", "--port", str(port)]
        raise ValueError(f"unknown broker {self.kind}")

    def _commit_interval(self, seconds: str) -> str:
        """The ``[store]`` line for a kind's commit interval ("" for the default).

        A checkout from before group commit has no such option and refuses it as
        unknown; it commits every change at once, which is what 0 asks for, so 0 is
        left out there; any other interval cannot be had from it.
        """
        if not seconds:
            return ""
        if default_commit_interval(self.kind) is None:
            if float(seconds) == 0:
                return ""
            raise BenchError(
                f"{self.kind}: {checkout(self.kind)} has no store.commit_interval "
                "(it commits every change at once)"
            )
        return f"commit_interval = {seconds}\n"

    def start(
        self,
        pinning: Pinning,
        nofile: int,
        max_connections: int = 1024,
        default_config: bool = False,
        timeout: float = 30.0,
    ) -> Broker:
        root = checkout(self.kind)
        self.port = free_port()
        cmd = pinning.broker_prefix(nofile) + self.command(max_connections, default_config)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=child_env(root),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        _register(self.proc)
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if self.proc.poll() is not None:
                raise BenchError(
                    f"{self.kind} exited with code {self.proc.returncode} before listening:\n"
                    f"{tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise BenchError(f"{self.kind} did not listen within {timeout:.0f} s")
            time.sleep(0.05)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> int | None:
        code = None
        if self.proc is not None:
            _stop(self.proc, grace)
            code = self.proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def log_problems(self) -> list[str]:
        """Log lines that point at a failure in the broker (tracebacks, errors)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        keys = ("Traceback", "ERROR", "Error:", "CRITICAL", "Exception")
        return [line for line in lines if any(k in line for k in keys)]

    def log_warnings(self) -> list[str]:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [line for line in lines if "WARNING" in line]


def mosquitto_binary() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    return "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None


# ---------------------------------------------------------------- load generators


class LoadGen:
    """A ``python -m bench.loadgen`` process and its line protocol."""

    def __init__(self, role: str, params: dict[str, Any], log_path: Path, name: str = "") -> None:
        self.role = role
        self.name = name or role
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        params_path = log_path.with_suffix(".json")
        params_path.write_text(json.dumps(params))
        self.proc: subprocess.Popen[str] = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen", role, str(params_path)],
            cwd=REPO,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        _register(self.proc)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, tag: str, deadline: float) -> dict[str, Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"load generator ({self.role}) sent no {tag} in time")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(5.0)
                raise BenchError(
                    f"load generator ({self.role}) exited with code {self.proc.returncode} "
                    f"before {tag}:\n{tail(self.log_path)}"
                )
            if line.startswith(tag + " "):
                result: dict[str, Any] = json.loads(line[len(tag) + 1 :])
                return result

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def finish(self) -> None:
        """Close stdin: the worker closes its connections and exits."""
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()

    def stop(self, grace: float = 5.0) -> None:
        self.finish()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            _stop(self.proc, 2.0)
        self._reader.join(2.0)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
