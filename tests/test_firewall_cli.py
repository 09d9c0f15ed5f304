"""``ledge firewall``: the nftables rules that open what a config listens on, checked by
the real ``nft`` against the SD-card image's ruleset (``image/rootfs/etc/nftables.conf``)
in a network namespace of their own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import REPO

CONFIG = """\
[[listeners]]
host = "0.0.0.0"
port = 2883

[[listeners]]
host = "127.0.0.1"
port = 1883

[[listeners]]
host = "::"
port = 8080
type = "websocket"

[[listeners]]
host = "192.168.7.2"
port = 8883

[[listeners]]
host = "0.0.0.0"
port = 0

[http]
enabled = true
host = "0.0.0.0"
port = 9883

[[mqttsn.udp]]
host = "0.0.0.0"
port = 1884
"""


def ledge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def rules(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("add rule ")]


def test_each_port_beyond_loopback_gets_one_rule(tmp_path: Path) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text(CONFIG)
    done = ledge("firewall", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2] == "flush chain inet filter ledge"
    ipv4 = "meta nfproto ipv4 "
    assert rules(done.stdout) == [
        f'add rule inet filter ledge {match} dport {port} accept comment "{what}"'
        for match, port, what in (
            (f"{ipv4}tcp", 2883, "listeners[0] (tcp) 0.0.0.0:2883"),
            ("tcp", 8080, "listeners[2] (websocket) [::]:8080"),
            ("ip daddr 192.168.7.2 tcp", 8883, "listeners[3] (tcp) 192.168.7.2:8883"),
            (f"{ipv4}tcp", 9883, "http 0.0.0.0:9883"),
            (f"{ipv4}udp", 1884, "mqttsn.udp[0] 0.0.0.0:1884"),
        )
    ]
    # Loopback needs no rule; port 0 cannot have one, and the user is told.
    assert "1883" not in "".join(rules(done.stdout))
    assert "listeners[4] (tcp) 0.0.0.0:0 listens on any free port" in done.stderr


def test_a_changed_port_changes_the_rule(tmp_path: Path) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text('[[listeners]]\nhost = "0.0.0.0"\nport = 1883\n')
    before = rules(ledge("firewall", "-c", str(config)).stdout)
    config.write_text('[[listeners]]\nhost = "0.0.0.0"\nport = 11883\n')
    after = rules(ledge("firewall", "-c", str(config)).stdout)
    assert [" dport 1883 " in r for r in before] == [True]
    assert [" dport 11883 " in r for r in after] == [True]


def test_the_default_config_opens_nothing() -> None:
    done = ledge("firewall")
    assert done.returncode == 0, done.stderr
    assert rules(done.stdout) == []


def test_an_invalid_config_prints_no_rules(tmp_path: Path) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text('[[listeners]]\nhost = "0.0.0.0"\nport = 70000\n')
    done = ledge("firewall", "-c", str(config))
    assert done.returncode == 2
    assert done.stdout == ""
    assert "listeners[0].port" in done.stderr


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft is not installed (scripts/setup)")
def test_nft_loads_the_rules_into_the_images_ruleset(tmp_path: Path) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text(CONFIG)
    generated = tmp_path / "firewall.nft"
    generated.write_text(ledge("firewall", "-c", str(config)).stdout)
    image_rules = (REPO / "image" / "rootfs" / "etc" / "nftables.conf").read_text()
    assert 'include "/etc/ledge/firewall.nft"' in image_rules
    ruleset = tmp_path / "nftables.conf"
    ruleset.write_text(image_rules.replace("/etc/ledge/firewall.nft", str(generated)))
    # Loaded twice, as at a restart: the chain holds the rules once.
    script = f"nft -f {ruleset} && nft -f {ruleset} && nft list chain inet filter ledge"
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    listed = [line.strip() for line in done.stdout.splitlines() if "accept" in line]
    assert len(listed) == 5
    assert any(line.startswith("ip daddr 192.168.7.2 tcp dport 8883 accept") for line in listed)
