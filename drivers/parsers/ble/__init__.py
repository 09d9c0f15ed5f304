"""BLE advertisement decoders: one module per format, all pure and table-driven.

``FORMATS`` names every format Ledge reads; ``recognise`` tells which one an advert
speaks; ``decode_advert`` decodes every element of an advert a format reads. The
gateway keeps per-device state (duplicates, replayed counters, decryption failures)
in ``drivers.ble.tracker``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from drivers.parsers.ble import (
    beacons,
    bthome,
    govee,
    inkbird,
    mibeacon,
    pvvx,
    ruuvi,
    switchbot,
)
from drivers.parsers.ble.base import (
    AdvertError,
    Context,
    Decoded,
    Format,
    Source,
    short_uuid,
    uuid16,
)

FORMATS: Final[dict[str, Format]] = {
    f.name: f
    for f in (
        Format(
            "bthome",
            "BTHome v2",
            (Source("service", bthome.UUID, bthome.decode, lambda d, c: bool(d)),),
            encrypted=True,
            patterns=bthome.PATTERNS,
        ),
        Format(
            "pvvx",
            "pvvx custom (Xiaomi thermometers)",
            (Source("service", pvvx.UUID, pvvx.decode_pvvx, pvvx.accepts_pvvx),),
            patterns=pvvx.PATTERNS,
        ),
        Format(
            "atc1441",
            "ATC1441 custom (Xiaomi thermometers)",
            (Source("service", pvvx.UUID, pvvx.decode_atc, pvvx.accepts_atc),),
            patterns=pvvx.PATTERNS,
        ),
        Format(
            "mibeacon",
            "Xiaomi MiBeacon",
            (Source("service", mibeacon.UUID, mibeacon.decode, lambda d, c: len(d) >= 5),),
            encrypted=True,
            patterns=mibeacon.PATTERNS,
        ),
        Format(
            "ruuvi",
            "RuuviTag data format 5",
            (Source("company", ruuvi.COMPANY_ID, ruuvi.decode, ruuvi.accepts),),
            patterns=ruuvi.PATTERNS,
        ),
        Format(
            "govee",
            "Govee H5072/H5074/H5075/H5179 class",
            tuple(Source("company", c, govee.decode, govee.accepts) for c in govee.COMPANY_IDS),
            active_scan=True,
            patterns=govee.PATTERNS,
        ),
        Format(
            "inkbird",
            "Inkbird IBS-TH/IBS-TH2/IBT",
            (Source("any_company", -1, inkbird.decode, inkbird.accepts),),
            patterns=inkbird.PATTERNS,
        ),
        Format(
            "switchbot",
            "SwitchBot Meter/Meter Plus/Outdoor Meter",
            (
                *(
                    Source("service", u, switchbot.decode, switchbot.accepts)
                    for u in switchbot.UUIDS
                ),
                Source("company", switchbot.COMPANY_ID, switchbot.decode_company),
            ),
            patterns=switchbot.PATTERNS,
        ),
        Format(
            "ibeacon",
            "iBeacon",
            (
                Source(
                    "company",
                    beacons.APPLE,
                    beacons.decode_ibeacon,
                    beacons.accepts_ibeacon,
                ),
            ),
            beacon=True,
            patterns=beacons.IBEACON_PATTERNS,
        ),
        Format(
            "eddystone",
            "Eddystone",
            (
                Source(
                    "service",
                    beacons.EDDYSTONE_UUID,
                    beacons.decode_eddystone,
                    lambda d, c: bool(d),
                ),
            ),
            beacon=True,
            patterns=beacons.EDDYSTONE_PATTERNS,
        ),
    )
}

_BY_SERVICE: dict[str, list[tuple[Format, Source]]] = {}
_BY_COMPANY: dict[int, list[tuple[Format, Source]]] = {}
_ANY_COMPANY: list[tuple[Format, Source]] = []
for _f in FORMATS.values():
    for _s in _f.sources:
        if _s.kind == "service":
            _BY_SERVICE.setdefault(str(_s.key), []).append((_f, _s))
        elif _s.kind == "company":
            _BY_COMPANY.setdefault(int(_s.key), []).append((_f, _s))
        else:
            _ANY_COMPANY.append((_f, _s))


def recognise(
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    ctx: Context,
) -> Format | None:
    """The format an advert speaks, from the first element that identifies one."""
    for uuid, data in service_data.items():
        for fmt, source in _BY_SERVICE.get(uuid, ()):
            if source.accepts is not None and source.accepts(data, ctx):
                return fmt
    for company, data in manufacturer_data.items():
        ctx.company_id = company
        for fmt, source in _BY_COMPANY.get(company, ()):
            if source.accepts is not None and source.accepts(data, ctx):
                return fmt
        for fmt, source in _ANY_COMPANY:
            if source.accepts is not None and source.accepts(data, ctx):
                return fmt
    return None


def elements(
    fmt: Format,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
) -> Iterator[tuple[Source, int, bytes]]:
    """The (source, company id, bytes) of an advert that ``fmt`` reads."""
    for source in fmt.sources:
        if source.kind == "service":
            data = service_data.get(str(source.key))
            if data is not None:
                yield source, 0, data
        elif source.kind == "company":
            data = manufacturer_data.get(int(source.key))
            if data is not None:
                yield source, int(source.key), data
        else:
            for company, data in manufacturer_data.items():
                yield source, company, data


def decode_advert(
    fmt: Format,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    ctx: Context,
) -> list[Decoded | AdvertError]:
    """Every element of an advert ``fmt`` reads, decoded (stateless: no duplicate or
    replay checks; ``ledge ble scan`` and tests use it)."""
    out: list[Decoded | AdvertError] = []
    for source, company, data in elements(fmt, service_data, manufacturer_data):
        ctx.company_id = company
        try:
            out.append(source.decode(data, ctx))
        except AdvertError as exc:
            out.append(exc)
    return out


def passive_patterns(formats: list[Format]) -> list[tuple[int, int, bytes]]:
    """BlueZ or_patterns matching every advert of ``formats`` (each pattern once)."""
    seen: list[tuple[int, int, bytes]] = []
    for fmt in formats:
        for pattern in fmt.patterns:
            if pattern not in seen:
                seen.append(pattern)
    return seen


__all__ = [
    "FORMATS",
    "AdvertError",
    "Context",
    "Decoded",
    "Format",
    "Source",
    "decode_advert",
    "elements",
    "passive_patterns",
    "recognise",
    "short_uuid",
    "uuid16",
]
