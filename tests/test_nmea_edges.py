"""NMEA 0183 at its edges: each refusal's reason and column, exactly (what a garbage GPS
line logs beside the device); fields that are empty (no fix yet) give no sample, each
field at its own position; coordinates at the minute's edge and each hemisphere; the
fix time's two-digit years and fractions. Sentences are made here with the checksum
computed as the standard says (XOR of the bytes between '$' and '*')."""

from __future__ import annotations

from functools import reduce

import pytest

from drivers.parsers import ParseError
from drivers.parsers.nmea import parse


def sentence(body: str | bytes) -> bytes:
    raw = body.encode() if isinstance(body, str) else body
    total = reduce(lambda a, b: a ^ b, raw, 0)
    return b"$" + raw + f"*{total:02X}".encode()


def values(body: str) -> dict[str, tuple[object, str]]:
    return {s.field: (s.value, s.unit) for s in parse(sentence(body))}


def refusal(line: bytes) -> tuple[str, int]:
    with pytest.raises(ParseError) as caught:
        parse(line)
    return caught.value.reason, caught.value.column


GGA = "GPGGA,123519,4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"GPGGA,1*00", ("NMEA sentence does not start with '$'", 0)),
        (b"$GPGGA,123519", ("NMEA sentence has no checksum", 13)),
        (b"$GPVTG,,T,,M,,N,,K*zz", ("checksum b'zz' is not hexadecimal", 19)),
        (
            sentence(GGA)[:-2] + b"00",
            ("checksum 00 does not match " + sentence(GGA)[-2:].decode(), len(sentence(GGA)) - 2),
        ),
        (sentence(b"GPVTG,\xe9,T,,M,,N,,K"), ("non-ASCII byte in sentence", 7)),
        (sentence("GPGG,1"), ("address field 'GPGG' is not a talker and a sentence type", 1)),
        (sentence("GPXYZ,1"), ("sentence type 'XYZ' is not read", 3)),
        (sentence("GPGGA,1,2"), ("GGA has 3 fields, not 15", 0)),
        (sentence("GPGGA" + ",1" * 13), ("GGA has 14 fields, not 15", 0)),
        (sentence("GPRMC,1,A"), ("RMC has 3 fields, not 12 or more", 0)),
        (sentence("GPVTG,1"), ("VTG has 2 fields, not 9 or more", 0)),
        (
            sentence(GGA.replace("4807.038", "4860.000")),
            ("latitude '4860.000' has 60.0 minutes", 0),
        ),
        (sentence(GGA.replace(",N,", ",X,")), ("latitude hemisphere 'X' is not N/S/E/W", 0)),
        (
            sentence(GGA.replace("4807.038", "48x7.038")),
            ("latitude '48x7.038' is not (d)ddmm.mmmm", 0),
        ),
        (sentence(GGA.replace(",08,", ",eight,")), ("satellites 'eight' is not a number", 0)),
        (sentence(GGA.replace(",0.9,", ",n/a,")), ("HDOP 'n/a' is not a number", 0)),
        (sentence(GGA.replace(",545.4,", ",high,")), ("altitude 'high' is not a number", 0)),
        (sentence(GGA.replace(",1,08,", ",a,08,")), ("fix quality 'a' is not a number", 0)),
        (
            sentence("GPRMC,123519,A,4807.038,N,01131.000,E,fast,084.4,230394,003.1,W"),
            ("speed 'fast' is not a number", 0),
        ),
        (
            sentence("GPRMC,123519,A,4807.038,N,01131.000,E,022.4,up,230394,003.1,W"),
            ("course 'up' is not a number", 0),
        ),
        (
            sentence("GPRMC,126019,V,,,,,,,230394,,"),
            ("time '126019' / date '230394' is not a valid UTC time", 0),
        ),
        (
            sentence(GGA.replace("01131.000", "011x1.000")),
            ("longitude '011x1.000' is not (d)ddmm.mmmm", 0),
        ),
        (sentence(GGA.replace(",E,", ",Q,")), ("longitude hemisphere 'Q' is not N/S/E/W", 0)),
        (
            sentence("GPVTG,north,T,034.4,M,005.5,N,010.2,K"),
            ("course 'north' is not a number", 0),
        ),
    ],
)
def test_each_refusal_names_its_reason_and_column(line: bytes, expected: tuple[str, int]) -> None:
    assert refusal(line) == expected


