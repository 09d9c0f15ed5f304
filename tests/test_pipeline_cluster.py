"""The same job on a cluster: a standalone Spark master and worker started on loopback from
the pip package, ``ledge-pipeline run --master spark://127.0.0.1:PORT`` in its own process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipeline.generate import Spec, generate, write_landing
from pipeline.session import FAST_JVM, ready_archive
from tests.support.procs import REPO, free_port
from tests.support.wait import wait_for
from tests.test_pipeline_jobs import check_gold, check_silver

SPARK_CLASS = Path(sys.executable).with_name("spark-class")


class SparkDaemon:
    """``spark-class <main> ...`` in the foreground; its log is kept for waiting on."""

    def __init__(self, main: str, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(SPARK_CLASS), main, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_log(self, pattern: str, timeout: float) -> None:
        rx = re.compile(pattern)

        def found() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError("spark daemon exited:\n" + "\n".join(self.lines))
            return any(rx.search(line) for line in list(self.lines))

        wait_for(found, timeout, f"spark log line matching {pattern!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


#: Every JVM here (master, worker, drivers, executors) runs on this machine's Java and
#: Spark: the class archive ``prepare`` made for them maps on their class path, as the
#: README tells an operator (the test took 25.6 s with it against 37.5 s).
ARCHIVE = ready_archive()
JVM = FAST_JVM + (f" -XX:SharedArchiveFile={ARCHIVE}" if ARCHIVE else "")


def spark_env() -> dict[str, str]:
    return dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_JAVA_OPTS=JVM,
        SPARK_DAEMON_MEMORY="256m",
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOG_DIR="/nonexistent-unused",
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, SparkDaemon]]:
    """A master and one worker (2 cores) on loopback; yields the master URL and process."""
    env = spark_env() | {"SPARK_WORKER_DIR": str(tmp_path / "work")}
    port = free_port()
    master = SparkDaemon(
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
        env=env,
    )
    url = f"spark://127.0.0.1:{port}"
    worker: SparkDaemon | None = None
    try:
        master.wait_log(r"I have been elected leader", 60)
        worker = SparkDaemon(
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--cores", "2", "--memory", "768m"),
            *("--webui-port", str(free_port()), url),
            env=env,
        )
        master.wait_log(r"Registering worker 127\.0\.0\.1", 60)
        yield url, master
    finally:
        if worker is not None:
            worker.stop()
        master.stop()


#: Settings given to both ways of starting the job, as an operator would.
CONF = [
    "spark.executor.memory=512m",
    # short-lived JVMs start faster with C1 only and the serial GC
    f"spark.driver.extraJavaOptions={JVM}",
    f"spark.executor.extraJavaOptions={JVM}",
    "spark.driver.host=127.0.0.1",
    # a cluster's tuning is the operator's: 200 shuffle tasks would swamp a small worker
    "spark.sql.shuffle.partitions=2",
]


def run(command: list[str]) -> str:
    done = subprocess.run(
        command,
        check=False,
        cwd=REPO,
        env=spark_env() | {"PYSPARK_DRIVER_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


# Three JVMs start here (master, worker, then two spark-submit runs of up to 170 s each):
# the suite's 120 s default is shorter than the subprocess timeouts it would cut short.
@pytest.mark.timeout(420)
def test_the_same_job_runs_on_a_standalone_cluster(
    spark: SparkSession, tmp_path: Path, cluster: tuple[str, SparkDaemon]
) -> None:
    """Silver under spark-submit (which picks the master), gold with ``--master``."""
    url, master = cluster
    messages, truth = generate(Spec(readings=600))
    root = tmp_path / "tables"
    write_landing(root, messages)
    submit = Path(sys.executable).with_name("spark-submit")
    confs = [x for c in CONF for x in ("--conf", c)]
    log = run(
        [
            *(str(submit), "--master", url, *confs, str(REPO / "pipeline/__main__.py")),
            *("silver", "--root", str(root), "--quiet"),
        ]
    )
    master.wait_log(r"Registering app ledge-pipeline", 5)  # it ran there
    log = run(
        [
            *(sys.executable, "-m", "pipeline", "gold", "--root", str(root), "--quiet"),
            *("--master", url, *confs),
        ]
    )
    assert f"on {url} " in log  # the session says where it runs
    check_silver(spark, root, truth)
    check_gold(spark, root, truth)
