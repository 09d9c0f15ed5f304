"""Coverage-guided fuzzing of the codec and the connection state machine (atheris).

    python -m fuzz [--seconds N | --runs N] [--target NAME|all]   (names: --help)

Each target runs under libFuzzer in its own process, with its corpus in
``fuzz/corpus/<target>/`` (kept between runs, so each run starts where the last one
stopped) and crashing inputs written to ``fuzz/crashes/``. Prints the number of inputs
executed per target and in total; exits 1 when a crash was found. A crash becomes a
regression vector by copying it to ``tests/vectors/fuzz/<target>-<what>.bin``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Every target in fuzz.targets.TARGETS (named here so --help needs no import of them).
TARGET_NAMES = (
    "codec",
    "fastpath",
    "session",
    "websocket",
    "http",
    "mqttsn_codec",
    "mqttsn_gateway",
    "landing_line",
)
DONE = re.compile(r"Done (\d+) runs in (\d+) second")
STATS = re.compile(r"^#(\d+)\s")


def child(target: str, libfuzzer_args: list[str]) -> None:
    """Runs in the fuzzing process: instrument Ledge's pure layers, then fuzz."""
    import logging

    import atheris

    logging.disable(logging.CRITICAL)  # refusals are expected; logging is not fuzzed
    with atheris.instrument_imports(include=["gateway", "fuzz", "pipeline", "drivers"]):
        # What the targets import lazily is imported here, to be instrumented too.
        import fuzz.landing
        import fuzz.mqttsn  # noqa: F401
        import gateway.broker.acl
        import gateway.broker.handle_login
        import gateway.broker.logins
        import gateway.mqttsn.gateway
        import gateway.net.http
        import gateway.net.websocket  # noqa: F401
        from fuzz.targets import TARGETS
    function = TARGETS[target]

    def one_input(data: bytes) -> None:
        function(data)

    atheris.Setup([sys.argv[0], *libfuzzer_args], one_input)
    atheris.Fuzz()


def run(
    target: str, seconds: int | None, runs: int | None, quiet: bool, workdir: Path
) -> tuple[int, bool]:
    """Fuzz one target in a child process; returns (inputs executed, crashed)."""
    corpus = workdir / "corpus" / target
    corpus.mkdir(parents=True, exist_ok=True)
    crashes = workdir / "crashes"
    crashes.mkdir(exist_ok=True)
    args = [
        f"-artifact_prefix={crashes}/{target}-",
        "-max_len=4096",
        "-rss_limit_mb=1024",
        "-timeout=10",
        "-print_final_stats=1",
    ]
    if seconds is not None:
        args.append(f"-max_total_time={seconds}")
    if runs is not None:
        args.append(f"-runs={runs}")
    args.append(str(corpus))
    env = dict(
        os.environ, PYTHONPATH=f"{HERE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "fuzz", "--child", target, "--", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=HERE.parent,
    )
    assert proc.stderr is not None
    executed = 0
    tail: list[str] = []
    for line in proc.stderr:
        tail = [*tail[-40:], line]
        if m := DONE.search(line):
            executed = int(m.group(1))
        elif m := STATS.match(line):
            executed = max(executed, int(m.group(1)))
        if not quiet and ("pulse" in line or "DONE" in line):
            print(f"[{target}] {line.rstrip()}", flush=True)
    code = proc.wait()
    crashed = code != 0
    if crashed:
        sys.stdout.write("".join(tail))
    return executed, crashed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[3:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--target",
        choices=[*TARGET_NAMES, "all"],
        default="all",
    )
    parser.add_argument("--seconds", type=int, help="per target (default 300)")
    parser.add_argument("--runs", type=int, help="inputs per target instead of a duration")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--workdir", type=Path, default=HERE, help="where corpus/ and crashes/ live (fuzz/)"
    )
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds or args.runs else 300
    targets = list(TARGET_NAMES) if args.target == "all" else [args.target]
    total = 0
    crashed = []
    start = time.monotonic()
    for target in targets:
        executed, crash = run(target, seconds, args.runs, args.quiet, args.workdir)
        print(f"fuzz {target}: {executed:,} inputs executed{' -- CRASH' if crash else ''}")
        total += executed
        if crash:
            crashed.append(target)
    took = time.monotonic() - start
    print(
        f"fuzz: {total:,} inputs executed in {took:.0f} s; crashes: {', '.join(crashed) or 'none'}"
    )
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
