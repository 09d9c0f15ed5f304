"""``python -m gateway`` is ``ledge``."""

from __future__ import annotations

import sys

from gateway.cli.main import main

sys.exit(main())
