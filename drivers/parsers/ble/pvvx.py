"""Custom firmware for Xiaomi thermometers (LYWSD03MMC, MHO-C401, CGG1...): the pvvx and
ATC1441 "custom" formats, service data 0x181A (Environmental Sensing). Pure.

Both come from github.com/pvvx/ATC_MiThermometer (README, "Custom format"):

- pvvx, 15 bytes, little endian: MAC (6, least significant first), temperature
  int16 x 0.01 °C, humidity uint16 x 0.01 %, battery uint16 mV, battery uint8 %,
  measurement counter uint8, flags uint8.
- ATC1441, 13 bytes, big endian: MAC (6, most significant first), temperature int16
  x 0.1 °C, humidity uint8 %, battery uint8 %, battery uint16 mV, frame counter uint8.

Which one is told by the length. The encrypted variants (8 and 11 bytes) are not read:
such devices can send BTHome instead, which Ledge decrypts.
"""

from __future__ import annotations

import struct
from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.base import (
    AdvertError,
    Context,
    Decoded,
    mac_text,
    service_pattern,
    uuid16,
)

UUID: Final = uuid16(0x181A)
PVVX_LENGTH: Final = 15
ATC_LENGTH: Final = 13
_PVVX = struct.Struct("<hHHBBB").unpack_from
_ATC = struct.Struct(">hBBHB").unpack_from


def decode_pvvx(data: bytes, ctx: Context) -> Decoded:
    if len(data) != PVVX_LENGTH:
        raise _length_error(data, PVVX_LENGTH)
    temp, hum, mv, batt, count, _flags = _PVVX(data, 6)
    return Decoded(
        [
            Sample("temperature", temp / 100, "°C"),
            Sample("humidity", hum / 100, "%"),
            Sample("battery", batt, "%"),
            Sample("voltage", mv / 1000, "V"),
        ],
        packet_id=count,
        identity=mac_text(data[5::-1]),
    )


def decode_atc(data: bytes, ctx: Context) -> Decoded:
    if len(data) != ATC_LENGTH:
        raise _length_error(data, ATC_LENGTH)
    temp, hum, batt, mv, count = _ATC(data, 6)
    return Decoded(
        [
            Sample("temperature", temp / 10, "°C"),
            Sample("humidity", hum, "%"),
            Sample("battery", batt, "%"),
            Sample("voltage", mv / 1000, "V"),
        ],
        packet_id=count,
        identity=mac_text(data[:6]),
    )


def _length_error(data: bytes, want: int) -> AdvertError:
    if len(data) in (8, 11):
        return AdvertError(
            "unsupported", "encrypted pvvx/ATC custom format (send BTHome instead)", 0
        )
    return AdvertError("malformed", f"{len(data)} bytes, the format has {want}", len(data))


def accepts_pvvx(data: bytes, ctx: Context) -> bool:
    return len(data) == PVVX_LENGTH


def accepts_atc(data: bytes, ctx: Context) -> bool:
    return len(data) == ATC_LENGTH


def encode_pvvx(
    mac: bytes, temperature: float, humidity: float, mv: int, battery: int, count: int
) -> bytes:
    """A pvvx custom advert (``mac`` most significant first); for tests and tooling."""
    body = struct.pack(
        "<hHHBBB", round(temperature * 100), round(humidity * 100), mv, battery, count, 0
    )
    return mac[::-1] + body


def encode_atc(
    mac: bytes, temperature: float, humidity: int, battery: int, mv: int, count: int
) -> bytes:
    return mac + struct.pack(">hBBHB", round(temperature * 10), humidity, battery, mv, count)


PATTERNS: Final = (service_pattern(0x181A),)
