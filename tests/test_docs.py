"""The manual: it builds, it is current with the code, and the README's commands run.

- The generated reference pages and man pages are what ``python -m docs.gen`` makes from
  the code now (a declaration changed without regenerating fails here).
- The config reference has every option of the model; the metrics reference has every
  family a real gateway serves on ``/metrics``; the command reference every subcommand.
- ``mkdocs build --strict`` passes (a broken link or anchor, a page missing from the
  navigation or a page in it that does not exist fails it), and so do the README's links.
- ``man -l`` renders both man pages with no groff warning.
- The README stays short, and each command in its shell blocks runs as written: the
  tour's clients against a real ``ledge run``, ``ledge check-config`` and ``ledge bridge
  test`` on the README's own TOML, the rest against the parsers, the scripts and the
  Makefile's targets.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from docs.gen import cli, config, generate, man, metrics
from gateway.app.config import Config
from gateway.cli.main import build_parser
from tests.support.procs import REPO, LedgeProcess
from tests.support.prometheus import metrics_text
from tests.support.wait import wait_for
from tests.test_option_bounds import _model_of

README = REPO / "README.md"
DOCS = REPO / "docs"


def _all_options(model: type[BaseModel], path: str = "") -> set[str]:
    """Every leaf option of the config model, dotted (``bridges.outbox.max_bytes``)."""
    found: set[str] = set()
    for name, info in model.model_fields.items():
        inner = _model_of(info.annotation)
        if inner is None:
            for arg in getattr(info.annotation, "__args__", ()):
                inner = inner or _model_of(arg)
        if inner is not None:
            found |= _all_options(inner, f"{path}{name}.")
        else:
            found.add(path + name)
    return found


def test_the_generated_files_are_current() -> None:
    stale = [str(p.relative_to(REPO)) for p in generate.stale()]
    assert not stale, f"out of date (run python -m docs.gen): {stale}"


def test_the_config_reference_has_every_option() -> None:
    options = _all_options(Config)
    assert {"broker.max_connecting_per_address", "bridges.outbox.max_bytes"} <= options
    page = (DOCS / "reference" / "configuration.md").read_text()
    shown = set(re.findall(r"^### `([^`]+)`$", page, re.M))
    assert options - shown == set(), "options missing from the reference"
    assert shown - options == set(), "the reference shows options the model has not"
    manual = man.ledge_toml_5()
    for name in options:
        assert f".B {man.esc(name.rsplit('.', 1)[-1])}\n" in manual


def test_config_descriptions_come_from_the_example() -> None:
    """An option's description is its own comment in ledge.example.toml, not its
    neighbour's, and reload notes are not part of it."""
    by_name = {(t.path, o.name): o for t in config.tables() for o in t.options}
    max_connections = by_name[("broker", "max_connections")]
    assert "CONNECT" in max_connections.description
    assert "reload:" not in max_connections.description
    assert max_connections.default == "1024" and max_connections.bounds
    keyfile, certfile = by_name[("listeners", "keyfile")], by_name[("listeners", "certfile")]
    assert keyfile.description == certfile.description != ""  # one comment for the pair
    described = sum(1 for o in by_name.values() if o.description)
    assert described >= 0.9 * len(by_name)


def test_the_metrics_reference_has_every_family_a_gateway_serves(tmp_path: Path) -> None:
    """A gateway with the HTTP listener, a bridge, a serial device, the firmware bridge
    and taps serves families; each of them is in the reference."""
    taps = tmp_path / "taps.py"
    taps.write_text("")
    toml = tmp_path / "ledge.toml"
    toml.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        '[gateway]\nid = "gw1"\n[http]\nenabled = true\nport = 0\n'
        f'[taps]\nmodule = "{taps}"\n'
        '[[serial]]\nname = "env"\npath = "/dev/null"\nprotocol = "kv"\n'
        "[[mqttsn.udp]]\nport = 0\n"
        '[[bridges]]\nname = "up"\naddress = "127.0.0.1:9"\n'
        '[[bridges.rules]]\nfilter = "a/#"\n'
    )
    ledge = LedgeProcess(config=toml).start(listeners=3)
    try:
        http = re.search(r"listening on [0-9.]+:(\d+) \(http\)", ledge.log)
        assert http is not None, ledge.log
        text = metrics_text(int(http.group(1)))
    finally:
        assert ledge.stop() == 0
    served = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert {"ledge_bridge_connected", "ledge_mqttsn_clients", "ledge_taps_waiting"} <= served
    documented = {m.name for m in metrics.metrics()}
    assert served - documented == set(), "families served but not in the reference"


