"""Fuzz target of the pipeline (registered in ``fuzz.targets.TARGETS``).

``landing_line``: the bytes are one landing line, as Spark's text reader hands it to
silver (UTF-8, undecodable bytes replaced), or, when the first byte is odd, the payload
of a well-formed landing record from a bridge, as they are or as the value, unit and
timestamp (NUL-separated) of the gateway's own payload shape: so the fuzzer spends its
time in the payload rules (the contract, the fast path, the reasons), which parse JSON in
C where coverage cannot guide it.
Invariants: the judge never raises; it makes one row of the right shape, a quarantined
row says why, an accepted one has its marks and timestamp; and Arrow takes the row
(text Arrow refuses would fail the whole Spark job).
"""

from __future__ import annotations

import json
from typing import Any, Final

import pyarrow as pa

from pipeline.config import PipelineConfig
from pipeline.transforms.judge import (
    FIELDS,
    HEALTH_REPORT,
    IGNORED,
    QUARANTINED,
    READING,
    Judge,
    arrow_judge,
)

CFG: Final = PipelineConfig()
JUDGE: Final = Judge(CFG)
ARROW: Final = arrow_judge(CFG)
KINDS: Final = {READING, HEALTH_REPORT, QUARANTINED, IGNORED}
TOPICS: Final = ("ledge/gw1/serial/env/temperature", "ledge/gw1/health", "ledge/gw1/status")


def line_of(data: bytes) -> str:
    """A landing line from the bytes: the first byte chooses how (see the module doc)."""
    if not data or data[0] % 2 == 0:
        return data[1:].decode("utf-8", "replace").replace("\n", " ")
    payload = data[1:].decode("utf-8", "surrogateescape")
    if data[0] % 4 == 3:  # the gateway's own shape, its three values from the bytes
        value, unit, stamp = [*payload.split("\x00", 2), "", ""][:3]
        payload = f'{{"value":{value},"unit":"{unit}","timestamp":"{stamp}"}}'
    record = {
        "topic": TOPICS[data[0] // 4 % len(TOPICS)],
        "payload": payload,
        "qos": 1,
        "retain": False,
        "gateway": "gw1",
        "seq": "7",
        "received": "2026-11-21T10:00:00.000000Z",
    }
    return json.dumps(record)  # (escapes the surrogates the undecodable bytes became)


def judged(text: str) -> dict[str, Any]:
    """The judge's row of one landing line, by field; AssertionError when it breaks an
    invariant (the tests' fuzz of the judge checks the same)."""
    row = JUDGE.line(text)
    if len(row) != len(FIELDS):
        raise AssertionError(f"{len(row)} fields")
    got = dict(zip(FIELDS, row, strict=True))
    if got["kind"] not in KINDS:
        raise AssertionError(f"kind {got['kind']!r}")
    if got["kind"] == QUARANTINED and not got["reason"]:
        raise AssertionError("quarantined without a reason")
    if got["kind"] in (READING, HEALTH_REPORT) and (
        got["reason"] is not None
        or got["timestamp"] is None
        or got["seq"] is None
        or got["bridge"] is None
    ):
        raise AssertionError(f"accepted without its marks or timestamp: {got}")
    return got


def fuzz_landing_line(data: bytes) -> int:
    text = line_of(data)
    judged(text)
    if len(ARROW(pa.array([text], pa.string()))) != 1:
        raise AssertionError("Arrow lost the row")
    return 1
