"""A short run of the firmware bridge's soak (``bench/mqttsn.py``; the bench runs 1,000
clients for 10 minutes): sleeping devices over real UDP, QoS 1 both ways. Every message
Ledge acknowledged arrives; nothing is delivered twice. (RSS is measured by the bench,
never asserted here.)"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from bench.mqttsn import Ledge, soak
from bench.procs import Pinning


@pytest.mark.slow
def test_sleeping_devices_lose_nothing_acknowledged() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ledge = Ledge(Path(tmp), Pinning())
        try:
            result = soak(ledge, clients=60, seconds=6, sleep_s=1.0)
        finally:
            ledge.stop()
    assert result.cycles >= 60  # every device went through sleep cycles
    assert result.down_acknowledged > 0 and result.up_acknowledged > 0
    assert result.down_received == result.down_acknowledged
    assert result.up_received == result.up_acknowledged
    assert result.down_duplicates == 0
