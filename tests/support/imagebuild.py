"""The SD-card image for the tests marked ``image``, built once per run in the background.

``image/build`` spends most of its time running arm64 maintainer scripts under
qemu-user, one process at a time: it is started as soon as pytest
knows image tests were selected, the image tests run last, and the first of them waits
for the build while every other test has used the machine meanwhile.

``LEDGE_IMAGE=path/to/ledge-VERSION-arm64.img.xz`` uses an image built earlier instead.
"""

from __future__ import annotations

import contextlib
import json
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


class _Report(dict[str, str]):
    """Figures the image tests measured, printed at the end of the run by the process
    that prints the summary (with workers, not the one that measured): kept in a file."""

    FILE = OUT / "build.report.json"

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        saved = self.saved()
        saved[key] = value
        self.FILE.parent.mkdir(parents=True, exist_ok=True)
        self.FILE.write_text(json.dumps(saved))

    def saved(self) -> dict[str, str]:
        try:
            loaded: dict[str, str] = json.loads(self.FILE.read_text())
            return loaded
        except (FileNotFoundError, ValueError):
            return {}


REPORT = _Report()
#: Taken by the one process that starts the build (the tests may run on several
#: workers, each collecting every test); the build writes its exit status to ``STATUS``.
CLAIM = OUT / "build.claim"
STATUS = OUT / "build.status"
PID = OUT / "build.pid"


def prebuilt() -> Path | None:
    given = os.environ.get("LEDGE_IMAGE")
    return Path(given).resolve() if given else None


def start() -> None:
    """Start ``image/build`` in the background, once per run: the first process here
    claims it; the others find it claimed and wait for ``STATUS``."""
    if _build.proc is not None or prebuilt() is not None:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    if not _claim(os.environ.get("PYTEST_XDIST_TESTRUNUID")):
        return  # another worker of this run started it
    STATUS.unlink(missing_ok=True)
    _Report.FILE.unlink(missing_ok=True)
    for old in [*OUT.glob("ledge-*.img.xz"), *OUT.glob("ledge-*.img"), *OUT.glob("ledge-*.raucb")]:
        old.unlink()  # never test an image left over from an earlier build
    _build.started = time.monotonic()
    # At the tests' priority: it is the longest path of the run (mostly one process at a
    # time, so the tests keep the other core). xz -1 instead of -6: several minutes
    # less, about a fifth bigger, the same image inside; the update bundle in zstd, not
    # xz: seconds instead of two minutes, a third bigger. The .img stays too: the
    # reproducibility test builds again and compares it.
    command = [
        str(REPO / "image" / "build"),
        *("--out", str(OUT), "--xz-level", "1", "--keep-img", "--bundle-comp", "zstd"),
    ]
    script = '"$@"; echo $? > "$STATUS.tmp"; mv "$STATUS.tmp" "$STATUS"'
    with LOG.open("wb") as log:
        _build.proc = subprocess.Popen(
            ["sh", "-c", script, "build", *command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "STATUS": str(STATUS)},
        )
    PID.write_text(str(_build.proc.pid))


def _claim(run: str | None) -> bool:
    """Whether this process is the one to start the build of run ``run`` (the
    workers' common run id; None without workers): the claim file is made whole
    and linked into place, which fails when it is there already."""
    mine = OUT / f"build.claim.{os.getpid()}"
    mine.write_text(run or "")
    try:
        while True:
            try:
                os.link(mine, CLAIM)
                return True
            except FileExistsError:
                if run is not None and CLAIM.read_text() == run:
                    return False
                CLAIM.unlink(missing_ok=True)  # left by an earlier run
    finally:
        mine.unlink()


def wait(timeout: float) -> Path:
    """The built ``.img.xz``; fails with the end of the build's log if it failed."""
    given = prebuilt()
    if given is not None:
        return given
    start()
    started = time.monotonic()
    deadline = started + timeout
    while not STATUS.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"image/build did not finish within {timeout} s; see {LOG}")
        time.sleep(1.0)  # a build of many minutes, polled from another process
    rc = int(STATUS.read_text().strip() or "1")
    if not _build.finished:
        _build.finished = time.monotonic()
        took = _build.finished - (_build.started or started)
        REPORT["image build (in the background)"] = f"{took:.0f} s, log {LOG}"
    if rc != 0:
        tail = "\n".join(LOG.read_text(errors="replace").splitlines()[-40:])
        raise AssertionError(f"image/build failed (exit status {rc}):\n{tail}")
    [image] = OUT.glob("ledge-*-arm64.img.xz")
    return image


def stop() -> None:
    """Stop a build still running (the run was cut short). Called once per run, by
    the process that runs no tests of its own when there are workers."""
    try:
        pid = int(PID.read_text())
    except (FileNotFoundError, ValueError):
        return
    if not STATUS.exists():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                os.killpg(pid, 0)  # raises once the group is gone
                time.sleep(0.2)
            os.killpg(pid, signal.SIGKILL)
    PID.unlink(missing_ok=True)
    CLAIM.unlink(missing_ok=True)


def forget() -> None:
    """A new run: no figures of an earlier one."""
    _Report.FILE.unlink(missing_ok=True)


def summary() -> list[str]:
    saved = REPORT.saved()
    lines = [f"{key}: {value}" for key, value in saved.items()]
    if "image build (in the background)" in saved:  # built in this run: stages, size
        for report in OUT.glob("ledge-*.build.txt"):
            lines += report.read_text().splitlines()
    return lines
