"""Shared fixtures: real Ledge and Mosquitto processes on free loopback ports, and the
pipeline tests' one SparkSession."""

from __future__ import annotations

import os
import signal
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from tests.support.certs import Certs, make_certs
from tests.support.procs import LedgeProcess, MosquittoProcess

if TYPE_CHECKING:  # PySpark is imported only by the pipeline's tests
    from pyspark.sql import SparkSession

# The BLE tests' fake BlueZ on a private system bus (system_bus, bluez fixtures).
pytest_plugins = ["tests.support.bluez"]

settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile(
    "long", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def ledge() -> Iterator[LedgeProcess]:
    """A fresh ``ledge run`` on the embedded default config, on a free port."""
    proc = LedgeProcess().start()
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def shared_ledge() -> Iterator[LedgeProcess]:
    """One ``ledge run`` for a whole module; tests use distinct client ids and topics."""
    proc = LedgeProcess().start()
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoProcess]:
    proc = MosquittoProcess(tmp_path).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for 127.0.0.1 and client certificates (openssl)."""
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One SparkSession for the whole run (``local[2]``, the fast JVM settings).

    Starting a JVM costs about 10 s; every test after the first pays under a second."""
    from pipeline.session import build, stop

    session = build("local[2]", app_name="ledge-tests", fast_jvm=True)
    _spark_watch.session = session
    yield session
    _spark_watch.session = None
    crowded = [] if _stopped(session) else _crowded_code_cache(session)
    stop(session)
    # A full code cache fails the JVM's next link of a call site, and Spark stops its
    # context when that happens in one of its own threads: fail before it is that full.
    assert not crowded, f"the shared Spark session's code cache came near full: {crowded}"


#: How full the shared JVM's code cache may get over a run, at most.
CODE_CACHE_MARGIN = 0.8


def _crowded_code_cache(session: SparkSession) -> list[str]:
    """The JVM's code cache pools whose peak use over the run passed the margin, each as
    "name: peak of size KiB"."""
    jvm = session.sparkContext._jvm
    assert jvm is not None
    out = []
    for pool in jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans():
        peak = pool.getPeakUsage()
        name, used, size = pool.getName(), peak.getUsed(), peak.getMax()
        if name.startswith("Code") and size > 0 and used > CODE_CACHE_MARGIN * size:
            out.append(f"{name}: {used // 1024} of {size // 1024} KiB")
    return out


class _SparkWatch:
    """Whether the shared session's context stopped (Spark stops it itself on an error in
    one of its own threads) or its JVM went, and during which test: every later test
    using the session fails, and says so."""

    session: SparkSession | None = None
    stopped_during: str = ""
    said: tuple[str, ...] = ()


_spark_watch = _SparkWatch()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    watch = _spark_watch
    if (
        call.when == "teardown"
        and watch.session is not None
        and not watch.stopped_during
        and "spark" in getattr(item, "fixturenames", ())
        and _stopped(watch.session)
    ):
        watch.stopped_during = item.nodeid
        lines = [
            line
            for title, text in report.sections
            if "stderr" in title
            for line in text.splitlines()
        ]
        errors = [i for i, line in enumerate(lines) if " ERROR spark " in line]
        watch.said = tuple(line for i in errors[:5] for line in lines[i : i + 12])
    return report


def _stopped(session: SparkSession) -> bool:
    """Whether the session's context was stopped, or its JVM is gone (a hook that raised
    would end the whole run, not one test)."""
    try:
        return bool(session.sparkContext._jsc.sc().isStopped())
    except Exception:
        return True


#: Why the tests of a group would not run together (pytest_collection_finish), if so.
_ungrouped: list[str] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _ungrouped and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(_ungrouped[0], pytrace=False)
    watch = _spark_watch
    if watch.stopped_during and "spark" in getattr(item, "fixturenames", ()):
        pytest.fail(
            f"the shared Spark session's context stopped (or its JVM went) during "
            f"{watch.stopped_during}; Spark's errors then:\n"
            + "\n".join(watch.said or ("(none on its stderr)",)),
            pytrace=False,
        )


# ---------------------------------------------------------------------- the SD-card image


#: Tests that share one expensive thing run on one worker (``--dist loadgroup``):
#: the pipeline's SparkSession (one JVM per worker otherwise: only the tests that use it,
#: directly or through a fixture) and the image and VM.
GROUPS = (("tests/test_pipeline_", "spark"),)


# First: pytest-xdist reads the groups in a hook of its own, once, when it names tests.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Image tests run last (the image builds in the background meanwhile), all on one
    worker; the pipeline's tests that use the Spark session share one worker's."""
    items.sort(key=lambda item: item.get_closest_marker("image") is not None)
    for item in items:
        if item.get_closest_marker("image") is not None:
            item.add_marker(pytest.mark.xdist_group("image"))
            continue
        path = item.nodeid.split("::", 1)[0]
        for prefix, group in GROUPS:
            # The pipeline's tests that start no session of their own in this process (its
            # settings, or a JVM in a process of its own: ``prepare``'s archive written,
            # a session stopped and started again) go to whichever worker is free, not
            # after the shared session's tests (45 of their 167 s in one process; the
            # group is named after the fixture).
            if path.startswith(prefix) and group in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # A run started with SIGTERM ignored (some CI runners do) would pass that on to every
    # process the tests start, and those without a handler of their own (the mock
    # bluetoothd, dbus-monitor, shells) would then outlive their ``terminate()``.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not hasattr(session.config, "workerinput"):  # once per run, before any worker
        from tests.support import imagebuild

        imagebuild.forget()


def pytest_collection_finish(session: pytest.Session) -> None:
    if getattr(session.config.option, "loadgroup", False):
        # A worker of ``--dist loadgroup``: pytest-xdist has appended each test's group to
        # its id, which is all the controller schedules by. If it could not (a pytest it
        # does not know), the groups would be spread over every worker: several VMs at
        # once on two cores, a JVM per worker. Each grouped test then fails, saying why.
        lost = [
            item.nodeid
            for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
        ]
        if lost:
            _ungrouped.append(
                f"pytest-xdist did not group {len(lost)} tests (e.g. {lost[0]}): pytest "
                f"{pytest.__version__} is not one it supports; see pyproject.toml"
            )
    if any(item.get_closest_marker("image") for item in session.items):
        from tests.support import imagebuild

        # Once per run, by scripts/test or whichever worker collects first.
        imagebuild.start(again=any(item.get_closest_marker("rebuild") for item in session.items))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # a worker: the build may still be another worker's to wait for
    from tests.support import imagebuild

    imagebuild.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.support import imagebuild

    lines = imagebuild.summary()
    if lines:
        terminalreporter.section("SD-card image")
        for line in lines:
            terminalreporter.write_line(line)
