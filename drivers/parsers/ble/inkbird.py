"""Inkbird IBS-TH / IBS-TH2 hygrometers and IBT (iBBQ) probes. Pure.

Inkbird puts a reading where the company id belongs, so these are told by name, as the
reference decoder (Bluetooth-Devices/inkbird-ble) does:

- IBS-TH ("sps") and IBS-TH2/P01B ("tps"): the company id field is the temperature
  (int16 LE x 0.01 °C); the 7 data bytes: humidity uint16 LE x 0.01 %, three more
  bytes, battery % at byte 5.
- iBBQ/xBBQ (IBT-2X, IBT-4XS, IBT-6XS): 8 bytes, then one int16 LE x 0.1 °C per probe
  (0xFFFF: probe not plugged in); 1, 2, 4 or 6 probes by length.
"""

from __future__ import annotations

import struct
from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.base import AD_COMPLETE_LOCAL_NAME, AdvertError, Context, Decoded

SENSOR_NAMES: Final = ("sps", "tps")
BBQ_PROBES: Final = {10: 1, 12: 2, 16: 4, 20: 6}  # data length (after the company id) -> probes
NOT_PLUGGED: Final = -1

_H = struct.Struct("<h").unpack_from
_UH = struct.Struct("<H").unpack_from


def decode(data: bytes, ctx: Context) -> Decoded:
    name = ctx.name.lower()
    if name in SENSOR_NAMES:
        if len(data) != 7:
            raise AdvertError("malformed", f"{len(data)} bytes, IBS-TH sends 7", len(data))
        temp = _H(ctx.company_id.to_bytes(2, "little"), 0)[0] / 100
        humidity = _UH(data, 0)[0] / 100
        battery = data[5]
        out = [Sample("temperature", temp, "°C")]
        # The IBS-P01B (also "tps") has no humidity sensor: 0 or 0xFFFF there.
        if name == "sps" or humidity not in (0, 655.35):
            if humidity > 100:
                raise AdvertError("invalid_value", f"humidity {humidity} %", 0)
            out.append(Sample("humidity", humidity, "%"))
        if battery > 100:
            raise AdvertError("invalid_value", f"battery {battery} %", 5)
        out.append(Sample("battery", battery, "%"))
        return Decoded(out)
    if "bbq" in name:
        probes = BBQ_PROBES.get(len(data))
        if probes is None:
            raise AdvertError("malformed", f"{len(data)} bytes from an iBBQ", len(data))
        out = []
        for i in range(probes):
            raw = _H(data, 8 + 2 * i)[0]
            if raw != NOT_PLUGGED:
                out.append(Sample(f"temperature_probe_{i + 1}", raw / 10, "°C"))
        return Decoded(out)
    raise AdvertError("unsupported", f"name {ctx.name!r} is no Inkbird model Ledge reads", 0)


def accepts(data: bytes, ctx: Context) -> bool:
    name = ctx.name.lower()
    return (name in SENSOR_NAMES and len(data) == 7) or (
        ("xbbq" in name or "ibbq" in name) and len(data) in BBQ_PROBES
    )


PATTERNS: Final = tuple(
    (0, AD_COMPLETE_LOCAL_NAME, name) for name in (b"sps", b"tps", b"iBBQ", b"xBBQ")
)
