"""NMEA 0183 GPS sentences (GGA, RMC, VTG). Pure: one line in, samples out.

Samples, with their units:

- ``latitude``, ``longitude`` (deg, south and west negative) -- GGA, RMC
- ``fix_quality`` (0 invalid, 1 GPS, 2 DGPS, 4 RTK fixed, 5 RTK float, ...) -- GGA
- ``satellites`` (count of satellites in use) -- GGA
- ``altitude`` (m above mean sea level) -- GGA
- ``hdop`` -- GGA
- ``speed`` (m/s, from knots) -- RMC, VTG
- ``course`` (deg true) -- RMC, VTG
- ``time`` (ISO 8601 UTC date and time of the fix) -- RMC

Empty fields (no fix yet) give no sample. A sentence with a wrong checksum, a
talker or type this module does not read, or a malformed field is a ``ParseError``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from drivers.parsers import ParseError, Sample

KNOT = 1852 / 3600  # m/s


def checksum(body: bytes) -> int:
    value = 0
    for byte in body:
        value ^= byte
    return value


def _fields(line: bytes) -> list[str]:
    if not line.startswith((b"$", b"!")):
        raise ParseError("NMEA sentence does not start with '$'", 0)
    star = line.rfind(b"*")
    if star < 0:
        raise ParseError("NMEA sentence has no checksum", len(line))
    body = line[1:star]
    given = line[star + 1 : star + 3]
    try:
        expected = int(given, 16)
    except ValueError:
        raise ParseError(f"checksum {given!r} is not hexadecimal", star + 1) from None
    actual = checksum(body)
    if actual != expected:
        raise ParseError(f"checksum {expected:02X} does not match {actual:02X}", star + 1)
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ParseError("non-ASCII byte in sentence", 1 + exc.start) from None
    return text.split(",")


def _coordinate(value: str, hemisphere: str, degree_digits: int, what: str) -> float:
    try:
        degrees = int(value[:degree_digits])
        minutes = float(value[degree_digits:])
    except ValueError:
        raise ParseError(f"{what} {value!r} is not (d)ddmm.mmmm") from None
    if minutes >= 60:
        raise ParseError(f"{what} {value!r} has {minutes} minutes")
    result = degrees + minutes / 60
    if hemisphere in ("S", "W"):
        result = -result
    elif hemisphere not in ("N", "E"):
        raise ParseError(f"{what} hemisphere {hemisphere!r} is not N/S/E/W")
    return round(result, 7)


def _number(value: str, what: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ParseError(f"{what} {value!r} is not a number") from None


def _position(f: list[str], lat: int) -> list[Sample]:
    if not f[lat] or not f[lat + 2]:
        return []
    return [
        Sample("latitude", _coordinate(f[lat], f[lat + 1], 2, "latitude"), "deg"),
        Sample("longitude", _coordinate(f[lat + 2], f[lat + 3], 3, "longitude"), "deg"),
    ]


def _gga(f: list[str]) -> list[Sample]:
    if len(f) < 15:
        raise ParseError(f"GGA has {len(f)} fields, not 15")
    out = _position(f, 2)
    if f[6]:
        out.append(Sample("fix_quality", int(_number(f[6], "fix quality"))))
    if f[7]:
        out.append(Sample("satellites", int(_number(f[7], "satellites"))))
    if f[8]:
        out.append(Sample("hdop", _number(f[8], "HDOP")))
    if f[9]:
        out.append(Sample("altitude", _number(f[9], "altitude"), "m"))
    return out


def _rmc(f: list[str]) -> list[Sample]:
    if len(f) < 12:
        raise ParseError(f"RMC has {len(f)} fields, not 12 or more")
    out: list[Sample] = []
    if f[2] == "A":  # data valid
        out.extend(_position(f, 3))
        if f[7]:
            out.append(Sample("speed", round(_number(f[7], "speed") * KNOT, 3), "m/s"))
        if f[8]:
            out.append(Sample("course", _number(f[8], "course"), "deg"))
    if f[1] and f[9]:
        out.append(Sample("time", _fix_time(f[1], f[9])))
    return out


def _fix_time(hhmmss: str, ddmmyy: str) -> str:
    try:
        seconds = float(hhmmss[4:])
        year = int(ddmmyy[4:6])
        stamp = datetime(
            year + (1900 if year >= 80 else 2000),  # two-digit years: 1980-2079
            int(ddmmyy[2:4]),
            int(ddmmyy[0:2]),
            int(hhmmss[0:2]),
            int(hhmmss[2:4]),
            int(seconds),
            round((seconds % 1) * 1_000_000),
            tzinfo=UTC,
        )
    except ValueError:
        raise ParseError(f"time {hhmmss!r} / date {ddmmyy!r} is not a valid UTC time") from None
    return stamp.isoformat()


def _vtg(f: list[str]) -> list[Sample]:
    if len(f) < 9:
        raise ParseError(f"VTG has {len(f)} fields, not 9 or more")
    out: list[Sample] = []
    if f[1]:
        out.append(Sample("course", _number(f[1], "course"), "deg"))
    if f[5]:
        out.append(Sample("speed", round(_number(f[5], "speed") * KNOT, 3), "m/s"))
    return out


_SENTENCES = {"GGA": _gga, "RMC": _rmc, "VTG": _vtg}
#: Sentences GPS receivers send that carry nothing read here (satellites in view, DOP).
IGNORED = frozenset({"GSA", "GSV", "GLL", "TXT", "ZDA", "GST"})


def parse(line: bytes) -> list[Sample]:
    """Samples from one NMEA sentence (no line end)."""
    fields = _fields(line.strip())
    head = fields[0]
    if len(head) != 5:
        raise ParseError(f"address field {head!r} is not a talker and a sentence type", 1)
    kind = head[2:]
    if kind in IGNORED:
        return []
    reader = _SENTENCES.get(kind)
    if reader is None:
        raise ParseError(f"sentence type {kind!r} is not read", 3)
    return reader(fields)
