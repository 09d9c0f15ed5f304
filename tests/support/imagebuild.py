"""The SD-card image for the tests marked ``image``, built once per run in the background.

``image/build`` spends most of its time running arm64 maintainer scripts under
qemu-user, one process at a time: it is started as soon as pytest
knows image tests were selected, the image tests run last, and the first of them waits
for the build while every other test has used the machine meanwhile.

``LEDGE_IMAGE=path/to/ledge-VERSION-arm64.img.xz`` uses an image built earlier instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support.procs import REPO

OUT = REPO / "image" / "out"
LOG = OUT / "build.log"


class _Build:
    proc: subprocess.Popen[bytes] | None = None
    started = 0.0
    finished = 0.0


_build = _Build()
#: Figures the image tests measured, printed at the end of the run.
REPORT: dict[str, str] = {}


def prebuilt() -> Path | None:
    given = os.environ.get("LEDGE_IMAGE")
    return Path(given).resolve() if given else None


def start() -> None:
    """Start ``image/build`` in the background (once)."""
    if _build.proc is not None or prebuilt() is not None:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("ledge-*.img.xz"):
        old.unlink()  # never test an image left over from an earlier build
    _build.started = time.monotonic()
    # At the tests' priority: it is the longest path of the run (mostly one process at a
    # time, so the tests keep the other core). xz -1 instead of -6: several minutes
    # less, about a fifth bigger, the same image inside.
    command = [str(REPO / "image" / "build"), "--out", str(OUT), "--xz-level", "1"]
    with LOG.open("wb") as log:
        _build.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait(timeout: float) -> Path:
    """The built ``.img.xz``; fails with the end of the build's log if it failed."""
    given = prebuilt()
    if given is not None:
        return given
    start()
    proc = _build.proc
    assert proc is not None
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop()
        raise AssertionError(f"image/build did not finish within {timeout} s; see {LOG}") from None
    if not _build.finished:
        _build.finished = time.monotonic()
        took = _build.finished - _build.started
        REPORT["image build (in the background)"] = f"{took:.0f} s, log {LOG}"
    if rc != 0:
        tail = "\n".join(LOG.read_text(errors="replace").splitlines()[-40:])
        raise AssertionError(f"image/build failed (exit status {rc}):\n{tail}")
    [image] = OUT.glob("ledge-*-arm64.img.xz")
    return image


def stop() -> None:
    """Stop a build still running (the run was cut short)."""
    proc = _build.proc
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def summary() -> list[str]:
    lines = [f"{key}: {value}" for key, value in REPORT.items()]
    if _build.proc is not None:  # built in this run: its stages and size
        for report in OUT.glob("ledge-*.build.txt"):
            lines += report.read_text().splitlines()
    return lines
