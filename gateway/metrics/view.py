"""The metrics view: values in, Prometheus text and the status document out. Pure.

Components describe what they already count as ``Sample`` values (a ``MetricSource``
gives them on demand) and, optionally, what a person wants to see of them as a
``StatusPart`` (a ``StatusSource``). This module turns them into

- the Prometheus text exposition format 0.0.4 (``exposition``): ``# HELP`` and
  ``# TYPE`` once per family, label values escaped, families in the order first seen;
- the status document behind ``/api/status``, the status page and ``ledge status``
  (``status_document``), with the warnings derived from the values.

No asyncio, no sockets, no clock: time arrives inside the values.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

Kind = Literal["counter", "gauge"]
Labels = tuple[tuple[str, str], ...]

#: Prometheus data model: metric and label names.
_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

#: Warnings: the store or the disk under ``data_dir`` is this close to full.
STORE_WARN_SHARE: Final = 0.8
DISK_WARN_BYTES: Final = 64 * 1024 * 1024
#: A bridge outbox this full (by bytes or messages) is worth a warning.
OUTBOX_WARN_SHARE: Final = 0.8
#: Drop reasons (metric label values) in words; others are shown with spaces.
DROP_REASONS: Final = {
    "offline_qos0": "QoS 0 for an offline session",
    "qos0_offline": "QoS 0 while the link is down",
    "too_large": "too large for the client",
    "outbox_full": "outbox full",
    "rejected": "rejected by the remote",
    "loop": "came back around a loop",
    "echo": "echo of what was sent",
}
#: Status documents list at most this many sensor devices and warnings (the rest are
#: counted), and text values are cut to ``MAX_TEXT`` characters.
MAX_DEVICES: Final = 100
MAX_WARNINGS: Final = 20
MAX_TEXT: Final = 80


class MetricError(ValueError):
    """A source produced something the exposition format cannot carry (a bug)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one metric family. Counters are named with their ``_total``."""

    name: str
    kind: Kind
    help: str
    value: float
    labels: Labels = ()


def counter(name: str, help: str, value: float, /, **labels: str) -> Sample:
    """A monotonic count (its name ends in ``_total``, Prometheus convention)."""
    if not name.endswith("_total"):
        raise MetricError(f"counter {name!r} must end in _total")
    return Sample(name, "counter", help, value, tuple(labels.items()))


def gauge(name: str, help: str, value: float, /, **labels: str) -> Sample:
    """A value that goes up and down."""
    return Sample(name, "gauge", help, value, tuple(labels.items()))


class MetricSource(Protocol):
    """A part of the gateway that counts things: it hands over its current values."""

    def samples(self) -> Iterable[Sample]: ...


# ----------------------------------------------------------------------------- exposition


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value as the text format writes it (``+Inf``, ``NaN``, integers bare)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def exposition(samples: Iterable[Sample]) -> str:
    """The Prometheus text format (version 0.0.4) of ``samples``.

    Samples of one family are written together (however the sources interleave them),
    families in the order first seen. A family must keep one type and one help text, and
    one label set appears once per family: a violation is a ``MetricError``.
    """
    families: dict[str, list[Sample]] = {}
    for sample in samples:
        family = families.get(sample.name)
        if family is None:
            if not _METRIC_NAME.match(sample.name):
                raise MetricError(f"invalid metric name {sample.name!r}")
            families[sample.name] = [sample]
            continue
        first = family[0]
        if sample.kind != first.kind or sample.help != first.help:
            raise MetricError(f"{sample.name}: two sources disagree on its type or help")
        family.append(sample)
    out: list[str] = []
    for name, family in families.items():
        first = family[0]
        out.append(f"# HELP {name} {_escape_help(first.help)}")
        out.append(f"# TYPE {name} {first.kind}")
        seen: set[Labels] = set()
        for sample in family:
            key = tuple(sorted(sample.labels))
            if key in seen:
                raise MetricError(f"{name}: label set {dict(key)} given twice")
            seen.add(key)
            if sample.labels:
                parts = []
                for label, value in sample.labels:
                    if not _LABEL_NAME.match(label) or label.startswith("__"):
                        raise MetricError(f"{name}: invalid label name {label!r}")
                    parts.append(f'{label}="{_escape_label(value)}"')
                out.append(f"{name}{{{','.join(parts)}}} {format_value(sample.value)}")
            else:
                out.append(f"{name} {format_value(sample.value)}")
    return "\n".join(out) + "\n" if out else ""


# ----------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class ValueStatus:
    """The last value of one quantity of a device, and its recent history (oldest first)."""

    quantity: str
    value: float | bool | str
    unit: str = ""
    history: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """A sensor device as a person sees it."""

    driver: str
    name: str
    online: bool
    #: Wall-clock time (Unix seconds) of its last reading, None: no reading yet.
    last_seen: float | None = None
    values: tuple[ValueStatus, ...] = ()
    #: Its state in words ("" : connected or disconnected, by ``online``): a BLE
    #: device that advertises is "present" or "away", for instance.
    state: str = ""
    #: Its state is what it reports (a beacon): being away is news, not a fault.
    presence: bool = False

    @property
    def state_words(self) -> str:
        return self.state or ("connected" if self.online else "disconnected")


@dataclass(frozen=True, slots=True)
class BridgeStatus:
    name: str
    state: str
    address: str = ""
    last_error: str = ""
    #: Wall-clock times (Unix seconds): of the last error, and of the last change
    #: between connected and not (the outage began, or the link came up).
    last_error_at: float | None = None
    since: float | None = None
    queued: int = 0
    bytes: int = 0
    max_messages: int = 0
    max_bytes: int = 0
    oldest_age: float = 0.0
    sent: int = 0
    acknowledged: int = 0
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class ListenerStatus:
    name: str
    type: str
    address: str


@dataclass(frozen=True, slots=True)
class StatusPart:
    """What one component adds to the status page: devices, bridges, warnings."""

    devices: tuple[DeviceStatus, ...] = ()
    bridges: tuple[BridgeStatus, ...] = ()
    warnings: tuple[str, ...] = ()


class StatusSource(Protocol):
    """A part of the gateway with something to show on the status page."""

    def status(self) -> StatusPart: ...


@dataclass(frozen=True, slots=True)
class Rates:
    """Messages per second in and out, now and over the recent past (oldest first)."""

    received: float = 0.0
    sent: float = 0.0
    received_history: tuple[float, ...] = ()
    sent_history: tuple[float, ...] = ()


def message_rates(points: Sequence[tuple[float, float, float]]) -> Rates:
    """Rates from ``(time, received total, sent total)`` points taken at intervals
    (oldest first): one rate per interval; "now" is the last interval's."""
    received: list[float] = []
    sent: list[float] = []
    for (t0, r0, s0), (t1, r1, s1) in itertools.pairwise(points):
        elapsed = t1 - t0
        if elapsed <= 0:
            continue
        received.append(max(0.0, (r1 - r0) / elapsed))
        sent.append(max(0.0, (s1 - s0) / elapsed))
    if not received:
        return Rates()
    return Rates(received[-1], sent[-1], tuple(received), tuple(sent))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the status document is made of, collected at one moment."""

    gateway: str
    version: str
    #: Unix seconds when collected, and seconds since the gateway started.
    wall_time: float
    uptime: float
    listeners: tuple[ListenerStatus, ...] = ()
    samples: tuple[Sample, ...] = ()
    parts: tuple[StatusPart, ...] = ()
    rates: Rates = field(default_factory=Rates)


class Values:
    """Look up samples by family name and labels."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self.by_name: dict[str, list[Sample]] = {}
        for sample in samples:
            self.by_name.setdefault(sample.name, []).append(sample)

    def get(self, name: str, default: float = 0.0, **labels: str) -> float:
        for sample in self.by_name.get(name, ()):
            if all(dict(sample.labels).get(k) == v for k, v in labels.items()):
                return sample.value
        return default

    def has(self, name: str) -> bool:
        return name in self.by_name

    def total(self, name: str) -> float:
        return sum(s.value for s in self.by_name.get(name, ()))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Sum of a family's values per value of ``label``."""
        out: dict[str, float] = {}
        for sample in self.by_name.get(name, ()):
            key = dict(sample.labels).get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + sample.value
        return out


