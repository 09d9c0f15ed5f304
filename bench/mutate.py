"""Mutation testing: how many small bugs planted in the code do the fast tests catch?

``python -m bench.mutate`` (``make mutate``) runs mutmut over one scope at a time -- the
packages ``gateway/mqtt``, ``gateway/broker``, ``gateway/bridge``, ``gateway/mqttsn``,
``gateway/metrics``, ``gateway/store``, ``drivers``, and ``config``
(``gateway/app/config.py`` with every settings module) -- with that scope's fast,
in-process tests (no gateway processes), niced, in a scratch copy under
``.mutate/<scope>/`` so the checkout is never touched.
mutmut plants one mutant at a time (an operator flipped, a constant changed, a call
dropped) and runs the tests that cover the mutated function; a mutant no test fails on
*survived*. Results are kept between runs: a second run only checks mutants of changed
code, so a run after a change costs what the change touched.

The report (``.mutate/report.md``, also printed) gives per module: mutants, killed,
survived, no covering test, timeouts, and the score, killed (timeouts included) over all
mutants checked; then every surviving mutant of the run as a diff. Not part of
``scripts/test``: a full run takes hours of CPU on two cores.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import math
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".mutate"


@dataclass(frozen=True)
class Scope:
    """What mutmut plants bugs in (globs, relative to the repository) and the fast
    tests that judge them."""

    mutate: tuple[str, ...]
    tests: tuple[str, ...]
    #: Files the globs take in that another scope judges (not mutated here).
    elsewhere: tuple[str, ...] = ()
    #: Tests of the list that do not judge this scope's mutants (deselected): a slow
    #: test that another scope's list holds costs every surviving mutant of a function it
    #: runs its whole time (the store filled to 90 %: 21 s of a broker mutant's 38 s).
    deselect: tuple[str, ...] = ()


#: Settings modules: every config option is declared in one of them (``option()``).
SETTINGS = (
    "gateway/app/config.py",
    "gateway/app/runtime.py",
    "gateway/sensors/ble_settings.py",
    "gateway/sensors/field_settings.py",
    "gateway/sensors/settings.py",
    "gateway/broker/settings.py",
    "gateway/bridge/settings.py",
    "gateway/mqttsn/settings.py",
    "gateway/net/settings.py",
    "gateway/net/http_settings.py",
    "gateway/store/settings.py",
)

#: scope -> what is mutated and the fast tests that exercise it (the mutants'
#: judges). Tests that start a gateway process run once, for mutmut's map of which test
#: covers which function, and never judge a mutant: the mutated code runs only in
#: mutmut's own process.
SCOPES: dict[str, Scope] = {
    "mqtt": Scope(
        ("gateway/mqtt/*",),
        (
            "tests/test_codec_vectors.py",
            "tests/test_codec_edges.py",  # each packet's refusals, properties, wire, framer
            "tests/test_codec_fastpath.py",
            "tests/test_topics.py",
            "tests/test_subtree.py",
            "tests/test_core_connect.py",
            "tests/test_core_publish.py",
            "tests/test_core_subscribe.py",
            "tests/test_core_retain_will_session.py",
            "tests/test_core_fastpath.py",
            "tests/test_core_bridge_clients.py",
        ),
    ),
    "broker": Scope(
        ("gateway/broker/*",),
        (
            "tests/test_core_acl.py",
            "tests/test_core_connect.py",
            "tests/test_core_fastpath.py",
            "tests/test_core_logins.py",
            "tests/test_core_publish.py",
            "tests/test_core_retain_will_session.py",
            "tests/test_core_subscribe.py",
            "tests/test_core_sys_bridge_state.py",
            "tests/test_core_bridge_clients.py",
            "tests/test_publish_policy.py",
            "tests/test_refusal_counts.py",
            "tests/test_ratelog.py",
            "tests/test_store.py",
            "tests/test_limits.py",
            "tests/test_local_and_taps.py",
            "tests/test_subtree.py",
            "tests/test_mqttsn_gateway.py",  # the MQTT-SN clients' broker sessions (proxy.py)
            "tests/test_security_passwd.py",  # password files (auth.py)
            "tests/test_broker_closing_logins.py",  # refusals, deadlines, logins, hashes
            "tests/test_broker_sessions_sys.py",  # restored sessions, wills, ACL reload, $SYS
            "tests/test_broker_proxy_local.py",  # MQTT-SN and in-process sessions, ACL files
            "tests/test_broker_pool_core.py",  # slots, evictions, shutdown, timers, buckets
            "tests/test_broker_delivery_journal.py",  # re-sends, shared groups, the journal
            "tests/test_broker_publish_paths.py",  # PUBLISH in and out, gates, output
            "tests/test_core_max_packet.py",  # what fits a client's Maximum Packet Size
            "tests/test_broker_remaining.py",  # No Local twice, queue drops, connect lines
        ),
        elsewhere=("gateway/broker/settings.py",),  # the config scope's
        deselect=(  # the store's watermarks and truncated file: the store scope's
            "tests/test_store.py::test_a_store_at_90_percent_refuses_and_takes_again_only_below_80",
            "tests/test_store.py::test_truncated_store_is_refused",
        ),
    ),
    "bridge": Scope(
        ("gateway/bridge/*",),
        (
            "tests/test_bridge_units.py",
            "tests/test_bridge_link.py",  # the link in process, to a Ledge as the cloud
            "tests/test_bridge_link_more.py",  # CONNECT, status and will, backoff, logs, TLS
            "tests/test_bridge_sink.py",  # into the outbox and up: marks, loops, bypass, envelope
            "tests/test_bridge_aiomqtt_hooks.py",  # what the client makes of each paho callback
            "tests/test_bridge_state.py",  # $SYS, state, paging, gate, inbound, marks, logs
        ),
    ),
    "mqttsn": Scope(
        ("gateway/mqttsn/*",),
        (
            "tests/test_mqttsn_gateway.py",
            "tests/test_mqttsn_flows.py",
            "tests/test_mqttsn_edges.py",  # return codes, refusal lines, Will, PUBLISH
            "tests/test_mqttsn_sessions.py",  # deadlines, sessions, sleep, registry, acks
            "tests/test_mqttsn_pool.py",  # eviction choices, life-cycle log lines
            "tests/test_mqttsn_output.py",  # counted datagrams, held output, msg ids
            "tests/test_mqttsn_codec.py",
            "tests/test_mqttsn_config.py",
            "tests/test_metrics_collect.py",  # every counter, each by its own value
            "tests/test_refusal_counts.py",
        ),
    ),
    "metrics": Scope(
        ("gateway/metrics/*",),
        (
            "tests/test_metrics_view.py",
            "tests/test_metrics_collect.py",
            "tests/test_status_page.py",
            "tests/test_metrics_reference.py",  # each family as the reference says
            "tests/test_metrics_edges.py",  # routes, durations, warning thresholds, caps
            "tests/test_metrics_homeassistant.py",  # the gateway's discovery and state
            "tests/test_status_text.py",  # ledge status whole, sizes, numbers, page tables
            "tests/test_metrics_sources.py",  # HTTP and store metrics, each its own count
            "tests/test_metrics_gateway.py",  # a whole gateway's status: listeners, bridge
        ),
    ),
    "drivers": Scope(
        ("drivers/*",),
        (
            "tests/test_drivers.py",
            "tests/test_homeassistant.py",  # discovery rendered by Jinja2 against the state
            "tests/test_ble_decoders.py",
            "tests/test_bthome_edges.py",  # refusals, offsets, MAC, every kind of object
            "tests/test_inkbird_edges.py",  # refusals, bounds, probes, what it claims
            "tests/test_mibeacon_edges.py",  # frame control, MAC, capability, refusals
            "tests/test_ruuvi_edges.py",  # the specification's vectors, units, refusals
            "tests/test_pvvx_edges.py",  # both custom formats byte by byte, refusals
            "tests/test_gatt_values.py",  # every GATT field type, scale, text, refusals
            "tests/test_line_parser_errors.py",  # key=value and JSON lines: reason, column
            "tests/test_nmea_edges.py",  # NMEA refusals and columns, fields, years
            "tests/test_reading_wire.py",  # a reading's payload byte for byte, read back
            "tests/test_ble_counter_file.py",  # the replay counters' file, its bounds
            "tests/test_ble_tracker_edges.py",  # repeats, packet window, retry, replay words
            "tests/test_ble_policy_edges.py",  # interval and heartbeat edges, counts, away
            "tests/test_ble_watchdog_counts.py",  # every step counted, reasons, backoff reset
            "tests/test_line_framer_edges.py",  # line ends at chunk edges, max_line, reset
            "tests/test_ble_state.py",
            "tests/test_ble_scanner.py",  # the scanner in process: real bleak, mock BlueZ
            "tests/test_ble_scan_command.py",  # ledge ble scan in process, output whole
            "tests/test_ble_gatt_sessions.py",  # GATT sessions in process: real bleak, mock
            "tests/test_serial.py",
        ),
    ),
    "store": Scope(
        ("gateway/store/sqlite.py", "gateway/store/restore.py"),  # settings: in config
        (
            "tests/test_store.py",
            "tests/test_store_rows.py",  # each op's rows, clock steps, meta, move aside
            "tests/test_bridge_units.py",  # the outbox's rows: paging, compaction, drops
            "tests/test_bridge_state.py",  # pages read back, a page that cannot be read
            "tests/test_bridge_sink.py",  # store batches of the outbox
        ),
    ),
    "config": Scope(
        SETTINGS,
        (
            "tests/test_config_cli.py",
            "tests/test_config_bounds.py",
            "tests/test_option_bounds.py",
            "tests/test_config_reload_plan.py",
            "tests/test_security_config.py",
            "tests/test_mqttsn_config.py",
            "tests/test_runtime_build.py",
            "tests/test_config_overrides.py",
            "tests/test_config_checks.py",
            "tests/test_config_rules.py",
        ),
    ),
}


#: Run in a fresh interpreter: which functions of the given files run while their
#: modules are imported (mutmut's names: ``module.x_name``, ``module.xǁClassǁname``).
_IMPORT_PROBE = """\
import importlib, json, sys
files = set(sys.argv[2:])
called = set()
def probe(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_filename in files and "<" not in code.co_qualname:
        called.add((frame.f_globals.get("__name__", ""), code.co_qualname))
sys.setprofile(probe)
for name in sys.argv[1].split(","):
    importlib.import_module(name)
sys.setprofile(None)
out = []
for module, qual in called:
    owner, _, name = qual.rpartition(".")
    out.append(f"{module}.x\u01c1{owner}\u01c1{name}" if owner else f"{module}.x_{name}")
print(json.dumps(sorted(out)))
"""


def import_time(package: str) -> set[str]:
    """Functions of scope ``package`` that run at import and no test calls again.

    mutmut switches a mutant on for the test run, after the modules were imported:
    a mutant of a function that only ran at import (building a model from the option
    declarations, say) can never be active, so no test could kill it. Found by
    importing the scope's modules under a profiler, and kept only where mutmut's own
    map gives the function at most one test (the one being collected at import).
    """
    import json

    files = sorted(
        p for glob in SCOPES[package].mutate for p in REPO.glob(glob) if p.suffix == ".py"
    )
    modules = [
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for p in files
    ]
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, ",".join(modules), *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    at_import = set(json.loads(proc.stdout))
    stats = WORK / package / "mutants" / "mutmut-stats.json"
    tests: dict[str, list[str]] = {}
    if stats.exists():
        tests = json.loads(stats.read_text())["tests_by_mangled_function_name"]
    return {name for name in at_import if len(tests.get(name, [])) <= 1}


#: mutmut's exit codes per mutant -> what they mean.
STATUS = {
    1: "killed",
    3: "killed",  # the test run crashed: caught
    37: "killed",  # caught by mutmut's type check
    -24: "timeout",  # SIGXCPU
    24: "timeout",
    36: "timeout",
    152: "timeout",
    255: "timeout",
    -9: "timeout",  # SIGKILL after the CPU limit
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    2: "not checked",  # interrupted
    None: "not checked",
}


@dataclass
class Score:
    module: str
    counts: Counter[str]

    @property
    def checked(self) -> int:
        left_out = ("not checked", "skipped", "import time")
        return sum(n for status, n in self.counts.items() if status not in left_out)

    @property
    def score(self) -> float:
        caught = self.counts["killed"] + self.counts["timeout"]
        return caught / self.checked if self.checked else 0.0

    @property
    def margin(self) -> float:
        """Half the 95 % interval of the score, were the checked mutants a sample."""
        p, n = self.score, self.checked
        return 1.96 * math.sqrt(p * (1 - p) / n) if n else 0.0


#: Loaded by the scratch copy's test runs: a test that starts a gateway (or Mosquitto)
#: process is skipped there. The process imports the code with every mutant off, so it
#: can never judge one, and under mutmut's trampolines on a busy machine its start-up
#: can outlast the helpers' deadline and abort the whole run.
PLUGIN = """\
from __future__ import annotations

import pytest

from tests.support import procs


def _skip(*args: object, **kwargs: object) -> None:
    pytest.skip("a separate process cannot judge a mutant")


procs.LedgeProcess.start = _skip  # type: ignore[assignment,method-assign]
procs.MosquittoProcess.start = _skip  # type: ignore[assignment,method-assign]
"""


#: What the judging tests read from the repository's root (the example config, the
#: MQTT-SN vectors shared with the firmware, the fuzz and bench packages some import,
#: the docs (the metrics reference the served families are held to)).
DATA = ("ledge.example.toml", "firmware-bridge", "fuzz", "bench", "docs")


_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules")


def _copy(scope_name: str, scope: Scope) -> Path:
    """A scratch copy of what the tests import, with mutmut's config for the scope."""
    where = WORK / scope_name
    where.mkdir(parents=True, exist_ok=True)
    for name in ("gateway", "drivers", "tests"):
        target = where / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(REPO / name, target, ignore=_IGNORE)
    for name in DATA:
        if (REPO / name).is_dir():
            shutil.rmtree(where / name, ignore_errors=True)
            shutil.copytree(REPO / name, where / name, ignore=_IGNORE)
        else:
            shutil.copy2(REPO / name, where / name)
    pyproject = (REPO / "pyproject.toml").read_text()
    tests = ", ".join(f'"{path}"' for path in scope.tests)
    globs = ", ".join(f'"{glob}"' for glob in scope.mutate)
    # mutmut mutates under its source path and copies the other package as it is.
    source, other = (
        ("drivers", "gateway")
        if scope.mutate[0].startswith("drivers/")
        else (
            "gateway",
            "drivers",
        )
    )
    copied = ", ".join(f'"{name}"' for name in (other, *DATA))
    elsewhere = ", ".join(f'"{path}"' for path in scope.elsewhere)
    deselect = "".join(f', "--deselect", "{test}"' for test in scope.deselect)
    pyproject += (
        "\n[tool.mutmut]\n"
        f'source_paths = ["{source}"]\n'
        f"only_mutate = [{globs}]\n"
        f"do_not_mutate = [{elsewhere}]\n"
        f"also_copy = [{copied}]\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "tests.mutate_plugin", '
        f'"-q", "-x"{deselect}]\n'
        f"pytest_add_cli_args_test_selection = [{tests}]\n"
    )
    (where / "pyproject.toml").write_text(pyproject)
    (where / "tests" / "mutate_plugin.py").write_text(PLUGIN)
    return where


def _mutmut() -> str:
    found = shutil.which("mutmut", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("mutmut is not installed: pip install -e '.[mutate]'")
    return found


def _generated(package: str) -> list[str]:
    """The names of every mutant mutmut generated for scope ``package`` (its meta files),
    but those of files another scope judges."""
    import json

    scope = SCOPES[package]
    mutants = WORK / package / "mutants"
    names: list[str] = []
    for meta in sorted(mutants.rglob("*.py.meta")):
        name = meta.relative_to(mutants).as_posix().removesuffix(".meta")
        if name in scope.elsewhere or not any(fnmatch.fnmatch(name, g) for g in scope.mutate):
            continue
        names.extend(json.loads(meta.read_text())["exit_code_by_key"])
    return names


def run(package: str, children: int, niceness: int, sample: int = 0, seed: int = 1) -> None:
    """One mutmut run over scope ``package``: every mutant not checked since its code or
    the scope's tests changed, or with ``sample`` only that many drawn at random (by
    ``seed``) from all of them, checked again; the report then counts only those."""
    where = _copy(package, SCOPES[package])
    cmd = ["nice", "-n", str(niceness), _mutmut(), "run", "--max-children", str(children)]
    chosen: list[str] = []
    drawn = where / "sample.txt"
    drawn.unlink(missing_ok=True)
    if sample:
        if not _generated(package):
            # mutmut generates every mutant (and maps tests to functions), then finds
            # none by this name to run: the names to draw from.
            subprocess.run([*cmd, "no.such.mutant"], cwd=where, capture_output=True, check=False)
        at_import = import_time(package)
        names = [n for n in _generated(package) if n.rsplit("__mutmut_", 1)[0] not in at_import]
        chosen = sorted(random.Random(seed).sample(names, min(sample, len(names))))
        drawn.write_text("".join(f"{name}\n" for name in chosen))
    started = time.monotonic()
    print(f"mutate {package}: {' '.join(cmd)} in {where}", flush=True)
    if chosen:
        print(f"mutate {package}: {len(chosen)} mutants drawn (seed {seed})", flush=True)
    with open(where / "run.log", "wb") as log:
        subprocess.run(
            [*cmd, *chosen], cwd=where, stdout=log, stderr=subprocess.STDOUT, check=False
        )
    print(f"mutate {package}: {time.monotonic() - started:.0f} s", flush=True)


def results(package: str) -> tuple[list[Score], dict[str, list[str]]]:
    """The scores of scope ``package``, file by file then in all, and its survivors by
    file (from mutmut's meta files, keyed by the file's path in the repository)."""
    import json

    mutants = WORK / package / "mutants"
    total: Counter[str] = Counter()
    scores: list[Score] = []
    survivors: dict[str, list[str]] = {}
    globs = SCOPES[package].mutate
    at_import = import_time(package)
    drawn = WORK / package / "sample.txt"
    sample = set(drawn.read_text().split()) if drawn.exists() else None
    for meta in sorted(mutants.rglob("*.py.meta")):
        name = meta.relative_to(mutants).as_posix().removesuffix(".meta")
        if not any(fnmatch.fnmatch(name, glob) for glob in globs):
            continue
        if name in SCOPES[package].elsewhere:
            continue
        counts: Counter[str] = Counter()
        data = json.loads(meta.read_text())
        for key, code in data["exit_code_by_key"].items():
            if sample is not None and key not in sample:
                continue  # not drawn: an earlier run's verdict would bias the sample
            status = STATUS.get(code, f"exit {code}")
            if key.rsplit("__mutmut_", 1)[0] in at_import:
                status = "import time"
            counts[status] += 1
            if status in ("survived", "no tests"):
                survivors.setdefault(name, []).append(key)
        if counts:
            scores.append(Score(name, counts))
            total.update(counts)
    scores.append(Score(f"**{package}**", total))
    return scores, survivors


def _functions(path: Path) -> dict[str, str]:
    """Function name -> source, for every function of a mutmut-generated file."""
    source = path.read_text()
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # By line numbers: ast.get_source_segment rescans the file for each node.
            found[node.name] = "\n".join(lines[node.lineno - 1 : node.end_lineno])
    return found


def _diff(functions: dict[str, str], key: str) -> str:
    """The lines a mutant changed, as ``- old | + new``."""
    name = key.rpartition(".")[2]
    original = functions.get(name.rsplit("__mutmut_", 1)[0] + "__mutmut_orig", "")
    mutant = functions.get(name, "")
    lines = difflib.unified_diff(original.splitlines()[1:], mutant.splitlines()[1:], n=0)
    changed = [ln.strip() for ln in lines if ln[:1] in "+-" and ln[:3] not in ("---", "+++")]
    return " | ".join(changed)[:200]


def report(packages: list[str], diffs: bool) -> str:
    rows = []
    details = []
    for package in packages:
        if not (WORK / package / "mutants").exists():
            continue
        scores, survivors = results(package)
        sampled = (WORK / package / "sample.txt").exists()

        def spread(score: Score, sampled: bool = sampled) -> str:
            return f" ± {score.margin:.1%}" if sampled else ""

        for score in scores:
            c = score.counts
            rows.append(
                f"| {score.module} | {score.checked} | {c['killed']} | {c['survived']} | "
                f"{c['no tests']} | {c['timeout']} | {score.score:.1%}{spread(score)} | "
                f"{c['not checked']} | {c['import time']} |"
            )
        if diffs:
            for file, names in survivors.items():
                functions = _functions(WORK / package / "mutants" / file)
                details.append(f"\n### {file} ({len(names)} surviving)\n")
                details.extend(f"- `{name}`: `{_diff(functions, name)}`" for name in names)
    scopes = "\n".join(
        f"- {p} ({', '.join(SCOPES[p].mutate)}): {', '.join(SCOPES[p].tests)}" for p in packages
    )
    return (
        "# Mutation testing (mutmut)\n\n"
        "Score: killed (with timeouts) over all mutants checked; a mutant no covering "
        "test exists for counts as surviving. Equivalent mutants (no behaviour can tell "
        "them apart) are listed with their reason in bench/mutate_equivalent.md.\n\n"
        "| module | checked | killed | survived | no tests | timeout | score | not checked "
        "| import time |\n|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n\nTests per module:\n\n"
        f"{scopes}\n" + ("\n## Surviving mutants\n" + "\n".join(details) if details else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mutate", description=__doc__)
    parser.add_argument("packages", nargs="*", default=list(SCOPES), choices=list(SCOPES))
    parser.add_argument("--children", type=int, default=1, help="mutants run at once")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the runs")
    parser.add_argument("--report-only", action="store_true", help="report the last runs")
    parser.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="N",
        help="check only N mutants drawn at random from each scope's (the score then "
        "comes with its 95 %% interval): minutes instead of hours for a large scope",
    )
    parser.add_argument("--seed", type=int, default=1, help="which mutants --sample draws")
    args = parser.parse_args(argv)
    packages = args.packages or list(SCOPES)
    if not args.report_only:
        for package in packages:
            run(package, args.children, args.nice, args.sample, args.seed)
    text = report(packages, diffs=True)
    WORK.mkdir(exist_ok=True)
    (WORK / "report.md").write_text(text)
    print(text)
    print(f"written to {os.path.relpath(WORK / 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
