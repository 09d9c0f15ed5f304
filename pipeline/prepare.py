"""``ledge-pipeline prepare``: the JVM class archive of this machine's Java and Spark, and
silver's JVM judge compiled (``pipeline.session.ready_judge``).

A fresh JVM loads, parses and verifies some ten thousand of Spark's classes before and
during its first queries. A class archive (the JVM's class data sharing, a dynamic
archive over the JDK's own) holds them ready to map: every later session on a local
master starts with it (``pipeline.session.ready_archive``) and a run finishes seconds
sooner.

To make it, a small generated fleet goes through ``run`` (silver and gold) in a JVM
told to write the classes it loaded when it exits; the JVM is then stopped and waited
for, the archive is checked by a JVM that must map it on Spark's class path, and only
then moved into place (``pipeline.session.cache_dir``; a file per Java and Spark, named
after them). Nothing is lost without it: a run without an archive loads its classes as
before, and a JVM that finds an archive not made for it says so and goes on without.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from pipeline.session import (
    FILE_SYSTEM,
    HADOOP_LOCAL_FILES,
    ClassArchive,
    build,
    class_archive,
    ready_judge,
    stop,
    under_spark_submit,
)

log = logging.getLogger(__name__)

#: How long the JVM may take to exit and write the archive (about 10 s here).
EXIT_TIMEOUT: Final = 600.0


def prepare(force: bool = False) -> int:
    """Write this machine's class archive unless it exists (``force``: again). Exit status."""
    if under_spark_submit():
        log.error("prepare: it starts a JVM of its own; run it directly, not under spark-submit")
        return 1
    archive = class_archive()
    if archive is None:
        log.error("prepare: no java to start (set JAVA_HOME or put java on the PATH)")
        return 1
    judge = ready_judge()
    if judge is not None:
        log.info("prepare: the JVM judge is ready: %s", judge)
    for gone in abandoned(archive.path.parent):
        log.info("prepare: removed %s (left by a prepare that was stopped)", gone)
    if archive.path.is_file() and not force:
        log.info("prepare: the class archive is ready: %s", archive.path)
        return 0
    partial = archive.path.with_name(f"{archive.path.stem}.{os.getpid()}.partial")
    started = time.monotonic()
    log.info("prepare: writing the class archive for %s (under a minute)", archive.java)
    try:
        archive.path.parent.mkdir(parents=True, exist_ok=True)
        class_path = _record(partial, archive)
        problem = _check(archive.java, partial, class_path)
        if problem:
            log.error("prepare: the archive %s does not load: %s", partial, problem)
            return 1
        os.replace(partial, archive.path)
    except Exception as exc:  # (runs do without an archive: say why, and stop)
        log.error("prepare: no class archive written: %s", exc)
        return 1
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
    made = {**archive.identity, "made": datetime.now(UTC).isoformat(timespec="seconds")}
    archive.about.write_text(json.dumps(made, indent=2) + "\n")
    log.info(
        "prepare: wrote %s (%.0f MiB) in %.0f s; local runs start with it",
        archive.path,
        archive.path.stat().st_size / 2**20,
        time.monotonic() - started,
    )
    for gone in outdated(archive):
        log.info("prepare: removed %s (made for a Spark since installed again, or gone)", gone)
    return 0


def abandoned(cache: Path) -> list[Path]:
    """Remove the ``NAME.PID.partial`` files in ``cache`` whose process is gone: a prepare
    (or a judge's compilation) killed while writing leaves one, an archive's size, for
    good otherwise. A live process's is its own to finish. The files removed."""
    removed = []
    for partial in sorted(cache.glob("*.partial")):
        _, _, pid = partial.stem.rpartition(".")
        if not pid.isdigit() or _running(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
            removed.append(partial)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def outdated(archive: ClassArchive) -> list[Path]:
    """Remove the archives beside ``archive`` that no JVM can use any more: made for the
    Spark at the same place before it was installed again (the JVM refuses them: their
    jars changed), or for a Spark that is gone. The archives removed."""
    removed = []
    for about in sorted(archive.path.parent.glob("jvm-*.json")):
        if about == archive.about:
            continue
        try:
            home = json.loads(about.read_text()).get("spark_home", "")
        except (OSError, ValueError, AttributeError):
            continue  # (not ours to judge)
        if home == archive.identity["spark_home"] or not Path(home, "jars").is_dir():
            for path in (about.with_suffix(".jsa"), about):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            removed.append(about.with_suffix(".jsa"))
    return removed


def _record(partial: Path, archive: ClassArchive) -> str:
    """Run a small fleet through silver and gold in a JVM that writes the classes it
    loaded to ``partial`` as it exits; wait for it to exit. Spark's class path."""
    from pyspark import SparkContext

    from pipeline import jobs
    from pipeline.config import PipelineConfig
    from pipeline.generate import Spec, generate, write_landing
    from pipeline.storage import Layout

    # (classes the archive cannot hold, e.g. from signed jars, are warnings: left out)
    java = f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds*=error"
    with tempfile.TemporaryDirectory(prefix="ledge-prepare-") as root:
        messages, _ = generate(Spec())
        write_landing(Path(root), messages)
        # Spark's class path alone (Hadoop's own local file system): a session's JVM
        # appends the judge's jar (``session.LOCAL_FILES``), and the archive still matches
        # when the jar is made again for another source.
        conf = {"spark.driver.extraJavaOptions": java, FILE_SYSTEM: HADOOP_LOCAL_FILES}
        spark = build("local[2]", conf, app_name="ledge-pipeline-prepare")
        gateway = SparkContext._gateway
        assert gateway is not None
        system = spark.sparkContext._jvm.java.lang.System  # type: ignore[union-attr]
        home, class_path = system.getProperty("java.home"), system.getProperty("java.class.path")
        quiet = logging.getLogger(jobs.__name__)
        level = quiet.level
        quiet.setLevel(logging.WARNING)  # (the sample's own tables are of no interest)
        try:
            jobs.run(spark, Layout(root), PipelineConfig(), progress=False)
        finally:
            quiet.setLevel(level)
            stop(spark)
            # The JVM exits when its standard input closes (PySpark's gateway), writing
            # the archive on its way out.
            process = gateway.proc
            gateway.shutdown()
            process.stdin.close()
            process.wait(timeout=EXIT_TIMEOUT)
            SparkContext._gateway = None
            SparkContext._jvm = None
    if os.path.realpath(Path(home, "bin", "java")) != str(archive.java):
        raise RuntimeError(f"Spark started {home}/bin/java, not {archive.java}")
    return str(class_path)


def _check(java: Path, archive: Path, class_path: str) -> str | None:
    """None when a JVM maps ``archive`` on ``class_path`` (or must refuse to start)."""
    if not archive.is_file():
        return "the JVM wrote no archive (does this Java have its base class archive?)"
    command = [str(java), "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", class_path]
    done = subprocess.run([*command, "-version"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit status {done.returncode}"
    return None
