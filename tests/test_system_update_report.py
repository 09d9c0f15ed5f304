"""The last system update's outcome, reported by a whole gateway in this process: the
record the SD-card image's ``ledge-update-commit`` writes (``gateway.system_update_file``)
comes out retained on ``<prefix>/<id>/system-update``, in the log, as a warning on the
status page (when the update was given up) and in ``/metrics``; a file that is not a
record is named in the log and reported as nothing. The script that writes the record is
tested in tests/test_image_sources.py; the whole path on the booted image in
tests/test_image.py."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from gateway.app.config import parse_config
from gateway.app.root import Gateway
from gateway.app.system_update import MAX_BYTES, read_record
from gateway.broker.local import LocalClient
from gateway.broker.message import Message

Retained = tuple[str, bytes, int, bool]

ROLLED_BACK = (
    "outcome=rolled-back\nslot=B\nfrom=A\nat=2026-12-01T10:00:00Z\n"
    "reason=not healthy: bridge cloud: connecting, not connected\n"
)
COMMITTED = "outcome=committed\nslot=B\nfrom=A\nat=2026-12-01T10:00:00Z\nreason=healthy\n"


def gateway(tmp_path: Path, record: Path) -> Gateway:
    config = parse_config(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'[gateway]\nid = "gw7"\nsystem_update_file = "{record}"\n'
        '[[listeners]]\nhost = "127.0.0.1"\nport = 0\n'
        '[http]\nenabled = true\nhost = "127.0.0.1"\nport = 0\n'
    ).to_runtime()
    return Gateway(config)


def watch(gw: Gateway) -> list[Retained]:
    """What a client subscribing to the gateway's topics gets from now on (retained
    ones first)."""
    got: list[Retained] = []

    def sink(msg: Message, qos: int, retain: bool, _ids: tuple[int, ...]) -> None:
        got.append((msg.topic, bytes(msg.payload), qos, retain))

    assert gw.broker is not None
    LocalClient(gw.broker, "watcher", sink).subscribe("ledge/gw7/#", 1, 0.0)
    return got


def report(tmp_path: Path, text: str | None) -> tuple[str, list[str], list[Retained]]:
    """Start a whole gateway over a record holding ``text`` (None: no file): its
    metrics, its status page's warnings, and what a client subscribing afterwards gets
    retained under the gateway's topics."""
    record = tmp_path / "last"
    if text is not None:
        record.write_text(text)

    async def run() -> tuple[str, list[str], list[Retained]]:
        gw = gateway(tmp_path, record)
        await gw.start()
        try:
            assert gw.metrics is not None
            got = watch(gw)
            collector = gw.metrics.collector
            return collector.metrics(), list(collector.status()["warnings"]), got
        finally:
            await gw.close()

    return asyncio.run(run())


def test_an_update_given_up_is_reported_everywhere_a_person_or_the_cloud_looks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="ledge"):
        metrics, warnings, retained = report(tmp_path, ROLLED_BACK)
    ((topic, message, qos, retain),) = retained
    assert (topic, qos, retain) == ("ledge/gw7/system-update", 1, True)
    said = (
        "system update to slot B rolled back to slot A (2026-12-01T10:00:00Z): "
        "not healthy: bridge cloud: connecting, not connected"
    )
    assert json.loads(message) == {
        "outcome": "rolled-back",
        "slot": "B",
        "from": "A",
        "at": "2026-12-01T10:00:00Z",
        "reason": "not healthy: bridge cloud: connecting, not connected",
    }
    assert said in warnings
    assert 'ledge_system_update_info{outcome="rolled-back",slot="B",previous="A"} 1' in metrics
    assert "ledge_system_update_timestamp_seconds 1796119200" in metrics.replace(".0\n", "\n")
    logged = [r for r in caplog.records if r.getMessage() == said]
    assert [r.levelno for r in logged] == [logging.WARNING]


def test_an_update_kept_is_reported_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="ledge"):
        metrics, warnings, retained = report(tmp_path, COMMITTED)
    assert json.loads(retained[0][1])["outcome"] == "committed"
    assert not any("system update" in w for w in warnings)
    assert 'ledge_system_update_info{outcome="committed",slot="B",previous="A"} 1' in metrics
    said = "system update to slot B kept (2026-12-01T10:00:00Z): healthy"
    assert [r.levelno for r in caplog.records if r.getMessage() == said] == [logging.INFO]


def test_without_a_record_nothing_is_reported(tmp_path: Path) -> None:
    metrics, warnings, retained = report(tmp_path, None)
    assert retained == []
    assert "ledge_system_update" not in metrics
    assert not any("system update" in w for w in warnings)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("outcome=rolled-back\nslot=B\n", " has no from"),
        ("outcome=maybe\nslot=B\nfrom=A\n", ": outcome 'maybe' is not committed or rolled-back"),
        ("outcome=committed\nslot B\nfrom=A\n", " line 2: no key=value: 'slot B'"),
        ("x" * (MAX_BYTES + 1), f" is over {MAX_BYTES} bytes: not a record"),
    ],
)
def test_a_file_that_is_not_a_record_is_named_and_reported_as_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, said: str
) -> None:
    record = tmp_path / "last"
    record.write_text(text)
    with caplog.at_level(logging.WARNING, logger="ledge.update"):
        assert read_record(str(record)) is None
    assert [r.getMessage() for r in caplog.records] == [f"system update record {record}{said}"]


def test_a_record_is_read_with_every_field(tmp_path: Path) -> None:
    record = tmp_path / "last"
    record.write_text(ROLLED_BACK + "\n")
    read = read_record(str(record))
    assert read is not None
    assert (read.outcome, read.slot, read.previous, read.at) == (
        "rolled-back",
        "B",
        "A",
        "2026-12-01T10:00:00Z",
    )
    assert read.timestamp == 1796119200.0
    assert read_record(None) is None and read_record("") is None
    assert read_record(str(tmp_path / "absent")) is None


def test_a_record_written_while_running_is_reported_at_the_next_sighup(tmp_path: Path) -> None:
    """ledge-update-commit writes the record after the gateway started, then reloads it."""
    record = tmp_path / "last"

    async def run() -> tuple[list[Retained], str, str, list[Retained]]:
        gw = gateway(tmp_path, record)
        await gw.start()
        try:
            assert gw.metrics is not None
            got = watch(gw)
            before = gw.metrics.collector.metrics()
            record.write_text(COMMITTED)
            gw.reload()
            first = list(got)
            after = gw.metrics.collector.metrics()
            gw.reload()  # the same record: not reported again
            return first, before, after, got
        finally:
            await gw.close()

    first, before, after, got = asyncio.run(run())
    assert "ledge_system_update_info" not in before
    assert 'ledge_system_update_info{outcome="committed",slot="B",previous="A"} 1' in after
    assert [(t, json.loads(p)["outcome"], retain) for t, p, _, retain in first] == [
        ("ledge/gw7/system-update", "committed", False)  # live to a subscriber; stored retained
    ]
    assert got == first
