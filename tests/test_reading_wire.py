"""A reading on the wire, byte for byte: the JSON payload (with and without metadata,
each kind of value, a non-UTC time), the plain payload, and a payload read back with
each refusal's text. These bytes are what subscribers, the bridge and the pipeline
read; the fast path must give what ``json.dumps`` gives."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from drivers.model import Reading, reading_from_message, reading_payload

AT = datetime(2026, 12, 7, 0, 30, 1, 250000, tzinfo=UTC)


def reading(value: object, unit: str = "°C", **more: object) -> Reading:
    return Reading(
        device="env", quantity="t", value=value, unit=unit, timestamp=AT, driver="serial", **more
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (21.5, "21.5"),
        (-3, "-3"),
        (True, "true"),
        (False, "false"),
        ("on é", '"on é"'),
        (0.1 + 0.2, "0.30000000000000004"),
    ],
)
def test_the_json_payload_byte_for_byte(value: object, text: str) -> None:
    got = reading_payload(reading(value))
    want = f'{{"value":{text},"unit":"°C","timestamp":"2026-12-07T00:30:01.250000+00:00"}}'
    assert got == want.encode()
    body = {"value": value, "unit": "°C", "timestamp": AT.isoformat()}
    assert got == json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def test_metadata_and_other_time_zones() -> None:
    with_meta = reading_payload(reading(1, "", metadata={"rssi": -70, "name": "é"}))
    assert (
        with_meta
        == (
            '{"value":1,"unit":"","timestamp":"2026-12-07T00:30:01.250000+00:00",'
            '"metadata":{"rssi":-70,"name":"é"}}'
        ).encode()
    )
    # a reading's time is stored in UTC whatever zone it came with
    local = AT.astimezone(timezone(timedelta(hours=2)))
    moved = Reading(device="d", quantity="q", value=1, unit="", timestamp=local, driver="serial")
    assert b'"timestamp":"2026-12-07T00:30:01.250000+00:00"' in reading_payload(moved)
    with pytest.raises(ValueError, match=r"timestamp must carry a time zone \(use UTC\)"):
        Reading(
            device="d",
            quantity="q",
            value=1,
            unit="",
            timestamp=AT.replace(tzinfo=None),
            driver="serial",
        )


def test_the_plain_payload() -> None:
    assert [reading_payload(reading(v), plain=True) for v in (True, False, 21.5, 7, "x")] == [
        b"true",
        b"false",
        b"21.5",
        b"7",
        b"x",
    ]


def test_a_payload_read_back_and_each_refusal() -> None:
    topic = "ledge/gw1/serial/env/t"
    original = reading(21.5, metadata={"rssi": -70})
    gateway, back = reading_from_message(topic, reading_payload(original))
    assert (gateway, back) == ("gw1", original)
    _, bare = reading_from_message(topic, b'{"value":1,"timestamp":"2026-12-07T00:30:01+00:00"}')
    assert (bare.unit, bare.metadata) == ("", {})
    for bad_topic in ("ledge/gw1/serial/env", "other/gw1/serial/env/t"):
        with pytest.raises(ValueError) as caught:
            reading_from_message(bad_topic, b"{}")
        assert str(caught.value) == (
            f"topic {bad_topic!r} is not ledge/<gateway>/<driver>/<device>/<quantity>"
        )
    with pytest.raises(ValueError, match=r"^payload is not JSON: "):
        reading_from_message(topic, b"\xff")
    for body in (b"[1]", b'{"value":1}', b'{"timestamp":"2026-12-07T00:30:01+00:00"}'):
        with pytest.raises(ValueError) as caught:
            reading_from_message(topic, body)
        assert str(caught.value) == "payload lacks value or timestamp"
