"""``ledge ble scan``: what is advertising nearby, which decoder reads it, and what it
says -- the command to run before writing ``[[ble]]`` devices into the config."""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivers.parsers.ble import Format
    from drivers.parsers.ble.base import Context
    from drivers.parsers.ble.ccm import Cipher

# The decoders are imported by the command only: ``ledge run`` builds this parser too.


@dataclass
class Seen:
    address: str
    name: str = ""
    rssi: int = -127
    adverts: int = 0
    service_data: dict[str, bytes] = field(default_factory=dict)
    manufacturer_data: dict[int, bytes] = field(default_factory=dict)


def add_parser(sub: Any) -> None:
    """``scan`` among the subcommands ``sub`` of ``ledge ble``."""
    scan = sub.add_parser(
        "scan",
        help="list nearby BLE devices and what Ledge decodes from them",
        description="Scan (actively: names and scan responses included) and list every "
        "device heard with its address, name, RSSI, the decoder that recognised it and the "
        "values decoded. With --toml, print [[ble]] tables for the recognised devices.",
    )
    scan.add_argument(
        "--seconds", type=float, default=10.0, metavar="N", help="how long to scan (default 10)"
    )
    scan.add_argument(
        "--adapter", default="hci0", metavar="hciX", help="adapter to scan with (default hci0)"
    )
    scan.add_argument(
        "--bindkey",
        action="append",
        default=[],
        metavar="ADDRESS=KEY",
        help="decrypt this device's adverts with KEY (32 hex digits); repeatable",
    )
    scan.add_argument("--all", action="store_true", help="also list devices no decoder recognises")
    scan.add_argument("--toml", action="store_true", help="print [[ble]] tables instead of a table")


def run(args: argparse.Namespace) -> int:
    from drivers.parsers.ble import recognise
    from drivers.parsers.ble.base import Context
    from drivers.parsers.ble.ccm import Cipher, parse_key

    keys: dict[str, bytes] = {}
    for item in args.bindkey:
        address, sep, key = item.partition("=")
        try:
            if not sep:
                raise ValueError("expected ADDRESS=KEY")
            keys[address.strip().upper()] = parse_key(key)
        except ValueError as exc:
            print(f"ledge ble scan: --bindkey {item!r}: {exc}", file=sys.stderr)
            return 2
    try:
        seen = asyncio.run(scan(args.adapter, args.seconds))
    except Exception as exc:  # bleak raises several kinds when BlueZ is missing
        print(f"ledge ble scan: cannot scan with {args.adapter}: {exc}", file=sys.stderr)
        return 1
    ciphers: dict[str, Cipher] = {address: Cipher(key) for address, key in keys.items()}
    rows = []
    for dev in sorted(seen.values(), key=lambda d: -d.rssi):
        ctx = Context(dev.address, name=dev.name, cipher=ciphers.get(dev.address))
        fmt = recognise(dev.service_data, dev.manufacturer_data, ctx)
        if fmt is None and not args.all:
            continue
        rows.append((dev, fmt, describe(fmt, dev, ctx)))
    if args.toml:
        print(toml(rows, keys))
    else:
        print(table(rows, args.seconds))
    return 0


async def scan(adapter: str, seconds: float) -> dict[str, Seen]:
    from bleak import BleakScanner
    from bleak.backends.device import BLEDevice
    from bleak.backends.scanner import AdvertisementData

    seen: dict[str, Seen] = {}

    def on_advert(device: BLEDevice, adv: AdvertisementData) -> None:
        entry = seen.setdefault(device.address.upper(), Seen(device.address.upper()))
        entry.name = adv.local_name or entry.name
        entry.rssi = adv.rssi
        entry.adverts += 1
        entry.service_data = dict(adv.service_data)
        entry.manufacturer_data = dict(adv.manufacturer_data)

    async with BleakScanner(on_advert, scanning_mode="active", bluez={"adapter": adapter}):
        await asyncio.sleep(seconds)
    return seen


def describe(fmt: Format | None, dev: Seen, ctx: Context) -> str:
    from drivers.parsers.ble import decode_advert
    from drivers.parsers.ble.base import AdvertError, Decoded, short_uuid

    if fmt is None:
        parts = [f"svc {short_uuid(u)}={d.hex()}" for u, d in dev.service_data.items()]
        parts += [f"mfr 0x{c:04x}={d.hex()}" for c, d in dev.manufacturer_data.items()]
        return " ".join(parts) or "-"
    out = []
    for result in decode_advert(fmt, dev.service_data, dev.manufacturer_data, ctx):
        if isinstance(result, AdvertError):
            out.append(f"({result.reason}: {result})")
            continue
        out += [
            f"{s.field}={s.value}{s.unit if s.unit in ('%', '°C') else ''}" for s in result.samples
        ]
        if isinstance(result, Decoded) and result.identity and fmt.beacon:
            out.append(f"beacon={result.identity}")
    return " ".join(out) or "-"


def table(rows: list[tuple[Seen, Format | None, str]], seconds: float) -> str:
    lines = [f"{'ADDRESS':<17}  {'NAME':<16}  {'RSSI':>4}  {'FORMAT':<10}  VALUES"]
    for dev, fmt, values in rows:
        lines.append(
            f"{dev.address:<17}  {dev.name[:16]:<16}  {dev.rssi:>4}  "
            f"{fmt.name if fmt else '?':<10}  {values}"
        )
    lines.append(f"{len(rows)} device(s) in {seconds:g} s")
    return "\n".join(lines)


def toml(rows: list[tuple[Seen, Format | None, str]], keys: dict[str, bytes]) -> str:
    """``[[ble]]`` tables for the recognised devices; a device given a key with
    ``--bindkey`` gets it as its ``bindkey`` (pasted as is, the config decrypts it)."""
    out = []
    for dev, fmt, values in rows:
        if fmt is None:
            continue
        name = (dev.name or fmt.name).lower()
        name = "".join(c if c.isalnum() else "_" for c in name).strip("_") or "device"
        name = f"{name}_{dev.address[-5:].replace(':', '').lower()}"
        out.append(f"# {values}")
        out.append("[[ble]]")
        out.append(f'name = "{name}"')
        if fmt.beacon and "beacon=" in values:
            identity = values.split("beacon=", 1)[1].split()[0]
            out.append(f'beacon = "{identity}"')
        else:
            out.append(f'address = "{dev.address}"')
        out.append(f'format = "{fmt.name}"')
        key = keys.get(dev.address)
        if fmt.encrypted and key is not None:
            if "wrong_key" in values or "decrypt_retry" in values:
                out.append("# the key given with --bindkey does not decrypt these adverts")
            out.append(f'bindkey = "{key.hex()}"')
        elif fmt.encrypted and "no_key" in values:
            out.append('bindkey = "..."  # the device encrypts: its 32-digit key')
        out.append("")
    return "\n".join(out)


__all__ = ["add_parser", "run"]
