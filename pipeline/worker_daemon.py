"""The Python worker daemon of a local session: PySpark's own (``pyspark.daemon``), with
silver's Python judge and what it imports loaded once, before the workers fork from it.

A local session (``pipeline.session``) names this module as ``spark.python.daemon.module``.
PySpark starts the daemon once, when a task first needs Python, and forks a worker from it
for each task slot. Each worker would otherwise import PySpark's worker, the judge, the
contract (pydantic), pyarrow and pandas (pyarrow looks for it) as it judges its first
batch: about 0.8 s of CPU in each, two at once on two cores while the driver plans silver.
Loaded here, they are imported once and shared by every worker. 1M landing lines: 23.42 s
against 23.83 s (means of 5 interleaved runs, 4 faster), and in an earlier set 23.45 s
against 24.36 s (4 runs, each faster).

A module that does not load is left to the workers (a line on stderr says which), so the
daemon starts whatever happens here. Nothing here writes to stdout: the daemon tells the
JVM its port there.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Final

#: What the workers find loaded, in this order.
PRELOADED: Final = ("pyspark.worker", "pandas", "pipeline.transforms.judge")
#: The workers' environment variable naming the modules the daemon loaded.
LOADED_ENV: Final = "LEDGE_PIPELINE_PRELOADED"


def preload(modules: tuple[str, ...] = PRELOADED) -> list[str]:
    """Import ``modules``; the ones that loaded, also put in ``LOADED_ENV`` (for the
    workers forked after, and for whoever looks at them)."""
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the worker imports it itself, and reports then
            print(
                f"ledge-pipeline: the Python workers import {name} themselves ({exc!r})",
                file=sys.stderr,
                flush=True,
            )
        else:
            loaded.append(name)
    os.environ[LOADED_ENV] = ",".join(loaded)
    return loaded


def main() -> None:
    preload()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
