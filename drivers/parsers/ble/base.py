"""What every advertisement decoder shares: its input context, its output, its errors. Pure.

A decoder takes the bytes of one advertisement element (a service data value or a
manufacturer data value) and the ``Context`` of the device that sent it, and returns
``Decoded`` samples, or raises ``AdvertError`` naming a reason and the byte offset
where the element went wrong.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from drivers.parsers import Sample
from drivers.parsers.ble.ccm import Cipher

#: Bluetooth SIG base UUID: a 16-bit UUID xxxx is 0000xxxx-0000-1000-8000-00805f9b34fb.
BASE_UUID_SUFFIX: Final = "-0000-1000-8000-00805f9b34fb"


def uuid16(short: int) -> str:
    """The full, lower-case 128-bit form of a 16-bit SIG UUID (as BlueZ and bleak write it)."""
    return f"0000{short:04x}{BASE_UUID_SUFFIX}"


@functools.lru_cache(maxsize=512)
def short_uuid(uuid: str) -> str:
    """``0x181a`` for SIG-based UUIDs, else the UUID itself (for display)."""
    uuid = uuid.lower()
    if uuid.startswith("0000") and uuid.endswith(BASE_UUID_SUFFIX):
        return "0x" + uuid[4:8]
    return uuid


class AdvertError(ValueError):
    """An advertisement element that cannot be read.

    ``reason`` is a short stable code counted per device (``short``, ``malformed``,
    ``unknown_object``, ``no_key``, ``wrong_key``, ``replay``, ``unsupported``,
    ``invalid_value``); ``offset`` is the byte where reading stopped.
    """

    def __init__(self, reason: str, detail: str, offset: int = 0) -> None:
        super().__init__(f"{detail} (byte {offset})")
        self.reason = reason
        self.detail = detail
        self.offset = offset


def mac_bytes(address: str) -> bytes:
    """``AA:BB:CC:DD:EE:FF`` -> 6 bytes, most significant first (as sensors put them in
    nonces); ValueError for anything else."""
    raw = bytes.fromhex(address.replace(":", "").replace("-", ""))
    if len(raw) != 6:
        raise ValueError(f"{address!r} is not a Bluetooth address")
    return raw


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02X}" for b in raw)


@dataclass(slots=True)
class Context:
    """What a decoder may know about the sender besides the bytes: its address, the
    name it advertises, the company id of a manufacturer element, its bindkey."""

    address: str
    mac: bytes = b""
    name: str = ""
    company_id: int = 0
    cipher: Cipher | None = None

    def __post_init__(self) -> None:
        if not self.mac:
            self.mac = mac_bytes(self.address)


@dataclass(slots=True)
class Decoded:
    """The samples one advertisement element carried.

    ``packet_id`` identifies a transmission (BTHome packet id, MiBeacon frame counter,
    Ruuvi measurement sequence, pvvx counter) so repeats of one packet count once;
    ``counter`` is an encryption counter that must grow (replay protection);
    ``identity`` names a beacon independently of its address (iBeacon
    ``uuid/major/minor``, Eddystone ``namespace/instance``) or the address a payload
    carries; ``problem`` says why decoding stopped early (the samples before it are
    good).
    """

    samples: list[Sample]
    packet_id: int | None = None
    counter: int | None = None
    identity: str | None = None
    events: frozenset[str] = frozenset()
    problem: AdvertError | None = None


#: A decoder: element bytes and sender -> samples (or AdvertError).
Decode = Callable[[bytes, Context], Decoded]
#: A cheap check that an element of the right key really is this format.
Accepts = Callable[[bytes, Context], bool]


@dataclass(frozen=True, slots=True)
class Source:
    """One advert element a format reads: service data of a UUID, manufacturer data of a
    company id, or (Inkbird) manufacturer data of any company id. With ``accepts`` the
    element alone identifies the format; without, it is read only from devices already
    known to speak the format."""

    kind: str  # "service", "company" or "any_company"
    key: str | int
    decode: Decode
    accepts: Accepts | None = None


@dataclass(frozen=True, slots=True)
class Format:
    """One advertisement format: where in an advert it lives and how to read it."""

    name: str
    title: str
    sources: tuple[Source, ...]
    #: Takes a bindkey.
    encrypted: bool = False
    #: Sent in scan responses: needs active scanning.
    active_scan: bool = False
    #: A presence beacon rather than a sensor.
    beacon: bool = False
    #: Patterns for BlueZ's passive scanning (AdvertisementMonitor or_patterns):
    #: (start position, AD type, bytes).
    patterns: tuple[tuple[int, int, bytes], ...] = ()


#: AD types used in passive-scanning patterns (Bluetooth Core Supplement, Part A, 1).
AD_COMPLETE_LOCAL_NAME: Final = 0x09
AD_SERVICE_DATA_16: Final = 0x16
AD_MANUFACTURER_DATA: Final = 0xFF


def service_pattern(short: int) -> tuple[int, int, bytes]:
    return (0, AD_SERVICE_DATA_16, short.to_bytes(2, "little"))


def company_pattern(company_id: int) -> tuple[int, int, bytes]:
    return (0, AD_MANUFACTURER_DATA, company_id.to_bytes(2, "little"))


def precision(factor: float) -> int:
    """Decimal places of a scale factor as written in a spec (0.01 -> 2, 0.35 -> 1)."""
    return -int(f"{factor:e}".split("e")[-1])
