"""``ledge-pipeline prepare``: the class archive a local session starts with.

The end-to-end test takes the real archive ``prepare`` wrote with the real JVM for this
run (``scripts/setup --test`` writes it once; the test writes it when that did not), has
the JDK's own ``java`` map it on Spark's class path, and a real run of the pipeline load
Spark's classes from it (the JVM's class-loading log names where each class came from).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import session as S
from pipeline import worker_daemon as WD
from tests.support.procs import REPO

# ----------------------------------------------------------------------------- settings


def test_a_local_session_starts_with_the_archive_it_is_given(tmp_path: Path) -> None:
    archive = tmp_path / "jvm.jsa"
    java = S.settings("local[2]", {}, archive=archive)["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={archive}" in java.split()
    fast = S.settings("local[2]", {}, fast_jvm=True, archive=archive)
    assert f"-XX:SharedArchiveFile={archive}" in fast["spark.driver.extraJavaOptions"]
    # the user's options come last (a later JVM option wins)
    own = S.settings("local[2]", {"spark.driver.extraJavaOptions": "-Xmx2g"}, archive=archive)
    assert own["spark.driver.extraJavaOptions"].endswith("-Xmx2g")


@pytest.mark.parametrize(
    ("master", "conf"),
    [
        ("spark://127.0.0.1:7077", {}),  # a cluster's driver: not this machine's JVM
        ("local[2]", {"spark.driver.extraJavaOptions": "-Xshare:off"}),
        ("local[2]", {"spark.driver.extraJavaOptions": "-XX:SharedArchiveFile=/other.jsa"}),
        ("local[2]", {"spark.driver.extraJavaOptions": "-XX:ArchiveClassesAtExit=/new.jsa"}),
        # classes before Spark's: the archive no longer matches the class path
        ("local[2]", {"spark.driver.extraClassPath": "/opt/extra.jar"}),
    ],
)
def test_no_archive_where_it_cannot_apply(master: str, conf: dict[str, str]) -> None:
    java = S.settings(master, conf, archive=Path("/cache/jvm.jsa"))["spark.driver.extraJavaOptions"]
    assert "/cache/jvm.jsa" not in java


def test_a_local_session_with_the_judges_jar_takes_its_local_file_system() -> None:
    jar = Path("/cache/judge.jar")
    assert S.settings("local[2]", {}, judge=jar)[S.FILE_SYSTEM] == S.LOCAL_FILES
    assert S.FILE_SYSTEM not in S.settings("local[2]", {}, judge=None)  # no jar, no class
    # a cluster's executors start before any jar reaches them
    assert S.FILE_SYSTEM not in S.settings("spark://127.0.0.1:7077", {}, judge=jar)
    own = {S.FILE_SYSTEM: "org.example.Files"}  # the user's choice stays
    assert S.settings("local[2]", own, judge=jar)[S.FILE_SYSTEM] == "org.example.Files"


def test_a_local_sessions_files_get_hadoops_modes_without_a_chmod_process(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``file:`` URIs go through ``LocalFiles``: every file, checksum file and folder gets
    the mode Hadoop's own local file system (which runs chmod) gives it, by a system call;
    a mode with a sticky bit still through chmod."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop = jvm.org.apache.hadoop.fs
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    files = hadoop.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert files.getClass().getName() == S.LOCAL_FILES
    stock = hadoop.LocalFileSystem()
    stock.initialize(jvm.java.net.URI("file:///"), conf)

    def made(fs: Any, root: Path) -> dict[str, int]:
        def at(relative: str) -> Any:
            return hadoop.Path(str(root / relative))

        def mode(text: str) -> Any:
            return hadoop.permission.FsPermission(text)

        assert fs.mkdirs(at("a/b"), mode("770"))
        for name in ("f", "g"):
            out = fs.create(at(f"a/b/{name}"), True)
            out.write(b"x")
            out.close()
        fs.setPermission(at("a/b/g"), mode("600"))
        assert fs.mkdirs(at("t"), mode("777"))
        fs.setPermission(at("t"), mode("1777"))
        return {str(p.relative_to(root)): p.stat().st_mode & 0o7777 for p in root.rglob("*")}

    ours = made(files, tmp_path / "ours")
    assert ours == made(stock, tmp_path / "stock")
    assert (ours["a/b"], ours["a/b/f"], ours["a/b/.f.crc"]) == (0o750, 0o644, 0o644)
    assert (ours["a/b/g"], ours["t"]) == (0o600, 0o1777)


def test_a_local_run_waits_longer_for_the_optimising_compiler() -> None:
    """A local run (not a cluster's driver, not the tests' quick JVM) raises C2's
    thresholds, which the JDK's own java takes as given; the user's options come later
    and win."""
    java = S.settings("local[2]", {})["spark.driver.extraJavaOptions"].split()
    batch = S.BATCH_JIT.split()
    assert set(batch) <= set(java)
    for master, fast in (("spark://127.0.0.1:7077", False), ("local[2]", True)):
        assert not set(batch) & set(
            S.settings(master, {}, fast)["spark.driver.extraJavaOptions"].split()
        )
    own = S.settings(
        "local[2]", {"spark.driver.extraJavaOptions": "-XX:Tier4InvocationThreshold=7"}
    )
    options = own["spark.driver.extraJavaOptions"].split()
    binary = S.java_binary()
    assert binary is not None
    given = [o for o in options if o.startswith("-XX:")]
    flags = subprocess.run(
        [str(binary), *given, "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    final = dict(re.findall(r"^\s*\w+\s+(\w+)\s+=\s+(\S+)", flags, re.M))
    assert final["Tier4InvocationThreshold"] == "7"  # the user's, given last
    assert final["Tier4CompileThreshold"] == "150000"
    assert final["Tier4BackEdgeThreshold"] == "400000"
    assert final["FreqInlineSize"] == "100"
    assert (final["InlineSmallCode"], final["MaxInlineLevel"]) == ("1000", "9")


def test_a_local_run_starts_its_heap_at_half_the_driver_memory() -> None:
    """Half of the memory chosen (the user's, else a quarter of the machine's), which the
    JDK's java accepts beside the maximum Spark gives it; none on a cluster's driver, or
    when the user's options size the heap's start."""

    def java(master: str, conf: dict[str, str]) -> list[str]:
        return S.settings(master, conf)["spark.driver.extraJavaOptions"].split()

    batch = {"-Xms1536m", S.BATCH_METASPACE, S.THROUGHPUT_GC, S.BATCH_TENURING}
    assert batch <= set(java("local[2]", {"spark.driver.memory": "3g"}))
    # (the JVM refuses an initial tenuring threshold above the maximum: the user's wins)
    own = {"spark.driver.extraJavaOptions": "-XX:InitialTenuringThreshold=3"}
    assert S.BATCH_TENURING not in java("local[2]", own)
    chosen = S.settings("local[2]", {})["spark.driver.memory"]
    assert f"-Xms{S.initial_heap(chosen)}" in java("local[2]", {})
    assert S.initial_heap("4096m") == "2048m" and S.initial_heap("lots") is None
    for master, conf in (
        ("spark://127.0.0.1:7077", {}),
        ("local[2]", {"spark.driver.extraJavaOptions": "-Xms64m"}),
    ):
        assert [o for o in java(master, conf) if o.startswith("-Xms")] in ([], ["-Xms64m"])
    binary = S.java_binary()
    assert binary is not None
    given = [o for o in java("local[2]", {}) if o.startswith("-X")]
    subprocess.run(
        [str(binary), f"-Xmx{chosen}", *given, "-version"], check=True, capture_output=True
    )


def test_a_local_run_sorts_off_the_heap_and_keeps_its_executor_when_the_clock_steps(
    spark: SparkSession,
) -> None:
    """A local session: execution memory outside the heap (half the heap's size), and no
    heartbeat timeout a step of the wall clock could reach; the user's own settings win,
    and a cluster gets neither. The tests' own session has both."""
    conf = S.settings("local[2]", {"spark.driver.memory": "3g"})
    assert conf["spark.memory.offHeap.enabled"] == "true"
    assert conf["spark.memory.offHeap.size"] == "1536m"
    assert int(conf[S.HEARTBEAT_TIMEOUT]) >= 365 * 86_400_000
    own = S.settings("local[2]", {"spark.memory.offHeap.enabled": "false"})
    assert own["spark.memory.offHeap.enabled"] == "false"
    assert "spark.memory.offHeap.size" not in own
    assert S.HEARTBEAT_TIMEOUT not in S.settings("local[2]", {"spark.network.timeout": "300s"})
    cluster = S.settings("spark://127.0.0.1:7077", {})
    assert not {"spark.memory.offHeap.enabled", S.HEARTBEAT_TIMEOUT} & set(cluster)

    running = spark.sparkContext.getConf()
    assert running.get(S.HEARTBEAT_TIMEOUT) == str(S.LOCAL_HEARTBEAT_TIMEOUT_MS)
    assert running.get("spark.memory.offHeap.enabled") == "true"
    memory = S.initial_heap(running.get("spark.driver.memory") or "")
    assert memory is not None and running.get("spark.memory.offHeap.size") == memory


def test_a_local_sessions_python_workers_fork_with_the_judge_loaded(spark: SparkSession) -> None:
    """A local session's Python workers fork from ``pipeline.worker_daemon``, which loaded
    silver's judge and what it imports first; the user's own daemon wins, and a cluster
    keeps PySpark's."""
    variable = WD.LOADED_ENV

    def seen(_: int) -> tuple[str, str]:
        import os

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as parent:
            command = parent.read().replace(b"\0", b" ").decode()
        return command, os.environ.get(variable, "")

    for command, loaded in spark.sparkContext.parallelize(range(2), 2).map(seen).collect():
        assert f"-m {S.WORKER_DAEMON}" in command
        assert loaded.split(",") == list(WD.PRELOADED)
    own = S.settings("local[2]", {S.PYTHON_DAEMON: "own.daemon"})
    assert own[S.PYTHON_DAEMON] == "own.daemon"
    assert S.PYTHON_DAEMON not in S.settings("spark://127.0.0.1:7077", {})


def test_a_module_the_daemon_cannot_load_is_left_to_the_workers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon names what it could not load, on stderr, and goes on without it."""
    monkeypatch.setenv(WD.LOADED_ENV, "")  # (put back after)
    assert WD.preload(("json", "ledge_no_such_module", "base64")) == ["json", "base64"]
    assert os.environ[WD.LOADED_ENV] == "json,base64"
    out, err = capsys.readouterr()
    assert out == ""  # (the daemon's stdout carries its port to the JVM)
    assert "import ledge_no_such_module themselves" in err


def test_a_column_expression_is_built_without_sending_its_call_site(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's column expressions cost a few round trips to the JVM each, not ~15
    more for PySpark's record of the Python line each was built on; the user's own
    setting wins."""
    import py4j.clientserver  # type: ignore[import-untyped]
    from pyspark.errors import utils
    from pyspark.sql import functions as F

    sent: list[str] = []
    send = py4j.clientserver.ClientServerConnection.send_command

    def counted(self: object, command: str) -> str:
        sent.append(command)
        return send(self, command)  # type: ignore[no-any-return]

    # (PySpark reads the setting once per process, at the first expression it builds)
    monkeypatch.setattr(utils, "_enable_debugging_cache", None)
    monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", counted)
    F.when(F.col("a").isNull(), F.lit(1)).otherwise(F.col("b"))
    assert sent, "no command reached the JVM"
    assert not [c for c in sent if "PySparkCurrentOrigin" in c]
    assert S.settings("local[2]", {S.DEBUG_CALL_SITES: "true"})[S.DEBUG_CALL_SITES] == "true"


def test_the_archive_is_named_after_the_java_and_spark_it_was_made_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGE_PIPELINE_CACHE", str(tmp_path / "cache"))
    homes = []
    for name in ("a", "b"):
        home = tmp_path / name
        (home / "bin").mkdir(parents=True)
        (home / "lib/server").mkdir(parents=True)
        (home / "bin/java").write_text("#!/bin/sh\n")
        (home / "lib/server/libjvm.so").write_text(name)
        homes.append(home)
    paths = []
    for home in homes:
        monkeypatch.setenv("JAVA_HOME", str(home))
        archive = S.class_archive()
        assert archive is not None
        assert archive.path.parent == tmp_path / "cache"
        assert archive.java == home / "bin/java"
        paths.append(archive.path)
    # the same Java upgraded in place (another JVM library): another archive
    (homes[1] / "lib/server/libjvm.so").write_text("b, upgraded")
    upgraded = S.class_archive()
    spark = tmp_path / "another-spark"
    (spark / "jars").mkdir(parents=True)
    monkeypatch.setenv("SPARK_HOME", str(spark))
    elsewhere = S.class_archive()
    # the same Spark installed again: its jars written anew (a later time)
    os.utime(spark / "jars", ns=(10**18, 10**18))
    reinstalled = S.class_archive()
    assert upgraded is not None and elsewhere is not None and reinstalled is not None
    assert len({*paths, upgraded.path, elsewhere.path, reinstalled.path}) == 5
    assert S.ready_archive() is None  # none of them was written
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java-here"))
    assert S.class_archive() is None


# ---------------------------------------------------------------------------- end to end


#: A run as a user's: the pipeline's own session (which starts with the archive), a small
#: fleet through silver and gold, with the JVM's class-loading log; then its class path.
PROBE = """
import sys
from pathlib import Path
from pipeline import jobs
from pipeline.config import PipelineConfig
from pipeline.generate import Spec, generate, write_landing
from pipeline.session import build, stop
from pipeline.storage import Layout
root = sys.argv[2]
write_landing(Path(root), generate(Spec(readings=300))[0])
spark = build("local[2]", {"spark.driver.extraJavaOptions": sys.argv[1]})
jobs.run(spark, Layout(root), PipelineConfig(), progress=False)
print(spark.sparkContext._jvm.java.lang.System.getProperty("java.class.path"))
stop(spark)
"""


def _run(
    command: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="session")
def prepared() -> S.ClassArchive:
    """This machine's class archive as ``ledge-pipeline prepare`` wrote it: once per run,
    by ``scripts/setup --test`` (the archive every local session of the run then starts
    with); when the tests run without that, here, once (a lock keeps workers from writing
    it side by side), and it must succeed."""
    archive = S.class_archive()
    assert archive is not None, "no java to make an archive for"
    archive.path.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.path.parent / ".tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not archive.path.is_file():
            done = _run([sys.executable, "-m", "pipeline", "prepare"], dict(os.environ), 280)
            assert done.returncode == 0, done.stderr[-3000:]
    return archive


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prepare_writes_an_archive_that_a_session_loads_spark_from(
    prepared: S.ClassArchive, tmp_path: Path
) -> None:
    archive = prepared.path
    written = {p.name for p in archive.parent.iterdir()}
    judge = S.judge_jar().name  # and the JVM judge compiled (this machine has a JDK)
    assert {judge, archive.name, f"{archive.stem}.json"} <= written
    assert not [name for name in written if name.endswith(".partial")]  # (none left)
    assert json.loads(prepared.about.read_text())["spark_home"] == prepared.identity["spark_home"]
    java = S.java_binary()
    assert java is not None

    # A run of the pipeline's own starts with it and loads Spark's classes from it, and
    # Spark's driver log says nothing of what the pipeline does on purpose
    # (``pipeline/log4j2.properties``).
    log = tmp_path / "classes.log"
    probe = [sys.executable, "-c", PROBE, f"-Xlog:class+load=info:file={log}", str(tmp_path)]
    done = _run(probe, dict(os.environ), 170)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if " WARN spark " in line]
    assert not warned, warned
    class_path = done.stdout.strip().splitlines()[-1]
    loaded = log.read_text()
    shared = re.compile(r"org\.apache\.spark\.sql\.SparkSession source: shared objects file")
    assert shared.search(loaded), "SparkSession was not loaded from the archive"
    from_archive = loaded.count("source: shared objects file (top)")
    assert from_archive > 5000, f"only {from_archive} classes came from the archive"

    # The JDK maps it on that class path, and refuses it on another one.
    def maps(class_path: str) -> subprocess.CompletedProcess[str]:
        share = ["-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", class_path]
        return _run([str(java), *share, "-version"], dict(os.environ), 60)

    assert maps(class_path).returncode == 0, maps(class_path).stderr
    assert maps(str(tmp_path)).returncode != 0
    # The session's JVM has the judge's jar last (its local file system is there), and the
    # archive was made without it: it maps as well beside a jar made for another source.
    entries = class_path.split(os.pathsep)
    assert entries[-1] == str(archive.parent / judge), entries[-3:]
    shutil.copy(entries[-1], tmp_path / "judge-other.jar")
    other = os.pathsep.join([*entries[:-1], str(tmp_path / "judge-other.jar")])
    assert maps(other).returncode == 0, maps(other).stderr

    # Once written, prepare leaves it be, and removes what a prepare killed while
    # writing left (its process gone).
    before = archive.stat().st_mtime_ns
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = archive.with_name(f"{archive.stem}.{gone.pid}.partial")
    left.write_bytes(b"half an archive")
    done = _run([sys.executable, "-m", "pipeline", "prepare"], dict(os.environ), 60)
    assert done.returncode == 0 and "ready" in done.stderr, done.stderr
    assert archive.stat().st_mtime_ns == before
    assert not left.exists() and "left by a prepare that was stopped" in done.stderr


