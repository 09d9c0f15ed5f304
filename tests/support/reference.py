"""The reference BLE decoders from PyPI (installed for tests only: the ble-reference
extra), behind one function per format that returns ``{name: value}`` in Ledge's
names, so tests and the benchmark can put both side by side.

Each reference keeps per-device state (duplicates, counters), so every call uses a
fresh parser object: the comparison is of decoding, not of history.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData

Values = dict[str, Any]

#: Names bthome-ble gives (its key, without a _N postfix) -> Ledge's.
BTHOME_NAMES = {
    "pm25": "pm25",
    "pm10": "pm10",
    "volatile_organic_compounds": "tvoc",
    "carbon_dioxide": "co2",
    "dew_point": "dew_point",
    "uv_index": "uv_index",
    "volume_flow_rate": "volume_flow_rate",
    "gyroscope": "gyroscope",
    "command": "remote_command",
}
BTHOME_BINARY_NAMES = {
    "power": "power_on",
    "battery": "battery_low",
    "gas": "gas_detected",
    "moisture": "moisture_detected",
    "presence": "presence_detected",
}


def service_info(
    address: str,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    name: str = "",
) -> Any:
    from habluetooth import BluetoothServiceInfoBleak

    return BluetoothServiceInfoBleak(
        name or address,
        address,
        -60,
        dict(manufacturer_data),
        dict(service_data),
        list(service_data),
        "local",
        BLEDevice(address, name or None, None),
        None,
        True,
        time.monotonic(),
        None,
    )


def _values(update: Any, names: Mapping[str, str] | None = None) -> Values:
    out: Values = {}
    for key, value in update.entity_values.items():
        name = str(key.key)
        if name in ("signal_strength",):
            continue
        out[(names or {}).get(name, name)] = value.native_value
    binaries = getattr(update, "binary_entity_values", {})
    for key, value in binaries.items():
        name = str(key.key)
        base, _, n = name.rpartition("_")
        if n.isdigit() and base:
            name = f"{BTHOME_BINARY_NAMES.get(base, base)}_{n}"
        else:
            name = BTHOME_BINARY_NAMES.get(name, name)
        out[name] = value.native_value
    return out


def bthome(
    address: str,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    name: str,
    key: bytes | None,
) -> Values:
    from bthome_ble import BTHomeBluetoothDeviceData

    update = BTHomeBluetoothDeviceData(key).update(
        service_info(address, service_data, manufacturer_data, name)
    )
    out = {}
    values = _values(update)
    values.pop("packet_id", None)  # Ledge's decoders hand it over separately
    for label_in, v in values.items():
        base, _, n = label_in.rpartition("_")
        label = (
            f"{BTHOME_NAMES.get(base, base)}_{n}"
            if n.isdigit() and base
            else BTHOME_NAMES.get(label_in, label_in)
        )
        out[label] = v.isoformat() if isinstance(v, datetime) else v
    for key_, event in update.events.items():
        out[BTHOME_NAMES.get(str(key_.key), str(key_.key))] = event.event_type
        if event.event_properties and "steps" in event.event_properties:
            steps = str(key_.key).replace("dimmer", "dimmer_steps", 1)
            out[steps] = event.event_properties["steps"]
    return out


def mibeacon(
    address: str,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    name: str,
    key: bytes | None,
) -> Values:
    from xiaomi_ble import XiaomiBluetoothDeviceData

    update = XiaomiBluetoothDeviceData(key).update(
        service_info(address, service_data, manufacturer_data, name)
    )
    values = _values(update, {"illuminance": "illuminance"})
    values.pop("voltage", None)  # derived from the battery percentage, not sent
    return values


def ruuvi(
    address: str,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    name: str,
    key: bytes | None,
) -> Values:
    from ruuvitag_ble import RuuvitagBluetoothDeviceData

    update = RuuvitagBluetoothDeviceData().update(
        service_info(address, service_data, manufacturer_data, name)
    )
    values = _values(update)
    if values.get("voltage") is not None:
        values["voltage"] = values["voltage"] / 1000  # mV there, V here
    values.pop("acceleration_total", None)
    if values.get("movement_counter") == 0xFF:
        # dataformat_05.md: 255 is "invalid"; ruuvitag-ble reports it as a count
        values.pop("movement_counter")
    return {k: v for k, v in values.items() if v is not None}


def _known_values(
    parser: Any,
    address: str,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    name: str,
) -> Values:
    """What a sensor-state-data parser (govee-ble, inkbird-ble) reads from one advert."""
    update = parser().update(service_info(address, service_data, manufacturer_data, name))
    return {k: v for k, v in _values(update).items() if v is not None}


def govee(
    address: str,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    name: str,
    key: bytes | None,
) -> Values:
    from govee_ble import GoveeBluetoothDeviceData

    return _known_values(GoveeBluetoothDeviceData, address, service_data, manufacturer_data, name)


def inkbird(
    address: str,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    name: str,
    key: bytes | None,
) -> Values:
    from inkbird_ble import INKBIRDBluetoothDeviceData

    return _known_values(INKBIRDBluetoothDeviceData, address, service_data, manufacturer_data, name)


def switchbot(
    address: str,
    service_data: Mapping[str, bytes],
    manufacturer_data: Mapping[int, bytes],
    name: str,
    key: bytes | None,
) -> Values:
    from switchbot.adv_parser import parse_advertisement_data

    adv = AdvertisementData(
        name or None, dict(manufacturer_data), dict(service_data), list(service_data), None, -60, ()
    )
    parsed = parse_advertisement_data(BLEDevice(address, name or None, None), adv)
    if parsed is None:
        return {}
    data = parsed.data["data"]
    return {k: data[k] for k in ("temperature", "humidity", "battery") if data.get(k) is not None}


REFERENCES: dict[str, Callable[..., Values]] = {
    "bthome": bthome,
    "mibeacon": mibeacon,
    "ruuvi": ruuvi,
    "govee": govee,
    "inkbird": inkbird,
    "switchbot": switchbot,
}