def test_the_command_reference_has_every_command() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    names = [" ".join(path) for path, _ in cli.commands()]
    assert {"ledge run", "ledge bridge status", "ledge ble reset-counter"} <= set(names)
    for name in names:
        assert f"## `{name}`" in page
    manual = man.ledge_1()
    for name in names[1:]:
        assert f".SS {man.esc(name)}\n" in manual


@pytest.mark.parametrize("page", ["ledge.1", "ledge.toml.5"])
def test_the_man_pages_render(page: str) -> None:
    path = DOCS / "man" / page
    lint = subprocess.run(
        ["groff", "-man", "-ww", "-z", str(path)], capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0 and lint.stderr == "", lint.stderr
    shown = subprocess.run(
        ["man", "-l", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat"},
    )
    assert shown.returncode == 0, shown.stderr
    assert "NAME" in shown.stdout and "SEE ALSO" in shown.stdout
    if page == "ledge.1":
        assert "check-config" in shown.stdout and "SIGHUP" in shown.stdout
    else:
        assert "max_connecting_per_address" in shown.stdout


def test_the_manual_builds_strict(tmp_path: Path) -> None:
    """mkdocs fails on a broken link or anchor and on a page left out of the nav."""
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (site / "reference" / "configuration" / "index.html").exists()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    nav = set(
        re.findall(r"^\s*- (?:[^:\n]+: )?(\S+\.md)$", (REPO / "mkdocs.yml").read_text(), re.M)
    )
    assert pages == nav, f"not in the nav: {pages - nav}; missing: {nav - pages}"
    # Offline: no font or script is fetched from elsewhere.
    index = (site / "index.html").read_text()
    assert "fonts.googleapis" not in index and "fonts.gstatic" not in index


def test_the_readmes_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        assert (REPO / target).exists(), f"README links to {target}, which does not exist"


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 300


# ------------------------------------------------------------------ the README's commands


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", README.read_text(), re.M | re.S)


def _commands() -> list[list[str]]:
    """Each command line of the README's sh blocks, as words (comments, ``&`` and line
    continuations dropped)."""
    found = []
    for block in _blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[-1] == "&":
                words = words[:-1]
            if words:
                found.append(words)
    return found


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.M))


def _mosquitto_client(words: list[str], port: int) -> list[str]:
    return [*words, "-p", str(port)]


