"""Debian's Prometheus, started by a test on loopback: a free port, its own data
directory, a one-second scrape interval; queried through its HTTP API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support.procs import free_port, port_open
from tests.support.wait import wait_for

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def promtool_problems(text: str) -> str:
    """What ``promtool check metrics`` says about an exposition ("" when it is clean:
    it exits non-zero and prints a line per problem, lint included)."""
    out = subprocess.run(
        ["promtool", "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return "" if out.returncode == 0 and not out.stdout.strip() else out.stdout + out.stderr


def cloud_bridge(port: int, topic_filter: str) -> str:
    """A ``[[bridges]]`` table named "cloud" towards a Mosquitto on ``port``, quick to
    reconnect, with one outbound rule."""
    return (
        f'[[bridges]]\nname = "cloud"\naddress = "127.0.0.1:{port}"\n'
        "reconnect_min = 0.05\nreconnect_max = 0.5\n"
        f'[[bridges.rules]]\nfilter = "{topic_filter}"\n'
    )


class PrometheusProcess:
    def __init__(self, workdir: Path, targets: list[str], extra_scrape: str = "") -> None:
        self.workdir = workdir
        self.targets = targets
        self.extra_scrape = extra_scrape
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("prometheus") is not None

    def start(self, timeout: float = 30.0) -> PrometheusProcess:
        self.port = free_port()
        config = self.workdir / "prometheus.yml"
        targets = ", ".join(f'"{t}"' for t in self.targets)
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            f"  - job_name: ledge\n    static_configs:\n      - targets: [{targets}]\n"
            f"{self.extra_scrape}"
        )
        data = self.workdir / "prometheus-data"
        data.mkdir(exist_ok=True)
        self.log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        wait_for(lambda: port_open(self.port), timeout, "prometheus to listen")
        wait_for(self.ready, timeout, "prometheus to be ready")
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> object:
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[str, float]:
        """Instant query: the result's series (by their labels as text) -> value."""
        data = self.api("query", query=expr)
        assert isinstance(data, dict)
        out = {}
        for series in data["result"]:
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(series["metric"].items()) if k != "__name__"
            )
            out[labels] = float(series["value"][1])
        return out

    def value(self, expr: str) -> float | None:
        """The single value of ``expr`` now, or None while it has none."""
        result = self.query(expr)
        if len(result) != 1:
            return None
        return next(iter(result.values()))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None:
            self.log.close()


def metrics_text(port: int, host: str = "127.0.0.1") -> str:
    """``/metrics`` of Ledge's HTTP listener, as served."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
        text: str = r.read().decode()
    return text


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """``/metrics`` as {series: value}, a series written ``name{label="value",...}``
    with its labels sorted by name."""
    text = metrics_text(port, host)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            name, _, labels = series.partition("{")
            if labels:
                pairs = sorted(_LABEL.findall(labels))
                name += "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"
            out[name] = float(value)
    return out
