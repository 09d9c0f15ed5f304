"""``python -m bench``: run the scenarios against each broker, alternating, and report."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bench import report
from bench.procs import (
    BROKER_NOFILE,
    LEDGE_CHECKOUTS,
    REPO,
    BenchError,
    Pinning,
    core_busy,
    core_times,
    kill_all,
    mosquitto_binary,
    raise_nofile,
)
from bench.scenarios import SCENARIOS, Outcome, Settings

ALL_BROKERS = ("ledge", "mosquitto", "amqtt", "relay")
#: "base" is Ledge from another checkout; it runs only with --base.
BASE = "base"


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark Ledge against Debian's Mosquitto (and amqtt when installed) on "
        "this machine, in one run, alternating brokers between rounds. The relay "
        "(a broker that only forwards bytes) gives the load generator's ceiling.",
    )
    parser.add_argument("--rounds", type=int, help="rounds per scenario and broker (default 3)")
    parser.add_argument(
        "--duration", type=float, help="measured window per run in seconds (default 5)"
    )
    parser.add_argument(
        "--scenarios",
        type=_list,
        default=list(SCENARIOS),
        metavar="A,B,...",
        help=f"scenarios to run (default all: {','.join(SCENARIOS)})",
    )
    parser.add_argument(
        "--brokers",
        type=_list,
        default=None,
        metavar="A,B,...",
        help="brokers to run: ledge,mosquitto,amqtt,relay (default all available)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the raw results here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 round of 1 s, fewer connections, subscribers and filters",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep broker and load-generator logs"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show each load-generator process's CPU use"
    )
    parser.add_argument(
        "--ledge-checkout",
        type=Path,
        metavar="DIR",
        help="run Ledge from this checkout (another commit's worktree) with this "
        "environment's Python; the default is this repository",
    )
    parser.add_argument(
        "--base",
        type=Path,
        metavar="DIR",
        help="also run Ledge from this checkout (e.g. git worktree add /tmp/base COMMIT) as "
        "the broker 'base', with the same config and command line as 'ledge', in the same "
        "rounds; the report adds its figures, new/base ratios and its RSS",
    )
    return parser


@dataclass(frozen=True)
class Checkout:
    """A directory Ledge runs from, and the commit it holds when it is a git checkout."""

    path: Path
    commit: str | None = None
    short: str | None = None
    dirty: bool = False

    @property
    def name(self) -> str:
        """How the report names Ledge from this checkout: ``Ledge@<commit or dir name>``."""
        return f"Ledge@{self.short or self.path.name}"

    def describe(self) -> str:
        """Where it is and what it holds, for the line above the table."""
        if self.short is None:
            return f"{self.path} (not a git checkout)"
        changes = " with uncommitted changes" if self.dirty else ""
        return f"{self.path} at {self.short}{changes}"

    def meta(self) -> dict[str, Any]:
        return {"dir": str(self.path), "commit": self.commit, "dirty": self.dirty}


def _git(path: Path, *args: str) -> list[str] | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(path), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines() if done.returncode == 0 else None


def checkout(path: Path) -> Checkout | None:
    """``path`` as a Ledge checkout (None when it holds no ``gateway`` to run), with its
    commit when it is the top of a git work tree (not merely a directory inside one, whose
    HEAD would be another repository's)."""
    path = path.resolve()
    if not (path / "gateway" / "__main__.py").is_file():
        return None
    found = _git(path, "rev-parse", "--show-toplevel", "HEAD", "--short", "HEAD")
    if found is None or len(found) != 3 or Path(found[0]).resolve() != path:
        return Checkout(path)
    changed = _git(path, "status", "--porcelain", "--untracked-files=no")
    return Checkout(path, commit=found[1], short=found[2], dirty=bool(changed))


def available() -> dict[str, str]:
    """Broker -> why it cannot run here ('' when it can)."""
    why = dict.fromkeys(ALL_BROKERS, "")
    try:
        importlib.import_module("gateway")
    except ImportError as exc:
        why["ledge"] = f"the gateway package is not importable ({exc}); run scripts/setup"
    if mosquitto_binary() is None:
        why["mosquitto"] = "mosquitto is not installed; run scripts/setup --test"
    try:
        importlib.import_module("amqtt")
    except ImportError:
        why["amqtt"] = "amqtt is not installed in this environment; skipped"
    return why


def machine_busy(seconds: float = 0.5, threshold: float = 0.15) -> str:
    """A note when other processes keep the cores busy before the benchmark starts."""
    before = core_times()
    time.sleep(seconds)
    busy = core_busy(before, core_times())
    if any(v >= threshold for v in busy.values()):
        shares = ", ".join(f"core {c} {v * 100:.0f}%" for c, v in sorted(busy.items()))
        return f"the machine was busy before the start ({shares}); other processes disturb figures"
    return ""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def progress(rnd: int, rounds: int, out: Outcome, verbose: bool = False) -> str:
    head = f"[{rnd}/{rounds}] {out.scenario:<10} {out.broker:<9}"
    if not out.ok:
        return f"{head} ERROR: {out.error.splitlines()[0] if out.error else 'no figure'}"
    text = f"{head} {report.fmt_figure(out.figure, out.unit):>8} {out.unit}"
    if out.peak_rss_kib:
        text += f"  peak RSS {out.peak_rss_kib / 1024:.1f} MiB"
    if out.drops is not None:
        text += f"  {'lost' if out.scenario == 'qos1' else 'drops'} {out.drops}"
    if "kib_per_conn" in out.details:
        text += f"  {out.details['kib_per_conn']:.1f} KiB/conn"
    if "p50_ms" in out.details:
        text += f"  p50 {out.details['p50_ms']:.3f} p99.9 {out.details['p999_ms']:.3f}"
    cpu = out.details.get("broker_cpu")
    busy = out.details.get("core_busy") or {}
    if cpu is not None:
        text += f"  broker cpu {cpu * 100:.0f}%"
    if busy:
        text += "  cores " + "/".join(f"{v * 100:.0f}%" for _, v in sorted(busy.items()))
    gens = out.details.get("loadgen_cpu") or {}
    if gens and verbose:
        text += "  loadgen " + " ".join(f"{k}={v * 100:.0f}%" for k, v in gens.items())
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    checkouts: dict[str, Checkout] = {}
    for broker, option, path in (
        ("ledge", "--ledge-checkout", args.ledge_checkout or REPO),
        (BASE, "--base", args.base),
    ):
        if path is None:
            continue
        found = checkout(path)
        if found is None:
            print(f"bench: {option}: {path.resolve()} is not a Ledge checkout", file=sys.stderr)
            return 2
        checkouts[broker] = found
    duration = args.duration if args.duration is not None else (1.0 if args.quick else 5.0)
    if rounds < 1 or duration <= 0:
        print("bench: --rounds must be >= 1 and --duration > 0", file=sys.stderr)
        return 2
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        print(f"bench: unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    why = available()
    requested = list(args.brokers if args.brokers is not None else ALL_BROKERS)
    bad = [b for b in requested if b not in (*ALL_BROKERS, BASE)]
    if bad:
        print(f"bench: unknown broker(s): {', '.join(bad)}", file=sys.stderr)
        return 2
    if BASE in requested and BASE not in checkouts:
        print("bench: the broker 'base' needs --base DIR", file=sys.stderr)
        return 2
    if BASE in checkouts and BASE not in requested:
        # Right after Ledge, so that each round runs ledge, base, mosquitto, ...
        at = requested.index("ledge") + 1 if "ledge" in requested else 0
        requested.insert(at, BASE)
    names = dict(report.NAMES)
    notes: list[str] = []
    if BASE in checkouts:
        base, ledge = checkouts[BASE], checkouts["ledge"]
        names[BASE] = base.name
        if base.commit is None:
            notes.append(f"base: {base.path} is not a git checkout; named after its directory")
        elif base.dirty:
            notes.append(f"base: {base.path} has uncommitted changes to {base.short}")
        same_commit = base.commit == ledge.commit and not (base.dirty or ledge.dirty)
        if base.path == ledge.path or (base.commit is not None and same_commit):
            notes.append("base runs the same code as ledge: new/base shows run-to-run noise")
    brokers = []
    for b in requested:
        if why.get(b):
            notes.append(f"{b}: {why[b]}")
        else:
            brokers.append(b)
    if not brokers:
        print("bench: no broker to run:\n  " + "\n  ".join(notes), file=sys.stderr)
        return 2
    for b, found in checkouts.items():
        LEDGE_CHECKOUTS[b] = found.path

    pinning = Pinning()
    pinning.pin_self()
    if pinning.note:
        notes.append(pinning.note)
    nofile, nofile_note = raise_nofile(BROKER_NOFILE)
    if nofile_note:
        notes.append(nofile_note)
    workdir = Path(tempfile.mkdtemp(prefix="ledge-bench-"))
    if args.quick:
        settings = Settings.quick(workdir, pinning, nofile, duration)
    else:
        settings = Settings(workdir=workdir, pinning=pinning, nofile=nofile, duration=duration)

    scenarios = [SCENARIOS[s] for s in args.scenarios]
    cores = os.cpu_count() or 1
    print(
        f"bench: {', '.join(brokers)} x {', '.join(s.name for s in scenarios)}; "
        f"{rounds} round(s) of {duration:g} s after {settings.warmup:g} s warm-up"
    )
    if pinning.enabled:
        print(
            f"bench: brokers on core {pinning.broker_cpu}, load generators on core "
            f"{pinning.loadgen_cpu} ({cores} cores)"
        )
    for note in notes:
        print(f"note: {note}")

    busy = machine_busy()
    if busy:
        notes.append(busy)
        print(f"note: {busy}")

    outcomes: list[Outcome] = []
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    try:
        for rnd in range(1, rounds + 1):
            for scen in scenarios:
                kinds = [b for b in brokers if scen.runs_on(b)]
                if not kinds:
                    continue
                shift = (rnd - 1) % len(kinds)
                for kind in kinds[shift:] + kinds[:shift]:
                    try:
                        out = scen.run(settings, kind, rnd)
                    except BenchError as exc:
                        out = Outcome(scen.name, kind, rnd, unit=scen.unit, error=str(exc))
                    except (OSError, ValueError, KeyError, TypeError) as exc:
                        error = f"{type(exc).__name__}: {exc}"
                        out = Outcome(scen.name, kind, rnd, unit=scen.unit, error=error)
                    outcomes.append(out)
                    print(progress(rnd, rounds, out, args.verbose), flush=True)
                    for note in out.notes:
                        print(f"    note: {note}", flush=True)
                    if out.error and "\n" in out.error:
                        print("    " + out.error.replace("\n", "\n    "), flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\nbench: interrupted; reporting the runs completed so far", flush=True)
    finally:
        kill_all()
        signal.signal(signal.SIGTERM, previous)

    summary = report.summarize(outcomes)
    print()
    print(
        f"Medians of {rounds} round(s), {duration:g} s windows; "
        "ratios are Ledge/Mosquitto; RSS is the broker's peak during the run."
    )
    if BASE in brokers:
        print(
            f"new/base is Ledge from {checkouts['ledge'].describe()} over {names[BASE]} "
            f"from {checkouts[BASE].describe()}; base RSS is {names[BASE]}'s."
        )
    print(report.table(summary, brokers, names) if outcomes else "(no run completed)")
    extra = report.details(summary, brokers, settings.idle_connections, names, settings.qos1_window)
    if extra:
        print()
        print(extra)
    checks = report.ceiling_check(summary)
    if checks:
        print()
        print("Load-generator ceiling (relay):")
        for line in checks:
            print(f"  {line}")
    run_notes = sorted({f"{o.broker}: {n}" for o in outcomes for n in o.notes})
    errors = [f"{o.scenario}/{o.broker} round {o.round}" for o in outcomes if o.error]
    if run_notes or errors or notes:
        print()
        print("Notes:")
        for line in notes + run_notes:
            print(f"  {line}")
        if errors:
            print(f"  failed runs: {', '.join(errors)}")
    print(f"\nbench: {len(outcomes)} runs in {time.monotonic() - started:.0f} s")

    if args.json is not None:
        meta: dict[str, Any] = {
            "rounds": rounds,
            "duration": duration,
            "warmup": settings.warmup,
            "quick": args.quick,
            "brokers": brokers,
            "scenarios": [s.name for s in scenarios],
            # The checkout each Ledge broker ran from, and its commit (null: not git).
            "ledge": checkouts["ledge"].meta(),
            "pinning": {
                "enabled": pinning.enabled,
                "broker_cpu": pinning.broker_cpu,
                "loadgen_cpu": pinning.loadgen_cpu,
            },
            "cores": cores,
            "machine": platform.platform(),
            "python": platform.python_version(),
            "notes": notes,
            "interrupted": interrupted,
            "scale": {
                "fan_in_publishers": settings.fan_in_publishers,
                "fan_out_subscribers": settings.fan_out_subscribers,
                "filter_connections": settings.filter_connections,
                "filters_per_connection": settings.filters_per_connection,
                "idle_connections": settings.idle_connections,
                "latency_rate": settings.latency_rate,
                "qos1_window": settings.qos1_window,
            },
        }
        if BASE in brokers:
            meta[BASE] = {**checkouts[BASE].meta(), "name": names[BASE]}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.document(outcomes, summary, meta), indent=2))
        print(f"bench: raw results in {args.json}")
    if args.keep_logs or errors:
        print(f"bench: logs in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 130 if interrupted else 0
