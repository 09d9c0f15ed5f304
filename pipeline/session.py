"""The SparkSession: embedded (``local[*]``) by default, a cluster by configuration.

- no options: ``local[*]`` in this process's JVM;
- ``--master spark://host:7077`` (or ``yarn``, ``k8s://...``): that cluster;
- under ``spark-submit``: whatever spark-submit was told (this code sets no master).

The settings below are the pipeline's own (UTC, dynamic partition overwrite); ``--conf``
values override them, so a cluster's tuning stays with the operator. A local JVM starts
with the class archive ``ledge-pipeline prepare`` wrote for this Java and Spark, if any.

Every session gets silver's JVM judge (``pipeline/java/LineJudge.java``) on its class
path and as the SQL function ``judge.JVM_JUDGE``: it judges the lines a Ledge bridge's
readings make where Spark reads them, and leaves every other line to the Python judge.
Nothing depends on it but speed: without a JDK's ``javac`` (a JRE alone) there is no jar,
and silver judges every line in Python. The jar is compiled once with this machine's
``javac`` against Spark's jars into the cache directory, named after its sources and
Spark's version (``ledge-pipeline prepare`` builds it ahead; otherwise the first session
does, in about two seconds). The jar also holds the file system of a local session's
``file:`` URIs (``LOCAL_FILES``): Hadoop's own, with modes set by a system call, not by a
``chmod`` process per file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

from pipeline.schema import struct
from pipeline.transforms.judge import JVM_CLASS, JVM_JUDGE, JVM_JUDGED

log = logging.getLogger(__name__)

#: PySpark's setting that records each column expression's Python call site.
DEBUG_CALL_SITES: Final = "spark.python.sql.dataFrameDebugging.enabled"
#: Settings every run needs; the rules of the pipeline assume the first three.
DEFAULTS: Final[dict[str, str]] = {
    # Dates and hours in the tables are UTC whatever the machine's zone.
    "spark.sql.session.timeZone": "UTC",
    # Overwrite only the date partitions a run writes (idempotent re-runs).
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    # The last of duplicate JSON keys wins, as in json.loads (silver's payload rules).
    "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
    # The pipeline prints its own progress (pipeline.progress), one line at a time.
    "spark.ui.showConsoleProgress": "false",
    # Timestamps in Parquet's own type (64-bit microseconds, UTC), not the legacy 96-bit
    # one: every reader knows it, and a 1M-line run writes its readings in two thirds of
    # the time, in smaller files.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # PySpark otherwise sends each column expression's Python call site to the JVM as it
    # is built (for error messages that name the line of a query's Python code): about
    # 15 more round trips to the JVM per function call, ``F.col`` 1.3 ms against 0.35 ms.
    # The pipeline's queries are its own, tested code, built with thousands of such calls
    # while the cores wait: a 1M-line run started its first silver stage 0.43 s sooner,
    # and took 24.41 s against 24.69 s (means of 7 interleaved runs).
    DEBUG_CALL_SITES: "false",
}
#: A JVM that starts fast (for tests and short runs): C1 compiler only, serial GC, and
#: the code cache of a JVM with both compilers (240 MiB, reserved, used as it fills).
#: With C1 alone the JVM reserves 48 MiB, which a session running the pipeline's tests
#: fills in about a minute (Janino's generated classes, compiled; they peak near 60 MiB);
#: a full cache cannot take the method-handle adapters the JVM generates as it links
#: new call sites, and one failed link ("InternalError: no such method:
#: MethodHandle.linkToStatic") in one of Spark's own threads stops the SparkContext.
FAST_JVM: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"
#: The collector of a local run (``--conf spark.driver.extraJavaOptions`` naming
#: another one replaces it).
THROUGHPUT_GC: Final = "-XX:+UseParallelGC"
#: With it, what survives a young collection goes to the old generation at once, not
#: after being copied between the survivor spaces at each collection until the tenuring
#: threshold (7 at first, adapting up to 15): what outlives one collection in a batch
#: run is kept data (shuffle and sort buffers, kept rows), not short-lived objects. GC
#: pauses at 1M landing lines: 0.50 to 0.58 s against 0.80 to 0.86 s (4 runs each); at
#: 4M lines 0.93 against 1.36 s. Not added when the user's options set a tenuring
#: threshold themselves (the JVM refuses an initial one above this maximum).
BATCH_TENURING: Final = "-XX:MaxTenuringThreshold=0"
#: The optimising compiler (C2) of a local run: only for code ten times as hot as it
#: waits for by default, and inlining only methods up to 100 bytecodes into hot code
#: (325 by default), compiled methods only up to 1000 bytes of code (2500) and 9 calls
#: deep (15). A run is seconds to minutes of a JVM that plans and generates code for
#: each query, and C2 spent about a third of a run's CPU (18 of 57 s at 1M landing
#: lines) compiling code that ran too briefly to repay it; the quick compiler (C1)
#: still compiles the rest. At 1M landing lines the thresholds took a run from 31.4 to
#: 29.4 s, and the inlining limit to 27.4 s (means of 8 to 10 runs); the shallower
#: inlining later took 26.1 s to 25.4 s (means of 9). A later option
#: (``--conf spark.driver.extraJavaOptions``) overrides each.
BATCH_JIT: Final = (
    "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
    "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000 "
    "-XX:FreqInlineSize=100 -XX:InlineSmallCode=1000 -XX:MaxInlineLevel=9"
)
#: The class metadata of a local run starts at 256 MiB, and its heap at half of
#: ``spark.driver.memory`` (``initial_heap``): growing from the JVM's defaults (21 MiB,
#: 1/64 of the machine's memory) cost a 1M-line run three full collections as Spark
#: loaded its classes and filled its first stages (GC pauses 1.04 s against 0.63 s).
BATCH_METASPACE: Final = "-XX:MetaspaceSize=256m"
#: How long the driver waits for an executor's heartbeat before it takes the executor
#: for lost, by the wall clock. A local session's only executor is the driver's own
#: process, so waiting can only be cut short by the clock: a forward step (an NTP
#: correction, a virtual machine resumed) of more than Spark's 120 s made a local session
#: remove its own executor ("no recent heartbeats: 86409936 ms exceeds timeout 120000
#: ms", a one-day step), after which its heartbeats failed. A year: a step of the
#: clock no longer loses the process's blocks.
HEARTBEAT_TIMEOUT: Final = "spark.storage.blockManagerHeartbeatTimeoutMs"
LOCAL_HEARTBEAT_TIMEOUT_MS: Final = 365 * 86_400_000
#: The module PySpark starts Python workers from, and a local session's choice.
PYTHON_DAEMON: Final = "spark.python.daemon.module"
WORKER_DAEMON: Final = "pipeline.worker_daemon"
LOG4J: Final = Path(__file__).with_name("log4j2.properties")
#: Java options that choose the JVM's class data sharing themselves (then no archive of ours).
OWN_SHARING: Final = re.compile(r"-Xshare|-XX:(SharedArchiveFile|ArchiveClassesAtExit)")


def under_spark_submit() -> bool:
    """True when spark-submit started this Python process (it chose the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def local_cores(master: str) -> int:
    """The task slots of a ``local``, ``local[N]`` or ``local[*]`` master; 0 for a cluster."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if match is None:
        return 0
    count = match.group(1)
    if count is None:
        return 1
    return os.cpu_count() or 1 if count == "*" else int(count)


def local_memory() -> str:
    """The JVM heap of a local run: a quarter of physical memory, 1 to 8 GiB."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return "1g"
    return f"{max(1, min(8, total // 4 // 2**30))}g"


def initial_heap(memory: str) -> str | None:
    """Half of a memory size as ``spark.driver.memory`` takes it (``4g``, ``512m``), for
    ``-Xms``; None for anything else."""
    match = re.fullmatch(r"(\d+)([kmgt])b?", memory.strip().lower())
    if match is None:
        return None
    scale = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}[match.group(2)]
    return f"{max(1, int(int(match.group(1)) * scale) // 2)}m"


