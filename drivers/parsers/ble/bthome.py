"""BTHome v2 (https://bthome.io/format/): service data 0xFCD2. Pure, table-driven.

Layout: one "adv info" byte (bit 0 encrypted, bit 1 MAC included, bit 2 trigger
based, bits 5-7 version = 2), optionally the sender's MAC (6 bytes, least significant
first), then objects: an object id byte followed by a value whose length the id
fixes (text, raw and command objects carry a length byte). Objects are little endian.

Encrypted adverts (bit 0) carry ``ciphertext || counter (4) || MIC (4)``; AES-CCM
with the device's bindkey, nonce = MAC (6, most significant first) || UUID
``d2 fc`` || adv info || counter, no associated data. The adv info byte is in the
nonce as sent (Shelly BLU devices send 0x45, not 0x41).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.base import (
    AdvertError,
    Context,
    Decoded,
    precision,
    service_pattern,
    uuid16,
)

UUID: Final = uuid16(0xFCD2)
NONCE_UUID: Final = b"\xd2\xfc"

# Object kinds.
NUM, BIN, BUTTON, DIMMER, COMMAND, TEXT, RAW, TIME, DEVICE_TYPE, FW4, FW3, PACKET_ID = range(12)

#: object id -> (name, kind, length, signed, factor, unit), from the BTHome v2 object list.
OBJECTS: Final[dict[int, tuple[str, int, int, bool, float, str]]] = {
    0x00: ("packet_id", PACKET_ID, 1, False, 1, ""),
    0x01: ("battery", NUM, 1, False, 1, "%"),
    0x02: ("temperature", NUM, 2, True, 0.01, "°C"),
    0x03: ("humidity", NUM, 2, False, 0.01, "%"),
    0x04: ("pressure", NUM, 3, False, 0.01, "hPa"),
    0x05: ("illuminance", NUM, 3, False, 0.01, "lx"),
    0x06: ("mass", NUM, 2, False, 0.01, "kg"),
    0x07: ("mass", NUM, 2, False, 0.01, "lb"),
    0x08: ("dew_point", NUM, 2, True, 0.01, "°C"),
    0x09: ("count", NUM, 1, False, 1, ""),
    0x0A: ("energy", NUM, 3, False, 0.001, "kWh"),
    0x0B: ("power", NUM, 3, False, 0.01, "W"),
    0x0C: ("voltage", NUM, 2, False, 0.001, "V"),
    0x0D: ("pm25", NUM, 2, False, 1, "µg/m³"),
    0x0E: ("pm10", NUM, 2, False, 1, "µg/m³"),
    0x0F: ("generic", BIN, 1, False, 1, ""),
    0x10: ("power_on", BIN, 1, False, 1, ""),
    0x11: ("opening", BIN, 1, False, 1, ""),
    0x12: ("co2", NUM, 2, False, 1, "ppm"),
    0x13: ("tvoc", NUM, 2, False, 1, "µg/m³"),
    0x14: ("moisture", NUM, 2, False, 0.01, "%"),
    0x15: ("battery_low", BIN, 1, False, 1, ""),
    0x16: ("battery_charging", BIN, 1, False, 1, ""),
    0x17: ("carbon_monoxide", BIN, 1, False, 1, ""),
    0x18: ("cold", BIN, 1, False, 1, ""),
    0x19: ("connectivity", BIN, 1, False, 1, ""),
    0x1A: ("door", BIN, 1, False, 1, ""),
    0x1B: ("garage_door", BIN, 1, False, 1, ""),
    0x1C: ("gas_detected", BIN, 1, False, 1, ""),
    0x1D: ("heat", BIN, 1, False, 1, ""),
    0x1E: ("light", BIN, 1, False, 1, ""),
    0x1F: ("lock", BIN, 1, False, 1, ""),
    0x20: ("moisture_detected", BIN, 1, False, 1, ""),
    0x21: ("motion", BIN, 1, False, 1, ""),
    0x22: ("moving", BIN, 1, False, 1, ""),
    0x23: ("occupancy", BIN, 1, False, 1, ""),
    0x24: ("plug", BIN, 1, False, 1, ""),
    0x25: ("presence_detected", BIN, 1, False, 1, ""),
    0x26: ("problem", BIN, 1, False, 1, ""),
    0x27: ("running", BIN, 1, False, 1, ""),
    0x28: ("safety", BIN, 1, False, 1, ""),
    0x29: ("smoke", BIN, 1, False, 1, ""),
    0x2A: ("sound", BIN, 1, False, 1, ""),
    0x2B: ("tamper", BIN, 1, False, 1, ""),
    0x2C: ("vibration", BIN, 1, False, 1, ""),
    0x2D: ("window", BIN, 1, False, 1, ""),
    0x2E: ("humidity", NUM, 1, False, 1, "%"),
    0x2F: ("moisture", NUM, 1, False, 1, "%"),
    0x3A: ("button", BUTTON, 1, False, 1, ""),
    0x3B: ("remote_command", COMMAND, 0, False, 1, ""),
    0x3C: ("dimmer", DIMMER, 2, False, 1, ""),
    0x3D: ("count", NUM, 2, False, 1, ""),
    0x3E: ("count", NUM, 4, False, 1, ""),
    0x3F: ("rotation", NUM, 2, True, 0.1, "°"),
    0x40: ("distance", NUM, 2, False, 1, "mm"),
    0x41: ("distance", NUM, 2, False, 0.1, "m"),
    0x42: ("duration", NUM, 3, False, 0.001, "s"),
    0x43: ("current", NUM, 2, False, 0.001, "A"),
    0x44: ("speed", NUM, 2, False, 0.01, "m/s"),
    0x45: ("temperature", NUM, 2, True, 0.1, "°C"),
    0x46: ("uv_index", NUM, 1, False, 0.1, ""),
    0x47: ("volume", NUM, 2, False, 0.1, "L"),
    0x48: ("volume", NUM, 2, False, 1, "mL"),
    0x49: ("volume_flow_rate", NUM, 2, False, 0.001, "m³/h"),
    0x4A: ("voltage", NUM, 2, False, 0.1, "V"),
    0x4B: ("gas", NUM, 3, False, 0.001, "m³"),
    0x4C: ("gas", NUM, 4, False, 0.001, "m³"),
    0x4D: ("energy", NUM, 4, False, 0.001, "kWh"),
    0x4E: ("volume", NUM, 4, False, 0.001, "L"),
    0x4F: ("water", NUM, 4, False, 0.001, "L"),
    0x50: ("timestamp", TIME, 4, False, 1, ""),
    0x51: ("acceleration", NUM, 2, False, 0.001, "m/s²"),
    0x52: ("gyroscope", NUM, 2, False, 0.001, "°/s"),
    0x53: ("text", TEXT, 0, False, 1, ""),
    0x54: ("raw", RAW, 0, False, 1, ""),
    0x55: ("volume_storage", NUM, 4, False, 0.001, "L"),
    0x56: ("conductivity", NUM, 2, False, 1, "µS/cm"),
    0x57: ("temperature", NUM, 1, True, 1, "°C"),
    0x58: ("temperature", NUM, 1, True, 0.35, "°C"),
    0x59: ("count", NUM, 1, True, 1, ""),
    0x5A: ("count", NUM, 2, True, 1, ""),
    0x5B: ("count", NUM, 4, True, 1, ""),
    0x5C: ("power", NUM, 4, True, 0.01, "W"),
    0x5D: ("current", NUM, 2, True, 0.001, "A"),
    0x5E: ("direction", NUM, 2, False, 0.01, "°"),
    0x5F: ("precipitation", NUM, 2, False, 0.1, "mm"),
    0x60: ("channel", NUM, 1, False, 1, ""),
    0x61: ("rotational_speed", NUM, 2, False, 1, "rpm"),
    0x62: ("speed", NUM, 4, True, 0.000001, "m/s"),
    0x63: ("acceleration", NUM, 4, True, 0.000001, "m/s²"),
    0x64: ("light_level", NUM, 1, False, 1, ""),
    0x65: ("settings_revision", NUM, 1, False, 1, ""),
    0xF0: ("device_type_id", DEVICE_TYPE, 2, False, 1, ""),
    0xF1: ("firmware_version", FW4, 4, False, 1, ""),
    0xF2: ("firmware_version", FW3, 3, False, 1, ""),
}

#: object id -> decimal places of its factor (precomputed: it is on the hot path).
PLACES: Final = {k: precision(v[4]) for k, v in OBJECTS.items()}

BUTTON_EVENTS: Final = {
    0x01: "press",
    0x02: "double_press",
    0x03: "triple_press",
    0x04: "long_press",
    0x05: "long_double_press",
    0x06: "long_triple_press",
    0x80: "hold_press",
    0x81: "hold_release",
}
DIMMER_EVENTS: Final = {0x01: "rotate_left", 0x02: "rotate_right"}
COMMAND_EVENTS: Final = {
    0x00: "off",
    0x01: "on",
    0x02: "toggle",
    0x03: "step_up",
    0x04: "step_down",
}

#: Names a device reports as events: published each time, never held back.
EVENT_NAMES: Final = frozenset(
    {"button", "dimmer", "dimmer_steps", "remote_command", "remote_command_args"}
)

FLAG_ENCRYPTED: Final = 0x01
FLAG_MAC: Final = 0x02
VERSION: Final = 2


def decode(data: bytes, ctx: Context) -> Decoded:
    if not data:
        raise AdvertError("short", "empty BTHome service data", 0)
    info = data[0]
    if info >> 5 != VERSION:
        raise AdvertError("unsupported", f"BTHome version {info >> 5}, only 2 is read", 0)
    start = 1
    mac = ctx.mac
    if info & FLAG_MAC:
        if len(data) < 7:
            raise AdvertError("short", "MAC flag set but fewer than 6 MAC bytes", len(data))
        mac = data[6:0:-1]
        start = 7
    counter = None
    if info & FLAG_ENCRYPTED:
        cipher = ctx.cipher
        if cipher is None:
            raise AdvertError("no_key", "encrypted BTHome advert and no bindkey configured", 0)
        if len(data) - start < 9:
            raise AdvertError(
                "short", "encrypted BTHome advert shorter than its counter and MIC", 0
            )
        ctr = data[-8:-4]
        counter = int.from_bytes(ctr, "little")
        payload = cipher.open(mac + NONCE_UUID + data[:1] + ctr, data[start:-8] + data[-4:], None)
        if payload is None:
            raise AdvertError("wrong_key", "BTHome advert does not decrypt with the bindkey", 0)
        base = 0  # offsets in the decrypted payload
    else:
        if ctx.cipher is not None:
            raise AdvertError(
                "not_encrypted", "plain BTHome advert from a device with a bindkey", 0
            )
        payload = data
        base = start
    decoded = objects(payload, base)
    decoded.counter = counter
    return decoded


def objects(payload: bytes, pos: int) -> Decoded:
    """Read the objects of a (decrypted) payload from ``pos`` on."""
    out: list[tuple[str, object, str]] = []
    packet_id = None
    problem = None
    n = len(payload)
    table = OBJECTS
    from_bytes = int.from_bytes
    while pos < n:
        oid = payload[pos]
        entry = table.get(oid)
        if entry is None:
            problem = AdvertError("unknown_object", f"unknown BTHome object id 0x{oid:02x}", pos)
            break
        name, kind, size, signed, factor, unit = entry
        start = pos + 1
        if size == 0:  # text, raw, command: a length byte first
            if start >= n:
                problem = AdvertError("short", f"object 0x{oid:02x} lacks its length byte", pos)
                break
            size = payload[start]
            if kind == COMMAND:
                size = 1 + (size & 0x1F)  # opcode and up to 31 argument bytes
            start += 1
        end = start + size
        if end > n:
            problem = AdvertError(
                "short", f"object 0x{oid:02x} needs {size} bytes, {n - start} left", pos
            )
            break
        pos = end
        if kind == NUM:
            raw = from_bytes(payload[start:end], "little", signed=signed)
            out.append((name, raw if factor == 1 else round(raw * factor, PLACES[oid]), unit))
        elif kind == BIN:
            out.append((name, payload[start] != 0, ""))
        elif kind == PACKET_ID:
            packet_id = payload[start]
        elif kind == BUTTON:
            event = BUTTON_EVENTS.get(payload[start])
            if event is not None:
                out.append((name, event, ""))
        elif kind == DIMMER:
            event = DIMMER_EVENTS.get(payload[start])
            if event is not None:
                out.append((name, event, ""))
                out.append(("dimmer_steps", payload[start + 1], ""))
        elif kind == COMMAND:
            event = COMMAND_EVENTS.get(payload[start])
            if event is not None:
                out.append((name, event, ""))
            if end - start > 1:
                out.append(("remote_command_args", payload[start + 1 : end].hex(), ""))
        elif kind == TEXT:
            if size:
                try:
                    out.append((name, payload[start:end].decode("utf-8"), ""))
                except UnicodeDecodeError:
                    problem = AdvertError("invalid_value", "text object is not UTF-8", start)
        elif kind == RAW:
            if size:
                out.append((name, payload[start:end].hex(), ""))
        elif kind == TIME:
            stamp = datetime.fromtimestamp(from_bytes(payload[start:end], "little"), UTC)
            out.append((name, stamp.isoformat(), ""))
        elif kind == DEVICE_TYPE:
            out.append((name, from_bytes(payload[start:end], "little"), ""))
        else:  # FW4, FW3: least significant component first
            out.append((name, ".".join(str(b) for b in payload[end - 1 : start - 1 : -1]), ""))
    samples = _named(out)
    events: frozenset[str] = frozenset()
    if any(v[0] in EVENT_NAMES for v in out):
        events = frozenset(s.field for s in samples if _base(s.field) in EVENT_NAMES)
    return Decoded(samples, packet_id, problem=problem, events=events)


def _named(values: list[tuple[str, object, str]]) -> list[Sample]:
    """Samples; a name sent more than once becomes name_1, name_2, ... in order."""
    names = [v[0] for v in values]
    if len(set(names)) == len(names):
        return [Sample(name, value, unit) for name, value, unit in values]  # type: ignore[arg-type]
    counts = {name: names.count(name) for name in names}
    seen: dict[str, int] = {}
    out = []
    for name, value, unit in values:
        label = name
        if counts[name] > 1:
            seen[name] = seen.get(name, 0) + 1
            label = f"{name}_{seen[name]}"
        out.append(Sample(label, value, unit))  # type: ignore[arg-type]
    return out


def _base(name: str) -> str:
    """``button_2`` -> ``button``."""
    head, _, tail = name.rpartition("_")
    return head if tail.isdigit() and head else name


def encode(
    objects_: list[tuple[int, bytes]],
    *,
    packet_id: int | None = None,
    mac: bytes | None = None,
    trigger: bool = False,
) -> bytes:
    """Plain BTHome v2 service data from (object id, value bytes); what a sensor sends.
    For tests, tooling and the benchmark (objects are written in the order given)."""
    info = VERSION << 5 | (0x04 if trigger else 0) | (FLAG_MAC if mac else 0)
    body = b"" if packet_id is None else bytes([0x00, packet_id])
    for oid, value in objects_:
        body += bytes([oid]) + value
    return bytes([info]) + (mac[::-1] if mac else b"") + body


def encrypt(plain: bytes, mac: bytes, counter: int, key: bytes) -> bytes:
    """Seal plain BTHome service data (as from ``encode``) with a bindkey: sets the
    encryption flag and appends counter and MIC. ``mac`` is most significant first."""
    from drivers.parsers.ble.ccm import Cipher

    info = plain[0] | FLAG_ENCRYPTED
    start = 7 if plain[0] & FLAG_MAC else 1
    ctr = counter.to_bytes(4, "little")
    sealed = Cipher(key).seal(mac + NONCE_UUID + bytes([info]) + ctr, plain[start:], None)
    return bytes([info]) + plain[1:start] + sealed[:-4] + ctr + sealed[-4:]


PATTERNS: Final = (service_pattern(0xFCD2),)
