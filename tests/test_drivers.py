"""Drivers, pure parts: line framing, NMEA / JSON lines / key=value parsers, mapping to
the Reading contract, topics and payloads, Home Assistant discovery. Byte vectors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from drivers import homeassistant
from drivers.lines import Garbage, Line, LineFramer
from drivers.mapping import DeviceMap, FieldMap
from drivers.model import (
    Health,
    Reading,
    envelope,
    health_from_message,
    health_payload,
    health_topic,
    open_envelope,
    reading_from_message,
    reading_payload,
    reading_topic,
)
from drivers.parsers import ParseError, Sample, jsonl, kv, nmea, scalar

T = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)

# --------------------------------------------------------------------------- lines


def test_lines_end_with_lf_crlf_or_cr_and_keep_offsets() -> None:
    f = LineFramer()
    assert f.feed(b"a=1\r\nb=2\nc=3\rd") == [Line(0, b"a=1"), Line(5, b"b=2"), Line(9, b"c=3")]
    assert f.feed(b"=4\n") == [Line(13, b"d=4")]


def test_a_line_split_across_reads_is_whole() -> None:
    f = LineFramer()
    out: list[Line | Garbage] = []
    for byte in b"$GPGGA,1*00\r\nnext\n":
        out.extend(f.feed(bytes([byte])))
    assert out == [Line(0, b"$GPGGA,1*00"), Line(13, b"next")]


def test_overlong_line_is_garbage_and_the_lines_around_it_survive() -> None:
    f = LineFramer(max_line=16)
    out = f.feed(b"good=1\n" + b"x" * 40 + b"\nalso=2\n")
    assert out == [
        Line(0, b"good=1"),
        Garbage(7, 41, "line longer than 16 bytes"),
        Line(48, b"also=2"),
    ]


def test_overlong_line_across_reads_is_bounded() -> None:
    f = LineFramer(max_line=8)
    assert f.feed(b"0123456789") == []
    assert len(f._buf) == 0  # nothing held beyond the bound
    assert f.feed(b"abc\nok\n") == [Garbage(0, 14, "line longer than 8 bytes"), Line(14, b"ok")]


# --------------------------------------------------------------------------- NMEA


def sentence(body: str) -> bytes:
    """Build a sentence with its correct checksum."""
    return f"${body}*{nmea.checksum(body.encode()):02X}".encode()


def test_gga_from_the_nmea_reference() -> None:
    """GGA example, NMEA 0183 (fix, 8 satellites, 545.4 m)."""
    line = b"$GPGGA,123519,4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,*47"
    assert nmea.parse(line) == [
        Sample("latitude", 48.1173, "deg"),
        Sample("longitude", 11.5166667, "deg"),
        Sample("fix_quality", 1),
        Sample("satellites", 8),
        Sample("hdop", 0.9),
        Sample("altitude", 545.4, "m"),
    ]


def test_rmc_from_the_nmea_reference() -> None:
    """RMC example: 022.4 knots, course 084.4, 23 March 1994."""
    line = b"$GPRMC,123519,A,4807.038,N,01131.000,E,022.4,084.4,230394,003.1,W*6A"
    assert nmea.parse(line) == [
        Sample("latitude", 48.1173, "deg"),
        Sample("longitude", 11.5166667, "deg"),
        Sample("speed", round(22.4 * 1852 / 3600, 3), "m/s"),
        Sample("course", 84.4, "deg"),
        Sample("time", "1994-03-23T12:35:19+00:00"),
    ]


def test_rmc_southern_western_hemisphere_and_multi_gnss_talker() -> None:
    line = sentence("GNRMC,083559.00,A,3345.2500,S,15112.5000,W,0.0,0.0,010126,,,A")
    samples = {s.field: s.value for s in nmea.parse(line)}
    assert samples["latitude"] == -33.7541667
    assert samples["longitude"] == -151.2083333
    assert samples["time"] == "2026-01-01T08:35:59+00:00"


def test_no_fix_gives_no_position() -> None:
    line = sentence("GPGGA,,,,,,0,00,99.99,,,,,,")
    assert nmea.parse(line) == [
        Sample("fix_quality", 0),
        Sample("satellites", 0),
        Sample("hdop", 99.99),
    ]
    assert nmea.parse(sentence("GPRMC,,V,,,,,,,,,,N")) == []


def test_vtg_course_and_speed() -> None:
    line = sentence("GPVTG,054.7,T,034.4,M,005.5,N,010.2,K")
    assert nmea.parse(line) == [
        Sample("course", 54.7, "deg"),
        Sample("speed", round(5.5 * 1852 / 3600, 3), "m/s"),
    ]


def test_satellites_in_view_are_ignored_not_errors() -> None:
    assert (
        nmea.parse(sentence("GPGSV,3,1,11,03,03,111,00,04,15,270,00,06,01,010,00,13,06,292,00"))
        == []
    )


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            b"$GPGGA,123519,4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,*48",
            "checksum 48 does not match 47",
        ),
        (b"GPGGA,1,2*00", "does not start"),
        (b"$GPGGA,123519", "no checksum"),
        (b"$GPGGA,1*ZZ", "not hexadecimal"),
        (sentence("GPXYZ,1,2"), "sentence type 'XYZ' is not read"),
        (sentence("GPGGA,123519,48x7.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,"), "latitude"),
        (sentence("GPGGA,1,2"), "GGA has 3 fields"),
        (b"$GP\xffGA,1*" + b"%02X" % nmea.checksum(b"GP\xffGA,1"), "non-ASCII"),
    ],
    ids=[
        "bad-checksum",
        "no-dollar",
        "no-star",
        "hex",
        "unknown-type",
        "bad-lat",
        "short",
        "non-ascii",
    ],
)
def test_nmea_errors(line: bytes, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        nmea.parse(line)


# --------------------------------------------------------------------------- JSON lines, kv


def test_json_lines_flattened() -> None:
    line = b'{"temp": 21.5, "ok": true, "env": {"lux": 300, "note": "x"}, "list": [1], "n": null}'
    assert jsonl.parse(line) == [
        Sample("temp", 21.5),
        Sample("ok", True),
        Sample("env.lux", 300),
        Sample("env.note", "x"),
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [(b'{"temp": 21.5', "not JSON"), (b"[1, 2]", "not an object"), (b'{"a": "\xff"}', "UTF-8")],
)
def test_json_lines_errors(line: bytes, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        jsonl.parse(line)


def test_key_value_lines() -> None:
    assert kv.parse(b"temp=21.5 hum=40.1") == [Sample("temp", 21.5), Sample("hum", 40.1)]
    assert kv.parse(b"a=1, b:on; c=idle") == [
        Sample("a", 1),
        Sample("b", True),
        Sample("c", "idle"),
    ]


@pytest.mark.parametrize("line", [b"temp 21.5", b"=5", b"", b"a=1 garbage"])
def test_key_value_errors(line: bytes) -> None:
    with pytest.raises(ParseError):
        kv.parse(line)


# --------------------------------------------------------------------------- mapping, model


def test_mapping_names_units_and_scales() -> None:
    m = DeviceMap(
        "env1",
        fields={"t": FieldMap("temperature", "°C", scale=0.1), "h": FieldMap("humidity", "%")},
    )
    readings, problems = m.readings([Sample("t", 215), Sample("h", 40), Sample("extra", 1)], T)
    assert problems == []
    assert [(r.quantity, r.value, r.unit) for r in readings] == [
        ("temperature", 21.5, "°C"),
        ("humidity", 40, "%"),
        ("extra", 1, ""),
    ]
    only = DeviceMap("env1", fields={"t": FieldMap("temperature")}, only_mapped=True)
    assert [r.quantity for r in only.readings([Sample("t", 1), Sample("x", 2)], T)[0]] == [
        "temperature"
    ]


def test_mapping_reports_fields_that_cannot_be_readings() -> None:
    readings, problems = DeviceMap("d").readings([Sample("a/b", 1), Sample("ok", 2)], T)
    assert [r.quantity for r in readings] == ["ok"]
    assert len(problems) == 1 and "a/b" in problems[0]


@pytest.mark.parametrize(
    "changes",
    [
        {"device": "a/b"},
        {"quantity": "x+"},
        {"device": "$sys"},
        {"timestamp": datetime(2026, 1, 1)},  # naive
        {"value": float("nan")},
        {"device": ""},
    ],
)
def test_reading_validation(changes: dict[str, object]) -> None:
    base: dict[str, object] = {"device": "d", "quantity": "q", "value": 1.0, "timestamp": T}
    with pytest.raises(ValidationError):
        Reading.model_validate({**base, **changes})


def test_reading_timestamps_are_utc() -> None:
    cet = timezone(timedelta(hours=1))
    r = Reading(device="d", quantity="q", value=1, timestamp=datetime(2026, 1, 1, 11, tzinfo=cet))
    assert r.timestamp == datetime(2026, 1, 1, 10, tzinfo=UTC)


def test_topic_and_payload_round_trip() -> None:
    r = Reading(
        device="gps", quantity="latitude", value=48.1173, unit="deg", timestamp=T, driver="serial"
    )
    topic = reading_topic(r, "gw1")
    payload = reading_payload(r)
    assert topic == "ledge/gw1/serial/gps/latitude"
    assert json.loads(payload) == {
        "value": 48.1173,
        "unit": "deg",
        "timestamp": "2026-11-21T10:00:00.123456+00:00",
    }
    assert reading_from_message(topic, payload) == ("gw1", r)
    assert reading_payload(r, plain=True) == b"48.1173"
    assert reading_topic(r, "gw1", prefix="site/a") == "site/a/gw1/serial/gps/latitude"


@pytest.mark.parametrize(
    ("topic", "payload"),
    [
        ("ledge/gw1/serial/gps", b"{}"),
        ("other/gw1/serial/gps/lat", b'{"value":1,"timestamp":"2026-01-01T00:00:00+00:00"}'),
        ("ledge/gw1/serial/gps/lat", b"not json"),
        ("ledge/gw1/serial/gps/lat", b'{"value":1}'),
    ],
)
def test_reading_from_bad_message(topic: str, payload: bytes) -> None:
    with pytest.raises(ValueError):
        reading_from_message(topic, payload)


def temperature_discovery(device: str) -> dict[str, object]:
    """The whole discovery payload of gateway gw1's serial device's temperature in °C,
    as Home Assistant must receive it (written out by hand, not by the code under test)."""
    return {
        "name": "temperature",
        "unique_id": f"ledge_gw1_{device}_temperature",
        "object_id": f"ledge_gw1_{device}_temperature",
        "state_topic": f"ledge/gw1/serial/{device}/temperature",
        "availability": [
            {"topic": "ledge/gw1/status"},
            {"topic": f"ledge/gw1/serial/{device}/status"},
        ],
        # Both must be online: a gateway that is up does not make a dead device available.
        "availability_mode": "all",
        "device": {
            "identifiers": [f"ledge_gw1_{device}"],
            "name": device,
            "manufacturer": "Ledge",
            "model": "serial",
            "via_device": "ledge_gw1",
        },
        "value_template": "{{ value_json.value }}",
        "unit_of_measurement": "°C",
        "state_class": "measurement",
        "device_class": "temperature",
    }


def test_home_assistant_discovery_config() -> None:
    topic, payload = homeassistant.sensor_config(
        discovery_prefix="homeassistant",
        gateway="gw1",
        driver="serial",
        device="env1",
        quantity="temperature",
        unit="°C",
        numeric=True,
        state_topic="ledge/gw1/serial/env1/temperature",
        json_payload=True,
        gateway_status_topic="ledge/gw1/status",
        device_status_topic="ledge/gw1/serial/env1/status",
    )
    # <discovery_prefix>/<component>/<node_id>/<object_id>/config, as the README says.
    assert topic == "homeassistant/sensor/gw1_env1/temperature/config"
    assert json.loads(payload) == temperature_discovery("env1")


def test_home_assistant_discovery_of_a_plain_text_quantity_without_a_class() -> None:
    topic, payload = homeassistant.sensor_config(
        discovery_prefix="ha",
        gateway="gw 1",
        driver="serial",
        device="door",
        quantity="state_open",
        unit="",
        numeric=False,
        state_topic="ledge/gw 1/serial/door/state_open",
        json_payload=False,
        gateway_status_topic="ledge/gw 1/status",
        device_status_topic="ledge/gw 1/serial/door/status",
    )
    assert topic == "ha/sensor/gw_1_door/state_open/config"
    assert json.loads(payload) == {
        "name": "state open",
        "unique_id": "ledge_gw_1_door_state_open",
        "object_id": "ledge_gw_1_door_state_open",
        "state_topic": "ledge/gw 1/serial/door/state_open",
        "availability": [
            {"topic": "ledge/gw 1/status"},
            {"topic": "ledge/gw 1/serial/door/status"},
        ],
        "availability_mode": "all",
        "device": {
            "identifiers": ["ledge_gw_1_door"],
            "name": "door",
            "manufacturer": "Ledge",
            "model": "serial",
            "via_device": "ledge_gw_1",
        },
    }


def test_home_assistant_discovery_of_the_gateway() -> None:
    topic, payload = homeassistant.gateway_config("homeassistant", "gw1", "ledge/gw1/status")
    assert topic == "homeassistant/binary_sensor/gw1/status/config"
    assert json.loads(payload) == {
        "name": "connectivity",
        "unique_id": "ledge_gw1_status",
        "state_topic": "ledge/gw1/status",
        "payload_on": "online",
        "payload_off": "offline",
        "device_class": "connectivity",
        "device": {"identifiers": ["ledge_gw1"], "name": "Ledge gw1", "manufacturer": "Ledge"},
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("21", 21),
        ("-7", -7),
        ("+3", 3),
        ("21.5", 21.5),
        ("-0.25", -0.25),
        ("1e3", 1000.0),
        ("on", True),
        ("FALSE", False),
        ("nan", "nan"),  # not finite: kept as text, never a NaN reading
        ("inf", "inf"),
        ("-", "-"),
        ("12ab", "12ab"),
        ("", ""),
    ],
)
def test_scalar_reads_numbers_booleans_and_text(text: str, expected: object) -> None:
    got = scalar(text)
    assert got == expected and type(got) is type(expected)


def test_payload_fast_path_gives_the_same_bytes_as_json() -> None:
    stamp = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)
    for value in [21.5, -0.0, 3, 10**20, True, False, 'say "hi" ü', 1e-7]:
        for unit in ["", "°C", 'a"b\\c']:
            r = Reading(device="d", quantity="q", value=value, unit=unit, timestamp=stamp)
            body = {"value": value, "unit": unit, "timestamp": stamp.isoformat()}
            expected = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
            assert reading_payload(r) == expected
            assert reading_from_message("ledge/gw/sensor/d/q", expected)[1] == r


@pytest.mark.parametrize(
    "payload", [b'{"value":1,"unit":"\xc2\xb0C"}', b"21.5", b"[1,2]", b"\xff\x00", b"hello", b""]
)
def test_envelope_round_trip(payload: bytes) -> None:
    gateway, seq, back = open_envelope(envelope("gw1", 2**40, payload))
    assert (gateway, seq) == ("gw1", 2**40)
    assert back == payload


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"nope", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"gateway":"g","seq":"1","payload":1}', r"seq \(integer\)"),
        (b'{"gateway":"g","seq":1}', "neither payload"),
        (b'{"gateway":"g","seq":1,"payload_base64":"!!"}', "payload_base64"),
    ],
)
def test_bad_envelopes_are_named(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        open_envelope(data)


def test_health_round_trip_and_errors() -> None:
    stamp = datetime(2026, 11, 21, 10, tzinfo=UTC)
    h = Health(timestamp=stamp, dropped=3, queued=10, uptime=5.5)
    assert health_topic("gw1") == "ledge/gw1/health"
    assert health_from_message("ledge/gw1/health", health_payload(h)) == ("gw1", h)
    with pytest.raises(ValueError, match="is not ledge/<gateway>/health"):
        health_from_message("ledge/gw1/status", health_payload(h))
    with pytest.raises(ValueError, match="health payload"):
        health_from_message(
            "ledge/gw1/health", b'{"timestamp":"2026-11-21T10:00:00Z","dropped":-1}'
        )