def test_prepare_says_why_it_wrote_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from pipeline.prepare import prepare

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("LEDGE_PIPELINE_CACHE", str(tmp_path / "a-file" / "cache"))
    assert prepare() == 1
    assert "no class archive written" in caplog.text and "a-file" in caplog.text
    caplog.clear()
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # what spark-submit sets
    assert prepare() == 1
    assert "not under spark-submit" in caplog.text


def test_prepare_removes_the_archives_no_jvm_can_use(tmp_path: Path) -> None:
    from pipeline.prepare import outdated

    here, there = tmp_path / "spark-here", tmp_path / "spark-there"
    for spark in (here, there):
        (spark / "jars").mkdir(parents=True)
    cache = tmp_path / "cache"
    cache.mkdir()

    def made(name: str, **identity: str) -> S.ClassArchive:
        archive = S.ClassArchive(cache / f"jvm-{name}.jsa", identity)
        archive.path.write_bytes(b"archive")
        archive.about.write_text(json.dumps(identity))
        return archive

    new = made("new", spark_home=str(here))
    made("before-reinstall", spark_home=str(here))  # same place, older jars
    made("other-install", spark_home=str(there))  # another install still there
    made("gone", spark_home=str(tmp_path / "removed-venv"))
    (cache / "jvm-unreadable.json").write_text("not json")
    (cache / "notes.txt").write_text("someone else's")
    removed = outdated(new)
    assert sorted(p.name for p in removed) == ["jvm-before-reinstall.jsa", "jvm-gone.jsa"]
    assert sorted(p.name for p in cache.iterdir()) == [
        "jvm-new.jsa",
        "jvm-new.json",
        "jvm-other-install.jsa",
        "jvm-other-install.json",
        "jvm-unreadable.json",
        "notes.txt",
    ]


