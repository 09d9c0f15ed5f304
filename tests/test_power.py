"""Power cuts: the lossy file system the rig runs on, and the rig itself.

The file system (``tests.support.lossyfs``) is driven with real system calls on a real
FUSE mount; the rig (``tests.support.power``) cuts the power under Ledge 50 times under
QoS 1/2 load with a bridge to Debian's Mosquitto. ``make power-test`` runs 1,000 cuts.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import power
from tests.support.lossyfs import PAGE, LossyMount


@pytest.fixture
def lossy(tmp_path: Path) -> Iterator[LossyMount]:
    mount = LossyMount(tmp_path / "disk", tmp_path / "mnt", tmp_path / "fs.sock").mount()
    try:
        yield mount
    finally:
        mount.unmount()


def test_unsynced_writes_are_read_back_and_lost_at_a_cut(lossy: LossyMount) -> None:
    disk, mnt = lossy.backing, lossy.mountpoint
    fd = os.open(mnt / "f", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"synced")
        os.fsync(fd)
        os.pwrite(fd, b"SYNCED and more", 0)
        assert os.pread(fd, 100, 0) == b"SYNCED and more"  # reads see pending writes
        assert os.fstat(fd).st_size == 15
        assert (disk / "f").read_bytes() == b"synced"  # the disk does not, yet
        os.ftruncate(fd, 3)
        assert os.pread(fd, 100, 0) == b"SYN"
        assert lossy.cut("all", 1) == {"dropped": 15, "kept": 0}
        with pytest.raises(OSError) as after:  # the power is off: nothing more
            os.pwrite(fd, b"late", 0)
        assert after.value.errno == errno.EIO
    finally:
        os.close(fd)
    lossy.unmount()
    assert (disk / "f").read_bytes() == b"synced"


def test_pending_writes_follow_the_file_through_a_rename(lossy: LossyMount) -> None:
    mnt = lossy.mountpoint
    with open(mnt / "a", "wb") as f:
        f.write(b"data")
        f.flush()
        os.rename(mnt / "a", mnt / "b")  # the namespace is durable at once
        assert (lossy.backing / "b").read_bytes() == b""
        assert (mnt / "b").read_bytes() == b"data"
        os.fsync(f.fileno())
    assert (lossy.backing / "b").read_bytes() == b"data"


def test_a_random_cut_keeps_whole_4k_pieces_of_the_pending_writes(lossy: LossyMount) -> None:
    """A torn write: one 16-page write survives page by page, never within a page."""
    old, new = bytes([1]) * (16 * PAGE), bytes([2]) * (16 * PAGE)
    with open(lossy.mountpoint / "f", "wb") as f:
        f.write(old)
        f.flush()
        os.fsync(f.fileno())
        os.pwrite(f.fileno(), new, 0)
        lost = lossy.cut("random", 4)
    lossy.unmount()
    got = (lossy.backing / "f").read_bytes()
    pages = [got[i * PAGE : (i + 1) * PAGE] for i in range(16)]
    assert all(page in (old[:PAGE], new[:PAGE]) for page in pages)
    kept = sum(page == new[:PAGE] for page in pages)
    assert 0 < kept < 16, kept  # this seed keeps some and loses some
    assert lost == {"kept": kept * PAGE, "dropped": (16 - kept) * PAGE}


def test_shared_writable_mmap_works_as_sqlite_shm_needs(lossy: LossyMount) -> None:
    with open(lossy.mountpoint / "x.db-shm", "w+b") as f:
        f.truncate(2 * PAGE)
        with mmap.mmap(f.fileno(), 2 * PAGE) as m:
            m[PAGE : PAGE + 5] = b"index"
            m.flush()
        assert os.pread(f.fileno(), 5, PAGE) == b"index"


def test_wear_counts_each_page_once_per_sync(lossy: LossyMount) -> None:
    with open(lossy.mountpoint / "ledge.db-wal", "wb") as f:
        for _ in range(3):
            f.write(b"abc")
            f.flush()
        os.pwrite(f.fileno(), b"z", 2 * PAGE)
        os.fsync(f.fileno())
    stats = lossy.stats()
    assert stats["bytes"]["wal"] == 10
    assert stats["pages"]["wal"] == 2
    assert stats["syncs"] == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nothing_acknowledged_is_lost_to_50_power_cuts(tmp_path: Path) -> None:
    """QoS 1/2 with persistent sessions, retained changes and clears, a bridge whose
    cloud comes and goes; the power cut at 50 random moments: no acknowledged message
    lost locally or upstream, no start refused, no corrupt store, retained state the
    last acknowledged change after every restart."""
    report = power.run(cuts=50, directory=tmp_path, seed=50)
    assert report.problems == [], report.problems[:20]
    assert report.modes["all"] > 10 and report.modes["random"] > 10, report.modes
    assert report.acknowledged > 5000, report.summary()
    assert report.checked >= 3 * report.acknowledged * 0.9
    assert report.checked_upstream >= report.acknowledged * 0.9
    assert report.upstream_outages >= 5, report.summary()
    assert report.retained_checks == 51
    assert report.refused_starts == report.corrupt_stores == 0
    assert len(report.connack) == 50
