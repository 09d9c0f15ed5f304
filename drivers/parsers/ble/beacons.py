"""Presence beacons: Apple iBeacon and Google Eddystone. Pure.

- iBeacon: manufacturer data of company 0x004C starting 0x02 0x15: proximity UUID
  (16), major uint16 BE, minor uint16 BE, measured power int8 (dBm at 1 m). Phones
  change their address; the identity ``uuid/major/minor`` does not.
- Eddystone (github.com/google/eddystone, protocol-specification.md): service data
  0xFEAA, byte 0 the frame type: 0x00 UID (tx power at 0 m, namespace 10, instance
  6), 0x10 URL (tx power, scheme, encoded URL), 0x20 TLM (version 0: battery mV
  uint16 BE, temperature 8.8 fixed point BE, advert count uint32, seconds x 10
  uint32), 0x30 EID (tx power, 8-byte ephemeral id).
"""

from __future__ import annotations

import struct
from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.base import (
    AdvertError,
    Context,
    Decoded,
    company_pattern,
    service_pattern,
    uuid16,
)

APPLE: Final = 0x004C
IBEACON_PREFIX: Final = b"\x02\x15"
EDDYSTONE_UUID: Final = uuid16(0xFEAA)

URL_SCHEMES: Final = ("http://www.", "https://www.", "http://", "https://")
URL_EXPANSIONS: Final = (
    ".com/", ".org/", ".edu/", ".net/", ".info/", ".biz/", ".gov/",
    ".com", ".org", ".edu", ".net", ".info", ".biz", ".gov",
)  # fmt: skip

_IBEACON = struct.Struct(">HHb").unpack_from
_TLM = struct.Struct(">BHhII").unpack_from


def ibeacon_identity(uuid: bytes, major: int, minor: int) -> str:
    u = uuid.hex()
    return f"{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}/{major}/{minor}"


def decode_ibeacon(data: bytes, ctx: Context) -> Decoded:
    if len(data) < 23 or data[:2] != IBEACON_PREFIX:
        raise AdvertError("malformed", "not an iBeacon frame (0x02 0x15 and 21 bytes)", 0)
    major, minor, power = _IBEACON(data, 18)
    return Decoded(
        [Sample("measured_power", power, "dBm")],
        identity=ibeacon_identity(data[2:18], major, minor),
    )


def accepts_ibeacon(data: bytes, ctx: Context) -> bool:
    return len(data) >= 23 and data[:2] == IBEACON_PREFIX


def decode_eddystone(data: bytes, ctx: Context) -> Decoded:
    if not data:
        raise AdvertError("short", "empty Eddystone frame", 0)
    frame = data[0]
    if frame == 0x00:  # UID
        if len(data) < 18:
            raise AdvertError("short", f"UID frame of {len(data)} bytes, needs 18", len(data))
        return Decoded(
            [Sample("tx_power", struct.unpack_from("b", data, 1)[0], "dBm")],
            identity=f"{data[2:12].hex()}/{data[12:18].hex()}",
        )
    if frame == 0x10:  # URL
        if len(data) < 3 or data[2] >= len(URL_SCHEMES):
            raise AdvertError("malformed", "URL frame without a valid scheme", min(2, len(data)))
        url = URL_SCHEMES[data[2]]
        for i, b in enumerate(data[3:], start=3):
            if b < len(URL_EXPANSIONS):
                url += URL_EXPANSIONS[b]
            elif 0x20 < b < 0x7F:
                url += chr(b)
            else:
                raise AdvertError("malformed", f"URL byte 0x{b:02x} is not printable", i)
        return Decoded([Sample("url", url, "")], identity=url)
    if frame == 0x20:  # TLM
        if len(data) < 14:
            raise AdvertError("short", f"TLM frame of {len(data)} bytes, needs 14", len(data))
        version, mv, temp, adv_count, deciseconds = _TLM(data, 1)
        if version != 0:
            raise AdvertError("unsupported", f"encrypted (version {version}) TLM frame", 1)
        out = []
        if mv:
            out.append(Sample("voltage", mv / 1000, "V"))
        if temp != -0x8000:
            out.append(Sample("temperature", round(temp / 256, 2), "°C"))
        out.append(Sample("advert_count", adv_count, ""))
        out.append(Sample("uptime", deciseconds / 10, "s"))
        return Decoded(out)
    if frame == 0x30:  # EID
        if len(data) < 10:
            raise AdvertError("short", f"EID frame of {len(data)} bytes, needs 10", len(data))
        return Decoded([], identity=data[2:10].hex())
    raise AdvertError("unsupported", f"Eddystone frame type 0x{frame:02x}", 0)


def encode_ibeacon(uuid: bytes, major: int, minor: int, power: int) -> bytes:
    return IBEACON_PREFIX + uuid + struct.pack(">HHb", major, minor, power)


def encode_eddystone_uid(namespace: bytes, instance: bytes, tx_power: int) -> bytes:
    return b"\x00" + struct.pack("b", tx_power) + namespace + instance + b"\x00\x00"


IBEACON_PATTERNS: Final = (company_pattern(APPLE),)
EDDYSTONE_PATTERNS: Final = (service_pattern(0xFEAA),)
