"""One landing line per received message: the format the lander writes and silver reads.

    {"topic": "ledge/gw1/serial/env/temperature",
     "payload": "{\"value\":21.5,...}",          # or "payload_base64" when not UTF-8
     "qos": 1, "retain": false,
     "gateway": "gw1", "seq": "42",               # the bridge's MQTT 5 user properties
     "received": "2026-11-21T10:00:00.123456Z"}   # the lander's receive time, UTC

``gateway`` and ``seq`` are absent when the message had no such properties (an MQTT 3.1.1
bridge wraps the payload in an envelope instead, which silver opens). The lander records
what arrived and judges nothing; silver decides what is valid.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any


def received_text(received: datetime) -> str:
    """``2026-11-21T10:00:00.123456Z``: UTC with microseconds, always the same length."""
    return received.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def landing_record(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    gateway: str | None,
    seq: str | None,
    received: datetime,
) -> dict[str, Any]:
    record: dict[str, Any] = {"topic": topic}
    try:
        record["payload"] = payload.decode("utf-8")
    except UnicodeDecodeError:
        record["payload_base64"] = base64.b64encode(payload).decode("ascii")
    record["qos"] = qos
    record["retain"] = retain
    if gateway is not None:
        record["gateway"] = gateway
    if seq is not None:
        record["seq"] = seq
    record["received"] = received_text(received)
    return record


def landing_line(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    gateway: str | None,
    seq: str | None,
    received: datetime,
) -> str:
    """The record as one JSON line (with its newline)."""
    record = landing_record(topic, payload, qos, retain, gateway, seq, received)
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
