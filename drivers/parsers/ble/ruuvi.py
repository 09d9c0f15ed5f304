"""RuuviTag data format 5 ("RAWv2"): manufacturer data of company 0x0499. Pure.

From ruuvi/ruuvi-sensor-protocols, dataformat_05.md: 24 bytes, big endian: format
(5), temperature int16 x 0.005 °C, humidity uint16 x 0.0025 %, pressure uint16 + 50000
Pa, acceleration x/y/z int16 mG, power info uint16 (11 bits battery mV above 1600, 5
bits tx power in 2 dBm steps above -40), movement counter uint8, measurement sequence
uint16, MAC (6). Each field's "not available" value (0x8000, 0xFFFF, 0x7FF, 0x1F, 0xFF)
leaves that reading out.
"""

from __future__ import annotations

import struct
from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.base import AdvertError, Context, Decoded, company_pattern, mac_text

COMPANY_ID: Final = 0x0499
FORMAT_5: Final = 5
LENGTH: Final = 24
STANDARD_GRAVITY: Final = 9.80665  # m/s² per G

_DF5 = struct.Struct(">BhHHhhhHBH").unpack_from


def decode(data: bytes, ctx: Context) -> Decoded:
    if not data:
        raise AdvertError("short", "empty Ruuvi manufacturer data", 0)
    if data[0] != FORMAT_5:
        raise AdvertError("unsupported", f"Ruuvi data format {data[0]}, only 5 is read", 0)
    if len(data) < LENGTH:
        raise AdvertError("short", f"{len(data)} bytes, data format 5 has {LENGTH}", len(data))
    _, temp, hum, pres, ax, ay, az, power, moves, seq = _DF5(data, 0)
    out: list[Sample] = []
    if temp != -0x8000:
        out.append(Sample("temperature", round(temp * 0.005, 3), "°C"))
    if hum != 0xFFFF:
        out.append(Sample("humidity", round(hum * 0.0025, 4), "%"))
    if pres != 0xFFFF:
        out.append(Sample("pressure", (pres + 50000) / 100, "hPa"))
    if -0x8000 not in (ax, ay, az):
        out.append(Sample("acceleration_x", round(ax * STANDARD_GRAVITY / 1000, 3), "m/s²"))
        out.append(Sample("acceleration_y", round(ay * STANDARD_GRAVITY / 1000, 3), "m/s²"))
        out.append(Sample("acceleration_z", round(az * STANDARD_GRAVITY / 1000, 3), "m/s²"))
    if power >> 5 != 0x7FF:
        out.append(Sample("voltage", ((power >> 5) + 1600) / 1000, "V"))
    if power & 0x1F != 0x1F:
        out.append(Sample("tx_power", (power & 0x1F) * 2 - 40, "dBm"))
    if moves != 0xFF:
        out.append(Sample("movement_counter", moves, ""))
    mac = data[18:24]
    return Decoded(
        out,
        packet_id=None if seq == 0xFFFF else seq,
        identity=None if mac == b"\xff" * 6 else mac_text(mac),
    )


def accepts(data: bytes, ctx: Context) -> bool:
    return len(data) >= LENGTH and data[0] == FORMAT_5


def encode(
    mac: bytes,
    temperature: float,
    humidity: float,
    pressure_pa: int,
    acceleration: tuple[int, int, int],
    battery_mv: int,
    tx_power: int,
    movements: int,
    sequence: int,
) -> bytes:
    power = (battery_mv - 1600) << 5 | (tx_power + 40) // 2
    return (
        struct.pack(
            ">BhHHhhhHBH",
            FORMAT_5,
            round(temperature / 0.005),
            round(humidity / 0.0025),
            pressure_pa - 50000,
            *acceleration,
            power,
            movements,
            sequence,
        )
        + mac
    )


PATTERNS: Final = (company_pattern(COMPANY_ID),)
