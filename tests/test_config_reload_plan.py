"""``ledge check-config NEW --against OLD``: whether SIGHUP is enough for a new config.

The answer comes from the ``reload=`` marks on the option declarations in
gateway/app/config.py (the same marks the running gateway's reload follows), so these tests
compare against those marks rather than a list of their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.app.config import (
    AuthConfig,
    BridgeConfig,
    BridgeRuleConfig,
    BridgeTlsConfig,
    BrokerConfig,
    Change,
    Config,
    HTTPConfig,
    ListenerConfig,
    OutboxConfig,
    config_changes,
    parse_config,
    reloadable_fields,
)
from tests.support.procs import REPO

BASE = """\
[[listeners]]
host = "127.0.0.1"
port = 1883

[broker]
max_inflight = 10

[gateway]
id = "gw-1"
"""

BRIDGE = """
[[bridges]]
name = "cloud"
address = "cloud.example:1883"
[[bridges.rules]]
filter = "plant/#"
"""


def changes(old: str, new: str) -> list[Change]:
    return config_changes(parse_config(old), parse_config(new))


def test_the_same_options_written_differently_are_unchanged() -> None:
    reordered = (
        '# comment\n[gateway]\nid="gw-1"\n[broker]\nmax_inflight=10\n[[listeners]]\nport=1883\n'
    )
    assert changes(BASE, reordered) == []


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            BASE,
            BASE.replace("max_inflight = 10", "max_inflight = 20"),
            [("broker.max_inflight", True)],
        ),
        (BASE, BASE + '[log]\nlevel = "debug"\n', [("log.level", True)]),
        (BASE, BASE + "[auth]\nallow_anonymous = false\n", [("auth.allow_anonymous", True)]),
        (
            BASE,
            BASE.replace("port = 1883", "port = 1883\nmax_connections = 5"),
            [("listeners[0].max_connections", True)],
        ),
        (BASE, BASE.replace("port = 1883", "port = 1884"), [("listeners[0].port", False)]),
        (BASE, BASE.replace('id = "gw-1"', 'id = "gw-2"'), [("gateway.id", False)]),
        (
            BASE,
            BASE.replace("[broker]", "[broker]\nmax_connections = 9"),
            [("broker.max_connections", False)],
        ),
        # A listener more or fewer: the list itself changed.
        (BASE, BASE + "[[listeners]]\nport = 1884\n", [("listeners", False)]),
        # Bridges come, go and change on SIGHUP, every option of them.
        (BASE, BASE + BRIDGE, [("bridges", True)]),
        (BASE + BRIDGE, BASE, [("bridges", True)]),
        (
            BASE + BRIDGE,
            (BASE + BRIDGE).replace("cloud.example:1883", "cloud.example:1884"),
            [("bridges[0].address", True)],
        ),
        (
            BASE + BRIDGE,
            BASE + BRIDGE + "[bridges.tls]\ninsecure = true\n",
            [("bridges[0].tls.insecure", True)],
        ),
        (
            BASE + BRIDGE,
            BASE + BRIDGE + "[bridges.outbox]\nmax_bytes = 4096\n",
            [("bridges[0].outbox.max_bytes", True)],
        ),
        (
            BASE + BRIDGE,
            (BASE + BRIDGE).replace('filter = "plant/#"', 'filter = "hall/#"'),
            [("bridges[0].rules[0].filter", True)],
        ),
        (
            BASE + BRIDGE,
            BASE + BRIDGE + '[[bridges.rules]]\nfilter = "hall/#"\n',
            [("bridges[0].rules", True)],
        ),
        # So does the HTTP listener, as a whole or option by option.
        (BASE, BASE + "[http]\nenabled = true\n", [("http", True)]),
        (
            BASE + "[http]\nenabled = true\n",
            BASE + "[http]\nenabled = true\nport = 9\n",
            [("http.port", True)],
        ),
        (
            BASE + "[http]\nenabled = true\n",
            BASE + "[http]\nenabled = false\nmax_connections = 4\n",
            [("http.enabled", True), ("http.max_connections", True)],
        ),
        # A table present in both is still compared option by option.
        (BASE, BASE + '[store]\ndurability = "process"\n', [("store.durability", False)]),
    ],
)
def test_each_changed_option_is_named_with_its_reload_mark(
    old: str, new: str, expected: list[tuple[str, bool]]
) -> None:
    assert [(c.path, c.reloadable) for c in changes(old, new)] == expected


def _changed(value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    return None


@pytest.mark.parametrize(
    ("model", "section", "base"),
    [
        (BrokerConfig, "broker", BASE),
        (AuthConfig, "auth", BASE),
        (ListenerConfig, "listeners[0]", BASE),
        (BridgeConfig, "bridges[0]", BASE + BRIDGE),
        (HTTPConfig, "http", BASE + "[http]\nenabled = true\n"),
    ],
)
def test_the_verdict_follows_every_declared_mark(
    model: type[BaseModel], section: str, base: str
) -> None:
    """Each number or switch of the section, changed alone, reloads exactly when its
    declaration says ``reload=True``."""
    old = parse_config(base)
    marks = reloadable_fields(model)
    table, _, index = section.partition("[")
    tried = 0
    for name, mark in marks.items():
        current = getattr(old, table)
        if index:
            current = current[0]
        new_value = _changed(getattr(current, name))
        if new_value is None:
            continue
        try:
            changed = current.model_validate({**current.model_dump(), name: new_value})
        except ValueError:
            continue  # a value this option does not take alone
        new = old.model_copy(update={table: [changed] if index else changed})
        assert config_changes(old, new) == [Change(f"{section}.{name}", mark)], name
        tried += 1
    assert tried >= 2


@pytest.mark.parametrize(
    "model", [BridgeConfig, BridgeRuleConfig, BridgeTlsConfig, OutboxConfig, HTTPConfig]
)
def test_every_bridge_and_http_option_is_reloadable(model: type[BaseModel]) -> None:
    """SIGHUP adds, removes and changes bridges and the HTTP listener, whatever changed."""
    assert {name for name, mark in reloadable_fields(model).items() if not mark} == set()


def test_bridges_and_http_may_come_and_go_on_reload() -> None:
    marks = reloadable_fields(Config)
    assert marks["bridges"] and marks["http"]
    assert not marks["data_dir"] and not marks["serial"]


def ledge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )


def test_check_config_against_says_reload_restart_or_unchanged(tmp_path: Path) -> None:
    old = tmp_path / "old.toml"
    old.write_text(BASE)
    reload = tmp_path / "reload.toml"
    reload.write_text(BASE.replace("max_inflight = 10", "max_inflight = 20"))
    restart = tmp_path / "restart.toml"
    restart.write_text(
        BASE.replace("max_inflight = 10", "max_inflight = 20").replace("1883", "1884")
    )

    def verdict(new: Path, against: Path) -> str:
        done = ledge(str(new), "--against", str(against))
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()[-1]

    assert verdict(old, old).startswith("unchanged:")
    assert verdict(reload, old) == "reload: SIGHUP applies every change: broker.max_inflight"
    assert verdict(restart, old) == (
        "restart: needed for listeners[0].port; reloadable: broker.max_inflight"
    )
    # Bridges and the HTTP listener: SIGHUP is enough, whatever changed in them.
    running = tmp_path / "running.toml"
    running.write_text(BASE + BRIDGE + "[http]\nenabled = true\n")
    moved = tmp_path / "moved.toml"
    moved.write_text(
        (BASE + BRIDGE).replace("cloud.example:1883", "backup.example:1883")
        + "[bridges.tls]\nenabled = true\n"
        + "[http]\nenabled = true\nport = 9884\n"
    )
    assert verdict(moved, running) == (
        "reload: SIGHUP applies every change: bridges[0].tls.enabled, bridges[0].address, http.port"
    )
    assert verdict(old, running) == "reload: SIGHUP applies every change: bridges, http"
    # No previous config (a first install): a start is needed, not a reload.
    assert verdict(old, tmp_path / "missing.toml").startswith("restart:")


def test_check_config_against_refuses_a_broken_new_file(tmp_path: Path) -> None:
    old = tmp_path / "old.toml"
    old.write_text(BASE)
    broken = tmp_path / "new.toml"
    broken.write_text(BASE.replace("port = 1883", "port = 70000"))
    done = ledge(str(broken), "--against", str(old))
    assert done.returncode == 2
    assert "listeners[0].port (line 3)" in done.stderr
    assert "reload" not in done.stdout and "restart" not in done.stdout
