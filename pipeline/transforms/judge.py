"""Silver's rules for one landing line, in plain Python: each line is judged where it is read.

Every rule that looks at one message alone lives here: the landing record, the bridge's
marks (MQTT 5 user properties or an MQTT 3.1.1 envelope), the topic, the payload, the
timestamp's plausibility and the late-data horizon. A reading's payload is judged by
calling the contract itself, ``drivers.model.reading_from_message``: a payload is
accepted exactly when the contract accepts it, and what is stored is what the contract
read. The payload the gateway itself writes (``{"value":...,"unit":...,"timestamp":...}``)
takes a fast path, ``canonical``, that accepts only what the contract certainly accepts,
with the same values (the differential test runs both); anything else goes to the
contract. Only when the contract refuses a message do the checks of ``reading_problem``
run, to name the first problem in the order the contract meets them.

Three refusals go beyond the contract, because silver stores what the contract returns
in Parquet and deduplicates by the topic's gateway: an integer value too large for a
double (``value must be finite``), text holding a lone surrogate (not storable as
UTF-8), and a gateway level that is not a valid name (the contract does not read it).

``Judge.line`` makes one row (a plain tuple: ``JUDGED``, then ``EXTRA``) per line; Spark
calls it through ``arrow_judge``, an Arrow UDF, on batches of lines (no row is
serialised on its own). Pure: no clock, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from orjson import loads as _fast_loads  # the lander's own records: 4x json.loads

from drivers.model import (
    GATEWAY_PROPERTY,
    SEQUENCE_PROPERTY,
    envelope_payload,
    reading_from_message,
)
from pipeline.config import PipelineConfig

READING: Final = "reading"
HEALTH_REPORT: Final = "health"
QUARANTINED: Final = "quarantine"
IGNORED: Final = "ignored"

#: The row ``Judge.line`` makes, field by field, with its Spark type. Times are
#: microseconds since the epoch, ``day`` days since the epoch (UTC), set for accepted
#: messages only. ``payload`` and ``payload_base64`` are the landing record's (copies
#: are compared by them and the topic). The topic's levels (gateway to quantity) are
#: read from ``topic`` by silver.
JUDGED: Final[dict[str, str]] = {
    "topic": "string",
    "received": "timestamp",
    "bridge": "string",
    "seq": "long",  # set only when the marks are usable
    "kind": "string",
    "value": "double",
    "text": "string",
    "unit": "string",
    "timestamp": "timestamp",
    "implausible": "boolean",
    "day": "date",
    "payload": "string",
}
#: The rest of the row, which silver keeps in one ``extra`` struct that is null when
#: every field has its usual value (``EXTRA_USUAL``: a reading as a bridge sends it), so
#: the common row carries one null instead of thirteen fields through the shuffle.
EXTRA: Final[dict[str, str]] = {
    "qos": "int",
    "retain": "boolean",
    "readable": "boolean",  # false: the line is not a landing record (kept whole)
    "seq_text": "string",  # the mark as it arrived, when it is not str(seq)
    "reason": "string",
    "metadata": "string",
    "dropped": "long",
    "queued": "long",
    "uptime": "double",
    "payload_base64": "string",
    "enveloped": "boolean",
    "opened": "string",  # what an envelope carried (the quarantine keeps it)
    "opened_base64": "string",
}
EXTRA_USUAL: Final = (1, False, True) + (None,) * 7 + (False, None, None)
FIELDS: Final = (*JUDGED, *EXTRA)

#: The JVM judge (``pipeline/java/LineJudge.java``): a fast path for the landing line a
#: Ledge bridge's reading makes, registered as this SQL function of the session (when
#: its jar is on the class path). It returns these fields of a reading (``JUDGED``
#: without ``kind``, times in microseconds and ``day`` in days since the epoch, ``extra``
#: usual), or null for every other line, which this module's judge then judges. ``late``
#: is null, or the days the reading arrived after its timestamp's day when that is
#: beyond the horizon: then it is quarantined (``BEYOND_HORIZON``), its ``extra`` usual
#: but for the reason.
JVM_JUDGE: Final = "ledge_judge_line"
JVM_CLASS: Final = "ledge.pipeline.LineJudge"
JVM_JUDGED: Final = {
    **{name: kind for name, kind in JUDGED.items() if name != "kind"},
    "received": "long",
    "timestamp": "long",
    "day": "int",
    "late": "long",
}
#: Why a message arriving more than ``horizon`` days after its timestamp's day (``late``)
#: is quarantined. Both judges give it (the JVM judge's ``late`` is formatted with it). A
#: line is judged alone, and a redelivered copy is the same line received later: whether
#: a copy of it is already in silver is not the judge's to know, so the reason says what
#: either case means and what a backfill with a larger horizon would change in each.
BEYOND_HORIZON: Final = (
    "arrived {late} days after its timestamp, beyond the late-data horizon of {horizon} "
    "days: not in silver; if it is a late copy of a message already in silver, it is not "
    "counted in copies, and a backfill with a larger horizon would count it as a copy; "
    "otherwise that backfill would fold it in"
)
Row = tuple[Any, ...]

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
US: Final = timedelta(microseconds=1)
_DAY_US: Final = 86_400_000_000
#: Sequence numbers are stored as longs: at most 18 digits.
_SEQ_LIMIT: Final = 10**18
_LONG_LIMIT: Final = 2**63

#: A topic level made from a name (drivers.model): 1 to 128 characters, none of ``/ + #``
#: or NUL, not starting with ``$``.
_NAME: Final = re.compile(r"[^$/+#\x00][^/+#\x00]{0,127}")
#: A sequence number as an MQTT 5 property: decimal digits.
_SEQ: Final = re.compile(r"[0-9]{1,18}")

UNREADABLE: Final = "unreadable landing line (not a landing record)"
#: A landing line with bytes that are not UTF-8 (a damaged file): kept whole as it is.
NOT_UTF8_LINE: Final = "unreadable landing line (not UTF-8 text)"
NOT_UTF8: Final = "payload is not JSON (not UTF-8 text)"
NOT_JSON: Final = "payload is not JSON"
UNMARKED: Final = (
    f"no {GATEWAY_PROPERTY}/{SEQUENCE_PROPERTY} marks (not sent by a Ledge bridge): "
    "cannot be deduplicated exactly"
)
NOT_FINITE: Final = "value must be finite"
#: Topics whose shape a judge keeps (then it starts over).
_TOPICS: Final = 65_536


def micros(at: datetime) -> int:
    """An aware datetime as microseconds since the epoch."""
    return (at - EPOCH) // US


def storable(text: str) -> bool:
    """True when ``text`` can be written as UTF-8 (it holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@functools.lru_cache(maxsize=4096)  # names repeat: check each once
def name_problem(level: str, name: str) -> str | None:
    """Why ``name`` cannot be the ``level`` of a topic, or None."""
    if _NAME.fullmatch(name) and storable(name):
        return None
    return (
        f"{level} '{name}' is not a valid topic name (1 to 128 characters, none of / + # "
        "or NUL, no leading $)"
    )


def json_kind(value: Any) -> str:
    """A parsed JSON value's type, as the reasons name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return "array" if isinstance(value, list) else "object"


def parse_time(raw: Any, what: str) -> tuple[datetime | None, str | None]:
    """``datetime.fromisoformat`` as the contract calls it, then its time zone rule:
    ``(the instant in UTC, None)`` or ``(None, why not)``."""
    if not isinstance(raw, str):
        return None, f"{what} must be ISO 8601 text"
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        return None, f"{what} '{raw}' is not ISO 8601 with a UTC offset"
    if stamp.tzinfo is None:
        return None, f"{what} must carry a time zone (use UTC)"
    try:
        return stamp.astimezone(UTC), None
    except OverflowError:  # an offset pushing it before year 1 or after 9999
        return None, f"{what} '{raw}' is not ISO 8601 with a UTC offset"


def loads(data: bytes | None) -> tuple[Any, str | None]:
    """``json.loads`` as the contract calls it: ``(value, None)`` or ``(None, why not)``."""
    if data is None:
        return None, NOT_UTF8
    try:
        return json.loads(data), None
    except Exception:  # JSONDecodeError, UnicodeDecodeError, RecursionError
        return None, NOT_JSON if _utf8(data) else NOT_UTF8


def metadata_text(metadata: dict[str, Any]) -> str:
    """A reading's metadata as JSON text (escaped where it holds a lone surrogate)."""
    text = json.dumps(metadata, ensure_ascii=False, separators=(",", ":"))
    return text if storable(text) else json.dumps(metadata, separators=(",", ":"))


def reading_problem(levels: list[str], data: bytes | None) -> str | None:
    """Why ``drivers.model.reading_from_message`` refuses a reading, in the order it
    meets the problems (topic, ``json.loads``, the keys, ``fromisoformat``, then the
    model's fields); None when it finds none of these."""
    gateway, driver, device, quantity = levels
    problem = name_problem("gateway", gateway)
    if problem:
        return problem
    body, problem = loads(data)
    if problem:
        return problem
    if not isinstance(body, dict) or "value" not in body or "timestamp" not in body:
        return "payload lacks value or timestamp"
    _, problem = parse_time(body["timestamp"], "timestamp")
    if problem:
        return problem
    for level, name in (("device", device), ("quantity", quantity), ("driver", driver)):
        problem = name_problem(level, name)
        if problem:
            return problem
    value = body["value"]
    kind = json_kind(value)
    if kind not in ("number", "boolean", "text"):
        return f"value must be a number, boolean or text, not {kind}"
    if isinstance(value, float) and not math.isfinite(value):
        return NOT_FINITE
    if "unit" in body and not isinstance(body["unit"], str):
        return "unit must be text"
    if "metadata" in body:
        meta = body["metadata"]
        if not isinstance(meta, dict) or not all(_scalar(v) for v in meta.values()):
            return "metadata must be an object of numbers, booleans or text"
    return None


#: The payload ``drivers.model.reading_payload`` writes without metadata (and the
#: envelope's opened form of it): ``{"value":V,"unit":"U","timestamp":"T"}`` with no
#: whitespace, V a JSON number, ``true``, ``false`` or a string, strings without escapes
#: or control characters (so ``json.loads`` returns their text unchanged).
_CANONICAL: Final = re.compile(
    r'\{"value":(?:(-?(?:0|[1-9][0-9]*))((?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)'
    r'|(true|false)|"([^"\\\x00-\x1f]*)"),'
    r'"unit":"([^"\\\x00-\x1f]*)","timestamp":"([^"\\\x00-\x1f]*)"\}'
)


def canonical(payload: str) -> tuple[Any, str, datetime] | None:
    """``(value, unit, timestamp in UTC)`` exactly as ``reading_from_message`` returns
    them, for a payload of the gateway's own shape (``_CANONICAL``) that the contract
    certainly accepts once the topic's names are valid (the caller checks those); None
    for anything else, which the contract itself then judges.

    For such a payload ``json.loads`` gives those three keys, the number as ``int`` or
    ``float`` (by its fraction or exponent) and the strings as written; the contract
    accepts exactly when the names are valid, the number is finite, and
    ``fromisoformat`` reads the timestamp with an offset that keeps it in range. The
    differential test runs this beside the contract."""
    match = _CANONICAL.fullmatch(payload)
    if match is None:
        return None
    integer, fraction, boolean, string, unit, stamp_text = match.groups()
    value: Any
    if integer is not None:
        if fraction:
            value = float(integer + fraction)
            if not math.isfinite(value):
                return None
        else:
            try:
                value = int(integer)
            except ValueError:  # beyond Python's digit limit: the contract's to refuse
                return None
    elif boolean is not None:
        value = boolean == "true"
    else:
        value = string
    stamp, _ = parse_time(stamp_text, "timestamp")
    return None if stamp is None else (value, unit, stamp)


def _scalar(value: Any) -> bool:
    return isinstance(value, int | float | str)  # a bool is an int


def health_problem(body: Any) -> str | None:
    """Why a health report's parsed payload is refused (``drivers.model.Health``'s
    fields, read from ``json.loads``), or None."""
    if not isinstance(body, dict):
        return "health payload is not a JSON object"
    if "timestamp" not in body:
        return "health payload lacks timestamp"
    _, problem = parse_time(body["timestamp"], "health timestamp")
    if problem:
        return problem
    if "dropped" not in body:
        return "health payload lacks dropped"
    for name in ("dropped", "queued"):
        if name not in body:
            continue
        count = body[name]
        if not isinstance(count, int) or isinstance(count, bool):
            return f"health {name} must be an integer"
        if count < 0:
            return f"health {name} must be 0 or more"
        if count >= _LONG_LIMIT:
            return f"health {name} must be below 2^63"
    if "uptime" in body:
        uptime = body["uptime"]
        if isinstance(uptime, bool) or not isinstance(uptime, int | float) or not uptime >= 0:
            return "health uptime must be a number, 0 or more"
        try:
            float(uptime)
        except OverflowError:  # an integer beyond a double
            return "health uptime must be a number, 0 or more"
    return None


class Judge:
    """Silver's per-line rules under one ``PipelineConfig``."""

    def __init__(self, cfg: PipelineConfig) -> None:
        self.prefix = cfg.prefix
        self.head = cfg.prefix + "/"
        #: the contract reads a one-level prefix; a longer one is replaced by this
        self.one_level = "/" not in cfg.prefix
        self.tolerance = cfg.future_tolerance // US
        self.earliest = micros(cfg.earliest)
        self.horizon = cfg.horizon_days
        self.topic_rule = f"is not {cfg.prefix}/<gateway>/<driver>/<device>/<quantity>"
        self.topics: dict[str, tuple[list[str], str | None, bool]] = {}

    # -------------------------------------------------------------------------- a line

    def line(self, text: str) -> Row:
        """What silver makes of one landing line (without its newline)."""
        try:
            rec = _fast_loads(text)
            checked = True  # orjson returns no lone surrogates: every text is storable
        except Exception:  # orjson refuses more than json.loads: ask json.loads
            try:
                rec = json.loads(text)
            except Exception:  # a line that is not JSON at all
                return _unreadable()
            checked = False
        if type(rec) is not dict:
            return _unreadable()
        get = rec.get
        topic, payload, b64 = get("topic"), get("payload"), get("payload_base64")
        gateway_mark, seq_mark, raw_received = get("gateway"), get("seq"), get("received")
        for v in (topic, payload, b64, gateway_mark, seq_mark, raw_received):
            if v is not None and (type(v) is not str or not (checked or storable(v))):
                return _unreadable()
        qos = get("qos")
        if type(qos) is not int or not 0 <= qos <= 2:
            qos = None
        retain = get("retain")
        if type(retain) is not bool:
            retain = None
        landed = (topic, qos, retain, payload, b64)

        received: int | None = None
        if raw_received is not None:
            try:
                at = datetime.fromisoformat(raw_received)
                received = micros(at if at.tzinfo is not None else at.replace(tzinfo=UTC))
            except (ValueError, OverflowError):
                received = None
        if topic is None or raw_received is None:
            return _refused(
                landed, received, "landing line lacks its topic or receive time", whole=True
            )
        shape = self.topics.get(topic)
        if shape is None:
            shape = self._shape(topic)
        levels, what, names_ok = shape
        # Status topics are not data, marked or not: a bridge sends the gateway's status
        # as its birth and will upstream, which carry no sequence number.
        status = what == IGNORED and received is not None
        if not status:
            if received is None:
                return _refused(
                    landed,
                    None,
                    f"landing line has an unreadable receive time '{raw_received}'",
                    whole=True,
                )
            if payload is None and b64 is None:
                return _refused(landed, received, "landing line has no payload", whole=True)
        data: bytes | None = None  # the message's bytes, when they are known yet
        if payload is None and b64 is not None:
            try:
                data = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError):
                data = None
        bridge, seq, seq_text, inner, envelope, problem = _marks(gateway_mark, seq_mark, payload)
        if envelope is not None:
            data = inner
        marks = (bridge, seq, seq_text, envelope)
        if status:
            return _refused(landed, received, None, kind=IGNORED, marks=marks)
        if problem is not None:
            return _refused(landed, received, problem, marks=marks)
        assert received is not None  # (only a status message may lack it here)

        # --------------------------------------------------------------- the message
        if what == READING:
            as_text = envelope[0] if envelope is not None else payload
            read = canonical(as_text) if names_ok and as_text is not None else None
            if read is not None:
                return self._stored(landed, received, marks, *read)
            if data is None and envelope is None and payload is not None:
                data = payload.encode("utf-8")
            return self._reading(landed, received, marks, levels, data)
        if what == HEALTH_REPORT:
            if data is None and envelope is None and payload is not None:
                data = payload.encode("utf-8")
            return self._health(landed, received, marks, levels, data)
        return _refused(landed, received, f"topic '{topic}' {self.topic_rule}", marks=marks)

    def _shape(self, topic: str) -> tuple[list[str], str | None, bool]:
        """``(levels after the prefix, READING | HEALTH_REPORT | IGNORED | None,
        every name a reading's contract reads is valid)`` of a topic, kept for the
        next line of the same topic (topics repeat: one per sensor)."""
        head = self.head
        levels = topic[len(head) :].split("/") if topic.startswith(head) else []
        n = len(levels)
        what: str | None = None
        if (n == 4 and levels[3] == "status") or (n == 2 and levels[1] == "status"):
            what = IGNORED
        elif n == 4:
            what = READING
        elif n == 2 and levels[1] == "health":
            what = HEALTH_REPORT
        names_ok = what == READING and not any(
            name_problem(level, name)
            for level, name in zip(("gateway", "driver", "device", "quantity"), levels, strict=True)
        )
        if len(self.topics) >= _TOPICS:  # bounded: start over
            self.topics.clear()
        shape = (levels, what, names_ok)
        self.topics[topic] = shape
        return shape

    def _reading(
        self, landed: tuple[Any, ...], received: int, marks: tuple[Any, ...], levels: list[str],
        data: bytes | None,
    ) -> Row:  # fmt: skip
        """A reading as ``drivers.model.reading_from_message`` reads it."""
        try:
            if data is None:
                raise ValueError(NOT_UTF8)
            topic = landed[0] if self.one_level else "p/" + "/".join(levels)
            _, reading = reading_from_message(topic, data, self.prefix if self.one_level else "p")
        except Exception:  # the contract refuses it (any exception)
            problem = reading_problem(levels, data)
            return _refused(
                landed, received, problem or "payload refused by the contract", marks=marks
            )
        problem = name_problem("gateway", levels[0])
        value, unit = reading.value, reading.unit
        if isinstance(value, str) and not storable(value):
            problem = problem or "value is text with a lone surrogate (not storable as UTF-8)"
        if not storable(unit):
            problem = problem or "unit is text with a lone surrogate (not storable as UTF-8)"
        if problem is not None:
            return _refused(landed, received, problem, marks=marks)
        meta = metadata_text(reading.metadata) if reading.metadata else None
        return self._stored(landed, received, marks, value, unit, reading.timestamp, meta)

    def _stored(
        self, landed: tuple[Any, ...], received: int, marks: tuple[Any, ...], value: Any,
        unit: str, stamp_at: datetime, meta: str | None = None,
    ) -> Row:  # fmt: skip
        """The row of an accepted reading (values as the contract returned them)."""
        text: str | None = None
        if value is True or value is False:
            number: float | None = 1.0 if value else 0.0
            text = "true" if value else "false"
        elif isinstance(value, str):
            number, text = None, value
        else:
            try:
                number = float(value)
            except OverflowError:  # an integer beyond a double
                return _refused(landed, received, NOT_FINITE, marks=marks)
        return self._accepted(
            landed, received, marks, READING, micros(stamp_at), (number, text, unit), meta
        )

    def _accepted(
        self, landed: tuple[Any, ...], received: int, marks: tuple[Any, ...], kind: str,
        stamp: int, reading: tuple[Any, ...] = (None, None, None), meta: str | None = None,
        counts: tuple[Any, ...] = (None, None, None),
    ) -> Row:  # fmt: skip
        """The row of a message the contract accepts: a reading's ``(value, text, unit)``
        and metadata, or a health report's ``(dropped, queued, uptime)``, judged by its
        timestamp (``_when``)."""
        kind, reason, implausible, day = self._when(kind, stamp, received)
        bridge, seq, seq_text, envelope = marks
        opened, opened_b64 = envelope or (None, None)
        topic, qos, retain, payload, b64 = landed
        return (
            topic, received, bridge, seq, kind, *reading, stamp, implausible, day, payload,
            qos, retain, True, _unusual(seq, seq_text), reason, meta, *counts, b64,
            envelope is not None, opened, opened_b64,
        )  # fmt: skip

    def _health(
        self, landed: tuple[Any, ...], received: int, marks: tuple[Any, ...], levels: list[str],
        data: bytes | None,
    ) -> Row:  # fmt: skip
        gateway = levels[0]
        problem = name_problem("gateway", gateway)
        body: Any = None
        if problem is None:
            body, problem = loads(data)
        if problem is None:
            problem = health_problem(body)
        if problem is not None:
            return _refused(landed, received, problem, marks=marks)
        stamp_at, _ = parse_time(body["timestamp"], "health timestamp")
        assert stamp_at is not None
        counts = (body["dropped"], body.get("queued", 0), float(body.get("uptime", 0.0)))
        return self._accepted(
            landed, received, marks, HEALTH_REPORT, micros(stamp_at), counts=counts
        )

    def _when(self, kind: str, stamp: int, received: int) -> tuple[str, str | None, bool, int]:
        """An accepted message's plausibility, its silver day and the late-data horizon:
        ``(kind, reason, implausible, day)``. An implausible timestamp (ahead of the
        receive time by more than the tolerance, or before ``earliest``) is kept and
        filed under the receive day; a message arriving more than ``horizon`` days after
        its timestamp's day is quarantined (its day is still its timestamp's)."""
        implausible = stamp > received + self.tolerance or stamp < self.earliest
        day = stamp // _DAY_US
        if implausible:
            return kind, None, True, received // _DAY_US
        late = received // _DAY_US - day
        if late > self.horizon:
            return QUARANTINED, BEYOND_HORIZON.format(late=late, horizon=self.horizon), False, day
        return kind, None, False, day


