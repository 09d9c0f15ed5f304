"""The HTTP listener's and the store's metrics, each read from its own count: every
count set to a value of its own, so a metric reading another's fails here."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from gateway.metrics.collect import HTTPSource, ProcessSource, StoreSource
from gateway.metrics.view import Values
from gateway.net.http import HTTPStats


def test_each_http_metric_reads_its_own_count() -> None:
    stats = HTTPStats(
        accepted=11, refused=7, timeouts=5, auth_failures=3,
        evicted={"unfinished": 2, "idle": 13}, responses={200: 17, 404: 19, 503: 23},
    )  # fmt: skip
    http = SimpleNamespace(stats=stats, admission=_Admission(open_now=6, unfinished=4))
    v = Values(HTTPSource(http).samples())  # type: ignore[arg-type]
    assert v.get("ledge_http_connections") == 6
    assert v.get("ledge_http_connections_unfinished") == 4
    assert v.get("ledge_http_connections_total") == 11
    assert v.get("ledge_http_connections_refused_total") == 7
    assert v.get("ledge_http_request_timeouts_total") == 5
    assert v.get("ledge_http_auth_failures_total") == 3
    assert v.by_label("ledge_http_connections_evicted_total", "reason") == {
        "unfinished": 2, "idle": 13
    }  # fmt: skip
    assert v.by_label("ledge_http_responses_total", "code") == {"200": 17, "404": 19, "503": 23}


class _Admission:
    def __init__(self, open_now: int, unfinished: int) -> None:
        self.open_now, self.unfinished = open_now, unfinished

    def __len__(self) -> int:
        return self.open_now


def test_each_store_metric_reads_its_own_value(tmp_path: Path) -> None:
    db = tmp_path / "ledge.db"
    db.write_bytes(b"x" * 3000)
    db.with_name("ledge.db-wal").write_bytes(b"y" * 500)
    store = SimpleNamespace(
        path=db, directory=tmp_path, settings=SimpleNamespace(max_bytes=10_000_000),
        backlog=9, commits=31,
    )  # fmt: skip
    broker = SimpleNamespace(store_full=True)
    v = Values(StoreSource(store, broker).samples())  # type: ignore[arg-type]
    assert v.get("ledge_store_size_bytes") == 3500  # the database and its WAL
    assert v.get("ledge_store_limit_bytes") == 10_000_000
    stat = os.statvfs(tmp_path)
    free = v.get("ledge_data_dir_free_bytes")
    assert abs(free - stat.f_bavail * stat.f_frsize) < 64 * 1024 * 1024  # the disk moves
    assert free > 0
    assert v.get("ledge_store_full") == 1
    assert v.get("ledge_store_backlog") == 9
    assert v.get("ledge_store_commits_total") == 31
    broker.store_full = False
    db.with_name("ledge.db-wal").unlink()  # no WAL now: the database alone
    v = Values(StoreSource(store, broker).samples())  # type: ignore[arg-type]
    assert (v.get("ledge_store_full"), v.get("ledge_store_size_bytes")) == (0, 3000)


def test_a_data_dir_that_is_gone_has_no_free_bytes(tmp_path: Path) -> None:
    store = SimpleNamespace(
        path=tmp_path / "gone" / "ledge.db", directory=tmp_path / "gone",
        settings=SimpleNamespace(max_bytes=0), backlog=0, commits=0,
    )  # fmt: skip
    v = Values(StoreSource(store, SimpleNamespace(store_full=False)).samples())  # type: ignore[arg-type]
    assert (v.get("ledge_store_size_bytes"), v.get("ledge_data_dir_free_bytes")) == (0, 0)


def test_the_process_metrics_are_what_linux_says_of_this_process() -> None:
    """Read beside /proc/self and the kernel's own accounting, in the names every
    Prometheus client library uses."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))  # the soft limit is it
    try:
        before = os.times()
        v = Values(ProcessSource(1_700_000_123.4567).samples())
        after = os.times()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert v.get("process_start_time_seconds") == 1_700_000_123.457
    cpu = v.get("process_cpu_seconds_total")
    assert before.user + before.system - 0.01 <= cpu <= after.user + after.system + 0.01
    page = os.sysconf("SC_PAGE_SIZE")
    size, resident = (int(x) * page for x in Path("/proc/self/statm").read_text().split()[:2])
    assert abs(v.get("process_resident_memory_bytes") - resident) < 16 * 1024 * 1024
    assert abs(v.get("process_virtual_memory_bytes") - size) < 64 * 1024 * 1024
    assert v.get("process_virtual_memory_bytes") > v.get("process_resident_memory_bytes") > 0
    assert abs(v.get("process_open_fds") - len(os.listdir("/proc/self/fd"))) <= 1
    assert v.get("process_max_fds") == soft - 1
