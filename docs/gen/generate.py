"""Write every generated file of the manual, or check that the committed ones are current."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from docs.gen import bench, cli, config, man, metrics, pages

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def outputs() -> dict[Path, Callable[[], str]]:
    """Each generated file and what makes it."""
    return {
        DOCS / "reference" / "configuration.md": config.markdown,
        DOCS / "reference" / "metrics.md": metrics.markdown,
        DOCS / "reference" / "cli.md": cli.markdown,
        DOCS / "reference" / "uart.md": pages.uart,
        DOCS / "reference" / "landing-format.md": pages.landing_format,
        DOCS / "reference" / "benchmark-results.md": bench.markdown,
        DOCS / "reference" / bench.PLOT: bench.svg,
        DOCS / "man" / "ledge.1": man.ledge_1,
        DOCS / "man" / "ledge.toml.5": man.ledge_toml_5,
    }


def stale() -> list[Path]:
    """The generated files whose committed text differs from what the sources make."""
    return [
        path for path, make in outputs().items() if not path.exists() or path.read_text() != make()
    ]


def write() -> list[Path]:
    written = []
    for path, make in outputs().items():
        text = make()
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.gen", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is out of date"
    )
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for path in old:
            print(f"out of date: {path.relative_to(REPO)} (run python -m docs.gen)")
        return 1 if old else 0
    for path in write():
        print(f"wrote {path.relative_to(REPO)}")
    return 0