def _int(value: float) -> int:
    return int(value) if math.isfinite(value) else 0


def status_document(snap: Snapshot) -> dict[str, Any]:
    """The status as plain JSON-able data (``/api/status``); bounded whatever the load:
    clients are counted per listener and protocol, devices capped at ``MAX_DEVICES``."""
    v = Values(snap.samples)
    clients: dict[str, dict[str, int]] = {}
    for sample in v.by_name.get("ledge_clients_connected", ()):
        labels = dict(sample.labels)
        per = clients.setdefault(labels.get("listener", ""), {})
        per[labels.get("protocol", "")] = _int(sample.value)
    listeners = [
        {
            "name": lst.name,
            "type": lst.type,
            "address": lst.address,
            "clients": clients.get(lst.name, {}),
        }
        for lst in snap.listeners
    ]
    drops: dict[str, int] = {}
    for name, family in v.by_name.items():
        if not name.endswith("_dropped_total"):
            continue
        what = name.removeprefix("ledge_").removesuffix("_dropped_total")
        what = "" if what == "messages" else what.removesuffix("_messages").replace("_", " ")
        for sample in family:
            labels = dict(sample.labels)
            where = " ".join(p for p in (what, labels.get("bridge") or labels.get("driver")) if p)
            label = labels.get("reason", "")
            reason = DROP_REASONS.get(label) or label.replace("_", " ")
            key = f"{where}: {reason}" if where and reason else where or reason
            drops[key] = drops.get(key, 0) + _int(sample.value)
    bridges = [b for part in snap.parts for b in part.bridges]
    devices = [d for part in snap.parts for d in part.devices]
    store: dict[str, Any] | None = None
    if v.has("ledge_store_size_bytes"):
        store = {
            "size_bytes": _int(v.get("ledge_store_size_bytes")),
            "limit_bytes": _int(v.get("ledge_store_limit_bytes")),
            "free_disk_bytes": _int(v.get("ledge_data_dir_free_bytes")),
            "full": bool(v.get("ledge_store_full")),
        }
    return {
        "gateway": snap.gateway,
        "version": snap.version,
        "time": round(snap.wall_time, 3),
        "uptime_seconds": round(snap.uptime, 1),
        "clients": {
            "connected": _int(v.total("ledge_clients_connected")),
            "maximum": _int(v.get("ledge_clients_maximum")),
            "sessions": _int(v.total("ledge_sessions")),
            "slow": _int(v.get("ledge_clients_slow")),
        },
        "listeners": listeners,
        "messages": {
            "received_per_second": round(snap.rates.received, 2),
            "sent_per_second": round(snap.rates.sent, 2),
            "received_history": [round(x, 2) for x in snap.rates.received_history],
            "sent_history": [round(x, 2) for x in snap.rates.sent_history],
            "received": _int(v.get("ledge_messages_received_total")),
            "sent": _int(v.get("ledge_messages_sent_total")),
        },
        "drops": drops,
        "subscriptions": _int(v.get("ledge_subscriptions")),
        "retained": _int(v.get("ledge_retained_messages")),
        "store": store,
        "process": {
            "rss_bytes": _int(v.get("process_resident_memory_bytes")),
            "cpu_seconds": round(v.get("process_cpu_seconds_total"), 2),
            "open_fds": _int(v.get("process_open_fds")),
        },
        "bridges": [_bridge(b) for b in bridges],
        "devices": [_device(d) for d in devices[:MAX_DEVICES]],
        "devices_not_shown": max(0, len(devices) - MAX_DEVICES),
        "warnings": warnings(snap, v, bridges, devices),
    }


