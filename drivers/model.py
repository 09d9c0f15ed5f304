"""The one contract between sensors, the gateway and the pipeline: ``Reading``.

Every driver turns what a device says into ``Reading`` values; the gateway maps
each to a topic and a payload with ``reading_topic`` / ``reading_payload``; the
pipeline reads them back with ``reading_from_message``. The topic scheme:

    <prefix>/<gateway>/<driver>/<device>/<quantity>      e.g. ledge/gw1/serial/gps/latitude

and the payload, by default JSON::

    {"value": 47.2851, "unit": "deg", "timestamp": "2026-11-21T10:00:00.123456+00:00"}

or, with plain payloads, just the value as text (``47.2851``).
"""

from __future__ import annotations

import functools
import json
import math
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# The cloud bridge's upstream marks (drivers.envelope, which the gateway imports
# without pydantic), re-exported: the pipeline reads everything from this module.
from drivers.envelope import (
    GATEWAY_PROPERTY,
    SEQUENCE_PROPERTY,
    envelope,
    envelope_payload,
    open_envelope,
)

#: Characters a topic level built from a name may not contain.
_FORBIDDEN = frozenset("/+#\x00")

Scalar = float | int | str | bool
Name = Annotated[str, Field(min_length=1, max_length=128)]


@functools.lru_cache(maxsize=1024)  # names repeat: check each once (errors are not cached)
def _check_name(value: str) -> str:
    bad = _FORBIDDEN.intersection(value)
    if bad:
        raise ValueError(
            f"{value!r} contains {''.join(sorted(bad))!r}, not allowed in a topic level"
        )
    if value.startswith("$"):
        raise ValueError(f"{value!r} starts with '$', which topic levels here may not")
    return value


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp must carry a time zone (use UTC)")
    return value.astimezone(UTC)


class Reading(BaseModel):
    """One value of one quantity measured by one device at one time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Name
    quantity: Name
    value: Scalar
    unit: str = ""
    timestamp: datetime
    driver: Name = "sensor"
    metadata: dict[str, Scalar] = Field(default_factory=dict)

    @field_validator("device", "quantity", "driver")
    @classmethod
    def _topic_safe(cls, value: str) -> str:
        return _check_name(value)

    @field_validator("timestamp")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return _utc(value)

    @field_validator("value")
    @classmethod
    def _finite(cls, value: Scalar) -> Scalar:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("value must be finite")
        return value


DEFAULT_PREFIX: Final = "ledge"

#: Spark / JSON field names and types of a reading as the pipeline stores it.
FIELDS: Final[dict[str, str]] = {
    "gateway": "string",
    "driver": "string",
    "device": "string",
    "quantity": "string",
    "value": "double",
    "text": "string",
    "unit": "string",
    "timestamp": "timestamp",
}


def reading_topic(reading: Reading, gateway: str, prefix: str = DEFAULT_PREFIX) -> str:
    """``<prefix>/<gateway>/<driver>/<device>/<quantity>``."""
    return f"{prefix}/{_check_name(gateway)}/{reading.driver}/{reading.device}/{reading.quantity}"


def reading_payload(reading: Reading, plain: bool = False) -> bytes:
    """JSON ``{"value", "unit", "timestamp"[, "metadata"]}``, or the bare value as text."""
    value = reading.value
    if plain:
        if isinstance(value, bool):
            return b"true" if value else b"false"
        return str(value).encode()
    if reading.metadata:
        body: dict[str, Any] = {
            "value": value,
            "unit": reading.unit,
            "timestamp": reading.timestamp.isoformat(),
            "metadata": reading.metadata,
        }
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    # The common case, written out: the same bytes json.dumps gives, a third of the time.
    if value is True:
        text = "true"
    elif value is False:
        text = "false"
    elif isinstance(value, str):
        text = _json_string(value)
    else:  # int or finite float: repr is JSON (the model refuses inf and nan)
        text = repr(value)
    return (
        f'{{"value":{text},"unit":{_json_string(reading.unit)},'
        f'"timestamp":"{_isoformat(reading.timestamp)}"}}'
    ).encode()


_json_string = functools.lru_cache(maxsize=256)(functools.partial(json.dumps, ensure_ascii=False))


def _isoformat(stamp: datetime) -> str:
    # Readings from one burst of lines share their timestamp: format it once.
    return _utc_isoformat(stamp) if stamp.tzinfo is UTC else stamp.isoformat()


@functools.lru_cache(maxsize=8)
def _utc_isoformat(stamp: datetime) -> str:
    return stamp.isoformat()


def reading_from_message(
    topic: str, payload: bytes, prefix: str = DEFAULT_PREFIX
) -> tuple[str, Reading]:
    """``(gateway, reading)`` back from a topic and a JSON payload made by this module.

    Raises ValueError naming what is wrong (the pipeline quarantines such rows)."""
    levels = topic.split("/")
    if len(levels) != 5 or levels[0] != prefix:
        raise ValueError(f"topic {topic!r} is not {prefix}/<gateway>/<driver>/<device>/<quantity>")
    _, gateway, driver, device, quantity = levels
    try:
        body = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"payload is not JSON: {exc}") from None
    if not isinstance(body, dict) or "value" not in body or "timestamp" not in body:
        raise ValueError("payload lacks value or timestamp")
    reading = Reading(
        device=device,
        quantity=quantity,
        driver=driver,
        value=body["value"],
        unit=body.get("unit", ""),
        timestamp=datetime.fromisoformat(body["timestamp"]),
        metadata=body.get("metadata", {}),
    )
    return gateway, reading


def now_utc() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------- gateway health
# Every gateway publishes <prefix>/<gateway>/health periodically (mirrored upstream
# like any topic): what it dropped since its previous health message, and more.


class Health(BaseModel):
    """One health report of one gateway."""

    model_config = ConfigDict(frozen=True, extra="allow")

    timestamp: datetime
    #: Messages dropped since the previous report, for any reason (queue bounds, slow
    #: consumers, a full outbox...). Summing these over a span gives its drops.
    dropped: int = Field(ge=0)
    #: Messages waiting in the cloud bridges' outboxes.
    queued: int = Field(0, ge=0)
    uptime: float = Field(0.0, ge=0)

    @field_validator("timestamp")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return _utc(value)


def health_topic(gateway: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}/{_check_name(gateway)}/health"


def health_payload(health: Health) -> bytes:
    return health.model_dump_json().encode()


def health_from_message(
    topic: str, payload: bytes, prefix: str = DEFAULT_PREFIX
) -> tuple[str, Health]:
    """``(gateway, health)``; ValueError naming what is wrong."""
    levels = topic.split("/")
    if len(levels) != 3 or levels[0] != prefix or levels[2] != "health":
        raise ValueError(f"topic {topic!r} is not {prefix}/<gateway>/health")
    try:
        return levels[1], Health.model_validate_json(payload)
    except ValidationError as exc:
        raise ValueError(f"health payload: {exc.errors()[0]['msg']}") from None


__all__ = [
    "DEFAULT_PREFIX",
    "FIELDS",
    "GATEWAY_PROPERTY",
    "SEQUENCE_PROPERTY",
    "Health",
    "Reading",
    "envelope",
    "envelope_payload",
    "health_from_message",
    "health_payload",
    "health_topic",
    "now_utc",
    "open_envelope",
    "reading_from_message",
    "reading_payload",
    "reading_topic",
]
