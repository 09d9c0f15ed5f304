"""``python -m pipeline`` and ``spark-submit pipeline/__main__.py``: the ``ledge-pipeline`` CLI."""

from __future__ import annotations

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