def _unreadable(reason: str = UNREADABLE, data: bytes | None = None) -> Row:
    """A line that is no landing record (kept whole); ``data``: its bytes, when they are
    not UTF-8 (kept as base64, the way a payload that is not text is)."""
    b64 = None if data is None else base64.b64encode(data).decode("ascii")
    return (
        None, None, None, None, QUARANTINED, *((None,) * 7), None, None, False, None,
        reason, *((None,) * 4), b64, False, None, None,
    )  # fmt: skip


def _texts(lines: pa.Array) -> list[str | bytes]:
    """The lines as text; a line whose bytes are not UTF-8 (Spark reads a damaged file's
    bytes as they are) as those bytes, where a batch would otherwise fail whole."""
    try:
        return lines.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError:
        out: list[str | bytes] = []
        for data in lines.cast(pa.binary()).to_pylist():
            try:
                out.append(data.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(data)
        return out


def _refused(
    landed: tuple[Any, ...],
    received: int | None,
    reason: str | None,
    kind: str = QUARANTINED,
    marks: tuple[Any, ...] = (None, None, None, None),
    whole: bool = False,
) -> Row:
    """A landing record that is quarantined (or ignored) as it arrived; ``whole``: a
    record the lander could not have written (its marks unread), kept as its line too."""
    if reason is not None and not storable(reason):  # it quotes text from the message
        reason = reason.encode("utf-8", "backslashreplace").decode("utf-8")
    bridge, seq, seq_text, envelope = marks
    topic, qos, retain, payload, b64 = landed
    opened, opened_b64 = envelope or (None, None)
    return (
        topic, received, bridge, seq, kind, *((None,) * 6), payload, qos, retain, not whole,
        _unusual(seq, seq_text), reason, None, None, None, None, b64, envelope is not None,
        opened, opened_b64,
    )  # fmt: skip


def _unusual(seq: int | None, seq_text: str | None) -> str | None:
    """The sequence number's text when it is not just ``str(seq)`` (leading zeros, or a
    mark that is not usable): what the quarantine keeps as it arrived."""
    if seq is not None and seq_text == str(seq):
        return None
    return seq_text


Marks = tuple[
    str | None, int | None, str | None, bytes | None, tuple[str | None, str | None] | None,
    str | None,
]  # fmt: skip


def _marks(gateway: str | None, seq: str | None, text: str | None) -> Marks:
    """The bridge's marks: ``(bridge, seq, seq text, the payload an envelope carried,
    (what the quarantine keeps of the envelope's payload), problem)``; ``seq`` is None
    unless the marks are usable.

    ``gateway``/``seq`` are the MQTT 5 user properties; without them the payload
    (``text``: only a payload that arrived as text) may be an MQTT 3.1.1 bridge's
    envelope, opened as ``drivers.envelope.open_envelope`` opens it."""
    if gateway is not None or seq is not None:
        if gateway is None:
            problem = f"message has a {SEQUENCE_PROPERTY} property but no {GATEWAY_PROPERTY}"
        elif seq is None:
            problem = f"message has a {GATEWAY_PROPERTY} property but no {SEQUENCE_PROPERTY}"
        elif not _SEQ.fullmatch(seq):
            problem = f"{SEQUENCE_PROPERTY} '{seq}' is not a decimal number"
        else:
            return gateway, int(seq), seq, None, None, None
        return gateway, None, seq, None, None, problem
    return _open_envelope(None if text is None else text.encode("utf-8"))


def _open_envelope(data: bytes | None) -> Marks:
    """An envelope is a JSON object with ``gateway``, ``seq`` and ``payload`` or
    ``payload_base64``; anything else carries no marks."""
    body: Any = None
    if data is not None:
        try:
            body = json.loads(data)
        except Exception:  # not JSON: not an envelope
            body = None
    if not (
        isinstance(body, dict)
        and "gateway" in body
        and "seq" in body
        and ("payload" in body or "payload_base64" in body)
    ):
        return None, None, None, None, None, UNMARKED
    gateway, seq = body["gateway"], body["seq"]
    inner: bytes | None = None
    opened: str | None = None
    opened_b64 = body.get("payload_base64") if "payload" not in body else None
    problem: str | None = None
    try:
        inner = envelope_payload(body)
    except UnicodeEncodeError:  # a lone surrogate inside: not UTF-8 text
        opened = json.dumps(body["payload"], separators=(",", ":"))
    except ValueError:
        problem = "envelope payload_base64 is not base64 text"
    if "payload" in body and inner is not None:
        opened = inner.decode("utf-8")
    if not (isinstance(opened_b64, str) and storable(opened_b64)):
        opened_b64 = None
    is_int = isinstance(seq, int) and not isinstance(seq, bool)
    seq_text = str(seq) if is_int and abs(seq) < _SEQ_LIMIT else None
    envelope = (opened, opened_b64)
    if not isinstance(gateway, str) or not storable(gateway) or seq_text is None:
        # no usable marks: the quarantine keeps the envelope itself, marks and all
        problem = "envelope lacks a gateway (text) or seq (integer)"
        return None, None, seq_text, None, None, problem
    if problem is not None:
        return gateway, None, seq_text, None, envelope, problem
    return gateway, seq, seq_text, inner, envelope, None


# ------------------------------------------------------------------------------ Arrow


_ARROW: Final = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}