def _bridge(b: BridgeStatus) -> dict[str, Any]:
    return {
        "name": b.name,
        "state": b.state,
        "address": b.address,
        "last_error": b.last_error,
        "last_error_at": None if b.last_error_at is None else round(b.last_error_at, 3),
        "since": None if b.since is None else round(b.since, 3),
        "outbox_messages": b.queued,
        "outbox_bytes": b.bytes,
        "oldest_age_seconds": round(b.oldest_age, 1),
        "sent": b.sent,
        "acknowledged": b.acknowledged,
        "dropped": b.dropped,
    }


def _device(d: DeviceStatus) -> dict[str, Any]:
    return {
        "driver": d.driver,
        "name": d.name,
        "online": d.online,
        "state": d.state_words,
        "presence": d.presence,
        "last_seen": None if d.last_seen is None else round(d.last_seen, 3),
        "values": [
            {
                "quantity": value.quantity,
                "value": value.value[:MAX_TEXT] if isinstance(value.value, str) else value.value,
                "unit": value.unit,
                "history": [round(x, 6) for x in value.history],
            }
            for value in d.values
        ],
    }


def warnings(
    snap: Snapshot, v: Values, bridges: list[BridgeStatus], devices: list[DeviceStatus]
) -> list[str]:
    """What needs a person's attention, derived from the values (no history needed)."""
    out: list[str] = []
    if v.get("ledge_store_full"):
        out.append("store full: QoS 1/2 messages for persistent sessions are being refused")
    size, limit = v.get("ledge_store_size_bytes"), v.get("ledge_store_limit_bytes")
    if limit and size >= STORE_WARN_SHARE * limit:
        out.append(f"store near full: {_mib(size)} of {_mib(limit)} (store.max_bytes)")
    if v.has("ledge_data_dir_free_bytes"):
        free = v.get("ledge_data_dir_free_bytes")
        if free < DISK_WARN_BYTES:
            out.append(f"disk near full: {_mib(free)} free under data_dir")
    slow = _int(v.get("ledge_clients_slow"))
    if slow:
        out.append(f"{slow} slow consumer(s): QoS 0 messages to them are being dropped")
    for b in bridges:
        if b.state != "connected":
            why = f" ({b.last_error})" if b.last_error else ""
            down = "" if b.since is None else f", down for {duration(snap.wall_time - b.since)}"
            out.append(f"bridge {b.name} {b.state}{why}{down}: {b.queued} message(s) waiting")
        if (b.max_bytes and b.bytes >= OUTBOX_WARN_SHARE * b.max_bytes) or (
            b.max_messages and b.queued >= OUTBOX_WARN_SHARE * b.max_messages
        ):
            out.append(f"bridge {b.name}: outbox near full ({b.queued} messages, {_mib(b.bytes)})")
    for d in devices:
        if not d.online and not d.presence:
            out.append(f"{d.driver} device {d.name} is {d.state_words}")
    for part in snap.parts:
        out.extend(part.warnings)
    if len(out) > MAX_WARNINGS:
        out[MAX_WARNINGS - 1 :] = [f"and {len(out) - MAX_WARNINGS + 1} more warnings"]
    return out


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: "42 s", "5 min 3 s", "2 h 10 min", "3 d 4 h"."""
    s = max(0, math.floor(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _mib(value: float) -> str:
    return f"{value / 1048576:.1f} MiB"


def gateway_state(doc: dict[str, Any], window: int) -> dict[str, Any]:
    """The gateway's health for Home Assistant (one retained JSON message) from a
    status document: message rates averaged over the last ``window`` intervals."""

    def mean(values: list[float]) -> float:
        recent = values[-window:]
        return round(sum(recent) / len(recent), 2) if recent else 0.0

    messages = doc["messages"]
    state: dict[str, Any] = {
        "clients": doc["clients"]["connected"],
        "messages_in": mean(messages["received_history"]),
        "messages_out": mean(messages["sent_history"]),
        "dropped": sum(doc["drops"].values()),
        "rss_mib": round(doc["process"]["rss_bytes"] / 1048576, 1),
        "uptime": int(doc["uptime_seconds"]),
        "bridges": {
            b["name"]: {
                "connected": b["state"] == "connected",
                "outbox": b["outbox_messages"],
                "oldest_age": b["oldest_age_seconds"],
            }
            for b in doc["bridges"]
        },
    }
    if doc["store"] is not None:
        state["free_disk_mib"] = round(doc["store"]["free_disk_bytes"] / 1048576, 1)
    return state
