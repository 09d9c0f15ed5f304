"""The sensor hub's tables as plain data: ``[readings]``, ``[homeassistant]``,
``[[serial]]`` and ``[bluetooth]`` (the adapter and the defaults of ``[[ble]]`` devices,
which are ``gateway.sensors.ble_settings``), and ``SensorSettings``, what the hub is
handed (``RuntimeConfig.sensors`` gathers it from those tables and ``[gateway]``).

Each option is declared once here (``option``: default, bounds); ``gateway.app.config``
makes the pydantic models from these fields and adds the checks that need a validator,
and ``gateway.app.runtime.RuntimeConfig`` holds them as the file's tables. Plain data, so
the driver glue reads its settings without importing the composition root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gateway.broker.settings import DAY, INT31, MAX_SLOTS, option
from gateway.sensors.field_settings import FieldSettings

if TYPE_CHECKING:
    from gateway.sensors.ble_settings import BleDeviceSettings


@dataclass(frozen=True, slots=True)
class ReadingsSettings:
    topic_prefix: str = option("ledge", min_length=1)
    payload: Literal["json", "value"] = option("json")
    qos: int = option(0, ge=0, le=2)
    retain: bool = option(False)


@dataclass(frozen=True, slots=True)
class HomeAssistantSettings:
    enabled: bool = option(False)
    discovery_prefix: str = option("homeassistant", min_length=1)


@dataclass(frozen=True, slots=True)
class SerialSettings:
    name: str = option(min_length=1)
    path: str = option(min_length=1)
    protocol: Literal["nmea", "jsonl", "kv"] = option("jsonl")
    baudrate: int = option(9600, gt=0, le=INT31)
    bytesize: Literal[5, 6, 7, 8] = option(8)
    parity: Literal["none", "even", "odd", "mark", "space"] = option("none")
    stopbits: float = option(1)
    max_line: int = option(1024, ge=16, le=1_048_576)
    fields: dict[str, FieldSettings] = option(factory=dict)
    only_mapped: bool = option(False)
    commands: bool = option(False)
    command_newline: str = option("\n")
    #: Seconds within which a reading is expected (``ledge health`` names the device
    #: when none came for longer); 0: the port being open is enough. Only ``ledge
    #: health`` reads it.
    heard_within: float = option(0.0, reload=True, ge=0, le=DAY)


@dataclass(frozen=True, slots=True)
class BluetoothSettings:
    """``[bluetooth]``: the adapter, its scanner, the watchdog, GATT connections, and
    the defaults of ``[[ble]]`` devices (``gateway.sensors.ble_settings``)."""

    adapter: str = option("hci0", pattern=r"^hci[0-9]+$")
    scanning: Literal["auto", "passive", "active"] = option("auto")
    watchdog: float = option(60.0, ge=0, le=DAY)
    watchdog_backoff_max: float = option(300.0, gt=0, le=DAY)
    queue_size: int = option(1000, ge=1, le=INT31)
    max_devices: int = option(256, ge=1, le=MAX_SLOTS)
    any_bthome: bool = option(False)
    allow: tuple[str, ...] = option(())
    gatt_concurrency: int = option(1, ge=1, le=8)
    gatt_timeout: float = option(20.0, gt=0, le=DAY)
    reconnect_min: float = option(1.0, gt=0, le=DAY)
    reconnect_max: float = option(300.0, gt=0, le=DAY)
    min_interval: float = option(10.0, ge=0, le=DAY)
    heartbeat: float = option(300.0, ge=0, le=DAY)
    away_after: float = option(300.0, gt=0, le=DAY)
    #: Seconds between writes of the encryption counters to data_dir (while they
    #: change; and at shutdown). 0: within a second of each change.
    counter_save_interval: float = option(10.0, ge=0, le=3600)


@dataclass(frozen=True, slots=True)
class SensorSettings:
    """What the sensor hub needs, gathered from ``[gateway]``, ``[readings]``,
    ``[[serial]]``, ``[homeassistant]``, ``[bluetooth]`` and ``[[ble]]``
    (``RuntimeConfig.sensors``)."""

    gateway: str
    prefix: str
    plain_payload: bool
    qos: int
    retain: bool
    serial: tuple[SerialSettings, ...]
    homeassistant: bool
    discovery_prefix: str
    bluetooth: BluetoothSettings
    ble: tuple[BleDeviceSettings, ...]
    #: ``data_dir``: where state that must survive a restart lives (None: nowhere).
    data_dir: str | None = None

    @property
    def uses_ble(self) -> bool:
        """BLE devices are configured (or adopted as they are heard)."""
        return bool(self.ble) or self.bluetooth.any_bthome
