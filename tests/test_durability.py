"""Acknowledged means durable: real clients, a real store, ``kill -9`` and restart."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    ConnAck,
    Connect,
    Disconnect,
    PubAck,
    Publish,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from tests.support import crash
from tests.support.clients import Paho
from tests.support.procs import REPO, LedgeProcess, free_port
from tests.support.raw import Raw
from tests.support.wait import wait_for


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


# --------------------------------------------------------------------------- a small disk

TMPFS_MIB = 64
MIB = 1024 * 1024


def on_small_disk(tmp_path: Path) -> tuple[LedgeProcess, Path]:
    """Ledge with its data directory on a 64 MiB tmpfs of its own: a private mount
    namespace (util-linux's unshare; a user namespace, so no privilege is needed)
    mounts it, then execs the gateway. The test reaches the disk through
    /proc/PID/root, which sees the gateway's mounts."""
    data = tmp_path / "data"
    data.mkdir()
    script = f'mount -t tmpfs -o size={TMPFS_MIB}m ledge-test "{data}" && exec "$@"'
    proc = LedgeProcess(
        "--data-dir", str(data), wrapper=("unshare", "-rm", "sh", "-c", script, "sh")
    ).start()
    assert proc.proc is not None
    disk = Path(f"/proc/{proc.proc.pid}/root") / str(data).lstrip("/")
    assert (disk / "ledge.db").exists()
    return proc, disk


def fill_to(disk: Path, free_mib: float) -> None:
    """Grow or shrink the filler file so that ``free_mib`` MiB stay free on ``disk``."""
    filler = disk / "filler"
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    size = filler.stat().st_size if filler.exists() else 0
    with open(filler, "ab") as f:
        f.truncate(max(0, size + free - int(free_mib * MIB)))
    if filler.stat().st_size > size:  # a truncate up leaves a hole: write the bytes
        with open(filler, "r+b") as f:
            f.seek(size)
            f.write(b"\0" * (filler.stat().st_size - size))


def test_a_nearly_full_disk_refuses_qos1_for_persistent_sessions_and_resumes(
    tmp_path: Path,
) -> None:
    """README: below 16 MiB free on the disk, QoS 1/2 messages that must be stored are
    refused (5.0: 0x97) while everything else flows; acceptance resumes at 32 MiB free."""
    proc, disk = on_small_disk(tmp_path)
    try:
        sub = Paho(proc.port, "disk-sub", 5)
        sub.connect(clean=False, session_expiry=3600)
        sub.subscribe("d/#", 1)
        sub.disconnect()
        live = Paho(proc.port, "disk-live", 5).connect()
        live.subscribe("other/#", 1)
        pub = Paho(proc.port, "disk-pub", 5).connect()
        assert pub.publish_code("d/x", b"room", 1) == 0
        fill_to(disk, 12)
        # The store notices at its next commit, or within a second once full.
        wait_for(lambda: pub.publish_code("d/x", b"p", 1) == 0x97, 10, "a refusal")
        proc.wait_log(r"store nearly full .* refusing QoS 1/2 messages for persistent")
        pub.publish("other/y", b"still flowing", 1)
        assert [m.payload for m in live.wait_messages(1)] == [b"still flowing"]
        fill_to(disk, 24)  # above 16 MiB, below 32 MiB: still refused
        deadline = time.monotonic() + 2.5  # the store looks again every second
        while time.monotonic() < deadline:
            assert pub.publish_code("d/x", b"p", 1) == 0x97
        fill_to(disk, 40)
        wait_for(lambda: pub.publish_code("d/x", b"back", 1) == 0, 10, "acceptance again")
        proc.wait_log("store has room again")
        for c in (live, pub):
            c.disconnect()
    finally:
        assert proc.stop() == 0


# --------------------------------------------------------------------------- back-pressure


def test_reads_pause_while_the_writer_is_50000_changes_behind(tmp_path: Path) -> None:
    """README: when the store's writer falls 50,000 changes behind, Ledge stops reading
    from clients until it catches up. Another connection holding SQLite's write lock
    stalls the real writer; 30,000 QoS 1 messages for an offline persistent session
    (two changes each, the session's queue bound raised) put it 60,000 behind."""
    data = tmp_path / "data"
    config = tmp_path / "ledge.toml"  # a queue that takes them all
    config.write_text("[broker]\nmax_queued_messages = 100000\n")
    proc = LedgeProcess("--data-dir", str(data), config=config).start()
    lock = None
    sender = None
    try:
        sub = Raw(proc.port, MQTT_311)
        assert sub.connect("behind-sub", clean_start=False).reason_code == 0
        sub.send(encode(Subscribe(1, (SubscriptionRequest("b/#", 1),)), MQTT_311))
        sub.expect(1)
        sub.send(encode(Disconnect(), MQTT_311))
        sub.close()
        lock = sqlite3.connect(data / "ledge.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # the writer's commits now wait and retry
        pub = Raw(proc.port, MQTT_311)
        assert pub.connect("behind-pub").reason_code == 0
        burst = b"".join(
            encode(Publish("b/x", b"%d" % i, 1, packet_id=i + 1), MQTT_311) for i in range(30_000)
        )
        # The gateway stops reading: the burst waits in the socket buffers.
        sender = threading.Thread(target=pub.sock.sendall, args=(burst,), daemon=True)
        sender.start()
        line = proc.wait_log(r"store is \d+ changes behind: pausing reads from clients", 30)
        assert int(re.search(r"is (\d+) changes", line)[1]) > 50_000  # type: ignore[index]
        probe = Raw(proc.port)
        probe.send(encode(Connect("behind-probe", MQTT_5), MQTT_5))
        with pytest.raises(AssertionError, match="timed out"):
            probe.expect(1, 1.0)  # not read while paused
        lock.rollback()
        proc.wait_log("store caught up: reading from clients again", 30)
        (ack,) = probe.expect(1, 10)
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        got = pub.expect(30_000, 30)  # every PUBACK, once stored
        assert [p.packet_id for p in got if isinstance(p, PubAck)] == list(range(1, 30_001))
        probe.close()
        pub.close()
    finally:
        if lock is not None:
            lock.close()
        if sender is not None:
            sender.join(10)
        assert proc.stop() == 0
