"""Xiaomi MiBeacon: service data 0xFE95, plain and encrypted (v4/v5). Pure.

Layout (MiBeacon "frame control" format, as documented by Xiaomi's IoT developer
platform and read by custom-components/ble_monitor): frame control uint16 LE, product
id uint16 LE, frame counter uint8, then optional parts by frame-control bits: bit 4
the MAC (6 bytes, least significant first), bit 5 a capability byte (and an I/O byte
when capability bit 5 is set), bit 6 objects. Objects: type uint16 LE, length uint8,
value. Bit 3 marks encryption; bits 12-15 are the version.

v4/v5 encryption: objects || extended counter (3) || MIC (4); AES-CCM with the
device's bindkey, nonce = MAC (least significant first) || product id || frame
counter || extended counter, associated data 0x11. Older (v2/v3) encryption and mesh
frames are reported as unsupported.
"""

from __future__ import annotations

import struct
from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.base import AdvertError, Context, Decoded, service_pattern, uuid16

UUID: Final = uuid16(0xFE95)
AAD: Final = b"\x11"

BIT_ENCRYPTED: Final = 1 << 3
BIT_MAC: Final = 1 << 4
BIT_CAPABILITY: Final = 1 << 5
BIT_OBJECTS: Final = 1 << 6
BIT_MESH: Final = 1 << 7

#: LYWSD03MMC and MHO-C401 report humidity in whole percent in a 0.1 % field (their
#: readings step; Home Assistant and ESPHome truncate them the same way).
WHOLE_PERCENT_HUMIDITY: Final = frozenset({0x055B, 0x0387})

_H = struct.Struct("<h").unpack_from
_UH = struct.Struct("<H").unpack_from
_HH = struct.Struct("<hH").unpack_from
_F = struct.Struct("<f").unpack_from


def decode(data: bytes, ctx: Context) -> Decoded:
    n = len(data)
    if n < 5:
        raise AdvertError("short", f"{n} bytes, a MiBeacon header has 5", n)
    frctrl = data[0] | data[1] << 8
    version = frctrl >> 12
    if frctrl & BIT_MESH:
        raise AdvertError("unsupported", "MiBeacon mesh frame", 0)
    if version < 2:
        raise AdvertError("unsupported", f"MiBeacon version {version}", 0)
    product = data[2] | data[3] << 8
    frame = data[4]
    pos = 5
    mac_lsb = ctx.mac[::-1]
    if frctrl & BIT_MAC:
        if n < pos + 6:
            raise AdvertError("short", "MAC flag set but the MAC is cut off", n)
        mac_lsb = data[pos : pos + 6]
        pos += 6
    if frctrl & BIT_CAPABILITY:
        if n < pos + 1:
            raise AdvertError("short", "capability flag set but no capability byte", n)
        capability = data[pos]
        pos += 1
        if capability & 0x20:
            pos += 1
            if n < pos:
                raise AdvertError("short", "I/O capability byte is cut off", n)
    if not frctrl & BIT_OBJECTS:
        return Decoded([], packet_id=frame)  # a beacon without values (pairing, idle)
    counter = None
    if frctrl & BIT_ENCRYPTED:
        if version <= 3:
            raise AdvertError("unsupported", f"legacy MiBeacon v{version} encryption", 0)
        cipher = ctx.cipher
        if cipher is None:
            raise AdvertError("no_key", "encrypted MiBeacon advert and no bindkey configured", 0)
        if n < pos + 8:
            raise AdvertError("short", "encrypted MiBeacon advert shorter than counter and MIC", n)
        ext = data[-7:-4]
        counter = frame | int.from_bytes(ext, "little") << 8
        payload = cipher.open(mac_lsb + data[2:5] + ext, data[pos:-7] + data[-4:], AAD)
        if payload is None:
            raise AdvertError("wrong_key", "MiBeacon advert does not decrypt with the bindkey", 0)
        base = 0
    else:
        if ctx.cipher is not None:
            raise AdvertError(
                "not_encrypted", "plain MiBeacon advert from a device with a bindkey", 0
            )
        payload = data
        base = pos
    decoded = objects(payload, base, product)
    decoded.packet_id = frame
    decoded.counter = counter
    return decoded


