"""Govee thermo-hygrometers: manufacturer data, values in fixed places. Pure.

Layouts as read by Bluetooth-Devices/govee-ble (the reference decoder):

- H5072/H5075/H5101/H5102/H5177 class (company 0xEC88, 6 bytes): byte 0 reserved,
  bytes 1-3 one big-endian 24-bit number: bit 23 the sign, the rest
  ``temperature x 10000 + humidity x 10`` (temperature to 0.1 °C), byte 4 battery %
  (bit 7: sensor error).
- H5074 (company 0xEC88, 7 bytes): temperature int16 LE x 0.01 °C at byte 1,
  humidity uint16 LE x 0.01 %, battery %.
- H5051/H5052/H5071 (company 0xEC88, 9 bytes): as H5074.
- H5179 (company 0x8801, 9 bytes): temperature int16 LE x 0.01 °C at byte 4, humidity
  uint16 LE x 0.01 %, battery %.

These models put the values in the scan response: scan actively.
"""

from __future__ import annotations

import struct
from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.base import AdvertError, Context, Decoded, company_pattern

COMPANY_IDS: Final = (0xEC88, 0x8801)
#: Plausible temperatures (°C); a value outside is a sensor error, like govee-ble's.
MIN_TEMP: Final = -40.0
MAX_TEMP: Final = 100.0

_HHB = struct.Struct("<hHB").unpack_from


def decode(data: bytes, ctx: Context) -> Decoded:
    n = len(data)
    if ctx.company_id == 0x8801:
        if n != 9:
            raise AdvertError("malformed", f"{n} bytes from company 0x8801, H5179 sends 9", n)
        return _packed_le(data, 4)
    if n == 6:
        base = int.from_bytes(data[1:4], "big")
        magnitude = base & 0x7FFFFF
        temp = (magnitude // 1000) / 10.0
        if base & 0x800000:
            temp = -temp
        humidity = (magnitude % 1000) / 10.0
        battery = data[4] & 0x7F
        out = [Sample("battery", battery, "%")]
        if data[4] & 0x80 or not MIN_TEMP <= temp <= MAX_TEMP:
            return Decoded(
                out, problem=AdvertError("invalid_value", "the sensor reports an error", 1)
            )
        return Decoded([Sample("temperature", temp, "°C"), Sample("humidity", humidity, "%"), *out])
    if n in (7, 9):
        return _packed_le(data, 1)
    raise AdvertError("malformed", f"{n} bytes from company 0x{ctx.company_id:04x}", n)


def _packed_le(data: bytes, at: int) -> Decoded:
    temp, hum, battery = _HHB(data, at)
    return Decoded(
        [
            Sample("temperature", temp / 100, "°C"),
            Sample("humidity", hum / 100, "%"),
            Sample("battery", battery, "%"),
        ]
    )


def accepts(data: bytes, ctx: Context) -> bool:
    if ctx.company_id == 0x8801:
        return len(data) == 9
    return len(data) in (6, 7, 9)


def encode_h5075(temperature: float, humidity: float, battery: int) -> bytes:
    value = round(abs(temperature) * 10) * 1000 + round(humidity * 10)
    if temperature < 0:
        value |= 0x800000
    return b"\x00" + value.to_bytes(3, "big") + bytes([battery, 0])


PATTERNS: Final = tuple(company_pattern(c) for c in COMPANY_IDS)