def test_the_readme_tour_runs_against_a_real_gateway(tmp_path: Path) -> None:
    """``scripts/run &`` is ``ledge run``; its subscriber receives what its publisher
    sends (on a free port instead of 1883: the only change)."""
    lines = [w for w in _commands() if w[0].startswith("mosquitto_")]
    assert [w[0] for w in lines] == ["mosquitto_sub", "mosquitto_pub"]
    if shutil.which("mosquitto_sub") is None:
        pytest.fail("mosquitto-clients is not installed (scripts/setup --test installs it)")
    ledge = LedgeProcess().start()
    sub = subprocess.Popen(
        [*_mosquitto_client(lines[0], ledge.port), "-C", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # The subscriber may not have subscribed yet: publish, as the README does, until
        # it has received one message (-C 1) and exited.
        def received() -> bool:
            subprocess.run(_mosquitto_client(lines[1], ledge.port), check=True, timeout=10)
            return sub.poll() is not None

        wait_for(received, 15, "the subscriber to receive")
        out, _ = sub.communicate(timeout=10)
    finally:
        sub.kill()
        sub.wait()
        assert ledge.stop() == 0
    assert out.strip() == "demo/hello world"


def test_the_readme_config_and_bridge_commands_run_as_written(tmp_path: Path) -> None:
    """The tour's TOML blocks, one after another, are its ``ledge.toml``; the
    ``ledge check-config`` and ``ledge bridge test`` lines run on it as written."""
    (tmp_path / "ledge.toml").write_text("\n".join(_blocks("toml")))
    ran = 0
    for words in _commands():
        if words[:2] in (["ledge", "check-config"], ["ledge", "bridge"]):
            out = subprocess.run(
                [sys.executable, "-m", "gateway", *words[1:]],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            assert out.returncode == 0, f"{shlex.join(words)}: {out.stdout}{out.stderr}"
            ran += 1
            if words[1] == "bridge":
                said = re.search(r"answers `([^`]+)`", README.read_text().replace("\n", " "))
                assert said is not None and said.group(1).replace("-> ", "->") in (
                    out.stdout.replace("\n", " ").replace("-> ", "->")
                )
    assert ran == 2


def test_every_readme_command_exists() -> None:
    """Every other line names a script of the repository, a Makefile target, or a
    ``ledge`` command line its parser accepts."""
    parser = build_parser()
    targets = _make_targets()
    for words in _commands():
        head = words[0]
        if head.startswith("scripts/"):
            assert os.access(REPO / head, os.X_OK), f"{head} is not an executable script"
        elif head == "make":
            assert set(words[1:]) <= targets, f"{shlex.join(words)}: no such target"
        elif head == "ledge":
            try:
                parser.parse_args(words[1:])
            except SystemExit as exc:
                pytest.fail(f"{shlex.join(words)}: refused by the parser ({exc})")
        else:
            assert head.startswith("mosquitto_"), f"README runs {head}: not checked here"


def test_the_image_build_installs_the_man_pages(tmp_path: Path) -> None:
    """The lines of image/build that install the man pages, run as the build runs them
    (with its ``repo`` and ``root``), put readable pages where ``man`` looks."""
    build = (REPO / "image" / "build").read_text()
    block = re.search(r"^# man pages: begin\n(.*?)^# man pages: end", build, re.M | re.S)
    assert block is not None, "image/build has no man pages block"
    root = tmp_path / "root"
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.group(1)],
        env={**os.environ, "repo": str(REPO), "root": str(root)},
        check=True,
    )
    for page, section in (("ledge.1", "man1"), ("ledge.toml.5", "man5")):
        installed = root / "usr" / "share" / "man" / section / f"{page}.gz"
        assert installed.stat().st_mode & 0o777 == 0o644
        shown = subprocess.run(
            ["man", "-l", str(installed)],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat"},
        )
        assert shown.returncode == 0 and "SEE ALSO" in shown.stdout, shown.stderr


def test_a_benchmark_run_is_recorded_as_data_and_shown(tmp_path: Path) -> None:
    """``bench.results.record`` keeps every run (a second run the same day gets a file
    of its own), ``load`` gives them back in time order, and a bad name is refused."""
    from datetime import UTC, datetime

    from bench.results import load, record

    day = datetime(2027, 1, 5, 9, tzinfo=UTC)
    rows = [{"lines": 999_991, "run_s": 20.5, "duckdb_s": 1.5, "load": "1/1"}]
    first = record("pipeline", rows, directory=tmp_path, when=day)
    later = day.replace(hour=10)
    second = record("pipeline", [{**rows[0], "run_s": 19.0}], directory=tmp_path, when=later)
    assert first != second and first.exists() and second.exists()
    runs = load("pipeline", tmp_path)
    assert [r["rows"][0]["run_s"] for r in runs] == [20.5, 19.0]
    with pytest.raises(ValueError, match="benchmark name"):
        record("../x", rows, directory=tmp_path)
    # The committed page shows the newest recorded run's figures.
    latest = load("pipeline")[-1]
    page = (DOCS / "reference" / "benchmark-results.md").read_text()
    assert f"({latest['file']})" in page.replace("`", "")


def test_the_benchmark_page_places_each_run_by_its_size_and_shows_its_ratios(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run's line count is near the bench's size, not equal to it (the generator drops
    lines a fleet's faults remove): it still lands in its size's column, and the latest
    run's table shows the reference and the ratios the pipeline issue's targets name."""
    from docs.gen import bench as B

    assert (B.size(999_992), B.size(249_980), B.size(3_999_795)) == (1_000_000, 250_000, 4_000_000)
    assert B.size(2_000_000) is None
    row = {
        "lines": 3_999_795, "run_s": 80.0, "reference_s": 100.0, "session_s": 8.0,
        "duckdb_s": 16.0, "load": "1.0/1.2",
    }  # fmt: skip
    runs = [
        {"when": "2027-01-05T09:00:00", "machine": "m", "commit": "c", "file": "f", "rows": [row]}
    ]
    monkeypatch.setattr(B, "load", lambda _name: runs)
    page = B.markdown()
    assert "| 3,999,795 | 80.0 s | 100.0 s | 8.0 s | 16.0 s | 0.80 | 5.0 | 18.0 | 1.0/1.2 |" in page
    assert "| 2027-01-05 09:00 | m | `c` |  |  | 80.0 (16.0) |" in page