def test_a_fix_with_every_field_at_its_place() -> None:
    assert values(GGA) == {
        "latitude": (48.1173, "deg"),
        "longitude": (11.5166667, "deg"),
        "fix_quality": (1, ""),
        "satellites": (8, ""),
        "hdop": (0.9, ""),
        "altitude": (545.4, "m"),
    }
    rmc = "GPRMC,123519.25,A,4807.038,S,01131.000,W,022.4,084.4,230394,003.1,W"
    assert values(rmc) == {
        "latitude": (-48.1173, "deg"),
        "longitude": (-11.5166667, "deg"),
        "speed": (round(22.4 * 1852 / 3600, 3), "m/s"),
        "course": (84.4, "deg"),
        "time": ("1994-03-23T12:35:19.250000+00:00", ""),
    }
    assert values("GPVTG,054.7,T,034.4,M,005.5,N,010.2,K") == {
        "course": (54.7, "deg"),
        "speed": (round(5.5 * 1852 / 3600, 3), "m/s"),
    }
    # the minute's edge, and a sentence with '*' inside a field: the last '*' counts
    assert values(GGA.replace("4807.038", "4859.9999"))["latitude"] == (48.9999983, "deg")
    assert parse(sentence("GPTXT,01,01,02,a*b")) == []
    # two hex digits after the '*' are the checksum; a line end after them is not read
    vtg = sentence("GPVTG,054.7,T,034.4,M,005.5,N,010.2,K")
    assert parse(vtg + b"\r\n") == parse(vtg) == parse(b"  " + vtg)


def test_empty_fields_give_no_sample_and_each_field_is_read_from_its_own_place() -> None:
    assert values("GPGGA,123519,,,,,0,00,,,M,,M,,") == {
        "fix_quality": (0, ""),
        "satellites": (0, ""),
    }
    only = ["", "", "", "", "", "", "", "", "", "", "M", "", "M", "", ""]
    for index, name, text, value in (
        (6, "fix_quality", "2", 2),
        (7, "satellites", "12", 12),
        (8, "hdop", "1.5", 1.5),
        (9, "altitude", "12.5", 12.5),
    ):
        fields = list(only)
        fields[index] = text
        got = values("GPGGA," + ",".join(fields[1:]))
        assert [(k, v[0]) for k, v in got.items()] == [(name, value)], index
    # a latitude without a longitude is no position
    assert "latitude" not in values(GGA.replace("01131.000", ""))
    assert "latitude" not in values(GGA.replace("4807.038", ""))
    # not valid (V): no position, speed or course; the time when both parts are there
    void = values("GPRMC,123519,V,4807.038,N,01131.000,E,022.4,084.4,230394,,")
    assert void == {"time": ("1994-03-23T12:35:19+00:00", "")}
    assert values("GPRMC,,V,,,,,,,230394,,") == {}
    assert values("GPRMC,123519,V,,,,,,,,,") == {}
    # two-digit years: 80-99 are 1980-1999, 00-79 are 2000-2079
    assert values("GPRMC,000000,V,,,,,,,010180,,")["time"][0] == "1980-01-01T00:00:00+00:00"
    assert values("GPRMC,000000,V,,,,,,,311279,,")["time"][0] == "2079-12-31T00:00:00+00:00"


def test_rmc_course_and_date_and_vtg_course_are_each_read_from_their_own_field() -> None:
    """RMC: the course over ground is field 8, the date field 9; a receiver standing still
    leaves the course empty (u-blox does), and the date must come all the same; a course
    is a course even in a sentence without its date. VTG: the course is field 1, field 2
    its "T" (true) marker, sent whether or not there is a course."""
    no_date = values("GPRMC,123519,A,4807.038,N,01131.000,E,022.4,084.4,,003.1,W")
    assert no_date["course"] == (84.4, "deg") and "time" not in no_date
    no_course = values("GPRMC,123519,A,4807.038,N,01131.000,E,000.0,,230394,003.1,W")
    assert "course" not in no_course
    assert no_course["time"] == ("1994-03-23T12:35:19+00:00", "")
    assert no_course["speed"] == (0.0, "m/s")
    assert values("GPVTG,,T,,M,005.5,N,010.2,K") == {"speed": (round(5.5 * 1852 / 3600, 3), "m/s")}
