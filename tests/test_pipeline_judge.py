"""Silver's per-line judge fuzzed on hostile landing lines (no Spark: the judge is plain
Python, Arrow builds its batches): it never raises, always makes one row of the right
shape, and every row can be handed to Spark (Arrow refuses text holding a lone
surrogate, which JSON escapes can carry anywhere in a line or its payload).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.landing import CFG, judged
from pipeline.transforms.judge import QUARANTINED, arrow_judge
from tests.test_pipeline_payload import canonical_text, payload_text

#: Escapes JSON reads into a lone surrogate, and other text Arrow or Parquet may choke on.
NASTY = ["\\ud800", "\\udfff", "\\u0000", "\\ud83d", "\\ud83d\\ude00", "\\ufeff", "\x7f"]


SHORT_TEXT = st.text(max_size=12)
#: True one time in eight (hypothesis draws the first choice most readily).
RARELY = st.sampled_from([False] * 7 + [True])


@st.composite
def nasty_text(draw: st.DrawFn, base: st.SearchStrategy[str] = SHORT_TEXT) -> str:
    """``base`` with lone-surrogate escapes and NULs put in as JSON escapes: the result is
    JSON string content (no quotes), already escaped."""
    text = json.dumps(draw(base), ensure_ascii=draw(st.booleans()))[1:-1]
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        at = draw(st.integers(0, len(text)))
        if at and text[at - 1] == "\\":  # not inside an escape
            continue
        text = text[:at] + draw(st.sampled_from(NASTY)) + text[at:]
    return text


def quoted(content: str) -> str:
    return f'"{content}"'


TOPICS = st.one_of(
    st.sampled_from(
        [
            "ledge/gw1/serial/env/temperature",
            "ledge/gw1/serial/env/temperature",
            "ledge/gw1/health",
            "ledge/gw1/status",
            "ledge/gw1/serial/env/status",
            "ledge/gw+1/serial/env/t",
            "other/gw1/x",
        ]
    ),
    nasty_text(st.sampled_from(["ledge/gw1/serial/env/t", "ledge/g/h", "ledge/$x/a/b/c"])),
)
SCALARS: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["null", "true", "1", "1.5", "-3", "1e400", "[]", "{}", '"1"', "NaN"]),
    st.integers(-(10**30), 10**30).map(str),
)


@st.composite
def landing_line(draw: st.DrawFn) -> str:
    """A landing record as text: every field present, absent, mistyped or hostile."""
    payload = draw(st.one_of(payload_text(), canonical_text(), st.just("online")))
    for key in ("timestamp", "unit", "value"):  # escapes inside the payload's own strings
        opening = f'"{key}":"'
        if opening in payload and draw(RARELY):
            nasty = draw(st.sampled_from(NASTY))
            payload = payload.replace(opening, opening + nasty, 1)
    fields: dict[str, str] = {
        "topic": quoted(draw(TOPICS)),
        "payload": json.dumps(payload, ensure_ascii=draw(st.booleans())),
        "payload_base64": quoted(draw(st.sampled_from(["eyJ2YWx1ZSI6MX0=", "!!", ""]))),
        "qos": draw(SCALARS),
        "retain": draw(SCALARS),
        "gateway": quoted(draw(nasty_text(st.sampled_from(["gw1", "gw1", "gw2", ""])))),
        "seq": quoted(draw(st.sampled_from(["7", "8", "007", "x", "", "1" * 20]))),
        "received": quoted(
            draw(
                st.sampled_from(["2026-11-21T10:00:00.000000Z"] * 3)
                | nasty_text(st.sampled_from(["2026-11-21T10:00:00", "yesterday", ""]))
            )
        ),
    }
    if draw(RARELY):
        fields["payload"] = quoted(draw(nasty_text(st.just(payload[:40]))))
    kept = [k for k in fields if not draw(RARELY)]  # each field absent now and then
    if draw(RARELY):
        fields[draw(st.sampled_from(list(fields)))] = draw(SCALARS)  # mistyped
    text = "{" + ",".join(f'"{k}":{fields[k]}' for k in kept) + "}"
    return text[: draw(st.integers(1, len(text)))] if draw(RARELY) else text  # cut short


@st.composite
def marked_line(draw: st.DrawFn) -> str:
    """A well-formed landing record from a bridge: only its payload is hostile (text with
    escapes, among them lone surrogates, inside the payload's own strings)."""
    payload = draw(st.one_of(canonical_text(), payload_text()))
    for key in ("timestamp", "unit", "value"):
        opening = f'"{key}":"'
        if opening in payload and draw(st.booleans()):
            payload = payload.replace(opening, opening + draw(st.sampled_from(NASTY)), 1)
    record = {
        "topic": draw(st.sampled_from(["ledge/gw1/serial/env/t", "ledge/gw1/health"])),
        "payload": payload,
        "qos": 1,
        "retain": False,
        "gateway": "gw1",
        "seq": str(draw(st.integers(1, 99))),
        "received": "2026-11-21T10:00:00.000000Z",
    }
    return json.dumps(record, ensure_ascii=draw(st.booleans()))


@settings(max_examples=400, deadline=None)
@given(st.lists(marked_line() | landing_line() | st.text(max_size=40), min_size=1, max_size=8))
def test_the_judge_makes_one_storable_row_of_any_line(lines: list[str]) -> None:
    for line in lines:
        judged(line)  # the fuzz target's invariants: one row, a reason, marks...
    # Spark gets every batch through Arrow: a row Arrow cannot take fails the whole job.
    out = arrow_judge(CFG)(pa.array(lines, pa.string()))
    assert len(out) == len(lines)


def test_a_reason_quoting_a_lone_surrogate_is_escaped_not_fatal() -> None:
    line = json.dumps(
        {
            "topic": "ledge/gw1/serial/env/t",
            "payload": '{"value":1,"timestamp":"\\ud800"}',
            "gateway": "gw1",
            "seq": "5",
            "received": "2026-11-21T10:00:00.000000Z",
        }
    )
    row = judged(line)
    assert row["kind"] == QUARANTINED
    assert row["reason"] == "timestamp '\\ud800' is not ISO 8601 with a UTC offset"
    assert len(arrow_judge(CFG)(pa.array([line]))) == 1


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"topic": "ledge/gw1/serial/env/t", "payload": "{}", "gateway": "gw1", "seq": "1"},
         "landing line lacks its topic or receive time"),
        ({"topic": "ledge/gw1/serial/env/t", "payload": "{}", "received": "yesterday",
          "gateway": "gw1", "seq": "1"},
         "landing line has an unreadable receive time 'yesterday'"),
        ({"topic": "ledge/gw1/serial/env/t", "received": "2026-11-21T10:00:00Z",
          "gateway": "gw1", "seq": "1"},
         "landing line has no payload"),
    ],
)  # fmt: skip
def test_a_record_the_lander_cannot_have_written_is_also_kept_as_its_line(
    record: dict[str, str], reason: str
) -> None:
    """Its marks are not read (no bridge, no seq): the line keeps them."""
    row = judged(json.dumps(record))
    assert (row["kind"], row["reason"], row["readable"]) == (QUARANTINED, reason, False)
    assert row["topic"] == record["topic"]


