"""Refusal log lines at a bounded rate (``gateway.broker.ratelog``)."""

from __future__ import annotations

import logging

import pytest

from gateway.broker.ratelog import RateLimitedLog

log = logging.getLogger("ledge.test.ratelog")


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == log.name]


def test_one_line_per_source_per_interval_and_the_next_says_how_many_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = RateLimitedLog(log, interval=10.0)
    caplog.set_level(logging.INFO, logger=log.name)
    assert refusals(0.0, "10.0.0.1", "refused %s", "a")
    for t in range(1, 10):
        assert not refusals(float(t), "10.0.0.1", "refused %s", "b")
    assert refusals(0.5, "10.0.0.2", "refused %s", "other")
    assert refusals(10.0, "10.0.0.1", "refused %s", "c")
    assert lines(caplog) == [
        "refused a",
        "refused other",
        "refused c (9 more from 10.0.0.1 in the last 10 s not logged)",
    ]


def test_many_sources_get_at_most_max_lines_per_interval_then_one_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = RateLimitedLog(log, interval=60.0, max_lines=5)
    caplog.set_level(logging.INFO, logger=log.name)
    for n in range(1000):
        refusals(n / 100, f"10.0.{n // 256}.{n % 256}", "refused %d", n)
    assert len(lines(caplog)) == 5
    refusals(61.0, "192.0.2.1", "refused late")
    assert lines(caplog)[5:] == [
        "995 more refusals from 995 sources in the last 60 s not logged",
        "refused late",
    ]


def test_the_table_of_sources_is_bounded_oldest_forgotten_first() -> None:
    refusals = RateLimitedLog(log, max_sources=3, max_lines=100)
    for n in range(10):
        refusals(0.0, f"s{n}", "x")
    assert [source for source, _ in refusals.sources] == ["s7", "s8", "s9"]


def test_each_kind_of_line_has_its_own_interval_per_source(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = RateLimitedLog(log, interval=60.0)
    caplog.set_level(logging.INFO, logger=log.name)
    assert refusals(0.0, "10.0.0.1", "pool full for %s", "a")
    assert refusals(1.0, "10.0.0.1", "bad packet from %s", "a")
    assert not refusals(2.0, "10.0.0.1", "pool full for %s", "b")
    assert lines(caplog) == ["pool full for a", "bad packet from a"]
