"""``[[ble]]`` devices and their GATT characteristics as plain data (``[bluetooth]``,
the adapter, is ``gateway.sensors.settings.BluetoothSettings``). Loaded only when BLE
devices are configured: a gateway without them does not carry these classes.

Each option is declared once here (``option``: default, bounds); ``gateway.app.config``
makes the pydantic models from these fields and adds the checks that need a validator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from gateway.broker.settings import DAY, option
from gateway.sensors.field_settings import FieldSettings

AdvertFormat = Literal[
    "auto", "bthome", "pvvx", "atc1441", "mibeacon", "ruuvi", "govee", "inkbird", "switchbot",
    "ibeacon", "eddystone",
]  # fmt: skip
#: Devices reached over a GATT connection instead of (only) by their adverts.
GattFormat = Literal["gatt", "lywsd03mmc"]
ADVERT_FORMATS: Final[tuple[str, ...]] = get_args(AdvertFormat)
GATT_FORMATS: Final[tuple[str, ...]] = get_args(GattFormat)
BEACON_FORMATS: Final = ("ibeacon", "eddystone")
#: The topic level under ``<prefix>/<gateway>/ble/<name>/`` that resets a device's
#: encryption counter (``ledge ble reset-counter``); the answer is on ``.../result``.
RESET_COUNTER: Final = "reset-counter"

#: How a value is laid out in a characteristic's bytes (``drivers.parsers.ble.gatt``).
ValueType = Literal[
    "uint8", "int8", "uint16", "int16", "uint16be", "int16be", "uint24", "int24",
    "uint32", "int32", "uint32be", "int32be", "float32", "float16", "bool", "utf8", "hex",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class GattFieldSettings:
    """One value inside a characteristic's bytes (``[[ble.characteristics.fields]]``)."""

    quantity: str = option(min_length=1)
    type: ValueType = option("uint8")
    start: int = option(0, ge=0, le=511)
    scale: float = option(1.0, allow_inf_nan=False)
    offset: float = option(0.0, allow_inf_nan=False)
    unit: str = option("")


@dataclass(frozen=True, slots=True)
class GattCharacteristicSettings:
    """``[[ble.characteristics]]``: a characteristic to read or subscribe to."""

    #: 128-bit, or a 16-bit SIG UUID as 4 hex digits (the validator writes it in full).
    uuid: str = option()
    fields: tuple[GattFieldSettings, ...] = option(min_length=1)
    #: "read" (read every poll) or "notify" (subscribe; values arrive on their own).
    mode: Literal["read", "notify"] = option("read")


@dataclass(frozen=True, slots=True)
class BleDeviceSettings:
    """One ``[[ble]]`` device."""

    name: str = option(min_length=1)
    address: str | None = option(None)
    #: A beacon's identity instead of an address (iBeacon ``uuid/major/minor``,
    #: Eddystone ``namespace/instance``).
    beacon: str | None = option(None)
    format: AdvertFormat | GattFormat = option("auto")
    bindkey: str | None = option(None)
    fields: dict[str, FieldSettings] = option(factory=dict)
    only_mapped: bool = option(False)
    #: None: ``[bluetooth]``'s.
    min_interval: float | None = option(None, ge=0, le=DAY)
    heartbeat: float | None = option(None, ge=0, le=DAY)
    away_after: float | None = option(None, gt=0, le=DAY)
    #: None: true for beacons.
    presence: bool | None = option(None)
    rssi: bool = option(True)
    # GATT devices
    characteristics: tuple[GattCharacteristicSettings, ...] = option(())
    poll_interval: float = option(300.0, gt=0, le=DAY)
    keep_connected: bool = option(False)
    command_uuid: str | None = option(None)
    command_response: bool = option(True)

    @property
    def gatt(self) -> bool:
        return bool(self.characteristics) or self.command_uuid is not None

    @property
    def beacon_like(self) -> bool:
        """A beacon: presence is what it reports."""
        return self.format in BEACON_FORMATS or self.beacon is not None


#: Stock-firmware Xiaomi LYWSD03MMC (and MHO-C401): values only over GATT, as a
#: notification of 5 bytes: temperature int16 LE x 0.01 °C, humidity %, battery mV.
LYWSD03MMC: Final = (
    GattCharacteristicSettings(
        uuid="ebe0ccc1-7a0a-4b0c-8a1a-6ff2997da3a6",
        mode="notify",
        fields=(
            GattFieldSettings("temperature", "int16", 0, 0.01, 0.0, "°C"),
            GattFieldSettings("humidity", "uint8", 2, 1.0, 0.0, "%"),
            GattFieldSettings("voltage", "uint16", 3, 0.001, 0.0, "V"),
        ),
    ),
)

#: Presets by name: ``format = "lywsd03mmc"`` in ``[[ble]]``.
GATT_PRESETS: Final = {"lywsd03mmc": LYWSD03MMC}