def parse_conf(pairs: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` from ``--conf`` into a dict; ValueError naming a bad pair."""
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf {pair!r} is not key=value")
        conf[key.strip()] = value
    return conf


# ------------------------------------------------------------------ the class archive


@dataclass(frozen=True)
class ClassArchive:
    """Where ``ledge-pipeline prepare`` keeps the JVM class archive for this machine's
    Java and Spark (``pipeline.prepare``): a file named after what it was made from, so
    another Java or Spark (an upgrade, another install) looks for another file."""

    path: Path
    #: What the archive was made from: the java binary, its JVM library's size and
    #: modification time, Spark's version, home and when its jars were written.
    identity: dict[str, str]

    @property
    def java(self) -> Path:
        return Path(self.identity["java"])

    @property
    def about(self) -> Path:
        """The archive's description (its identity, when and how it was made)."""
        return self.path.with_suffix(".json")


def cache_dir() -> Path:
    """``$LEDGE_PIPELINE_CACHE``, else ``$XDG_CACHE_HOME/ledge-pipeline`` (``~/.cache``)."""
    own = os.environ.get("LEDGE_PIPELINE_CACHE")
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ledge-pipeline"


def java_binary() -> Path | None:
    """The java PySpark starts (``$JAVA_HOME/bin/java``, else the PATH's), resolved."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home, "bin", "java")) if home else shutil.which("java")
    if found is None or not Path(found).is_file():
        return None
    return Path(os.path.realpath(found))


def spark_home() -> Path:
    """The Spark installation spark-submit runs from: ``$SPARK_HOME``, else PySpark's own."""
    import pyspark

    own = os.environ.get("SPARK_HOME")
    return Path(own) if own else Path(pyspark.__file__).parent


def class_archive() -> ClassArchive | None:
    """The class archive of this machine's Java and Spark (it may not exist yet); None
    without a java to start."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    home = java.parent.parent
    jvm = next((p for p in (home / "lib/server/libjvm.so", java) if p.is_file()), java)
    stat = jvm.stat()
    spark = Path(os.path.realpath(spark_home()))
    # The JVM checks each jar's size and time against the archive's: a Spark installed
    # again (its jars written anew) needs another archive.
    jars = spark / "jars"
    identity = {
        "java": str(java),
        "jvm": f"{jvm} {stat.st_size} {stat.st_mtime_ns}",
        "spark_version": pyspark.__version__,
        "spark_home": str(spark),
        "spark_jars": str(jars.stat().st_mtime_ns) if jars.is_dir() else "",
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return ClassArchive(cache_dir() / f"jvm-{key}.jsa", identity)


def ready_archive() -> Path | None:
    """The class archive to start a local JVM with: this Java and Spark's, when prepared."""
    archive = class_archive()
    return archive.path if archive is not None and archive.path.is_file() else None


# -------------------------------------------------------------------- the JVM judge

JUDGE_SOURCE: Final = Path(__file__).with_name("java") / "LineJudge.java"
#: A local session's file system (``pipeline/java/LocalFiles.java``), in the judge's jar.
FILES_SOURCE: Final = JUDGE_SOURCE.with_name("LocalFiles.java")
LOCAL_FILES: Final = "ledge.pipeline.LocalFiles"
HADOOP_LOCAL_FILES: Final = "org.apache.hadoop.fs.LocalFileSystem"
#: Hadoop's setting for the class of ``file:`` URIs' file system.
FILE_SYSTEM: Final = "spark.hadoop.fs.file.impl"
#: How long javac may take (about two seconds here).
COMPILE_TIMEOUT: Final = 300.0


def judge_jar() -> Path:
    """Where the JVM judge's jar for these sources (``java_sources``) and Spark is kept (it
    may not exist yet)."""
    import pyspark

    spark = f"{pyspark.__version__} {os.path.realpath(spark_home())}".encode()
    source = b"".join(path.read_bytes() for path in java_sources()) + spark
    return cache_dir() / f"judge-{hashlib.sha256(source).hexdigest()[:16]}.jar"


def default_jars() -> str:
    """``spark.jars`` of the ``spark-defaults.conf`` spark-submit reads (``$SPARK_CONF_DIR``,
    else Spark's ``conf/``), which a value the session is built with would replace."""
    folder = os.environ.get("SPARK_CONF_DIR") or str(spark_home() / "conf")
    try:
        lines = Path(folder, "spark-defaults.conf").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    found = ""
    for line in lines:  # (java.util.Properties: key=value, key:value or key value)
        match = re.fullmatch(r"\s*spark\.jars\s*[=:\s]\s*(.*?)\s*", line)
        if match:
            found = match.group(1)
    return found


def javac() -> Path | None:
    """The ``javac`` beside the java Spark starts, when that Java is a JDK."""
    java = java_binary()
    found = java.with_name("javac") if java is not None else None
    return found if found is not None and found.is_file() else None


def java_sources() -> tuple[Path, ...]:
    """The Java sources compiled into the judge's jar."""
    return (JUDGE_SOURCE, FILES_SOURCE)


def ready_judge() -> Path | None:
    """The JVM judge's jar (with ``LOCAL_FILES``), compiled now if it is not there yet;
    None (the reason logged) when it cannot be: silver then judges every line in Python."""
    for source in java_sources():
        if not source.is_file():
            log.warning("%s is missing: silver judges every landing line in Python", source)
            return None
    path = judge_jar()
    if path.is_file():
        return path
    compiler = javac()
    if compiler is None:
        log.info("no javac (a JDK) beside java: silver judges every landing line in Python")
        return None
    with tempfile.TemporaryDirectory(prefix="ledge-judge-") as tmp:
        classes = Path(tmp, "classes")
        command = [
            str(compiler), "--release", "17", "-nowarn", "-d", str(classes),
            "-cp", str(spark_home() / "jars" / "*"), *map(str, java_sources()),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("the JVM judge was not compiled (%s): lines are judged in Python", exc)
            return None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip()[-2000:]
            log.warning("the JVM judge does not compile (lines are judged in Python): %s", why)
            return None
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
                for made in sorted(classes.rglob("*.class")):
                    jar.write(made, made.relative_to(classes).as_posix())
            os.replace(partial, path)
        except OSError as exc:
            log.warning("the JVM judge's jar was not written (%s): lines are judged in Python", exc)
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            return None
    log.info("compiled the JVM judge: %s", path)
    return path


def register_judge(spark: SparkSession) -> bool:
    """Make ``JVM_JUDGE`` a function of ``spark`` when the judge's class loads (its jar is
    on the class path); False, and silver judges in Python, when it does not."""
    try:
        spark.udf.registerJavaFunction(JVM_JUDGE, JVM_CLASS, struct(JVM_JUDGED))
    except Exception as exc:  # the class is not on this session's class path
        log.info("the JVM judge is not on the class path (%s): lines are judged in Python", exc)
        return False
    return True


# ----------------------------------------------------------------------------- settings


def settings(
    master: str | None,
    conf: Mapping[str, str],
    fast_jvm: bool = False,
    archive: Path | None = None,
    judge: Path | None = None,
) -> dict[str, str]:
    """Every setting the session is built with (the master under ``spark.master``).

    ``archive``: a class archive (``ready_archive``) a local JVM starts with, unless the
    options already choose the JVM's class sharing or put classes before Spark's (the
    archive then no longer matches the class path). ``judge``: the JVM judge's jar
    (``ready_judge``), added to ``spark.jars`` after the user's own (``conf``'s, else
    ``spark-defaults.conf``'s)."""
    out = dict(DEFAULTS)
    if master is not None:
        out["spark.master"] = master
    elif not under_spark_submit():
        out["spark.master"] = "local[*]"
    cores = local_cores(out.get("spark.master", ""))
    half: str | None = None  # of a local run's memory: the heap's start, and off the heap
    if cores:
        # A cached plan keeps its last shuffle's partition count (adaptive execution may not
        # coalesce it), and 200 near-empty tasks per stage dominate a small local run.
        out["spark.sql.shuffle.partitions"] = str(2 * cores)
        # Landing files are read in about four splits per core (not the fewest 128 MiB
        # splits): three splits on two cores leave one core idle for the last third.
        out["spark.sql.files.minPartitionNum"] = str(4 * cores)
        # What a local run caches (gold's minute rows; silver keeps its own rows as a
        # checkpoint) is built and read back in two thirds of the time uncompressed (a
        # spill goes to local disk).
        out["spark.sql.inMemoryColumnarStorage.compressed"] = "false"
        # The process is the whole cluster: a quarter of the machine's memory (Spark's
        # 1 GiB default makes a 4M-line run sort and cache through the disk).
        out["spark.driver.memory"] = local_memory()
        half = initial_heap(conf.get("spark.driver.memory", out["spark.driver.memory"]))
        if half and not any(k.startswith("spark.memory.offHeap.") for k in conf):
            # Sorts, aggregations and shuffle buffers in memory of their own, beside a
            # heap of twice as much: the collector no longer copies and scans them. GC
            # pauses of silver's deduplication at 4M landing lines: 0.20 to 0.88 s
            # against 2.24 to 2.98 s.
            out["spark.memory.offHeap.enabled"] = "true"
            out["spark.memory.offHeap.size"] = half
        if not {"spark.network.timeout", HEARTBEAT_TIMEOUT} & set(conf):
            out[HEARTBEAT_TIMEOUT] = str(LOCAL_HEARTBEAT_TIMEOUT_MS)
        # The Python workers fork from a daemon that loaded silver's judge once
        # (``pipeline.worker_daemon``); a cluster's executors start PySpark's own.
        out[PYTHON_DAEMON] = WORKER_DAEMON
    java = [f"-Dlog4j2.configurationFile={LOG4J.as_uri()}"]
    user_java = conf.get("spark.driver.extraJavaOptions", "")
    if fast_jvm:
        java.append(FAST_JVM)
    elif cores:
        if not re.search(r"-XX:[+-]Use\w+GC", user_java):
            # A batch job in one JVM: the throughput collector. On two cores G1's concurrent
            # work costs a run about a seventh of its time (measured: 37.6 s against 43.7 s).
            java.append(THROUGHPUT_GC)
            if "TenuringThreshold" not in user_java:
                java.append(BATCH_TENURING)
        java.append(BATCH_JIT)
        java.append(BATCH_METASPACE)
        if half and not re.search(r"-Xms|InitialRAM", user_java):
            java.append(f"-Xms{half}")
    if (
        archive is not None
        and cores
        and not OWN_SHARING.search(user_java)
        and "spark.driver.extraClassPath" not in conf
        and not os.environ.get("SPARK_DIST_CLASSPATH")
    ):
        # Spark's classes mapped from the archive, parsed and verified already: the JVM
        # and every first query start sooner (``ledge-pipeline prepare``).
        java.append(f"-XX:SharedArchiveFile={archive}")
    if user_java:
        java.append(user_java)
    out["spark.driver.extraJavaOptions"] = " ".join(java)
    out.update({k: v for k, v in conf.items() if k != "spark.driver.extraJavaOptions"})
    if judge is not None:
        own = conf.get("spark.jars", default_jars())
        out["spark.jars"] = ",".join(filter(None, (own, str(judge))))
        if cores and FILE_SYSTEM not in conf:
            # Files written with their modes set by a system call (``LOCAL_FILES``), not
            # a chmod process each: 283 processes in a 1M-line run. ``build`` puts the
            # jar on the JVM's class path, where Hadoop looks for the class.
            out[FILE_SYSTEM] = LOCAL_FILES
    return out


def build(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    app_name: str = "ledge-pipeline",
    fast_jvm: bool = False,
) -> SparkSession:
    """A SparkSession with the pipeline's settings (see the module docstring); a local
    one starts with this machine's class archive when ``ledge-pipeline prepare`` made it."""
    builder = SparkSession.builder.appName(app_name)
    # (under spark-submit its JVM runs already: the judge is there when --jars names it)
    judge = None if under_spark_submit() else ready_judge()
    chosen = settings(master, conf or {}, fast_jvm, ready_archive(), judge)
    if local_cores(chosen.get("spark.master", "")) and "spark.pyspark.python" not in chosen:
        # Silver's rules run in Python workers: in-process, this interpreter with the
        # pipeline's packages (on a cluster, the operator names the executors' Python
        # with PYSPARK_PYTHON or spark.pyspark.python). PySpark reads the variable.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    ours = chosen.get(FILE_SYSTEM) == LOCAL_FILES
    if ours and not _starts_with(judge):
        del chosen[FILE_SYSTEM]
        ours = False
    for key, value in chosen.items():
        builder = builder.config(key, value)
    with _on_class_path(judge if ours else None):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_judge(spark)
    log.info(
        "spark %s on %s (%d cores for tasks)",
        spark.version,
        spark.sparkContext.master,
        spark.sparkContext.defaultParallelism,
    )
    return spark


def _starts_with(jar: Path | None) -> bool:
    """True when the JVM the next session runs in has ``jar`` on its class path from its
    start: when ``build`` starts that JVM (``_on_class_path``), or one started so runs
    already. (PySpark keeps its JVM from one session to the next.)"""
    from pyspark import SparkContext

    if jar is None:
        return False
    jvm = SparkContext._jvm
    if jvm is None:
        return True
    class_path = str(jvm.java.lang.System.getProperty("java.class.path"))
    return str(jar) in class_path.split(os.pathsep)


@contextlib.contextmanager
def _on_class_path(jar: Path | None) -> Iterator[None]:
    """A JVM PySpark starts in the ``with`` block has ``jar`` at the end of its class path
    (``SPARK_DIST_CLASSPATH``, which spark-submit appends): loaded by the JVM's own class
    loader, which Hadoop looks in as spark-submit starts. At the end, where the class
    archive (``ledge-pipeline prepare``) still matches what comes before it."""
    if jar is None:
        yield
        return
    before = os.environ.get("SPARK_DIST_CLASSPATH")
    os.environ["SPARK_DIST_CLASSPATH"] = os.pathsep.join(filter(None, (before, str(jar))))
    try:
        yield
    finally:
        if before is None:
            del os.environ["SPARK_DIST_CLASSPATH"]
        else:
            os.environ["SPARK_DIST_CLASSPATH"] = before


def stop(spark: SparkSession) -> None:
    """Stop ``spark`` without waiting for PySpark's accumulator server.

    ``SparkSession.stop`` waits for that server's thread, which sees it is to stop only
    at its next poll, once a second: from the end of a 1M-line run's application to the
    process's exit it took 0.56 to 1.10 s, and 0.15 to 0.23 s this way (8 runs each).
    Here the JVM's side stops first, as there, and the server stops on a thread of its
    own (also when stopping the JVM's side failed): a process that goes on sees it gone
    within a second, one that exits ends it with it. A server on a Unix socket has its
    socket file removed at once (the thread would remove it only after that poll)."""
    context = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)
    # (``SparkContext.stop`` waits for it; PySpark sets None there too)
    context._accumulatorServer = None  # type: ignore[assignment]
    try:
        spark.stop()
    finally:
        if server is not None:
            threading.Thread(target=server.shutdown, name="accumulator-stop", daemon=True).start()
            if isinstance(server.server_address, str):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(server.server_address)
