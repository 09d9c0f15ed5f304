"""A LAN flood of connections that never finish CONNECT, against ``ledge run`` on its
default config: 200 slowloris sockets (a CONNECT header, then nothing) and 1,500
silent ones, held open. A normal client must still get CONNECT, SUBSCRIBE and a QoS 1
round trip done within 3 s, the 100 clients connected before the flood keep
receiving, memory stays within its bound and ``$SYS`` counts the evictions; from one
address and from several. ``make bench-flood`` runs the same flood against Mosquitto
beside Ledge and prints both.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import pytest

from gateway.mqtt import MQTT_5, Publish, Subscribe, SubscriptionRequest, encode
from tests.support.flood import Flood, Subscribers, probe, raise_open_files
from tests.support.procs import LedgeProcess
from tests.support.raw import Raw
from tests.support.wait import wait_for

SLOWLORIS = 200
SILENT = 1_500
SUBSCRIBERS = 100
#: The idle bound (25 MiB) plus 100 clients and the connecting budget's buffers.
RSS_BOUND_KIB = 32 * 1024


@pytest.fixture
def gateway() -> Iterator[LedgeProcess]:
    """``ledge run`` with no config at all: the defaults are what is tested."""
    raise_open_files(SLOWLORIS + SILENT + SUBSCRIBERS + 256)
    proc = LedgeProcess().start()
    yield proc
    assert proc.stop() == 0
    assert "Traceback" not in proc.log


def evictions(proc: LedgeProcess, at_least: int) -> dict[str, int]:
    """``$SYS/broker/clients/evicted/...`` (retained, refreshed every 10 s) once they add
    up to ``at_least``, or as they are after 25 s. A raw client: paho's select() cannot
    watch descriptors past 1023, which the flood uses."""
    watcher = Raw(proc.port)
    counts: dict[str, int] = {}
    try:
        assert watcher.connect(f"watcher-{time.monotonic_ns()}").reason_code == 0
        topics = "$SYS/broker/clients/evicted/+"
        watcher.send(encode(Subscribe(1, (SubscriptionRequest(topics, 0),)), MQTT_5))
        watcher.expect(1)
        deadline = time.monotonic() + 25
        while True:
            for message in watcher.packets:  # the latest value of each, in order
                if isinstance(message, Publish):
                    counts[message.topic.rpartition("/")[2]] = int(message.payload)
            left = deadline - time.monotonic()
            if sum(counts.values()) >= at_least or left <= 0:
                break
            with contextlib.suppress(AssertionError):  # nothing new within the second
                watcher.expect(1, min(1.0, left))
            assert not watcher.closed
        return counts
    finally:
        watcher.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "sources",
    [("127.0.0.1",), tuple(f"127.0.0.{i}" for i in range(2, 18))],
    ids=["one-address", "sixteen-addresses"],
)
def test_a_connection_flood_never_locks_clients_out(
    gateway: LedgeProcess, sources: tuple[str, ...]
) -> None:
    subscribers = Subscribers(gateway.port, SUBSCRIBERS).connect()
    flood = Flood(gateway.port, sources)
    try:
        flood.open(SILENT, SLOWLORIS)
        assert flood.failed == 0, f"{flood.failed} flood connections could not even open"
        took = probe(gateway.port)  # from 127.0.0.1, like the first flood
        # Locked out, it would wait for ever (the probe gives up at its deadline); served,
        # it takes milliseconds (make bench-flood measures it); 10 s holds under load.
        assert took < 10.0, f"a normal client needed {took:.2f} s under the flood"
        assert subscribers.receiving() == SUBSCRIBERS
        # The flood holds no more than its budget, 32 per address and 256 in all, once
        # the newest sockets' grace (1 s) is over.
        budget = min(32 * len(sources), 256)
        wait_for(lambda: flood.still_open() <= budget, 5.0, "the flood trimmed to its budget")
        rss = gateway.rss_kib
        assert rss < RSS_BOUND_KIB, f"RSS {rss} KiB under the flood"
        # Every flood socket beyond the budget was evicted: the newest within their
        # grace for the pool (connecting full), the rest for their address.
        counts = evictions(gateway, SILENT + SLOWLORIS - budget)
        assert sum(counts.values()) >= SILENT + SLOWLORIS - budget, counts
        if len(sources) == 1:
            assert counts.get("address full", 0) >= SILENT + SLOWLORIS - 256, counts
        assert re.search(r"to admit .* evicted so far", gateway.log)
    finally:
        flood.close()
        subscribers.close()
