"""BLE settings as plain data: what ``gateway.config`` validates from ``[bluetooth]`` and
``[[ble]]`` and the gateway process receives (as JSON). Field mappings are the serial
devices' ``FieldMap``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Final

from drivers.mapping import FieldMap


@dataclass(frozen=True, slots=True)
class GattField:
    """One value inside a characteristic's bytes."""

    quantity: str
    type: str = "uint8"
    start: int = 0
    scale: float = 1.0
    offset: float = 0.0
    unit: str = ""


@dataclass(frozen=True, slots=True)
class GattCharacteristic:
    uuid: str
    #: "read" (read every poll) or "notify" (subscribe; values arrive on their own).
    mode: str = "read"
    fields: tuple[GattField, ...] = ()


@dataclass(frozen=True, slots=True)
class BleDevice:
    name: str
    address: str = ""
    #: A beacon's identity instead of an address (iBeacon ``uuid/major/minor``,
    #: Eddystone ``namespace/instance``).
    beacon: str = ""
    format: str = "auto"
    bindkey: str | None = None
    fields: dict[str, FieldMap] = field(default_factory=dict)
    only_mapped: bool = False
    min_interval: float = 10.0
    heartbeat: float = 300.0
    away_after: float = 300.0
    presence: bool = False
    rssi: bool = True
    # GATT devices
    characteristics: tuple[GattCharacteristic, ...] = ()
    poll_interval: float = 300.0
    keep_connected: bool = False
    command_uuid: str | None = None
    command_response: bool = True

    @property
    def gatt(self) -> bool:
        return bool(self.characteristics) or self.command_uuid is not None


@dataclass(frozen=True, slots=True)
class BleSettings:
    adapter: str = "hci0"
    scanning: str = "auto"
    watchdog: float = 60.0
    watchdog_backoff_max: float = 300.0
    queue_size: int = 1000
    max_devices: int = 256
    any_bthome: bool = False
    allow: tuple[str, ...] = ()
    gatt_concurrency: int = 1
    gatt_timeout: float = 20.0
    reconnect_min: float = 1.0
    reconnect_max: float = 300.0
    #: Defaults for devices found with ``any_bthome``.
    min_interval: float = 10.0
    heartbeat: float = 300.0
    away_after: float = 300.0
    devices: tuple[BleDevice, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BleSettings:
        """Back from ``dataclasses.asdict`` (the JSON the gateway process receives)."""
        devices = tuple(_device(d) for d in data.get("devices", ()))
        known = {f.name for f in fields(cls)} - {"devices", "allow"}
        return cls(
            **{k: v for k, v in data.items() if k in known},
            allow=tuple(data.get("allow", ())),
            devices=devices,
        )


def _device(data: dict[str, Any]) -> BleDevice:
    chars = tuple(
        GattCharacteristic(
            c["uuid"], c.get("mode", "read"), tuple(GattField(**f) for f in c.get("fields", ()))
        )
        for c in data.get("characteristics", ())
    )
    mapping = {k: FieldMap(**v) for k, v in data.get("fields", {}).items()}
    rest = {k: v for k, v in data.items() if k not in ("characteristics", "fields")}
    return BleDevice(**rest, fields=mapping, characteristics=chars)


#: Stock-firmware Xiaomi LYWSD03MMC (and MHO-C401): values only over GATT, as a
#: notification of 5 bytes: temperature int16 LE x 0.01 °C, humidity %, battery mV.
LYWSD03MMC: Final = (
    GattCharacteristic(
        "ebe0ccc1-7a0a-4b0c-8a1a-6ff2997da3a6",
        "notify",
        (
            GattField("temperature", "int16", 0, 0.01, 0.0, "°C"),
            GattField("humidity", "uint8", 2, 1.0, 0.0, "%"),
            GattField("voltage", "uint16", 3, 0.001, 0.0, "V"),
        ),
    ),
)

#: Presets by name: ``format = "lywsd03mmc"`` in ``[[ble]]``.
GATT_PRESETS: Final = {"lywsd03mmc": LYWSD03MMC}
