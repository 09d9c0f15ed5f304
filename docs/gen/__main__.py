"""``python -m docs.gen [--check]``: write (or check) every generated file."""

from __future__ import annotations

import sys

from docs.gen.generate import main

sys.exit(main(sys.argv[1:]))
