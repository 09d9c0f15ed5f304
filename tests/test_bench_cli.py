"""``python -m bench --base DIR``: Ledge from another checkout as the broker "base", in
the same rounds as the others, with its own columns in the report and its commit in the
JSON. The scenarios' runners are replaced by fakes, so no broker is started."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import cli, procs, report, scenarios
from bench.procs import REPO, BenchError, Broker, Pinning
from bench.scenarios import SCENARIOS, Measured, Outcome, Settings
from gateway.app.config import parse_config
from gateway.store.settings import StoreSettings

#: Per scenario and broker: the figure the fake runner reports.
FIGURES = {
    "fan-in": {"ledge": 200.0, "base": 100.0, "mosquitto": 400.0, "relay": 1000.0},
    "latency": {"ledge": 2.0, "base": 4.0, "mosquitto": 1.0, "relay": 0.5},
    "persist": {"ledge": 300.0, "base": 150.0},
}
PEAK_RSS_KIB = {"ledge": 10 * 1024, "base": 20 * 1024, "mosquitto": 30 * 1024, "relay": 1024}
DROPS = {"ledge": 1, "base": 2, "mosquitto": 3, "relay": 0}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    """(scenario, broker, round) of every run, in order; main() without side effects on
    this process (no pinning, no open-file limit, no wait for an idle machine)."""
    made: list[tuple[str, str, int]] = []

    def fake(name: str) -> Any:
        def run(settings: Settings, kind: str, rnd: int) -> Outcome:
            made.append((name, kind, rnd))
            return Outcome(
                name,
                kind,
                rnd,
                figure=FIGURES[name][kind],
                unit=SCENARIOS[name].unit,
                peak_rss_kib=PEAK_RSS_KIB[kind],
                drops=DROPS[kind],
            )

        return run

    for name in FIGURES:
        monkeypatch.setitem(SCENARIOS, name, dataclasses.replace(SCENARIOS[name], run=fake(name)))
    monkeypatch.setattr(cli, "available", lambda: dict.fromkeys(cli.ALL_BROKERS, ""))
    monkeypatch.setattr(cli, "machine_busy", lambda: "")
    monkeypatch.setattr(cli, "raise_nofile", lambda target: (1024, ""))
    monkeypatch.setattr(Pinning, "pin_self", lambda self: None)
    # main() points the Ledge brokers at their checkouts; undone after the test.
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "ledge", REPO)
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "base", REPO)
    return made


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _checkout(path: Path, git: bool = True) -> Path:
    """A directory that passes for a Ledge checkout, committed to a new git repository."""
    (path / "gateway").mkdir(parents=True)
    (path / "gateway" / "__main__.py").write_text("")
    if git:
        _git(path, "init", "-q")
        _git(path, "add", ".")
        _git(path, "-c", "commit.gpgsign=false", "commit", "-q", "-m", "base")
    return path


def _table(stdout: str) -> dict[str, dict[str, str]]:
    """The main table as {scenario: {column: cell}}, cut at the header's dashes."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("scenario "))
    spans = [m.span() for m in re.finditer(r"-+", lines[at + 1])]

    def cells(line: str) -> list[str]:
        return [line[a:b].strip() for a, b in spans]

    head = cells(lines[at])
    rows: dict[str, dict[str, str]] = {}
    for line in lines[at + 2 :]:
        if not line.strip():
            break
        row = dict(zip(head, cells(line), strict=True))
        rows[row["scenario"]] = row
    return rows


def _main(*argv: str) -> int:
    return cli.main(["--rounds", "2", "--duration", "1", *argv])


