"""A real Prometheus (Debian's) scrapes ``ledge run`` on loopback; its query API must
return what the test caused: messages sent, drops by reason, a bridge outage against
Debian's Mosquitto as the cloud, and the outbox filling and draining."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import Paho
from tests.support.http_flood import SlowRequests
from tests.support.procs import LedgeProcess, MosquittoProcess
from tests.support.prometheus import PrometheusProcess, cloud_bridge, metrics_text
from tests.support.wait import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (PrometheusProcess.available() and MosquittoProcess.available()),
        reason="Debian's prometheus and mosquitto",
    ),
]


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[MosquittoProcess]:
    proc = MosquittoProcess(tmp_path).start()
    yield proc
    proc.stop()


def test_prometheus_sees_messages_drops_and_a_bridge_outage(
    tmp_path: Path, cloud: MosquittoProcess
) -> None:
    config = tmp_path / "ledge.toml"
    config.write_text(
        f"""
[gateway]
id = "gw1"
[broker]
max_queued_messages = 1
[http]
enabled = true
port = 0
{cloud_bridge(cloud.port, "out/#")}qos = 1
"""
    )
    ledge = LedgeProcess(config=config).start(listeners=2)
    prometheus = PrometheusProcess(tmp_path, [f"127.0.0.1:{ledge.ports[1]}"]).start()
    try:

        def at(expr: str, value: float, what: str, timeout: float = 20.0) -> None:
            wait_for(lambda: prometheus.value(expr) == value, timeout, f"{what}: {expr} == {value}")

        at('up{job="ledge"}', 1, "the target is scraped")
        targets = prometheus.api("targets")
        assert isinstance(targets, dict)
        (target,) = targets["activeTargets"]
        assert target["health"] == "up" and target["lastError"] == ""
        at('ledge_bridge_connected{bridge="cloud"}', 1, "the bridge connects")

        # A persistent subscriber that went away, with a queue of one: drops.
        parked = Paho(ledge.port, "parked").connect(clean=False, session_expiry=300)
        parked.subscribe("out/#", qos=1)
        parked.disconnect()
        publisher = Paho(ledge.port, "publisher").connect()
        for i in range(25):
            publisher.publish("out/x", str(i).encode(), qos=1)
        at("ledge_messages_received_total", 25, "messages received")
        at('ledge_messages_dropped_total{reason="queue_full"}', 24, "queue-full drops")
        at('ledge_bridge_messages_acknowledged_total{bridge="cloud"}', 25, "sent upstream")
        at('sum(ledge_clients_connected{protocol="5.0"})', 1, "one client connected")

        # The uplink goes down: Prometheus sees the bridge go, the outbox fill and age.
        cloud.stop()
        at('ledge_bridge_connected{bridge="cloud"}', 0, "the outage")
        for i in range(5):
            publisher.publish("out/x", f"late {i}".encode(), qos=1)
        at('ledge_bridge_outbox_messages{bridge="cloud"}', 5, "the outbox fills")
        wait_for(
            lambda: (
                (prometheus.value('ledge_bridge_outbox_oldest_age_seconds{bridge="cloud"}') or 0)
                >= 1
            ),
            20,
            "the oldest queued message to age",
        )
        cloud.start(cloud.port)
        at('ledge_bridge_connected{bridge="cloud"}', 1, "the uplink is back")
        at('ledge_bridge_outbox_messages{bridge="cloud"}', 0, "the outbox drains")
        at('ledge_bridge_messages_acknowledged_total{bridge="cloud"}', 30, "all sent upstream")
        # The outage itself is in the time series: connected went 1 -> 0 -> 1.
        at('changes(ledge_bridge_connected{bridge="cloud"}[5m])', 2, "the outage in history")
        at(
            'max_over_time(ledge_bridge_outbox_messages{bridge="cloud"}[5m])',
            5,
            "the backlog in history",
        )
        # The process metrics every Prometheus dashboard expects.
        rss = prometheus.value("process_resident_memory_bytes")
        assert rss is not None and 10 * 2**20 < rss < 200 * 2**20
        publisher.disconnect()
    finally:
        prometheus.stop()
        assert ledge.stop() == 0


def test_prometheus_keeps_scraping_while_one_address_floods_the_listener(
    tmp_path: Path,
) -> None:
    """Twenty slow requests from 127.0.0.2, reopened as the listener closes them, for
    the whole life of a Prometheus scraping from 127.0.0.1 every second: every one of
    its scrapes must succeed."""
    config = tmp_path / "ledge.toml"
    config.write_text('[gateway]\nid = "gw1"\n[http]\nenabled = true\nport = 0\n')
    ledge = LedgeProcess(config=config).start(listeners=2)
    port = ledge.ports[1]
    prometheus: PrometheusProcess | None = None
    try:
        with SlowRequests(port, "127.0.0.2", count=20) as attack:
            wait_for(lambda: attack.closed >= 100 or attack.error, 30, "the attack to churn")
            closed_before = attack.closed
            prometheus = PrometheusProcess(tmp_path, [f"127.0.0.1:{port}"]).start()
            scrapes = 'count_over_time(up{job="ledge"}[10m])'
            wait_for(lambda: (prometheus.value(scrapes) or 0) >= 10, 60, "ten scrapes")
            assert attack.closed > closed_before and not attack.error  # it kept on
        # Every scrape in the attack succeeded: up was never 0.
        assert prometheus.value('min_over_time(up{job="ledge"}[10m])') == 1
        text = metrics_text(port)
        assert 'ledge_http_responses_total{code="503"}' not in text
    finally:
        if prometheus is not None:
            prometheus.stop()
        assert ledge.stop() == 0
