"""The ``fields`` tables of ``[[serial]]`` and ``[[ble]]`` devices: how a field a device
reports becomes a quantity. A module of its own so that the BLE settings (loaded only
when BLE is configured) and the runtime config both use it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.broker.settings import option


@dataclass(frozen=True, slots=True)
class FieldSettings:
    quantity: str = option(min_length=1)
    unit: str | None = option(None)
    scale: float = option(1.0, allow_inf_nan=False)
    offset: float = option(0.0, allow_inf_nan=False)