def _fields(columns: dict[str, str]) -> list[pa.Field]:
    return [pa.field(name, _ARROW[kind]) for name, kind in columns.items()]


def arrow_type() -> pa.StructType:
    """What ``arrow_judge`` returns: ``JUDGED``, then ``extra`` (``EXTRA``)."""
    return pa.struct([*_fields(JUDGED), pa.field("extra", pa.struct(_fields(EXTRA)))])


def _array(values: Sequence[Any], kind: pa.DataType) -> pa.Array:
    n = len(values)
    if values.count(None) == n:
        return pa.nulls(n, kind)
    if kind == pa.date32():
        return pa.array(values, pa.int32()).cast(kind)
    if isinstance(kind, pa.TimestampType):
        return pa.array(values, pa.int64()).cast(kind)
    return pa.array(values, kind)


def arrow_judge(cfg: PipelineConfig) -> Callable[[pa.Array], pa.Array]:
    """A function for an Arrow UDF: landing lines (``pa.StringArray``) in, a
    ``pa.StructArray`` of ``arrow_type()`` out, one row per line."""
    judge = Judge(cfg)
    top, extra = _fields(JUDGED), _fields(EXTRA)
    width, usual = len(top), EXTRA_USUAL
    extra_type = pa.struct(extra)

    def judged(lines: pa.Array) -> pa.Array:
        if lines.null_count:  # lines judged already (silver's JVM judge): null rows
            valid = pc.is_valid(lines)
            some = judged(lines.filter(valid))
            index = pc.subtract(pc.cumulative_sum(valid.cast(pa.int32())), 1)
            return some.take(pc.if_else(valid, index, pa.scalar(None, pa.int32())))
        one = judge.line
        rows = [
            one(t) if isinstance(t, str) else _unreadable(NOT_UTF8_LINE, t) for t in _texts(lines)
        ]
        if not rows:
            return pa.array([], arrow_type())
        # column by column (transposing whole rows costs twice as much)
        head = [_array(list(map(itemgetter(i), rows)), f.type) for i, f in enumerate(top)]
        # ``extra`` only for the rows where it is not the usual (null elsewhere)
        unusual = [i for i, row in enumerate(rows) if row[width:] != usual]
        if unusual:
            columns = zip(*(rows[i][width:] for i in unusual), strict=True)
            compact = pa.StructArray.from_arrays(
                [_array(c, f.type) for c, f in zip(columns, extra, strict=True)], fields=extra
            )
            at: list[int | None] = [None] * len(rows)
            for k, i in enumerate(unusual):
                at[i] = k
            rest = compact.take(pa.array(at, pa.int32()))
        else:
            rest = pa.nulls(len(rows), extra_type)
        return pa.StructArray.from_arrays(
            [*head, rest], fields=[*top, pa.field("extra", extra_type)]
        )

    return judged
