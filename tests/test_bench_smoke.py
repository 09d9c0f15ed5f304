"""The benchmark harness runs end to end: a short fan-in and QoS 1 run on Ledge and Mosquitto."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import REPO, MosquittoProcess


@pytest.mark.slow
def test_bench_quick_run(tmp_path: Path) -> None:
    MosquittoProcess.require()
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "--quick",
        "--scenarios",
        "fan-in,qos1",
        "--brokers",
        "ledge,mosquitto",
        "--rounds",
        "1",
        "--duration",
        "0.5",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=40, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(out.read_text())

    runs = {(r["scenario"], r["broker"]): r for r in doc["runs"]}
    for scenario in ("fan-in", "qos1"):
        for broker in ("ledge", "mosquitto"):
            run = runs[(scenario, broker)]
            assert not run["error"], run["error"]
            assert run["figure"] > 0, (scenario, broker, proc.stdout)
            assert run["peak_rss_kib"] > 0
    for broker in ("ledge", "mosquitto"):
        qos1 = runs[("qos1", broker)]
        assert qos1["drops"] == 0, (broker, qos1["details"])
        assert qos1["details"]["unacked"] == 0
        assert qos1["details"]["unknown_acks"] == 0
    assert "fan-in" in proc.stdout and "Ledge/Mosq" in proc.stdout


@pytest.mark.slow
def test_bench_mqttsn_runs_as_shipped_with_its_devices_on_many_addresses() -> None:
    """``make bench-mqttsn`` on a short run: its 300 idle devices and sleep soak go
    through the gateway's per-address limits (128 clients, 20 CONNECTs a second) and
    its CONNECT rates, as a LAN's devices do, and nothing acknowledged is lost."""
    cmd = [sys.executable, "-m", "bench.mqttsn", "--rounds", "1", "--seconds", "0.3"]
    cmd += ["--clients", "300", "--soak", "3"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=110, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| KiB (one subscription each) |" in proc.stdout
    assert "300 sleeping clients" in proc.stdout
    assert "  lost: 0\n" in proc.stdout, proc.stdout
