"""The SD-card image for the tests marked ``image``, built once per run in the background.

``image/build`` spends most of its time running arm64 maintainer scripts under
qemu-user, one process at a time: it is started as early as possible (by
``scripts/test`` as soon as the build's tools are installed, else as soon as pytest
knows image tests were selected), the image tests run last, and the first of them waits
for the build while every other test has used the machine meanwhile. The build the
tests wait for writes the ``.img`` and no ``.img.xz`` (a minute of xz off the longest
path); the second build, which the reproducibility test compares with it, starts in the
background as soon as the first is done, makes the ``.img.xz`` too, and the test checks
that it holds the same bytes.

``LEDGE_IMAGE=path/to/ledge-VERSION-arm64.img.xz`` uses an image built earlier instead.

Standard library only: ``python3 -m tests.support.imagebuild start`` runs before the
test environment exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "image" / "out"
#: The second build, which the reproducibility test compares with the first.
AGAIN_OUT = OUT / "again"
#: Both builds: xz -1 instead of -6 (several minutes less, about a fifth bigger, the
#: same image inside); the update bundle in zstd, not xz (seconds instead of two
#: minutes, a third bigger); the .img kept.
_QUICK = ("--xz-level", "1", "--keep-img", "--bundle-comp", "zstd")


class Background:
    """One ``image/build`` run in the background: its log, and the exit status it
    writes into a file when it ends (whichever process then waits for it)."""

    def __init__(
        self, name: str, out: Path, *options: str, nice: int = 0, work: Path = OUT
    ) -> None:
        self.out = out
        self.work = work  # where its log, status and pid files are
        self.log = work / f"{name}.log"
        self.status = work / f"{name}.status"
        self.pid = work / f"{name}.pid"
        self.command = [
            *(("nice", "-n", str(nice)) if nice else ()),
            str(REPO / "image" / "build"),
            *("--out", str(out), *options),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.waited = False
        self.wanted = False  # by a test of this run (the second build; ``start``)

    def forget(self) -> None:
        """Nothing of an earlier run: its status, its output."""
        self.status.unlink(missing_ok=True)
        self.pid.unlink(missing_ok=True)
        for old in [*self.out.glob("ledge-*.img*"), *self.out.glob("ledge-*.raucb*")]:
            old.unlink()  # never test an image left over from an earlier build

    def launch(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.forget()
        script = '"$@"; echo $? > "$STATUS.tmp"; mv "$STATUS.tmp" "$STATUS"'
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                # SIGTERM and SIGINT stop it, whatever started the run: a process started
                # with them ignored (some CI runners) passes that on, no shell can undo
                # it, and ``stop`` would then wait out its deadline instead of letting
                # the build clean up (its chroot's mounts).
                ["env", "--default-signal=TERM,INT", "sh", "-c", script, "build", *self.command],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "STATUS": str(self.status)},
            )
        self.pid.write_text(str(self.proc.pid))

    def wait(self, timeout: float) -> float:
        """Seconds waited; fails with the end of the build's log if it failed."""
        started = time.monotonic()
        deadline = started + timeout
        while not self.status.exists():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"image/build did not finish within {timeout} s; see {self.log}"
                )
            time.sleep(1.0)  # a build of many minutes, polled from another process
        if self.proc is not None:  # started here: reaped here (it writes the status last)
            self.proc.wait(timeout=60)
        rc = int(self.status.read_text().strip() or "1")
        if rc != 0:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])
            raise AssertionError(f"image/build failed (exit status {rc}):\n{tail}")
        return time.monotonic() - started

    def stop(self) -> None:
        """Stop it if it is still running (the run was cut short)."""
        try:
            pid = int(self.pid.read_text())
        except (FileNotFoundError, ValueError):
            return
        try:  # the pid of a build an earlier run left, since taken by another process?
            ours = "image/build" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        except OSError:
            ours = False
        if ours and not self.status.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    if self.proc is not None:
                        self.proc.poll()  # started here: reaped here, or it stays a zombie
                    os.killpg(pid, 0)  # raises once the group is gone
                    time.sleep(0.2)
                os.killpg(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        self.pid.unlink(missing_ok=True)


#: The build the image tests boot: no .img.xz, so they need not wait for xz; ahead of
#: the tests for the CPU (the longest path of the run; a higher priority needs root).
FIRST = Background("build", OUT, *_QUICK, "--no-xz", nice=-5)
#: The reproducibility test's: the same again, with the .img.xz, at a lower priority
#: than the VMs booting meanwhile.
AGAIN = Background("again", AGAIN_OUT, *_QUICK, nice=10)
LOG = FIRST.log


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
#: Taken by the one process that starts the build (``scripts/test`` before pytest, or
#: whichever worker collects first): it holds the run's id.
CLAIM = OUT / "build.claim"


def prebuilt() -> Path | None:
    given = os.environ.get("LEDGE_IMAGE")
    return Path(given).resolve() if given else None


def run_id() -> str | None:
    """What the processes of one test run share: ``scripts/test``'s id for the run, or
    pytest-xdist's (None in one process started otherwise)."""
    return os.environ.get("LEDGE_TEST_RUN") or os.environ.get("PYTEST_XDIST_TESTRUNUID")


def start(again: bool = False) -> bool:
    """Start the first build in the background, once per run: the first process here
    claims it; the others find it claimed. ``again``: the run has a test that needs the
    second build too, started as soon as the first is done (``wait``). Whether this
    call started it."""
    AGAIN.wanted = AGAIN.wanted or again
    if FIRST.proc is not None or prebuilt() is not None:
        return False
    OUT.mkdir(parents=True, exist_ok=True)
    if not _claim(run_id()):
        return False  # another process of this run started it
    _Report.FILE.unlink(missing_ok=True)
    AGAIN.forget()
    FIRST.launch()
    return True


def _claim(run: str | None) -> bool:
    """Whether this process is the one to start the build of run ``run`` (None: a
    process of its own): the claim file is made whole and linked into place, which fails
    when it is there already."""
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
    """The built image (the ``.img``; ``LEDGE_IMAGE`` if given); fails with the end of
    the build's log if it failed."""
    given = prebuilt()
    if given is not None:
        return given
    start()
    waited = FIRST.wait(timeout)
    if not FIRST.waited:
        FIRST.waited = True
        REPORT["image build (in the background)"] = (
            f"the first image test waited {waited:.0f} s for it; log {FIRST.log}"
        )
    [image] = OUT.glob("ledge-*-arm64.img")
    if AGAIN.wanted and AGAIN.proc is None:
        AGAIN.launch()
    return image


def wait_again(timeout: float) -> tuple[Path, Path]:
    """The second build's ``.img`` and ``.img.xz`` (started now if ``wait`` did not)."""
    wait(timeout)
    if AGAIN.proc is None:
        AGAIN.launch()
    AGAIN.wait(timeout)
    [image] = AGAIN_OUT.glob("ledge-*-arm64.img")
    return image, image.with_name(f"{image.name}.xz")


def stop() -> None:
    """Stop the builds still running (the run was cut short). Called once per run, by
    the process that runs no tests of its own when there are workers."""
    FIRST.stop()
    AGAIN.stop()
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


def main(argv: list[str]) -> int:
    """``python3 -m tests.support.imagebuild start|stop``: start the first build for the
    run ``LEDGE_TEST_RUN`` names (``scripts/test``, before the test environment is set
    up); stop what is still running of it (``scripts/test``, whatever ended the run)."""
    if argv == ["start"] and os.environ.get("LEDGE_TEST_RUN"):
        if start():
            print(f"image/build started in the background (log {FIRST.log})")
        return 0
    if argv == ["stop"]:
        stop()
        return 0
    print(
        "usage: LEDGE_TEST_RUN=ID python3 -m tests.support.imagebuild start|stop", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