def objects(payload: bytes, pos: int, product: int) -> Decoded:
    out: list[Sample] = []
    problem = None
    n = len(payload)
    while pos + 3 <= n:
        kind = payload[pos] | payload[pos + 1] << 8
        size = payload[pos + 2]
        start = pos + 3
        end = start + size
        if end > n:
            problem = AdvertError(
                "short", f"object 0x{kind:04x} needs {size} bytes, {n - start} left", pos
            )
            break
        reader = OBJECTS.get(kind)
        if reader is None:
            if problem is None:
                problem = AdvertError(
                    "unknown_object", f"unknown MiBeacon object 0x{kind:04x}", pos
                )
        else:
            want, read = reader
            if want and size != want:
                problem = AdvertError(
                    "malformed", f"object 0x{kind:04x} has {size} bytes, not {want}", pos
                )
            elif not size:  # (a reader of any length reads its first byte)
                problem = AdvertError("malformed", f"object 0x{kind:04x} has no value", pos)
            else:
                read(payload, start, product, out)
        pos = end
    if pos < n and problem is None:
        problem = AdvertError("short", f"{n - pos} stray bytes after the objects", pos)
    return Decoded(out, problem=problem)


def _temperature(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("temperature", _H(p, i)[0] / 10, "°C"))


def _humidity(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    raw = _UH(p, i)[0]
    out.append(
        Sample("humidity", raw // 10 if product in WHOLE_PERCENT_HUMIDITY else raw / 10, "%")
    )


def _temp_humidity(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    temp, hum = _HH(p, i)
    out.append(Sample("temperature", temp / 10, "°C"))
    out.append(Sample("humidity", hum / 10, "%"))


def _battery(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("battery", p[i], "%"))


def _illuminance(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("illuminance", int.from_bytes(p[i : i + 3], "little"), "lx"))


def _moisture(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("moisture", p[i], "%"))


def _conductivity(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("conductivity", _UH(p, i)[0], "µS/cm"))


def _formaldehyde(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("formaldehyde", _UH(p, i)[0] / 100, "mg/m³"))


def _float_temperature(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("temperature", round(_F(p, i)[0], 2), "°C"))


def _float_humidity(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("humidity", _F(p, i)[0], "%"))


def _humidity_percent(p: bytes, i: int, product: int, out: list[Sample]) -> None:
    out.append(Sample("humidity", p[i], "%"))


_Reader = tuple[int, "object"]

#: object type -> (required length, reader), from the MiBeacon object definitions.
OBJECTS: Final = {
    0x1004: (2, _temperature),
    0x1006: (2, _humidity),
    0x1007: (3, _illuminance),
    0x1008: (0, _moisture),
    0x1009: (2, _conductivity),
    0x100A: (0, _battery),
    0x100D: (4, _temp_humidity),
    0x1010: (2, _formaldehyde),
    0x4803: (0, _battery),
    0x4C01: (4, _float_temperature),
    0x4C02: (1, _humidity_percent),
    0x4C03: (0, _battery),
    0x4C08: (4, _float_humidity),
}


def encode(
    product: int,
    frame: int,
    objects_: list[tuple[int, bytes]],
    *,
    mac: bytes | None = None,
    version: int = 5,
    capability: int | None = None,
) -> bytes:
    """A plain MiBeacon frame (``mac`` most significant first); for tests and tooling."""
    frctrl = version << 12 | BIT_OBJECTS
    if mac is not None:
        frctrl |= BIT_MAC
    if capability is not None:
        frctrl |= BIT_CAPABILITY
    out = struct.pack("<HHB", frctrl, product, frame)
    if mac is not None:
        out += mac[::-1]
    if capability is not None:
        out += bytes([capability])
    for kind, value in objects_:
        out += struct.pack("<HB", kind, len(value)) + value
    return out


def encrypt(plain: bytes, mac: bytes, ext_counter: int, key: bytes) -> bytes:
    """Seal a plain v4/v5 frame from ``encode`` (``mac`` most significant first)."""
    from drivers.parsers.ble.ccm import Cipher

    frctrl = (plain[0] | plain[1] << 8) | BIT_ENCRYPTED
    pos = 5 + (6 if frctrl & BIT_MAC else 0) + (1 if frctrl & BIT_CAPABILITY else 0)
    ext = ext_counter.to_bytes(3, "little")
    sealed = Cipher(key).seal(mac[::-1] + plain[2:5] + ext, plain[pos:], AAD)
    head = struct.pack("<H", frctrl) + plain[2:pos]
    return head + sealed[:-4] + ext + sealed[-4:]


PATTERNS: Final = (service_pattern(0xFE95),)
