"""SwitchBot Meter, Meter Plus and Outdoor Meter: service data 0xFD3D (or the older
0x0D00), and on newer firmware manufacturer data of company 0x0969. Pure.

As read by the reference decoder (pySwitchbot, adv_parsers/meter.py): service data
byte 0 the model ('T' Meter, 'i' Meter Plus, 'w' Outdoor Meter; bit 7 encrypted
flag), byte 2 battery % (7 bits), bytes 3-5 the reading: byte 3 low nibble tenths
of °C, byte 4 bit 7 sign (1 = positive) and bits 0-6 whole °C, byte 5 bits 0-6
humidity %. Newer firmware repeats the reading at bytes 8-10 of the manufacturer
data, which wins when present.
"""

from __future__ import annotations

from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.base import AdvertError, Context, Decoded, service_pattern, uuid16

UUIDS: Final = (uuid16(0xFD3D), uuid16(0x0D00))
COMPANY_ID: Final = 0x0969
METER_MODELS: Final = frozenset(b"Tiw")


def decode(data: bytes, ctx: Context) -> Decoded:
    """Service data (what every meter sends)."""
    if len(data) < 3:
        raise AdvertError("short", f"{len(data)} bytes, a meter sends at least 3", len(data))
    model = data[0] & 0x7F
    if model not in METER_MODELS:
        raise AdvertError("unsupported", f"SwitchBot model {chr(model)!r} is not a meter", 0)
    if len(data) < 6:  # newer firmware: the reading is in the manufacturer data
        return Decoded([Sample("battery", data[2] & 0x7F, "%")])
    return reading(data[3:6], data[2] & 0x7F)


def decode_company(data: bytes, ctx: Context) -> Decoded:
    """Manufacturer data of newer firmware: the reading at bytes 8-10."""
    if len(data) < 11:
        raise AdvertError("short", f"{len(data)} bytes of company 0x0969, need 11", len(data))
    return reading(data[8:11], None)


def reading(th: bytes, battery: int | None) -> Decoded:
    sign = 1 if th[1] & 0x80 else -1
    temp = sign * ((th[1] & 0x7F) + (th[0] & 0x0F) / 10)
    humidity = th[2] & 0x7F
    out = []
    if temp or humidity:  # all zero: the meter has not measured yet
        out = [Sample("temperature", temp, "°C"), Sample("humidity", humidity, "%")]
    if battery is not None:
        out.append(Sample("battery", battery, "%"))
    return Decoded(out)


def accepts(data: bytes, ctx: Context) -> bool:
    return len(data) >= 3 and data[0] & 0x7F in METER_MODELS


def encode(model: str, temperature: float, humidity: int, battery: int) -> bytes:
    whole = int(abs(temperature))
    tenths = round((abs(temperature) - whole) * 10)
    return bytes(
        [ord(model), 0, battery, tenths, whole | (0x80 if temperature >= 0 else 0), humidity]
    )


PATTERNS: Final = (service_pattern(0xFD3D), service_pattern(0x0D00))
