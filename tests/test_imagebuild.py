"""The image build in the background (``tests/support/imagebuild.py``): what the run's
processes share through files, and what stopping a run stops.

The real build takes minutes; these run stand-in commands through the same
``Background`` (its wrapper, its status file, its process group).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import imagebuild
from tests.support.imagebuild import Background
from tests.support.wait import wait_for


def stand_in(tmp_path: Path, script: str) -> Background:
    """A Background whose command is ``script`` (its command line names image/build, as
    the real one does: that is how ``stop`` knows the process is a build)."""
    build = Background("build", tmp_path / "out", work=tmp_path)
    build.command = ["sh", "-c", script, "image/build"]
    return build


def alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_a_finished_build_reports_its_status_and_a_failed_one_its_log(tmp_path: Path) -> None:
    """Broken, a failed build would look finished, or say nothing of why it failed."""
    ok = stand_in(tmp_path, "echo built")
    ok.launch()
    assert ok.wait(30) >= 0
    assert ok.status.read_text().strip() == "0"

    failed = stand_in(tmp_path / "f", "echo 'step rootfs: no space left'; exit 3")
    failed.launch()
    with pytest.raises(AssertionError, match=r"exit status 3\):\nstep rootfs: no space left"):
        failed.wait(30)


def test_waiting_gives_up_at_its_deadline(tmp_path: Path) -> None:
    build = stand_in(tmp_path, "sleep 30")
    build.launch()
    try:
        with pytest.raises(AssertionError, match=r"did not finish within 1\.5 s"):
            build.wait(1.5)
    finally:
        build.stop()


@pytest.fixture
def sigterm_ignored() -> Iterator[None]:
    """The run started with SIGTERM ignored, as some CI runners start it."""
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("started", ["as usual", "with SIGTERM ignored"])
def test_stopping_a_run_stops_its_build_and_only_its_build(
    tmp_path: Path, unrelated: subprocess.Popen[bytes], started: str, request: pytest.FixtureRequest
) -> None:
    """Broken, a run cut short would leave its build running, or a pid file an earlier
    run left (its pid since taken by another process) would kill that process; or, in a
    run started with SIGTERM ignored, the build would ignore it too and be killed only at
    stop's deadline, without cleaning up."""
    if started != "as usual":
        request.getfixturevalue("sigterm_ignored")
    running = tmp_path / "running"
    build = stand_in(tmp_path, f"touch {running}; sleep 600")
    build.launch()
    assert build.proc is not None
    pid = build.proc.pid
    wait_for(running.exists, 30, "the build to run")  # a signal before then: a race
    assert alive(pid)
    build.stop()
    wait_for(lambda: build.proc is not None and build.proc.poll() is not None, timeout=30)
    assert build.proc.returncode == -signal.SIGTERM, "stopped by SIGKILL at the deadline"
    assert not alive(pid)
    assert not build.pid.exists()

    stale = stand_in(tmp_path / "stale", "true")
    stale.pid.parent.mkdir(parents=True)
    stale.pid.write_text(str(unrelated.pid))
    stale.stop()
    assert unrelated.poll() is None, "stop killed a process that was not a build"
    assert not stale.pid.exists()


def test_one_process_of_a_run_claims_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken, every worker of a run would start its own build (several at once on two
    cores), or a claim an earlier run left would keep this run from building."""
    monkeypatch.setattr(imagebuild, "OUT", tmp_path)
    monkeypatch.setattr(imagebuild, "CLAIM", tmp_path / "build.claim")
    assert imagebuild._claim("run-1")
    assert not imagebuild._claim("run-1")  # another worker of the same run
    assert imagebuild._claim("run-2")  # a new run: the old claim does not hold
    assert (tmp_path / "build.claim").read_text() == "run-2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build.claim"]


def test_the_start_command_runs_before_the_test_environment_exists() -> None:
    """``scripts/test`` runs it with Debian's python3, before the virtual environment:
    the module imports the standard library only."""
    code = (
        "import sys, tests.support.imagebuild; "
        "import json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, '.'); {code}"],
        cwd=imagebuild.REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    third_party = {"pytest", "_pytest", "pydantic", "paho", "gateway"}
    assert not third_party & set(json.loads(done.stdout))
    usage = subprocess.run(
        [sys.executable, "-m", "tests.support.imagebuild", "start"],
        cwd=imagebuild.REPO,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "LEDGE_TEST_RUN"},
        check=False,
    )
    assert usage.returncode == 2
    assert "LEDGE_TEST_RUN=ID" in usage.stderr
