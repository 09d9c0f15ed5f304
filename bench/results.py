"""Benchmark results as data: one JSON file per run in ``bench/results/``.

``record("pipeline", rows)`` writes ``bench/results/DATE-MACHINE-pipeline.json`` (a
``-2``, ``-3``... suffix when that name is taken): when, on which machine (its name,
cores, load before the run), at which commit, and the rows the benchmark printed.
The manual's benchmark page and its plot over time are generated from these files
(``python -m docs.gen``); history lives here and in the commit log, not in prose.
``LEDGE_BENCH_MACHINE`` names the machine (default: the host name).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parents[1]


def machine() -> str:
    name = os.environ.get("LEDGE_BENCH_MACHINE") or socket.gethostname()
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "machine"


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def record(
    benchmark: str,
    rows: list[dict[str, Any]],
    *,
    notes: str = "",
    directory: Path = RESULTS,
    when: datetime | None = None,
) -> Path:
    """Write one run's rows; returns the file written."""
    if not re.fullmatch(r"[a-z0-9-]+", benchmark):
        raise ValueError(f"benchmark name {benchmark!r}: lower-case letters, digits and -")
    when = when or datetime.now(UTC)
    host = machine()
    document = {
        "benchmark": benchmark,
        "when": when.isoformat(timespec="seconds"),
        "machine": host,
        "cpus": os.cpu_count(),
        "load": list(os.getloadavg()),
        "commit": _commit(),
        "notes": notes,
        "rows": rows,
    }
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{when:%Y-%m-%d}-{host}-{benchmark}"
    path = directory / f"{stem}.json"
    n = 1
    while path.exists():
        n += 1
        path = directory / f"{stem}-{n}.json"
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return path


def load(benchmark: str, directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every recorded run of ``benchmark``, oldest first."""
    runs = []
    for path in sorted(directory.glob("*.json")):
        document = json.loads(path.read_text())
        if document.get("benchmark") == benchmark:
            document["file"] = path.name
            runs.append(document)
    return sorted(runs, key=lambda d: str(d["when"]))
