"""The import direction between layers (DESIGN.md): pure layers stay pure.

Walks every module's imports (with ``ast``, without importing anything) and fails
when a pure layer imports I/O or clock modules, a third-party package, or a layer
to its right.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Layers left to right; a layer may import only itself and layers to its left.
ORDER = [
    "gateway.mqtt",
    "gateway.broker",
    "gateway.mqttsn",
    "gateway.store",
    "gateway.net",
    "gateway.bridge",
    "gateway.app",
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
        return "gateway.app"  # gateway.cli, gateway.config, gateway.app
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
    "drivers/lines.py",
    "drivers/mapping.py",
    "drivers/model.py",
    "drivers/homeassistant.py",
]
#: The one third-party package a pure driver module may use (for the Reading contract).
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
MQTTSN_CODEC = ["packets.py", "codec.py", "uart.py"]


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


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The walker itself must catch an import (so the tests above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom gateway.net import server\n")
    found = imports(bad)
    assert "socket" in found and "gateway.net" in found
