"""The pipeline's place in the layers (DESIGN.md): it imports only ``drivers.model`` from
the rest, its transforms are pure, and nothing on the gateway side imports it.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_layers import REPO, imports

#: What the pipeline may import from the repository (drivers.model re-exports the marks).
ALLOWED = {"drivers.model", "pipeline"}
IMPURE = {"asyncio", "socket", "time", "os", "subprocess", "threading", "pathlib", "logging"}


def test_nothing_on_the_gateway_side_imports_the_pipeline() -> None:
    problems = [
        f"{path.relative_to(REPO)} imports {module}"
        for folder in ("gateway", "drivers")
        for path in sorted((REPO / folder).rglob("*.py"))
        for module in imports(path)
        if module.split(".")[0] == "pipeline"
    ]
    assert not problems, "\n".join(problems)


def test_the_pipeline_imports_only_drivers_model_from_the_repository() -> None:
    problems = []
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        for module in imports(path):
            top = module.split(".")[0]
            if top in {"gateway", "drivers", "bench", "tests"} and module not in ALLOWED:
                problems.append(f"{path.relative_to(REPO)} imports {module}")
    assert not problems, "\n".join(problems)


def test_the_transforms_are_pure() -> None:
    paths = sorted((REPO / "pipeline/transforms").glob("*.py"))
    assert len(paths) >= 2
    problems = [
        f"{path.name} imports {module}"
        for path in paths
        for module in imports(path)
        if module.split(".")[0] in IMPURE
        or module.startswith(("pipeline.jobs", "pipeline.storage", "pipeline.landing"))
    ]
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_pipeline_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from pipeline.jobs import run\nimport gateway.app\n")
    assert {"pipeline.jobs", "gateway.app"} <= imports(bad)
