"""The metrics view at its edges: the HTTP routes, a duration at each unit's boundary,
each warning at its threshold and a hair under, the cap on warnings, rounding."""

from __future__ import annotations

import json

import pytest

from gateway.metrics import page
from gateway.metrics.view import (
    DISK_WARN_BYTES,
    MAX_WARNINGS,
    BridgeStatus,
    StatusPart,
    duration,
    gauge,
    status_document,
)
from tests.test_metrics_collect import busy_world
from tests.test_metrics_view import snapshot

MIB = 1024 * 1024


def steady(text: str) -> list[str]:
    """An exposition without the process's own values (CPU time and memory move)."""
    return [line for line in text.splitlines() if "process_" not in line]


def test_the_routes_serve_metrics_status_and_page_and_nothing_else() -> None:
    w, _ = busy_world()
    collector = w.collector
    metrics = collector.respond("/metrics")
    assert metrics is not None
    assert (metrics.status, metrics.content_type) == (
        200,
        "text/plain; version=0.0.4; charset=utf-8",
    )
    assert steady(metrics.body.decode()) == steady(collector.metrics())
    status = collector.respond("/api/status")
    assert status is not None
    assert (status.status, status.content_type) == (200, "application/json")
    moving = ("time", "process", "uptime_seconds")
    got, now = json.loads(status.body), collector.status()
    assert {k: v for k, v in got.items() if k not in moving} == {
        k: v for k, v in now.items() if k not in moving
    }
    assert got["gateway"] == "gw1" and got["clients"]["connected"] > 0
    assert b", " not in status.body and b": " not in status.body  # compact
    home = collector.respond("/")
    assert home is not None
    assert (home.status, home.content_type) == (200, "text/html; charset=utf-8")
    assert home.headers == (("content-security-policy", page.CONTENT_SECURITY_POLICY),)
    assert home.body.startswith(b"<!doctype html>") and b"gw1" in home.body
    for path in ("/METRICS", "/metrics/", "/api", "/index.html", ""):
        assert collector.respond(path) is None, path


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-3.0, "0 s"), (0.0, "0 s"), (59.99, "59 s"), (60.0, "1 min 0 s"),
        (3599.0, "59 min 59 s"), (3600.0, "1 h 0 min"), (3661.0, "1 h 1 min"),
        (86399.0, "23 h 59 min"), (86400.0, "1 d 0 h"), (2 * 86400 + 7 * 3600 + 59, "2 d 7 h"),
    ],
)  # fmt: skip
def test_a_duration_reads_in_its_largest_two_units(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def warnings_of(*samples: object, parts: tuple[StatusPart, ...] = ()) -> list[str]:
    doc = status_document(snapshot(*samples, parts=parts))  # type: ignore[arg-type]
    return list(doc["warnings"])


def test_the_store_warns_from_four_fifths_of_its_bound() -> None:
    def at(size: int) -> list[str]:
        return warnings_of(
            gauge("ledge_store_size_bytes", "s", size),
            gauge("ledge_store_limit_bytes", "l", 100 * MIB),
        )

    assert at(80 * MIB) == ["store near full: 80.0 MiB of 100.0 MiB (store.max_bytes)"]
    assert at(80 * MIB - 1) == []


def test_the_disk_warns_under_64_mib_free() -> None:
    def at(free: int) -> list[str]:
        return warnings_of(gauge("ledge_data_dir_free_bytes", "f", free))

    assert at(DISK_WARN_BYTES) == []
    assert at(DISK_WARN_BYTES - MIB) == ["disk near full: 63.0 MiB free under data_dir"]
    assert at(0) == ["disk near full: 0.0 MiB free under data_dir"]


def bridge(**fields: object) -> tuple[StatusPart, ...]:
    return (StatusPart(bridges=(BridgeStatus("cloud", "connected", **fields),)),)  # type: ignore[arg-type]


def test_an_outbox_warns_from_four_fifths_of_either_bound() -> None:
    near = "bridge cloud: outbox near full (80 messages, 0.0 MiB)"
    assert warnings_of(parts=bridge(queued=80, max_messages=100)) == [near]
    assert warnings_of(parts=bridge(queued=79, max_messages=100)) == []
    by_bytes = "bridge cloud: outbox near full (1 messages, 8.0 MiB)"
    assert warnings_of(parts=bridge(queued=1, bytes=8 * MIB, max_bytes=10 * MIB)) == [by_bytes]
    assert warnings_of(parts=bridge(queued=1, bytes=8 * MIB - 1, max_bytes=10 * MIB)) == []


def test_a_disconnected_bridge_says_why_only_when_it_knows() -> None:
    parts = (StatusPart(bridges=(BridgeStatus("cloud", "connecting", queued=2),)),)
    assert warnings_of(parts=parts) == ["bridge cloud connecting: 2 message(s) waiting"]


def test_warnings_are_capped_and_the_rest_counted() -> None:
    many = (StatusPart(warnings=tuple(f"w{i}" for i in range(MAX_WARNINGS))),)
    assert warnings_of(parts=many) == [f"w{i}" for i in range(MAX_WARNINGS)]  # all fit
    more = (StatusPart(warnings=tuple(f"w{i}" for i in range(MAX_WARNINGS + 5))),)
    got = warnings_of(parts=more)
    assert len(got) == MAX_WARNINGS
    assert got[-1] == "and 6 more warnings"
    assert got[:-1] == [f"w{i}" for i in range(MAX_WARNINGS - 1)]
