"""``python -m gateway.app``: the gateway process ``ledge run`` execs into."""

from __future__ import annotations

import sys

from gateway.app.root import main

sys.exit(main())
