"""``python -m bench.mutate``: what each scope's mutmut config says, and how the report
counts a sampled run (only the drawn mutants, with the score's 95 % interval)."""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from bench import mutate


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(mutate, "WORK", tmp_path)
    monkeypatch.setattr(mutate, "import_time", lambda package: set())
    return tmp_path


def _meta(work: Path, scope: str, file: str, codes: dict[str, int | None]) -> None:
    path = work / scope / "mutants" / (file + ".meta")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes}))


def test_a_scope_leaves_out_what_another_judges_and_its_deselected_tests(work: Path) -> None:
    """Without these a broker run mutates the config scope's settings again and runs the
    store's 21 s watermark test for every surviving mutant of a hot function: hours."""
    where = mutate._copy("broker", mutate.SCOPES["broker"])
    config = tomllib.loads((where / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert config["only_mutate"] == ["gateway/broker/*"]
    assert config["do_not_mutate"] == ["gateway/broker/settings.py"]
    args = config["pytest_add_cli_args"]
    deselected = [args[i + 1] for i, arg in enumerate(args) if arg == "--deselect"]
    assert deselected == list(mutate.SCOPES["broker"].deselect)
    assert all(
        test.split("::")[0] in config["pytest_add_cli_args_test_selection"] for test in deselected
    )
    # Every file the config scope judges is left out wherever another scope's glob
    # takes it in, and each scope's deselected tests name tests of its own list.
    for name, scope in mutate.SCOPES.items():
        for path in scope.elsewhere:
            assert path in mutate.SCOPES["config"].mutate, name
        for test in scope.deselect:
            assert test.split("::")[0] in scope.tests, name


def test_the_report_counts_only_the_drawn_mutants_of_a_sampled_run(work: Path) -> None:
    """An earlier full run's verdicts on mutants not drawn would bias the sample."""
    _meta(
        work,
        "store",
        "gateway/store/sqlite.py",
        {"a__mutmut_1": 1, "a__mutmut_2": 0, "a__mutmut_3": 1, "a__mutmut_4": 0},
    )
    _meta(work, "store", "gateway/store/settings.py", {"s__mutmut_1": 0})  # config's
    scores, survivors = mutate.results("store")
    assert [s.module for s in scores] == ["gateway/store/sqlite.py", "**store**"]
    assert scores[-1].counts == Counter({"killed": 2, "survived": 2})
    assert survivors == {"gateway/store/sqlite.py": ["a__mutmut_2", "a__mutmut_4"]}
    (work / "store" / "sample.txt").write_text("a__mutmut_1\na__mutmut_2\na__mutmut_3\n")
    scores, survivors = mutate.results("store")
    assert scores[-1].counts == Counter({"killed": 2, "survived": 1})
    assert survivors == {"gateway/store/sqlite.py": ["a__mutmut_2"]}
    assert "| 66.7% ± 53.3% |" in mutate.report(["store"], diffs=False)


def test_a_sampled_score_comes_with_its_95_percent_interval() -> None:
    """A score from 400 mutants drawn is 90 % give or take 2.9 points, and says so."""
    assert mutate.Score("x", Counter(killed=360, survived=40)).margin == pytest.approx(
        1.96 * (0.9 * 0.1 / 400) ** 0.5
    )
    assert mutate.Score("x", Counter()).margin == 0.0


def test_generated_skips_files_judged_elsewhere(work: Path) -> None:
    """A sample of the broker must not draw the broker's settings (the config scope's)."""
    _meta(work, "broker", "gateway/broker/core.py", {"c__mutmut_1": None, "c__mutmut_2": 1})
    _meta(work, "broker", "gateway/broker/settings.py", {"s__mutmut_1": None})
    assert mutate._generated("broker") == ["c__mutmut_1", "c__mutmut_2"]
