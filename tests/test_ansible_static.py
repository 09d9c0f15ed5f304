"""The Ansible role ``ledge`` without a gateway: syntax, lint, its argument specs, the
ledge.toml it renders (accepted by ``ledge check-config``), its health probe against a
real gateway. Every playbook here runs on the controller itself with
``connection: local`` and writes only under the test's tmp_path.

The role against a real gateway (the SD-card image booted in QEMU): test_ansible_vm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support import ansible
from tests.support.ansible import BIN, ROLE
from tests.support.procs import REPO, LedgeProcess, MosquittoProcess

PROBE = ROLE / "files" / "ledge_health.py"


def playbook(
    tmp_path: Path, plays: list[dict[str, object]], extra: dict[str, object], check: bool = False
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook on localhost (connection: local, this Python) with ``extra`` as
    extra variables; ``check``: in check mode (nothing changes). JSON is YAML."""
    book = tmp_path / "play.yml"
    book.write_text(json.dumps(plays))
    values = tmp_path / "values.yml"
    values.write_text(json.dumps({"ansible_python_interpreter": sys.executable, **extra}))
    args = ["-i", "localhost,", str(book), "-e", f"@{values}"]
    return ansible.run("ansible-playbook", [*args, "--check"] if check else args, tmp_path)


def test_the_playbook_passes_syntax_check(tmp_path: Path) -> None:
    done = ansible.run("ansible-playbook", ["--syntax-check", "site.yml"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_ansible_lint_production_profile_passes(tmp_path: Path) -> None:
    args = ["--offline", "--nocolor", "--profile", "production", "."]
    done = ansible.run("ansible-lint", args, tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Profile 'production' was required, and it passed" in done.stdout + done.stderr


ROLE_PLAY: dict[str, object] = {
    "hosts": "localhost",
    "connection": "local",
    "gather_facts": False,
    "roles": ["ledge"],
}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({}, "ledge_version"),  # required
        ({"ledge_version": "0.1.0", "ledge_listeners": "0.0.0.0:1883"}, "ledge_listeners"),
        ({"ledge_version": "0.1.0", "ledge_health_timeout": "soon"}, "ledge_health_timeout"),
        ({"ledge_version": "0.1.0", "ledge_log_level": "chatty"}, "ledge_log_level"),
    ],
)
def test_a_bad_variable_stops_the_role_before_any_task_naming_it(
    tmp_path: Path, values: dict[str, object], named: str
) -> None:
    # In check mode: should the role ever get past its argument check here, it changes
    # nothing on this machine.
    done = playbook(tmp_path, [ROLE_PLAY], values, check=True)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Validating arguments against arg spec" in out
    assert named in out.split("Validating arguments against arg spec", 1)[1]
    # The argument check is the only task that ran: nothing else was attempted.
    assert "ok=0" in out and "changed=0" in out, out


def render(tmp_path: Path, values: dict[str, object]) -> Path:
    """ledge.toml as the role's template renders it from the role defaults + values."""
    dest = tmp_path / "ledge.toml"
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml")],
        "tasks": [
            {
                "name": "render",
                "ansible.builtin.template": {
                    "src": str(ROLE / "templates" / "ledge.toml.j2"),
                    "dest": str(dest),
                    "mode": "0600",
                },
            }
        ],
    }
    done = playbook(tmp_path, [play], {"ledge_version": "0.1.0", **values})
    assert done.returncode == 0, done.stdout + done.stderr
    return dest


def test_the_rendered_config_is_what_the_variables_say_and_check_config_accepts_it(
    tmp_path: Path,
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not parsed by check-config; the bridge reads it at connect time\n")
    values: dict[str, object] = {
        "ledge_gateway_id": "gw-hall-1",
        "ledge_listeners": [{"host": "0.0.0.0", "port": 1883}, {"host": "::", "port": 1884}],
        "ledge_broker": {"max_inflight": 20, "deny_subscriptions": ["#", "$SYS/#"]},
        "ledge_bridges": [
            {
                "name": "cloud",
                "address": "mqtt.example.com:8883",
                "client_id": 'gw "hall" 1',  # quotes survive
                "tls": {"enabled": True, "ca_file": str(ca)},
                "rules": [
                    {"filter": "ledge/#", "remote_prefix": "site-a/"},
                    {"filter": "cmd/#", "direction": "in"},
                ],
            }
        ],
        "ledge_config_extra": {
            "store": {"durability": "process"},
            "gateway": {"health_interval": 5},
        },
        "ledge_log_level": "debug",
    }
    path = render(tmp_path, values)
    parsed = tomllib.loads(path.read_text())
    assert parsed == {
        "listeners": values["ledge_listeners"],
        "gateway": {"id": "gw-hall-1", "health_interval": 5},
        "log": {"level": "debug"},
        "broker": values["ledge_broker"],
        "bridges": values["ledge_bridges"],
        "store": {"durability": "process"},
    }
    done = subprocess.run(
        [str(BIN / "ledge"), "check-config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "2 listener(s)" in done.stdout


def test_password_and_acl_lines_point_auth_at_their_files(tmp_path: Path) -> None:
    path = render(
        tmp_path,
        {
            "ledge_auth": {"allow_anonymous": False},
            "ledge_password_lines": ["ops:$7$101$x$y"],
            "ledge_acl_lines": ["user ops", "topic readwrite #"],
        },
    )
    assert tomllib.loads(path.read_text())["auth"] == {
        "allow_anonymous": False,
        "password_file": "/etc/ledge/passwd",
        "acl_file": "/etc/ledge/acl",
    }


def test_the_role_installs_the_images_unit_and_user() -> None:
    """One source for the unit and the sysusers file: the role's files are links to
    the ones image/build installs."""
    for name in ("ledge.service", "ledge.sysusers"):
        role_file = ROLE / "files" / name
        assert role_file.is_symlink()
        assert role_file.resolve() == (REPO / "systemd" / name).resolve()
        assert f'"$repo/systemd/{name}"' in (REPO / "image" / "build").read_text()


# ---------------------------------------------------------------------- health probe


def probe(port: int, *bridges: str, timeout: float = 1.0) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(PROBE), "--port", str(port), "--timeout", str(timeout)]
    for bridge in bridges:
        argv += ["--bridge", bridge]
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)


def test_the_health_probe_wants_a_connack(ledge: LedgeProcess) -> None:
    assert probe(ledge.port).returncode == 0
    ledge.stop()
    gone = probe(ledge.port)
    assert gone.returncode == 1
    assert "nothing listens" in gone.stderr


def test_the_health_probe_waits_for_each_bridge_to_connect(
    tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text(
        "[[listeners]]\nport = 0\n[broker]\nsys_interval = 1\n"
        f'[[bridges]]\nname = "cloud"\naddress = "127.0.0.1:{mosquitto.port}"\n'
        '[[bridges.rules]]\nfilter = "plant/#"\n'
    )
    gateway = LedgeProcess(config=config, listen=False).start()
    try:
        assert probe(gateway.ports[0], "cloud", timeout=30).returncode == 0
        missing = probe(gateway.ports[0], "cloud", "elsewhere")
        assert missing.returncode == 1
        assert "bridge elsewhere is unknown" in missing.stderr
        mosquitto.stop()
        down = probe(gateway.ports[0], "cloud", timeout=10)
        assert down.returncode == 1
        assert "bridge cloud is" in down.stderr
    finally:
        gateway.stop()


def test_the_system_update_playbook_passes_syntax_check(tmp_path: Path) -> None:
    done = ansible.run("ansible-playbook", ["--syntax-check", "system-update.yml"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
