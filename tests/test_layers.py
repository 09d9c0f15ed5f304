"""The import direction between layers (DESIGN.md): pure layers stay pure, and no
modules import each other in a circle.

Walks every module's imports (with ``ast``, without importing anything) and fails
when a pure layer imports I/O or clock modules, a third-party package, or a layer
to its right, or when the import graph of ``gateway/`` has a circle -- counting every
import, also those inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Layers left to right; a layer may import only itself and layers to its left.
#: ``gateway.sensors`` is the driver glue the composition root (``gateway.app``) starts;
#: ``gateway.cli`` is the ``ledge`` command, which only the ``python -m gateway``
#: entry point imports.
ORDER = [
    "gateway.mqtt",
    "gateway.broker",
    "gateway.mqttsn",
    "gateway.store",
    "gateway.net",
    "gateway.bridge",
    "gateway.sensors",
    "gateway.app",
    "gateway.cli",
]
PURE = {"gateway.mqtt", "gateway.broker", "gateway.mqttsn"}
IMPURE_MODULES = {"asyncio", "socket", "time", "selectors", "ssl", "threading", "subprocess"}


def modules_of(package: str) -> list[Path]:
    return sorted((REPO / package.replace(".", "/")).rglob("*.py"))


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    parts = path.with_suffix("").parts
    package = (
        ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
        if path.is_relative_to(REPO)
        else parts[-2]
    )
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
    return found


def layer_of(module: str) -> str | None:
    for layer in ORDER:
        if module == layer or module.startswith(layer + "."):
            return layer
    if module.split(".", maxsplit=1)[0] == "gateway":
        # gateway.metrics, gateway.taps and the package itself: parts the composition
        # root wires up, so they count as its layer (the left layers may not import them).
        return "gateway.app"
    return None


@pytest.mark.parametrize("layer", sorted(PURE))
def test_pure_layers_import_only_stdlib_and_their_left(layer: str) -> None:
    allowed = set(ORDER[: ORDER.index(layer) + 1])
    problems = []
    for path in modules_of(layer):
        for module in imports(path):
            top = module.split(".")[0]
            if top in IMPURE_MODULES:
                problems.append(f"{path.name} imports {module} (I/O or clock in a pure layer)")
            elif top == "gateway":
                target = layer_of(module)
                if module != "gateway" and target not in allowed:
                    problems.append(f"{path.name} imports {module} (layer to the right)")
            elif top not in sys.stdlib_module_names and top != "__future__":
                problems.append(f"{path.name} imports third-party {module}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("layer", ORDER[:-1])
def test_no_layer_imports_to_its_right(layer: str) -> None:
    allowed = set(ORDER[: ORDER.index(layer) + 1])
    for path in modules_of(layer):
        for module in imports(path):
            target = layer_of(module)
            if target is not None and module != "gateway":
                assert target in allowed, f"{path} imports {module}"


#: Driver modules that must stay pure: bytes in, readings out, no I/O and no clock.
PURE_DRIVERS = [
    "drivers/envelope.py",
    "drivers/parsers",
    "drivers/ble/tracker.py",
    "drivers/ble/policy.py",
    "drivers/ble/watchdog.py",
    "drivers/lines.py",
    "drivers/mapping.py",
    "drivers/model.py",
    "drivers/homeassistant.py",
]
#: The third-party packages a pure driver module may use: pydantic for the Reading
#: contract.
DRIVER_THIRD_PARTY = {"pydantic"}


def test_drivers_never_import_the_gateway() -> None:
    """Drivers are reusable on their own (and by the pipeline): the gateway imports them."""
    problems = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in sorted((REPO / "drivers").rglob("*.py"))
        for module in imports(path)
        if module.split(".")[0] == "gateway"
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("where", PURE_DRIVERS)
def test_driver_parsers_are_pure(where: str) -> None:
    target = REPO / where
    paths = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    assert paths
    problems = []
    for path in paths:
        for module in imports(path):
            top = module.split(".")[0]
            if top in IMPURE_MODULES or top in {"serial", "os", "logging"}:
                problems.append(f"{path.name} imports {module} (I/O or clock in a parser)")
            elif top == "drivers":
                if module == "drivers.serial" or module.startswith("drivers.serial."):
                    problems.append(f"{path.name} imports {module} (a transport)")
            elif (
                top not in sys.stdlib_module_names
                and top != "__future__"
                and top not in DRIVER_THIRD_PARTY
            ):
                problems.append(f"{path.name} imports third-party {module}")
    assert not problems, "\n".join(problems)


def test_the_gateway_reads_upstream_marks_without_pydantic() -> None:
    """The bridge imports drivers.envelope; the gateway process must not load pydantic."""
    found = imports(REPO / "drivers/envelope.py")
    assert all(m.split(".")[0] in sys.stdlib_module_names | {"__future__"} for m in found)


#: The bridge's pure parts: topic rules, the outbox, sequence numbers, settings.
PURE_BRIDGE = ["rules.py", "outbox.py", "sequence.py", "settings.py"]


@pytest.mark.parametrize("name", PURE_BRIDGE)
def test_the_bridges_decisions_are_pure(name: str) -> None:
    allowed = {"gateway.mqtt", "gateway.broker", "gateway.store", "gateway.bridge"}
    problems = []
    for module in imports(REPO / "gateway/bridge" / name):
        top = module.split(".")[0]
        if top in IMPURE_MODULES:
            problems.append(f"imports {module} (I/O or clock)")
        elif top == "gateway":
            if layer_of(module) not in allowed or module == "gateway.store.sqlite":
                problems.append(f"imports {module}")
        elif top not in sys.stdlib_module_names and top != "__future__":
            problems.append(f"imports third-party {module}")
    assert not problems, "\n".join(problems)


#: The MQTT-SN codec: bytes only, nothing of the broker (the MicroPython client mirrors it).
MQTTSN_CODEC = ["packets.py", "codec.py", "encoding.py", "uart.py"]


@pytest.mark.parametrize("name", MQTTSN_CODEC)
def test_the_mqttsn_codec_imports_only_the_standard_library(name: str) -> None:
    problems = []
    for module in imports(REPO / "gateway/mqttsn" / name):
        top = module.split(".")[0]
        if top in IMPURE_MODULES or top == "logging":
            problems.append(f"imports {module} (I/O, clock or logging in the codec)")
        elif top == "gateway" and not module.startswith("gateway.mqttsn."):
            problems.append(f"imports {module}")
        elif top not in sys.stdlib_module_names and top not in ("__future__", "gateway"):
            problems.append(f"imports third-party {module}")
    assert not problems, "\n".join(problems)


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (``from pkg import mod`` counts
    as importing ``pkg.mod``), for every ``.py`` file under ``root / package``."""
    modules: dict[str, Path] = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    module = ".".join([*base, node.module] if node.module else base)
                else:
                    module = node.module or ""
                for alias in node.names:
                    if f"{module}.{alias.name}" in modules:
                        found.add(f"{module}.{alias.name}")
                    elif module in modules:
                        found.add(module)
        found.discard(name)
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", ["gateway", "drivers"])
def test_no_modules_import_each_other_in_a_circle(package: str) -> None:
    graph = module_graph(REPO, package)
    assert len(graph) > 10
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_sees_a_circle_through_a_type_checking_import(tmp_path: Path) -> None:
    """Planted: a <- b <- c <- a, the last edge only under TYPE_CHECKING, plus a module
    outside the circle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text("from pkg import c\nx = 1\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import y\n"
    )
    (pkg / "d.py").write_text("from . import a\n")
    graph = module_graph(tmp_path, "pkg")
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The walker itself must catch an import (so the tests above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom gateway.net import server\n")
    found = imports(bad)
    assert "socket" in found and "gateway.net" in found


#: Values in, text out: the metrics view and the status page (which may read each
#: other), and the health verdict ``ledge health`` and updates share (the standard
#: library only: it lives beside the command, outside ``gateway.metrics``, which a
#: gateway without ``[http]`` never loads).
PURE_VIEWS = {
    "gateway/metrics/view.py": "gateway.metrics",
    "gateway/metrics/page.py": "gateway.metrics",
    "gateway/cli/verdict.py": "gateway.cli.verdict",
}


@pytest.mark.parametrize("path", sorted(PURE_VIEWS))
def test_the_views_and_the_verdict_are_pure(path: str) -> None:
    own = PURE_VIEWS[path]
    problems = []
    for module in imports(REPO / path):
        top = module.split(".")[0]
        if top in IMPURE_MODULES or top in {"os", "logging"}:
            problems.append(f"imports {module} (I/O or clock)")
        elif top == "gateway" and not module.startswith(own):
            problems.append(f"imports {module} (it reads values, not the gateway)")
        elif top not in sys.stdlib_module_names and top not in {"__future__", "gateway"}:
            problems.append(f"imports third-party {module}")
    assert not problems, "\n".join(problems)
