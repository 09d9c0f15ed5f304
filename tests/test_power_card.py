"""The card with a volatile write cache that the image's power-cut rig boots from
(``tests.support.nbdcache``), driven by QEMU's own NBD client (``qemu-io``, the block
layer ``qemu-system-aarch64`` uses) with a write-back cache, as the booted image uses
it. ``make power-test-image`` runs the rig itself (20 cuts of the booted image).

A ``qemu-io`` that ends with ``abort`` stops like a killed QEMU: without the flush a
clean close sends, so what it wrote stays in the card's cache until the test cuts.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nbdcache import PAGE, CachedDisk

SIZE = 1 << 20


@pytest.fixture
def card(tmp_path: Path) -> Iterator[CachedDisk]:
    if shutil.which("qemu-io") is None:
        pytest.fail("qemu-io is not installed: run scripts/setup --test")
    image = tmp_path / "card.img"
    image.write_bytes(bytes(SIZE))
    with CachedDisk(image, tmp_path / "card.sock") as disk:
        yield disk
    assert disk.error is None, disk.error


def qemu_io(disk: CachedDisk, *commands: str, crash: bool = True) -> str:
    """What ``qemu-io`` said running ``commands`` on the card (``crash``: then it
    aborts, without the flush of a clean close)."""
    argv = ["stdbuf", "-oL", "qemu-io", "-t", "writeback", "-f", "raw"]
    argv.append(f"nbd+unix:///?socket={disk.socket_path}")
    for command in (*commands, "abort") if crash else commands:
        argv += ["-c", command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def on_card(disk: CachedDisk, offset: int, length: int) -> bytes:
    """What the card itself holds (the image file), cache aside."""
    with disk.path.open("rb") as f:
        f.seek(offset)
        return f.read(length)


def test_what_was_written_is_read_back_before_any_flush_and_lost_at_a_cut(
    card: CachedDisk,
) -> None:
    said = qemu_io(
        card,
        "write -P 0x55 0 64k",
        "write -P 0x66 1000 5000",  # across a page boundary, not aligned
        "read -P 0x55 0 1000",
        "read -P 0x66 1000 5000",
        "read -P 0x55 6000 59536",
    )
    assert "wrote 65536/65536" in said and "wrote 5000/5000" in said
    assert said.count("read ") == 3 and "Pattern verification failed" not in said, said
    assert len(card.dirty) == 16
    assert on_card(card, 0, 65536) == bytes(65536)  # acknowledged, but only in the cache
    report = card.cut(random.Random(1), "all")
    assert (report.dirty_pages, report.kept_pages) == (16, 0)
    assert on_card(card, 0, 65536) == bytes(65536)
    said = qemu_io(card, "read -P 0 0 64k")
    assert "read 65536/65536" in said and "Pattern verification failed" not in said, said


def test_a_flush_or_a_fua_write_survives_the_cut_and_nothing_after_it(card: CachedDisk) -> None:
    said = qemu_io(
        card,
        "write -P 0x11 0 8k",
        "flush",
        "write -P 0x22 64k 8k",
        "write -f -P 0x33 128k 4k",  # Force Unit Access: on the card when acknowledged
    )
    assert said.count("wrote ") == 3, said
    assert card.flushes == 1
    report = card.cut(random.Random(2), "all")
    assert report.dirty_pages == 2
    assert on_card(card, 0, 8192) == b"\x11" * 8192
    assert on_card(card, 65536, 8192) == bytes(8192)
    assert on_card(card, 131072, 4096) == b"\x33" * 4096


def test_write_zeroes_is_cached_like_a_write(card: CachedDisk) -> None:
    qemu_io(card, "write -P 0x44 0 16k", "flush", crash=False)
    said = qemu_io(card, "write -z 4k 8k", "read -P 0 4k 8k", "read -P 0x44 0 4k")
    assert "Pattern verification failed" not in said, said
    card.cut(random.Random(3), "all")
    assert on_card(card, 0, 16384) == b"\x44" * 16384


def test_a_random_cut_keeps_some_whole_pages_and_loses_the_others(card: CachedDisk) -> None:
    qemu_io(card, "write -P 0x77 0 256k")
    report = card.cut(random.Random(4), "subset")
    assert report.dirty_pages == 64
    kept = [n for n in range(64) if on_card(card, n * PAGE, PAGE) == b"\x77" * PAGE]
    lost = [n for n in range(64) if on_card(card, n * PAGE, PAGE) == bytes(PAGE)]
    assert len(kept) + len(lost) == 64  # never half a page
    assert len(kept) == report.kept_pages
    assert 0 < len(kept) < 64
    assert not card.dirty