@pytest.mark.parametrize("seq", ['"12"', "true", "null", str(10**18)])
def test_an_envelope_without_usable_marks_is_quarantined_as_it_arrived(seq: str) -> None:
    """The envelope itself, not the payload it carries: its marks are the evidence."""
    envelope = '{"gateway":"gw4","seq":' + seq + ',"payload":{"value":1}}'
    line = json.dumps(
        {"topic": "ledge/gw4/serial/env/t", "payload": envelope,
         "received": "2026-11-21T10:00:00.000000Z"}
    )  # fmt: skip
    row = judged(line)
    assert (row["kind"], row["reason"]) == (
        QUARANTINED, "envelope lacks a gateway (text) or seq (integer)",
    )  # fmt: skip
    assert (row["payload"], row["enveloped"], row["opened"]) == (envelope, False, None)


def test_an_envelope_whose_payload_utf8_cannot_carry_is_judged_as_that_payload() -> None:
    """Not as the envelope around it: the envelope's own text is no reading payload."""
    inner = '{"value":"\\ud800","timestamp":"2026-11-21T10:00:00Z"}'
    line = json.dumps(
        {
            "topic": "ledge/gw1/serial/env/t",
            "payload": '{"gateway":"gw1","seq":5,"payload":' + inner + "}",
            "received": "2026-11-21T10:00:00.000000Z",
        }
    )
    row = judged(line)
    assert (row["kind"], row["bridge"], row["seq"]) == (QUARANTINED, "gw1", 5)
    assert row["reason"] == "payload is not JSON (not UTF-8 text)"


def test_a_reading_beyond_the_horizon_says_what_a_late_copy_is_and_what_a_backfill_does() -> None:
    """A line is judged alone: a late copy of a message already in silver looks like the
    message itself, arrived late. The reason says what each case means (the JVM judge's
    rows carry the same text: tests/test_pipeline_jvm_judge.py compares them)."""
    record = {
        "topic": "ledge/gw1/serial/env/temperature",
        "payload": '{"value":21.5,"unit":"°C","timestamp":"2026-11-16T10:00:00Z"}',
        "qos": 1, "retain": False, "gateway": "gw1", "seq": "42",
        "received": "2026-11-21T10:00:00.000000Z",
    }  # fmt: skip
    row = judged(json.dumps(record))
    assert (row["kind"], row["bridge"], row["seq"]) == (QUARANTINED, "gw1", 42)
    assert row["reason"] == (
        f"arrived 5 days after its timestamp, beyond the late-data horizon of "
        f"{CFG.horizon_days} days: not in silver; if it is a late copy of a message already "
        "in silver, it is not counted in copies, and a backfill with a larger horizon would "
        "count it as a copy; otherwise that backfill would fold it in"
    )
