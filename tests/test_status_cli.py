"""``ledge status [--watch]`` against a running gateway: the summary, JSON, the
config's token used by itself, HTTPS with the gateway's own certificate, and clear
errors when it cannot read the status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.certs import make_certs
from tests.support.clients import Paho
from tests.support.procs import REPO, LedgeProcess, free_port
from tests.support.wait import wait_for


def ledge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def gateway_config(tmp_path: Path, http: str) -> Path:
    config = tmp_path / "ledge.toml"
    config.write_text(
        f'[gateway]\nid = "gw1"\n[http]\nenabled = true\nport = {free_port()}\n{http}'
    )
    return config


def test_status_prints_the_summary_and_json(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("status-token-0123456789\n")
    token.chmod(0o600)
    config = gateway_config(tmp_path, f'token_file = "{token}"\n')
    proc = LedgeProcess(config=config).start(listeners=2)
    client = Paho(proc.port, "watched", version=4).connect()
    try:
        out = ledge("status", "-c", str(config))  # the token comes from the config
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("gateway gw1 (ledge ")
        assert "1 connected (peak 1)" in out.stdout
        assert "clients: 1 on 3.1.1" in out.stdout
        doc = json.loads(ledge("status", "-c", str(config), "--json").stdout)
        assert doc["clients"]["connected"] == 1
        url = f"http://127.0.0.1:{proc.ports[1]}"
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token-at-all\n")
        refused = ledge("status", "--url", url, "--token-file", str(wrong))
        assert refused.returncode == 1
        assert "HTTP 401" in refused.stderr and "--token-file" in refused.stderr
    finally:
        client.disconnect()
        assert proc.stop() == 0
    gone = ledge("status", "-c", str(config))
    assert gone.returncode == 1 and "is the gateway running?" in gone.stderr


def _as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_status_watch_prints_frames_until_interrupted(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, "")
    proc = LedgeProcess(config=config).start(listeners=2)
    try:
        watch = subprocess.Popen(
            [sys.executable, "-m", "gateway", "status", "-c", str(config), "--watch", "0.2"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            # As from a terminal: SIGINT handled by default and not blocked. A child
            # inherits its parent's ignored and blocked signals across exec, and a test
            # process that ran other tests in-process may have either (the watch then
            # never saw the SIGINT, now and then).
            preexec_fn=_as_from_a_terminal,  # noqa: PLW1509  (two system calls, no locks)
        )
        frames: list[str] = []

        def read() -> None:
            assert watch.stdout is not None
            for line in watch.stdout:
                if line.startswith("\x1b[H\x1b[2Jgateway gw1"):
                    frames.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: len(frames) >= 3, 15, "three frames")
        watch.send_signal(signal.SIGINT)
        assert watch.wait(30) == 0
        reader.join(5)
        assert watch.stdout is not None
        watch.stdout.close()
    finally:
        assert proc.stop() == 0


def test_status_over_https_trusts_the_gateways_own_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    config = gateway_config(
        tmp_path, f'certfile = "{certs.server_cert}"\nkeyfile = "{certs.server_key}"\n'
    )
    proc = LedgeProcess(config=config).start(listeners=2)
    try:
        out = ledge("status", "-c", str(config))
        assert out.returncode == 0, out.stderr
        assert "gateway gw1" in out.stdout
        # Without the config, the certificate is checked against the CA given.
        url = f"https://localhost:{proc.ports[1]}"
        assert ledge("status", "--url", url, "--cafile", str(certs.ca)).returncode == 0
        untrusted = ledge("status", "--url", url)
        assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    finally:
        assert proc.stop() == 0


def test_status_explains_what_is_missing(tmp_path: Path) -> None:
    off = ledge("status")
    assert off.returncode == 2
    assert "[http] enabled = true" in off.stderr
    out = ledge("status", "--url", "http://127.0.0.1:9", "--user", "u", "--password-env", "NOPE")
    assert out.returncode == 2 and "NOPE is not set" in out.stderr
    env = dict(os.environ, PW="x")
    unreachable = ledge(
        "status", "--url", f"http://127.0.0.1:{free_port()}", "--user", "u", "--password-env", "PW",
        env=env,
    )  # fmt: skip
    assert unreachable.returncode == 1 and "cannot read" in unreachable.stderr