def test_prepare_removes_what_a_stopped_prepare_left_half_written(tmp_path: Path) -> None:
    """Broken, a prepare killed while writing would leave its partial archive (170 MB)
    in the cache for good; or one prepare would remove another's, still being written."""
    from pipeline.prepare import abandoned

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid: a process that has ended
    left = tmp_path / f"jvm-0123456789abcdef.{gone.pid}.partial"
    jar = tmp_path / f"ledge-judge-0123.jar.{gone.pid}.partial"
    writing = tmp_path / f"jvm-0123456789abcdef.{os.getpid()}.partial"
    odd = tmp_path / "notes.partial"  # no pid: not one of ours
    for path in (left, jar, writing, odd):
        path.write_bytes(b"half")
    assert abandoned(tmp_path) == sorted([jar, left])
    assert sorted(p.name for p in tmp_path.iterdir()) == [writing.name, odd.name]


STOP_PROBE = """
import os, socket, time
from pipeline.session import build, stop

def refused(address):
    try:
        socket.create_connection(address, timeout=1).close()
    except (ConnectionRefusedError, ConnectionResetError):  # (reset: reached as it closed)
        return True
    return False

def check(ok, problem):
    if not ok:
        raise SystemExit(problem)

spark = build("local[1]", fast_jvm=True)
spark.range(3).count()
address = spark.sparkContext._accumulatorServer.server_address
check(not refused(address), "the accumulator server was not listening")
stop(spark)
deadline = time.monotonic() + 10
while not refused(address):
    check(time.monotonic() < deadline, "the accumulator server still listens")
    time.sleep(0.05)

unix = build("local[1]", {"spark.python.unix.domain.socket.enabled": "true"}, fast_jvm=True)
path = unix.sparkContext._accumulatorServer.server_address
check(isinstance(path, str) and os.path.exists(path), f"no Unix socket: {path!r}")
stop(unix)
check(not os.path.exists(path), f"the accumulator socket {path} is left behind")

again = build("local[1]", fast_jvm=True)  # the process goes on: a new session counts
counted = again.sparkContext.accumulator(0)
again.sparkContext.parallelize(range(5), 2).foreach(lambda _: counted.add(1))
print("counted", counted.value)
stop(again)
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_stopped_session_leaves_nothing_listening_and_another_can_start() -> None:
    done = _run([sys.executable, "-c", STOP_PROBE], dict(os.environ), 170)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "counted 5"


def test_only_the_tests_using_the_shared_session_are_kept_on_its_worker(
    request: pytest.FixtureRequest,
) -> None:
    """``--dist loadgroup`` keeps the tests using the shared Spark session on one worker;
    the others here (the archive written, a session stopped: each a JVM of its own) run
    on any worker, beside them (tests/conftest.py GROUPS)."""

    def group(item: pytest.Item) -> str | None:
        marker = item.get_closest_marker("xdist_group")
        return None if marker is None else str(marker.args[0])

    assert group(request.node) is None  # (this test uses no session)
    # and every pipeline test collected with it
    ours = [i for i in request.session.items if i.nodeid.startswith("tests/test_pipeline_")]
    for item in ours:
        uses = "spark" in getattr(item, "fixturenames", ())
        assert group(item) == ("spark" if uses else None), item.nodeid
