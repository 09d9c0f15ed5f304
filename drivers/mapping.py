"""From parser samples to ``Reading`` values: names, units and scaling per device. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from pydantic import ValidationError

from drivers.model import Reading
from drivers.parsers import Sample


@dataclass(frozen=True, slots=True)
class FieldMap:
    """How one field a device reports becomes a quantity."""

    quantity: str
    unit: str | None = None  # None: the unit the parser gives, if any
    scale: float = 1.0
    offset: float = 0.0


class FieldRule(Protocol):
    """What a mapping says about one field: a ``FieldMap``, or the gateway's
    ``fields`` settings of a device, which have the same shape."""

    @property
    def quantity(self) -> str: ...
    @property
    def unit(self) -> str | None: ...
    @property
    def scale(self) -> float: ...
    @property
    def offset(self) -> float: ...


@dataclass(frozen=True, slots=True)
class DeviceMap:
    device: str
    driver: str = "serial"
    fields: Mapping[str, FieldRule] = field(default_factory=dict)
    #: Only report the fields listed in ``fields`` (otherwise every field, named as sent).
    only_mapped: bool = False

    def readings(self, samples: Iterable[Sample], now: datetime) -> tuple[list[Reading], list[str]]:
        """The readings, and a problem text per sample that could not become one."""
        out: list[Reading] = []
        problems: list[str] = []
        for sample in samples:
            mapped = self.fields.get(sample.field)
            if mapped is None and self.only_mapped:
                continue
            quantity = mapped.quantity if mapped else sample.field
            unit = sample.unit
            value = sample.value
            if mapped is not None:
                if mapped.unit is not None:
                    unit = mapped.unit
                scaled = mapped.scale != 1.0 or mapped.offset
                if scaled and isinstance(value, int | float) and not isinstance(value, bool):
                    value = value * mapped.scale + mapped.offset
            try:
                out.append(
                    Reading(
                        device=self.device,
                        quantity=quantity,
                        value=value,
                        unit=unit,
                        timestamp=now,
                        driver=self.driver,
                    )
                )
            except ValidationError as exc:
                first = exc.errors()[0]
                problems.append(f"field {sample.field!r}: {first['msg']}")
        return out, problems