def test_base_runs_right_after_ledge_in_every_round_and_the_report_compares_them(
    calls: list[tuple[str, str, int]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = _checkout(tmp_path / "base")
    commit, short = _git(base, "rev-parse", "HEAD"), _git(base, "rev-parse", "--short", "HEAD")
    out = tmp_path / "bench.json"
    code = _main(
        "--scenarios",
        "fan-in,latency,persist",
        "--brokers",
        "ledge,mosquitto,relay",
        "--base",
        str(base),
        "--json",
        str(out),
    )
    stdout = capsys.readouterr().out
    assert code == 0, stdout

    def order(scenario: str, rnd: int) -> list[str]:
        return [k for s, k, r in calls if s == scenario and r == rnd]

    # Round 1 in the order given, base inserted after ledge; round 2 turned by one.
    assert order("fan-in", 1) == ["ledge", "base", "mosquitto", "relay"]
    assert order("fan-in", 2) == ["base", "mosquitto", "relay", "ledge"]
    assert order("latency", 1) == ["ledge", "base", "mosquitto", "relay"]
    # persist is Ledge's own store: base runs it too, Mosquitto and the relay do not.
    assert order("persist", 1) == ["ledge", "base"]
    assert order("persist", 2) == ["base", "ledge"]

    rows = _table(stdout)
    name = f"Ledge@{short}"
    fan_in = rows["fan-in"]
    assert list(fan_in) == [
        "scenario",
        "unit",
        "Ledge",
        name,
        "Mosquitto",
        "amqtt",
        "ceiling",
        "Ledge/Mosq",
        "new/base",
        "Ledge RSS",
        "base RSS",
        "Mosq RSS",
        "drops L/B/M",
    ]
    assert (fan_in["Ledge"], fan_in[name], fan_in["Mosquitto"]) == ("200", "100", "400")
    assert (fan_in["Ledge/Mosq"], fan_in["new/base"]) == ("0.50x", "2.00x")
    assert (fan_in["Ledge RSS"], fan_in["base RSS"], fan_in["Mosq RSS"]) == (
        "10.0M",
        "20.0M",
        "30.0M",
    )
    assert fan_in["drops L/B/M"] == "1/2/3"
    # Lower is better: the ratio is still new over base, and the unit says so.
    latency = rows["latency"]
    assert latency["unit"] == "ms p99 (lower)"
    assert (latency["Ledge/Mosq"], latency["new/base"]) == ("2.00x", "0.50x")
    persist = rows["persist"]
    assert (persist["Ledge/Mosq"], persist["new/base"]) == ("-", "2.00x")
    assert persist["Mosq RSS"] == "-"
    assert f"over {name} from {base} at {short};" in stdout

    doc: dict[str, Any] = json.loads(out.read_text())
    meta = doc["meta"]
    assert meta["brokers"] == ["ledge", "base", "mosquitto", "relay"]
    assert meta["base"] == {"dir": str(base), "commit": commit, "dirty": False, "name": name}
    assert meta["ledge"]["dir"] == str(REPO)
    assert doc["summary"]["fan-in"]["base"]["figure"] == 100.0
    assert doc["summary"]["persist"]["base"]["peak_rss_kib"] == 20 * 1024
    runs = [(r["scenario"], r["broker"], r["round"]) for r in doc["runs"]]
    assert runs == calls
    assert procs.LEDGE_CHECKOUTS["base"] == base


def test_without_base_the_table_and_runs_are_as_before(
    calls: list[tuple[str, str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    code = _main("--scenarios", "fan-in", "--brokers", "ledge,mosquitto")
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert {k for _, k, _ in calls} == {"ledge", "mosquitto"}
    assert list(_table(stdout)["fan-in"]) == [
        "scenario",
        "unit",
        "Ledge",
        "Mosquitto",
        "amqtt",
        "ceiling",
        "Ledge/Mosq",
        "Ledge RSS",
        "Mosq RSS",
        "drops L/M",
    ]
    assert "new/base" not in stdout


def test_base_outside_git_is_named_after_its_directory(
    calls: list[tuple[str, str, int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _checkout(tmp_path / "old-tree", git=False)
    out = tmp_path / "bench.json"
    code = _main(
        "--scenarios", "fan-in", "--brokers", "ledge", "--base", str(base), "--json", str(out)
    )
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert "Ledge@old-tree" in _table(stdout)["fan-in"]
    assert "is not a git checkout" in stdout
    assert json.loads(out.read_text())["meta"]["base"]["commit"] is None


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--base", "{empty}"], "--base: {empty} is not a Ledge checkout"),
        (["--base", "{missing}"], "--base: {missing} is not a Ledge checkout"),
        (["--ledge-checkout", "{empty}"], "--ledge-checkout: {empty} is not a Ledge checkout"),
        (["--brokers", "ledge,base"], "the broker 'base' needs --base DIR"),
    ],
)
def test_base_and_ledge_checkout_are_validated_before_anything_runs(
    argv: list[str],
    error: str,
    calls: list[tuple[str, str, int]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = {"{empty}": str(tmp_path), "{missing}": str(tmp_path / "missing")}
    code = _main("--scenarios", "fan-in", *[paths.get(a, a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert calls == []
    for placeholder, path in paths.items():
        error = error.replace(placeholder, path)
    assert f"bench: {error}\n" == err


def test_checkout_reads_the_commit_only_at_the_top_of_a_work_tree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _checkout(repo / "sub", git=False)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "commit.gpgsign=false", "commit", "-q", "-m", "outer")
    # A directory inside another repository: that repository's HEAD is not its commit.
    inner = cli.checkout(repo / "sub")
    assert inner is not None
    assert (inner.commit, inner.name) == (None, "Ledge@sub")

    top = cli.checkout(_checkout(tmp_path / "top"))
    assert top is not None
    assert top.commit == _git(tmp_path / "top", "rev-parse", "HEAD")
    assert not top.dirty
    (tmp_path / "top" / "gateway" / "__main__.py").write_text("changed = True\n")
    changed = cli.checkout(tmp_path / "top")
    assert changed is not None and changed.dirty
    assert cli.checkout(tmp_path) is None


@pytest.mark.parametrize("durability", ["", "-process", "-power"])
def test_base_gets_ledges_command_line_and_config_from_its_own_checkout(
    durability: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "base", base)
    made = {}
    for kind in ("ledge", "base"):
        workdir = tmp_path / kind
        workdir.mkdir()
        broker = Broker(
            kind + durability, workdir, "run", extra_config="[x]\n", broker_options="y = 1\n"
        )
        command = broker.command(5000, default_config=False)
        config = (workdir / "run.toml").read_text()
        made[kind] = ([a.replace(str(workdir), "WORKDIR") for a in command], config)
    assert made["base"] == made["ledge"]
    command, config = made["base"]
    assert command[1:4] == ["-m", "gateway", "run"]
    assert "max_connections = 5000\ny = 1\n" in config
    if durability:
        assert f'durability = "{durability[1:]}"' in config
        assert "--data-dir" in command
    else:
        assert "[store]" not in config and "--data-dir" not in command
    assert procs.checkout("base" + durability) == base
    assert procs.checkout("ledge" + durability) == procs.LEDGE_CHECKOUTS["ledge"]
    assert procs.checkout("mosquitto") == REPO


def test_the_qos_1_runs_lift_both_brokers_session_queue_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscriber slowed by a busy machine must not see messages dropped by a queue
    limit (both brokers' policy) where the run counts every acknowledged message."""
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "ledge", REPO)
    for unbounded in (False, True):
        workdir = tmp_path / str(unbounded)
        workdir.mkdir()
        Broker("ledge", workdir, "l", unbounded_queues=unbounded).command(10, False)
        Broker("mosquitto", workdir, "m", unbounded_queues=unbounded).command(10, False)
        broker = parse_config((workdir / "l.toml").read_text()).broker
        mosquitto = (workdir / "m.conf").read_text()
        if unbounded:
            assert broker.max_queued_messages == broker.max_queued_bytes == 2**31 - 1
            assert "max_queued_messages 0\n" in mosquitto  # (0: no limit)
        else:
            assert (broker.max_queued_messages, broker.max_queued_bytes) == (1000, 8 << 20)
            assert "max_queued_messages 1000\n" in mosquitto


def test_base_without_a_checkout_is_an_error_not_this_repository(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(procs.LEDGE_CHECKOUTS, "base", raising=False)
    with pytest.raises(BenchError, match="--base"):
        procs.checkout("base-power")


#: Per persist run: the messages a fake measure() reports received in its 1 s window.
PERSIST_RATES = {"": 400, "-process": 200, "-power": 100, "-process-0": 300, "-power-0": 250}


def _fake_persist_measure(monkeypatch: pytest.MonkeyPatch, kinds: list[str]) -> None:
    """measure() for run_persist: records the kinds and answers PERSIST_RATES, writing
    10 bytes a message, its peak RSS the rate too."""

    def measure(
        settings: Settings, kind: str, label: str, *rest: Any, unbounded_queues: bool = False
    ) -> Measured:
        # Every acknowledged message is counted: no queue limit may drop one by policy.
        assert unbounded_queues, kind
        kinds.append(kind)
        _, dash, variant = kind.partition("-")
        rate = PERSIST_RATES[dash + variant]
        return Measured(
            subs=[{"window": rate, "total": rate}],
            pubs=[{"acked": rate}],
            seconds=1.0,
            idle_rss_kib=1,
            peak_rss_kib=rate,
            broker_cpu=None,
            busy={},
            loadgen_cpu={},
            notes=[],
            written=rate * 10,
        )

    monkeypatch.setattr(scenarios, "measure", measure)


def _settings_py(root: Path, interval: str | None) -> Path:
    """A checkout whose gateway/store/settings.py has ``commit_interval`` with this
    default (None: a checkout from before the option)."""
    store = root / "gateway" / "store"
    store.mkdir(parents=True)
    lines = ["class StoreSettings:", '    durability: str = option("power")']
    if interval is not None:
        lines.append(f"    commit_interval: float = option({interval}, ge=0, le=10.0)")
    (store / "settings.py").write_text("\n".join(lines) + "\n")
    return root


def test_persist_runs_each_durability_on_the_default_config_and_with_commit_interval_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds: list[str] = []
    _fake_persist_measure(monkeypatch, kinds)
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "base", _settings_py(tmp_path / "base", "0.25"))
    settings = Settings(workdir=tmp_path, pinning=Pinning(), nofile=1024)
    out = scenarios.run_persist(settings, "base", 1)
    assert kinds == ["base", "base-process", "base-power", "base-process-0", "base-power-0"]
    # power, on the default config, with that run's RSS
    assert (out.broker, out.figure, out.peak_rss_kib) == ("base", 100.0, 100)
    details = out.details
    assert details["memory_msgs"] == 400.0
    assert (details["process_msgs"], details["process_ratio"]) == (200.0, 0.5)
    assert (details["power_interval0_msgs"], details["power_interval0_ratio"]) == (250.0, 0.625)
    assert details["process_interval0_bytes_per_1000"] == 10_000.0
    assert details["commit_interval"] == 0.25
    assert out.notes == []
    with pytest.raises(BenchError):
        scenarios.run_persist(settings, "mosquitto", 1)


def test_persist_report_names_each_rows_commit_interval_for_ledge_and_an_older_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds: list[str] = []
    _fake_persist_measure(monkeypatch, kinds)
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "ledge", REPO)
    old = _settings_py(tmp_path / "old", None)
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "base", old)
    settings = Settings(workdir=tmp_path, pinning=Pinning(), nofile=1024)
    outcomes = [scenarios.run_persist(settings, kind, 1) for kind in ("ledge", "base")]
    assert "commit_interval" not in outcomes[1].details
    assert any(f"{old} has no store.commit_interval" in n for n in outcomes[1].notes)
    text = report.details(
        report.summarize(outcomes), ["ledge", "base"], 10, {**report.NAMES, "base": "Old"}
    )
    rows = {
        re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line)[1:]
        for line in text.splitlines()[2:]
        if "  " in line
    }
    assert rows == {
        "Ledge, in memory": ["400", "1.00", "-"],
        'Ledge, store.durability = "process", default commit_interval (0.1 s)': [
            "200",
            "0.50",
            "10 KiB",
        ],
        'Ledge, store.durability = "power", default commit_interval (0.1 s)': [
            "100",
            "0.25",
            "10 KiB",
        ],
        'Ledge, store.durability = "process", commit_interval = 0': ["300", "0.75", "10 KiB"],
        'Ledge, store.durability = "power", commit_interval = 0': ["250", "0.62", "10 KiB"],
        "Old, in memory": ["400", "1.00", "-"],
        'Old, store.durability = "process", default (no commit_interval: commits at once)': [
            "200",
            "0.50",
            "10 KiB",
        ],
        'Old, store.durability = "power", default (no commit_interval: commits at once)': [
            "100",
            "0.25",
            "10 KiB",
        ],
        'Old, store.durability = "process", commit_interval = 0 (not an option there)': [
            "300",
            "0.75",
            "10 KiB",
        ],
        'Old, store.durability = "power", commit_interval = 0 (not an option there)': [
            "250",
            "0.62",
            "10 KiB",
        ],
    }
    assert (
        "The default rows commit at most once per 0.1 s: the publisher's 100 messages in "
        "flight get at most 100 per interval through (1.0k msg/s)."
    ) in text


def test_the_default_commit_interval_is_read_from_the_checkouts_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "ledge", REPO)
    assert procs.default_commit_interval("ledge-power") == StoreSettings().commit_interval
    for interval, expected in (("0.5", 0.5), (None, None)):
        root = _settings_py(tmp_path / str(interval), interval)
        monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "base", root)
        assert procs.default_commit_interval("base") == expected
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "base", tmp_path / "no-settings")
    assert procs.default_commit_interval("base") is None
    odd = tmp_path / "odd" / "gateway" / "store"
    odd.mkdir(parents=True)
    (odd / "settings.py").write_text("    commit_interval: float = DEFAULT_INTERVAL\n")
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "base", tmp_path / "odd")
    with pytest.raises(BenchError, match="cannot read the default of commit_interval"):
        procs.default_commit_interval("base")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("ledge", procs.LedgeKind("ledge")),
        ("base-power", procs.LedgeKind("base", "power")),
        ("ledge-process-0", procs.LedgeKind("ledge", "process", "0")),
        ("base-power-0.5", procs.LedgeKind("base", "power", "0.5")),
        ("mosquitto", None),
    ],
)
def test_ledge_kinds(kind: str, expected: procs.LedgeKind | None) -> None:
    assert procs.ledge_kind(kind) == expected


@pytest.mark.parametrize("kind", ["ledge--0", "ledge-power-x", "base-power-0s"])
def test_a_commit_interval_is_seconds_after_a_durability(kind: str) -> None:
    with pytest.raises(BenchError, match="a commit interval is seconds after a durability"):
        procs.ledge_kind(kind)


@pytest.mark.parametrize("durability", ["process", "power"])
def test_commit_interval_0_is_in_the_config_only_where_the_checkout_has_the_option(
    durability: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "ledge", REPO)
    monkeypatch.setitem(procs.LEDGE_CHECKOUTS, "base", _settings_py(tmp_path / "old", None))

    def store(kind: str) -> str:
        workdir = tmp_path / kind
        workdir.mkdir()
        command = Broker(kind, workdir, "run").command(1024, default_config=False)
        config = Path(command[command.index("--config") + 1]).read_text()
        return config.partition("[store]\n")[2]

    # The default config: what a user gets, the checkout's own commit interval.
    assert store(f"ledge-{durability}") == f'durability = "{durability}"\n'
    new = store(f"ledge-{durability}-0")
    assert new == f'durability = "{durability}"\ncommit_interval = 0\n'
    assert parse_config("[store]\n" + new).store.commit_interval == 0
    # A checkout from before the option refuses it as unknown, and commits at once anyway.
    assert store(f"base-{durability}-0") == f'durability = "{durability}"\n'
    with pytest.raises(BenchError, match=r"has no store\.commit_interval"):
        store(f"base-{durability}-0.5")


def test_base_runs_every_scenario_ledge_runs() -> None:
    for scen in SCENARIOS.values():
        assert scen.runs_on("base") == scen.runs_on("ledge"), scen.name
    assert SCENARIOS["persist"].runs_on("base")
    assert not SCENARIOS["persist"].runs_on("mosquitto")
    assert not SCENARIOS["idle-rss"].runs_on("relay")
