"""Acknowledged means durable: real clients, a real store, ``kill -9`` and restart."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import crash
from tests.support.clients import Paho
from tests.support.procs import REPO, LedgeProcess, free_port


def restartable(tmp_path: Path, port: int, extra: str = "") -> tuple[LedgeProcess, Path, Path]:
    data = tmp_path / "data"
    config = tmp_path / "ledge.toml"
    config.write_text(extra)
    proc = LedgeProcess("--data-dir", str(data), config=config, port=port).start()
    return proc, data, config


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_queued_messages_and_retained_survive_kill_9(tmp_path: Path, version: int) -> None:
    port = free_port()
    proc, data, config = restartable(tmp_path, port)
    sub = Paho(port, "durable-sub", version)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe("d/#", 2)
    sub.disconnect()
    pub = Paho(port, "durable-pub", version).connect()
    for i in range(30):
        pub.publish("d/x", b"%d" % i, 1 + i % 2)  # waits for PUBACK / PUBCOMP
    pub.publish("state/r", b"retained", 1, retain=True)
    pub.disconnect()
    proc.kill()
    proc = LedgeProcess("--data-dir", str(data), config=config, port=port).start()
    try:
        assert proc.wait_log(r"restored 1 session")
        sub.connect(clean=False, session_expiry=3600)
        assert sub.session_present
        got = [int(m.payload) for m in sub.wait_messages(30)]
        assert sorted(got) == list(range(30))
        # In order per QoS (a QoS 2 message reaches the application at PUBREL, so QoS 1
        # and QoS 2 interleave differently at the client).
        assert [i for i in got if i % 2 == 0] == list(range(0, 30, 2))
        assert [i for i in got if i % 2 == 1] == list(range(1, 30, 2))
        watcher = Paho(port, "durable-watcher", version).connect()
        watcher.subscribe("state/#", 1)
        [ret] = watcher.wait_messages(1)
        assert (ret.payload, ret.retain) == (b"retained", True)
        sub.disconnect()
        watcher.disconnect()
    finally:
        assert proc.stop() == 0


def test_crash_harness_acknowledged_messages_reach_every_persistent_subscriber(
    tmp_path: Path,
) -> None:
    """SIGKILL at random moments under QoS 1/2 load: nothing acknowledged is lost, QoS 2
    is exactly once, order per publisher holds. (``make crash-test`` runs it longer.)"""
    report = crash.run(iterations=8, directory=tmp_path, seed=7)
    assert report.acknowledged > 1000, report
    assert report.problems == [], report.problems[:20]
    assert report.checked == 3 * report.acknowledged


def test_store_is_closed_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc, data, _config = restartable(tmp_path, port)
    c = Paho(port, "clean-close", 5)
    c.connect(clean=False, session_expiry=3600)
    c.subscribe("x", 1)
    c.disconnect()
    assert proc.stop() == 0
    assert not (data / "ledge.db-wal").exists() or (data / "ledge.db-wal").stat().st_size == 0
    db = sqlite3.connect(data / "ledge.db")
    assert db.execute("SELECT client_id FROM sessions").fetchall() == [("clean-close",)]
    db.close()


def test_corrupt_store_refuses_to_start_with_the_way_out(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "ledge.db").write_bytes(b"\x00garbage" * 512)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "run",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 2
    assert str(data / "ledge.db") in out.stderr
    assert "Move it aside" in out.stderr and "on_corrupt" in out.stderr


def test_corrupt_store_moved_aside_loudly_when_configured(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "ledge.db").write_bytes(b"\x00garbage" * 512)
    config = tmp_path / "c.toml"
    config.write_text('[store]\non_corrupt = "move-aside"\n')
    proc = LedgeProcess("--data-dir", str(data), config=config).start()
    try:
        line = proc.wait_log(r"ERROR ledge.store: store .* is unreadable")
        assert "moved aside" in line
        assert list(data.glob("ledge.db.corrupt-*"))
    finally:
        assert proc.stop() == 0


def test_full_store_refuses_qos1_for_persistent_sessions_and_serves_the_rest(
    tmp_path: Path,
) -> None:
    port = free_port()
    proc, _data, _config = restartable(tmp_path, port, "[store]\nmax_bytes = 200000\n")
    try:
        sub = Paho(port, "full-sub", 5)
        sub.connect(clean=False, session_expiry=3600)
        sub.subscribe("full/#", 1)
        sub.disconnect()  # offline: everything for it must be stored
        live = Paho(port, "full-live", 5).connect()
        live.subscribe("other/#", 1)
        pub = Paho(port, "full-pub", 5).connect()
        codes: list[int] = []
        for _ in range(400):
            codes.append(pub.publish_code("full/x", b"p" * 1000, 1))
            if codes[-1] == 0x97:
                break
        assert codes[0] == 0x00  # accepted and stored while there was room
        assert codes[-1] == 0x97  # then refused: quota exceeded
        proc.wait_log(r"store nearly full .* refusing QoS 1/2 messages for persistent")
        stored = codes.count(0)
        pub.publish("other/y", b"still flowing", 1)
        assert [m.payload for m in live.wait_messages(1)] == [b"still flowing"]
        sub.connect(clean=False, session_expiry=3600)
        assert len(sub.wait_messages(stored)) == stored  # every accepted one is there
        for c in (live, pub, sub):
            c.disconnect()
    finally:
        assert proc.stop() == 0
