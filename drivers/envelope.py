"""Upstream marks: what the cloud bridge adds to every message it sends upstream.

Consumers deduplicate redeliveries exactly by the gateway's id and a per-gateway
sequence number that only grows (also across restarts). MQTT 5 remotes get them as
user properties; for MQTT 3.1.1 remotes, which have none, the payload can travel in
a JSON envelope. Standard library only: the gateway imports this without pydantic.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Final

#: MQTT 5 user property holding the gateway id.
GATEWAY_PROPERTY: Final = "ledge-gateway"
#: MQTT 5 user property holding the sequence number (decimal text).
SEQUENCE_PROPERTY: Final = "ledge-seq"

#: Every envelope starts with these bytes (a cheap test before parsing).
ENVELOPE_START: Final = b'{"gateway":'


def envelope(gateway: str, seq: int, payload: bytes) -> bytes:
    """The JSON envelope for remotes without user properties (MQTT 3.1.1).

    ``{"gateway": "gw1", "seq": 42, "payload": <the payload as JSON>}``; a payload that
    is not JSON travels as ``"payload_base64"`` instead."""
    head = f'{{"gateway":{json.dumps(gateway)},"seq":{int(seq)},'
    try:
        json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return (head + f'"payload_base64":"{base64.b64encode(payload).decode()}"}}').encode()
    return head.encode() + b'"payload":' + payload.strip() + b"}"


def open_envelope(data: bytes) -> tuple[str, int, bytes]:
    """``(gateway, seq, payload)`` from an envelope; ValueError naming what is wrong."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"envelope is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("envelope is not a JSON object")
    gateway, seq = body.get("gateway"), body.get("seq")
    if not isinstance(gateway, str) or not isinstance(seq, int) or isinstance(seq, bool):
        raise ValueError("envelope lacks a gateway (text) or seq (integer)")
    return gateway, seq, envelope_payload(body)


def envelope_payload(body: dict[str, Any]) -> bytes:
    """The payload a parsed envelope carries; ValueError naming what is wrong (a
    ``UnicodeEncodeError`` when its ``payload`` holds text no UTF-8 can carry)."""
    if "payload" in body:
        return json.dumps(body["payload"], separators=(",", ":"), ensure_ascii=False).encode()
    if isinstance(body.get("payload_base64"), str):
        try:
            return base64.b64decode(body["payload_base64"], validate=True)
        except ValueError as exc:
            raise ValueError(f"envelope payload_base64: {exc}") from None
    raise ValueError("envelope has neither payload nor payload_base64")
