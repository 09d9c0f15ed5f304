"""``ledge check-config`` on the security options: every problem names its key path
and line, and files are read as the gateway will read them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bad_security_options_are_named_by_key_path_and_line(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("user a\ntopic red x\n")
    config = tmp_path / "ledge.toml"
    config.write_text(
        "[[listeners]]\nport = 1\n"
        f'[[listeners]]\nport = 2\ntype = "quic"\nacl_file = "{acl}"\n'
        '[[listeners]]\nport = 3\ntype = "tls"\n'
        "[[listeners]]\nport = 4\nrequire_certificate = true\n"
        "[auth]\nfailed_login_delay = -1\n"
    )
    out = check(config)
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    expected = [
        "listeners[1].type (line 5): Input should be 'tcp', 'tls', 'websocket' or",
        "listeners[1].acl_file (line 6): ",
        "listeners[2] (line 7): Value error, type 'tls' needs certfile and keyfile",
        "listeners[3] (line 10): Value error, require_certificate only apply",
        "auth.failed_login_delay (line 14): ",
    ]
    for want in expected:
        assert any(want in line for line in lines), (want, out.stderr)
    assert "line 2: unknown access 'red'" in out.stderr


def test_a_bad_password_file_line_is_skipped_and_named_but_not_the_hash(tmp_path: Path) -> None:
    """One bad line never refuses the file (a gateway must not stay down over a typo):
    check-config passes and names the line; the hash is not echoed."""
    pw = tmp_path / "pw"
    pw.write_text("# users\nalice:$7$101$c2FsdA==$not-a-hash\n")
    pw.chmod(0o600)
    config = tmp_path / "ledge.toml"
    config.write_text(f'[[listeners]]\nport = 1\npassword_file = "{pw}"\n')
    out = check(config)
    assert out.returncode == 0, out.stderr
    assert f"warning: password file {pw} line 2: user 'alice'" in out.stderr
    assert "line skipped" in out.stderr
    assert "not-a-hash" not in out.stderr  # a file's content is not echoed


def test_security_options_at_their_defaults_are_valid(tmp_path: Path) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text(
        '[[listeners]]\nport = 1883\n[[listeners]]\nport = 8080\ntype = "websocket"\n'
        'path = "/ws"\nmax_connections = 10\nallow_anonymous = true\n'
    )
    out = check(config)
    assert out.returncode == 0, out.stderr
    assert "127.0.0.1:8080 websocket" in out.stdout
