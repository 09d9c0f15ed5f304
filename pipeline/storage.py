"""Where the tables live under the root URI, and the few file operations jobs need.

Everything goes through Hadoop's FileSystem in the Spark JVM, so the root may be any URI
Spark can write (a local path, ``file:///``, ``hdfs://``, ``s3a://`` with its connector).

    <root>/landing/date=YYYY-MM-DD/hour=HH/*.jsonl    the lander's files (bronze)
    <root>/silver/readings/date=YYYY-MM-DD/           deduplicated readings
    <root>/silver/health/date=YYYY-MM-DD/             deduplicated gateway health reports
    <root>/quarantine/date=YYYY-MM-DD/                rejected messages and lines, with reasons
    <root>/gold/sensor_minute/date=YYYY-MM-DD/        per-sensor 1-minute aggregates
    <root>/gold/sensor_hour/date=YYYY-MM-DD/          per-sensor 1-hour aggregates
    <root>/gold/gaps/date=YYYY-MM-DD/                 silences longer than the gap span
    <root>/gold/health/date=YYYY-MM-DD/               per-gateway hourly health
    <root>/_state/pipeline.json                       what the last runs covered
    <root>/_checkpoints/stream/                       stream mode's checkpoint
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date
from typing import Any

from pyspark.sql import SparkSession

_PARTITION = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True)
class Layout:
    """The table locations under one root URI (see the module docstring)."""

    root: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", self.root.rstrip("/") or "/")

    def _at(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    @property
    def landing(self) -> str:
        return self._at("landing")

    @property
    def readings(self) -> str:
        return self._at("silver", "readings")

    @property
    def health(self) -> str:
        return self._at("silver", "health")

    @property
    def quarantine(self) -> str:
        return self._at("quarantine")

    def gold(self, table: str) -> str:
        return self._at("gold", table)

    @property
    def state(self) -> str:
        return self._at("_state", "pipeline.json")

    @property
    def checkpoints(self) -> str:
        return self._at("_checkpoints")


def partition_path(table: str, day: date) -> str:
    return f"{table}/date={day.isoformat()}"


class Storage:
    """Listing, deleting and small text files through the session's Hadoop FileSystem."""

    def __init__(self, spark: SparkSession) -> None:
        jvm: Any = spark.sparkContext._jvm
        self._jvm = jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()
        #: Looked up once: each package of a dotted name is a call into the JVM.
        self._path = jvm.org.apache.hadoop.fs.Path

    def _fs(self, path: str) -> tuple[Any, Any]:
        hpath = self._path(path)
        return hpath.getFileSystem(self._conf), hpath

    def exists(self, path: str) -> bool:
        fs, hpath = self._fs(path)
        return bool(fs.exists(hpath))

    def partition_dates(self, table: str) -> list[date]:
        """The ``date=`` partitions of ``table`` that hold at least one data file."""
        fs, hpath = self._fs(table)
        if not fs.exists(hpath):
            return []
        days = []
        for status in fs.listStatus(hpath):
            match = _PARTITION.match(status.getPath().getName())
            if match and status.isDirectory() and self._has_data(fs, status.getPath()):
                days.append(date.fromisoformat(match.group(1)))
        return sorted(days)

    def _has_data(self, fs: Any, hpath: Any) -> bool:
        """Whether a file whose name does not start with ``.`` or ``_`` is under
        ``hpath``, at any depth. Listed folder by folder: ``listFiles`` reads each file's
        owner and mode as well, which a local file system without Hadoop's native library
        (PySpark ships none) does with an ``ls`` process per file: 44 in a 1M-line run."""
        folders = [hpath]
        while folders:
            for status in fs.listStatus(folders.pop()):
                if status.isDirectory():
                    folders.append(status.getPath())
                elif not status.getPath().getName().startswith((".", "_")):
                    return True
        return False

    def delete(self, path: str) -> bool:
        fs, hpath = self._fs(path)
        return bool(fs.delete(hpath, True))

    def read_json(self, path: str) -> dict[str, Any] | None:
        fs, hpath = self._fs(path)
        if not fs.exists(hpath):
            return None
        stream = fs.open(hpath)
        try:
            data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        value = json.loads(bytes(data).decode())
        if not isinstance(value, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return value

    def write_json(self, path: str, value: dict[str, Any]) -> None:
        """Write to a temporary name, then rename over ``path`` (no torn state file)."""
        fs, hpath = self._fs(path)
        tmp = self._path(path + ".tmp")
        stream = fs.create(tmp, True)
        try:
            stream.write(json.dumps(value, indent=2, sort_keys=True).encode() + b"\n")
        finally:
            stream.close()
        if fs.exists(hpath):
            fs.delete(hpath, False)
        if not fs.rename(tmp, hpath):
            raise OSError(f"could not rename {tmp} to {path}")
