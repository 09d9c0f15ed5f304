"""Silver's payload rule against the contract: ``drivers.model.reading_from_message`` and
silver run on the same generated payloads and must agree on every one (accepted or not;
if accepted, the same value, text, unit, timestamp and metadata).

Hypothesis draws whole batches (one Spark job judges a batch): JSON bodies of every
shape, written in every JSON style, then damaged (trailing text of every kind, cut,
prefixed), timestamps from CPython 3.11's ``fromisoformat`` grammar and its quirks, and
arbitrary text. Also through an MQTT 3.1.1 bridge's envelope (``open_envelope``).

What silver refuses beyond the contract (see ``pipeline.transforms.judge``) is part of
the oracle and checked on its own too: integers beyond a double, text values and units
holding a lone surrogate (Parquet stores UTF-8).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from drivers.model import envelope, open_envelope, reading_from_message
from pipeline.config import PipelineConfig
from pipeline.transforms import silver
from pipeline.transforms.judge import storable
from tests.test_pipeline_transforms import frame, line

CFG = PipelineConfig(horizon_days=10**7)  # every timestamp in reach: the payload rule alone
TOPIC = "ledge/gw1/serial/env/temperature"
RECEIVED = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# ---------------------------------------------------------------------------- strategies


def two(lo: int = 0, hi: int = 99) -> st.SearchStrategy[str]:
    return st.integers(lo, hi).map(lambda v: f"{v:02d}")


@st.composite
def iso_text(draw: st.DrawFn) -> str:
    """Timestamp text from the grammar CPython 3.11 reads, values in and out of range."""
    year = draw(st.sampled_from(["2026", "2024", "0001", "9999", "0000", "1999", "2020"]))
    ext = draw(st.booleans())
    dash = "-" if ext else ""
    if draw(st.integers(0, 4)) == 0:  # ISO week date
        week = draw(two(0, 54))
        wd = draw(st.sampled_from(["", "1", "6", "7", "0", "8"]))
        date = f"{year}{dash}W{week}" + (f"{dash}{wd}" if wd else "")
    else:
        month = draw(st.one_of(two(1, 12), two(0, 13)))
        day = draw(st.one_of(two(1, 28), two(28, 32), two(0, 0)))
        date = f"{year}{dash}{month}{dash}{day}"
    if draw(st.integers(0, 9)) == 0:
        return date  # a date alone: naive
    sep = draw(st.sampled_from(["T", "T", " ", "x", "é", "1", "-", "\n", "😀"]))
    t_ext = draw(st.booleans())
    colon = ":" if t_ext else ""
    parts = [draw(st.one_of(two(0, 23), two(20, 25)))]
    for _ in range(draw(st.integers(0, 2))):
        parts.append(draw(st.one_of(two(0, 59), two(55, 61))))
    time = colon.join(parts)
    if draw(st.booleans()):
        time += draw(st.sampled_from([".", ",", ":"])) + draw(
            st.text("0123456789", min_size=0, max_size=9)
        )
    if draw(st.integers(0, 5)) == 0:
        time += draw(st.sampled_from(["a", " ", ":", "0", "."]))
    zone = draw(
        st.one_of(
            st.just(""),
            st.just("Z"),
            st.builds(
                lambda sign, h, m, s, f, sepc: (
                    sign + h + (sepc + m if m else "") + ((sepc + s) if m and s else "") + f
                ),
                st.sampled_from(["+", "-"]),
                st.one_of(two(0, 23), two(23, 25)),
                st.one_of(st.just(""), two(0, 59), two(59, 99)),
                st.one_of(st.just(""), two(0, 59)),
                st.sampled_from(["", ".5", ",123456", ".1234567", "."]),
                st.sampled_from([":", ""]),
            ),
            st.sampled_from(["+5", "+050", "+05:3", "Z+01", "z", "+05:00 ", "+05:30Z"]),
        )
    )
    return f"{date}{sep}{time}{zone}"


def aware_iso() -> st.SearchStrategy[str]:
    zones = st.integers(-24 * 60 + 1, 24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))
    return st.builds(
        lambda d, tz: d.replace(tzinfo=tz).isoformat(),
        st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
        zones,
    )


timestamps = st.one_of(
    aware_iso(),
    iso_text(),
    st.just("2026-11-21T10:00:00+00:00"),
    st.text(max_size=12).filter(lambda t: "\x00" not in t),
)
scalars: st.SearchStrategy[Any] = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.text(max_size=8),
)
values = st.one_of(
    scalars,
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "true", "1", ""]),
)
metadata = st.one_of(
    st.dictionaries(st.text(max_size=4), scalars, max_size=3),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.one_of(st.none(), st.lists(st.integers())), max_size=2),
    st.integers(),
)
# Keys of a reading body, plus others the contract ignores.
KEYS = ("value", "unit", "timestamp", "metadata", "extra", "Value")


@st.composite
def body(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        out["value"] = draw(values)
    if draw(st.booleans()):
        out["unit"] = draw(st.one_of(st.text(max_size=4), st.none(), st.integers()))
    if draw(st.integers(0, 9)):
        out["timestamp"] = draw(st.one_of(timestamps, st.integers(), st.none()))
    if draw(st.integers(0, 3)) == 0:
        out["metadata"] = draw(metadata)
    if draw(st.integers(0, 5)) == 0:
        out[draw(st.sampled_from(KEYS[4:]))] = draw(
            st.one_of(scalars, st.lists(st.lists(st.integers()), max_size=2))
        )
    keys = draw(st.permutations(list(out)))
    return {k: out[k] for k in keys}


def dumps(value: Any, style: int) -> str:
    if style == 0:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if style == 1:
        return json.dumps(value, ensure_ascii=True)
    return json.dumps(value, indent=style - 1)


#: Trailing text of every shape: what json.loads refuses after a complete value.
TRAILING = [
    "}", "]", "}}", "]]", "}]", "]}", "*07", " x", ",", ', "a": 1', ", 1]", ",}", "{}", "[]",
    "null", "0", "1", "5", '"s"', "\n", " \t\r\n", "\n}", " ]", "} ", "//c", "/*c*/", "#", ";",
    "\x00", "\ufeff", "NaN", ".5", "e5", "\u00a0", "x}", "]x}", "}]x", ', "b": 2}',
]  # fmt: skip


@st.composite
def payload_text(draw: st.DrawFn) -> str:
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.text(max_size=20))
    text = dumps(draw(body()), draw(st.integers(0, 3)))
    if choice <= 3:
        text += draw(st.one_of(st.sampled_from(TRAILING), st.text(max_size=4)))
    elif choice == 4:
        text = text[: draw(st.integers(0, max(0, len(text) - 1)))]
    elif choice == 5:
        text = draw(st.sampled_from(["\ufeff", " ", "\n", "\ufeff\ufeff", "x", "]", "\t"])) + text
    elif choice == 6 and '"value"' in text:  # a duplicate key, the later one wins
        text = text.replace('"value"', '"value": 1, "value"', 1)
    elif choice == 7:  # Python's and Spark's non-numbers
        token = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "+Infinity", "INF", "-NaN"]))
        text = text.replace("1.5", token).replace('"NaN"', token)
    return text


#: Number tokens, valid JSON and not, for payloads of the gateway's own shape.
NUMBERS = st.one_of(
    st.from_regex(r"\A-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,4})?\Z"),
    st.sampled_from(["1e400", "-1e400", "1e-400", "1" + "0" * 400, "-0", "0.0", "01", "1.", ".5"]),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "+1", "1e", "0x10", "\u0661"]),
)


@st.composite
def canonical_text(draw: st.DrawFn) -> str:
    """The shape ``drivers.model.reading_payload`` writes, with every kind of value,
    unit and timestamp text in it (silver judges this shape on a fast path)."""
    value = draw(
        st.one_of(
            NUMBERS,
            st.sampled_from(["true", "false", "null", "[1]", "{}"]),
            st.text(max_size=6).map(lambda t: json.dumps(t, ensure_ascii=False)),
        )
    )
    unit = json.dumps(draw(st.text(max_size=4)), ensure_ascii=draw(st.booleans()))
    stamp = json.dumps(draw(timestamps), ensure_ascii=draw(st.booleans()))
    return f'{{"value":{value},"unit":{unit},"timestamp":{stamp}}}'


# ----------------------------------------------------------------------------- the oracle


def contract(topic: str, payload: bytes) -> dict[str, Any] | None:
    """What silver must store for this message, or None when the contract refuses it."""
    try:
        _, reading = reading_from_message(topic, payload)
    except Exception:
        return None
    value = reading.value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1.7e308:
        return None  # stored values are doubles: silver quarantines it as not finite
    if not storable(reading.unit) or (isinstance(value, str) and not storable(value)):
        return None  # a lone surrogate: Parquet stores UTF-8
    return {
        "value": None if isinstance(value, str) else float(value),
        "text": ("true" if value else "false") if isinstance(value, bool) else (
            value if isinstance(value, str) else None
        ),
        "unit": reading.unit,
        "timestamp": (reading.timestamp - EPOCH) // timedelta(microseconds=1),
        "metadata": reading.metadata,
    }  # fmt: skip


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


Case = tuple[bytes, bool]  # a payload, and whether it travels in an envelope


def wanted(case: Case, seq: int) -> dict[str, Any] | None:
    payload, wrap = case
    if not wrap:
        return contract(TOPIC, payload)
    try:
        _, _, inner = open_envelope(envelope("gw1", seq, payload))
    except ValueError:
        return None
    return contract(TOPIC, inner)


def disagreements(got: dict[int, dict[str, Any]], cases: dict[int, Case]) -> list[str]:
    """What silver stored for each case against what the contract makes of it."""
    wrong = []
    for seq, case in cases.items():
        want, row = wanted(case, seq), got.get(seq)
        # no row under its sequence number: an envelope that is not JSON, refused unmarked
        accepted = row is not None and row["kind"] == "reading"
        if want is None:
            if accepted:
                wrong.append(f"{case}: contract refuses, silver accepted")
            continue
        if row is None or not accepted:
            wrong.append(f"{case}: contract accepts, silver: {row and row['reason']}")
            continue
        stored = {
            "value": row["value"],
            "text": row["text"],
            "unit": row["unit"],
            "timestamp": row["timestamp"],
            "metadata": json.loads(row["metadata"]) if row["metadata"] else {},
        }
        if not same(stored, want):
            wrong.append(f"{case}: stored {stored}, contract {want}")
    return wrong


def drawn(strategy: st.SearchStrategy[str]) -> list[bytes]:
    """Many payloads drawn by hypothesis (six times the profile's examples), to be judged
    in one Spark job: a Spark job per example would take minutes."""
    out: list[bytes] = []

    @settings(
        max_examples=6 * settings().max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(text: str) -> None:
        out.append(text.encode("utf-8", "surrogatepass"))

    collect()
    return out


GOOD = '{"value":4.86,"unit":"°C","timestamp":"2026-07-03T14:33:59+02:00"}'
#: The field's cases, and every quirk of fromisoformat found while writing the rule.
KNOWN = [
    GOOD + "}", GOOD[:-1].replace("4.86", "67.58") + "}*07", GOOD + " ", GOOD + "\n",
    "\ufeff" + GOOD, GOOD + "]", GOOD + ', "a": 1}', GOOD + "{}", " " + GOOD,
    *[
        GOOD.replace("2026-07-03T14:33:59+02:00", ts)
        for ts in (
            "2026-11-21T10:00Z", "2026-11-21T10Z", "2026-11-21T10:00:00.1234567+00:00",
            "2026-11-21T10:00:00,5+00:00", "2026-11-21T24:00:00Z", "2026-11-21T23:59:60Z",
            "2026-11-21x10:00:00Z", "2026-11-21é10:00:00Z", "2026-11-21T10:00:00+05:99",
            "2026-11-21T10:00:00+24:00", "2026-11-21T10:00:00-23:59:59.999999",
            "20261121T100000Z", "2026-W47-6T10:00Z", "2026W476T10:00Z", "2026-W53-1T10:00Z",
            "2020-W53-1T10:00Z", "2026-11-21T10:00:00.Z", "2026-11-21T1000Z",
            "2026-11-21T10:0000Z", "2026-11-21T10:00:00z", "0001-01-01T00:00:00+01:00",
            "9999-12-31T23:59:59-01:00", "2026-02-29T10:00Z", "2024-02-29T10:00Z",
            "2026-11-21T10:00 Z", "2026-11-21T10:00:00:00Z", "2026-11-21T10.5Z",
            "2026W47610:00Z", "2026-11-21T10:00:00.1234567a8Z", "2026-11-21T10:00:00+05:30.5",
            "2026-11-21", "2026-11-21T10:00:00", "2026-11-21T", "2026-W47",
            "2026-11-21T10:00:00+053000.5", "2026-11-21T10:00:00+05300",
        )
    ],
    '{"value":1,"value":"x","timestamp":"2026-11-21T10:00:00Z"}',
    '{"value":1,"timestamp":"2026-11-21T10:00:00Z","metadata":{"a":NaN,"b":"c","a":true}}',
    '{"value":NaN,"timestamp":"2026-11-21T10:00:00Z"}',
    '{"value":+INF,"timestamp":"2026-11-21T10:00:00Z","extra":1}',
    '{"value":1,"timestamp":"2026-11-21T10:00:00Z","extra":INF}',
    '{"value":1,"timestamp":"2026-11-21T10:00:00Z","extra":[Infinity,-Infinity]}',
    '{"value":1,"timestamp":"2026-11-21T10:00:00Z","unit":null}',
    '{"value":"\\u0031","timestamp":"2026\\u002d11-21T10:00:00Z","\\u0075nit":"V"}',
    '{"value":1e400,"timestamp":"2026-11-21T10:00:00Z"}', "[1]]", "[1]}", "{}", "",
    # more digits than Python's int() reads: json.loads refuses it (it once failed the job)
    '{"value":1' + "0" * 5000 + ',"unit":"","timestamp":"2026-11-21T10:00:00Z"}',
]  # fmt: skip


#: Payloads json.loads reads from bytes that are not UTF-8 text, NUL characters, lone
#: surrogates: the contract decides on these too.
KNOWN_BYTES = [
    json.dumps({"value": 1, "timestamp": "2026-11-21T10:00:00Z"}).encode(enc)
    for enc in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be")
] + [
    b'{"value":1,"timestamp":"2026-11-21T10:00:00Z\\u0000"}',
    b'{"value":"\\u0000","unit":"\\u0000","timestamp":"2026-11-21T10:00:00Z"}',
    b'{"value":1,"timestamp":"2026-11-21T10:00:00Z","metadata":{"\\ud800":"\\udc00"}}',
    b'{"value":1,"timestamp":"2026-11-21T10:00:00Z","extra":"\\ud800"}',
    "\ufeff".encode() + GOOD.encode(),
]
#: The documented exceptions: refused by silver (the contract accepts them), with a
#: reason, never dropped.
OTHERWISE = [
    ('{"value":1' + "0" * 400 + ',"timestamp":"2026-11-21T10:00:00Z"}').encode(),  # > double
    b'{"value":"\\ud800","timestamp":"2026-11-21T10:00:00Z"}',  # a lone surrogate
    b'{"value":1,"unit":"a\\udfff","timestamp":"2026-11-21T10:00:00Z"}',
]
Judged = tuple[dict[int, dict[str, Any]], dict[str, dict[int, Case]]]


@pytest.fixture(scope="module")
def judged(spark: SparkSession) -> Judged:
    """Every group of cases below, judged by silver in one Spark job (planning the job
    costs seconds): the rows by sequence number, and the cases of each group."""
    groups: dict[str, list[Case]] = {
        "drawn": [(p, False) for p in drawn(payload_text())],
        "enveloped": [(p, True) for p in drawn(payload_text())],
        "canonical": [(p, False) for p in drawn(canonical_text())]
        + [(p, True) for p in drawn(canonical_text())],
        "known": [(p.encode(), False) for p in KNOWN] + [(p, False) for p in KNOWN_BYTES],
        "otherwise": [(p, False) for p in OTHERWISE],
    }
    rows: list[dict[str, Any]] = []
    numbered: dict[str, dict[int, Case]] = {}
    for name, cases in groups.items():
        numbered[name] = {}
        for payload, wrap in cases:
            seq = len(rows)
            numbered[name][seq] = (payload, wrap)
            if wrap:
                data = envelope("gw1", seq, payload)
                rows.append(line(TOPIC, data, None, RECEIVED, gateway=None))
            else:
                rows.append(line(TOPIC, payload, seq, RECEIVED))
    staged = silver.stage(frame(spark, rows), CFG).select(
        "seq", "kind", "reason", "value", "text", "unit", "metadata",
        F.unix_micros("timestamp").alias("timestamp"),  # Python's datetime stops at year 1
    )  # fmt: skip
    got = {r["seq"]: r.asDict() for r in staged.collect() if r["seq"] is not None}
    return got, numbered


@pytest.mark.parametrize("group", ["drawn", "enveloped", "canonical", "known"])
def test_silver_judges_every_payload_as_the_contract_does(judged: Judged, group: str) -> None:
    """Generated payloads, the same in envelopes, payloads of the gateway's own shape
    (judged on a fast path), and the field's cases with every quirk of fromisoformat
    found while writing the rule."""
    got, cases = judged
    wrong = disagreements(got, cases[group])
    assert len(cases[group]) > 30
    assert not wrong, f"{len(wrong)} of {len(cases[group])} disagree:\n" + "\n".join(wrong[:20])


def test_what_silver_reads_otherwise_is_quarantined_not_lost(judged: Judged) -> None:
    got, cases = judged
    rows = [got[seq] for seq in cases["otherwise"]]
    for payload in OTHERWISE:  # what the contract makes of them
        reading_from_message(TOPIC, payload)
    assert [r["kind"] for r in rows] == ["quarantine"] * 3
    assert rows[0]["reason"] == "value must be finite"
    assert rows[1]["reason"].startswith("value is text with a lone surrogate")
    assert rows[2]["reason"].startswith("unit is text with a lone surrogate")
