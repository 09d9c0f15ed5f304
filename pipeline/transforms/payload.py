"""A reading's payload judged exactly as ``drivers.model.reading_from_message`` judges it,
as Spark expressions (no row leaves the JVM).

The contract parses with Python's ``json.loads``, builds a pydantic ``Reading`` and reads
the timestamp with ``datetime.fromisoformat``. Spark's JSON functions differ from
``json.loads`` in three ways this module corrects, so that a payload is accepted here if
and only if the contract accepts it:

- **Trailing text.** Spark parses the first complete JSON value and ignores what follows
  (``{...}}`` and ``{...}*07`` read as ``{...}``); ``json.loads`` refuses both. The payload
  is parsed inside ``{"a": ... }`` (a stray ``]`` breaks it) and its length is taken
  inside ``[ ... ]`` (a stray ``}`` breaks that, a stray ``,`` adds an element): only a
  payload that is one JSON value and nothing else passes both.
- **Types.** Spark returns a string value and the text of any other value alike (``"1"``
  and ``1`` both read as ``1``). Every string token is marked first (``"~..."``): a value
  read back with the mark was text.
- **Non-numbers.** ``json.loads`` reads ``NaN``, ``Infinity`` and ``-Infinity``; Spark
  also ``+Infinity``, ``INF``... The length check sees Python's three as ``null`` and
  refuses the others.

Regular expressions use only possessive loops (Java runs those without recursion, so a
long payload cannot overflow a task's stack). Timestamps follow CPython 3.11's
``fromisoformat`` grammar, quirks included (any one character between date and time, a
fraction on any time component, a stray character before the offset...); the common
``isoformat()`` shape takes a fast path through Spark's own cast.

Deliberately not followed (documented in the README): payloads in UTF-16 or UTF-32
(``json.loads`` decodes those from bytes; silver reads UTF-8 text only), integers too
large for a double (stored values are doubles: quarantined as not finite), timestamps
holding a NUL character, and JSON nested deeper than Jackson's limit.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

#: Prefixed to the content of every JSON string token before Spark parses the payload.
MARK: Final = "~"
#: A JSON string token (RFC 8259 section 7, as ``json.loads`` reads it: no raw control
#: characters, only the standard escapes); group 1 is its content.
_STRING: Final = r'"((?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+)"'
#: A marked string token as Spark writes it back (escapes are Spark's): group 1 unmarked.
_MARKED_STRING: Final = r'"~((?:[^"\\]++|\\.)*+)"'
#: How Spark writes back a non-finite number it read (``NaN``, ``Infinity``...).
_NON_FINITE: Final = ('"NaN"', '"Infinity"', '"-Infinity"')
_READ_OPTIONS: Final = {"allowSingleQuotes": "false", "columnNameOfCorruptRecord": "_c"}
_STRICT_OPTIONS: Final = {**_READ_OPTIONS, "allowNonNumericNumbers": "false"}


def marked(text: Column) -> Column:
    """``text`` with a leading UTF-8 byte order mark removed (``json.loads`` skips it in
    bytes) and every string token's content prefixed with ``MARK``."""
    return F.regexp_replace(F.regexp_replace(text, r"^\ufeff", ""), _STRING, f'"{MARK}$1"')


def unmarked(text: Column) -> Column:
    """JSON text Spark wrote back from a marked value, as plain JSON again."""
    bare = F.regexp_replace(text, r'"(NaN|-?Infinity)"', "$1")
    return F.regexp_replace(bare, _MARKED_STRING, '"$1"')


#: One flat JSON object and nothing after it: what gateways send, recognised by one
#: regular expression (no nesting), so the costlier length check runs only for the rest.
_WS: Final = r"[ \t\n\r]*+"
_TOKEN: Final = r'"(?:[^"\\]++|\\.)*+"'
_SCALAR: Final = (
    rf"(?:{_TOKEN}|-?(?:0|[1-9]\d*+)(?:\.\d++)?(?:[eE][-+]?\d++)?|true|false|null"
    r"|NaN|-?Infinity)"
)
_MEMBER: Final = rf"{_TOKEN}{_WS}:{_WS}{_SCALAR}{_WS}"
_FLAT: Final = rf"^{_WS}\{{{_WS}(?:{_MEMBER}(?:,{_WS}{_MEMBER})*+)?\}}{_WS}\z"


def _single_value(text: Column) -> Column:
    """True when ``text`` holds one JSON value and nothing after it (see the module doc);
    null when it is not JSON at all. Only the shape is checked here: the parse checks
    the rest (string contents, numbers)."""
    # Python's three non-numbers become null; Spark's other spellings stay and fail.
    plain = F.regexp_replace(text, "-?Infinity|NaN", "null")
    length = F.json_array_length(F.concat(F.lit("["), plain, F.lit("]")))
    return F.when(text.rlike(_FLAT), F.lit(True)).otherwise(length == 1)


def last_wins(fields: Column) -> Column:
    """``fields`` with one entry per key, the last one (Spark's JSON reader keeps every
    duplicate in a map, and a lookup finds the first; ``json.loads`` keeps the last).
    Rebuilding the map applies ``spark.sql.mapKeyDedupPolicy=LAST_WIN``."""
    return F.map_from_entries(F.map_entries(fields))


def with_object(frame: DataFrame, text: str, out: str) -> DataFrame:
    """``frame`` with ``{out}`` (a marked JSON text's top-level object as ``map<string,
    string>``: keys and text values marked, other values as JSON text, the last of
    duplicate keys winning as in ``json.loads``; null unless the text is exactly one JSON
    object), ``{out}_json`` (the text is JSON) and ``{out}_object`` (it is an object)."""
    src = F.col(text)
    wrapped = F.concat(F.lit('{"a":'), src, F.lit("}"))
    step = frame.select(
        "*",
        F.from_json(wrapped, "struct<a: map<string, string>, _c: string>", _READ_OPTIONS).alias(
            f"{out}_w"
        ),
        F.coalesce(_single_value(src), F.lit(False)).alias(f"{out}_single"),
    )
    w, single = F.col(f"{out}_w"), F.col(f"{out}_single")
    is_object = single & w["_c"].isNull() & w["a"].isNotNull()
    step = step.select("*", is_object.alias(f"{out}_object"))
    is_object = F.col(f"{out}_object")
    # Only for what is not an object (rare): is it JSON at all? ("lacks value" vs "not JSON")
    as_any = F.from_json(
        F.regexp_replace(F.when(single & ~is_object, wrapped), "-?Infinity|NaN", "null"),
        "struct<a: string, _c: string>",
        _STRICT_OPTIONS,
    )
    is_json = is_object | (single & as_any.isNotNull() & as_any["_c"].isNull())
    return step.select(
        "*",
        F.when(is_object, last_wins(w["a"])).alias(out),
        F.coalesce(is_json, F.lit(False)).alias(f"{out}_json"),
    ).drop(f"{out}_w", f"{out}_single")


# ---------------------------------------------------------------------------- JSON values


def kind_of(raw: Column) -> Column:
    """The JSON type of a value Spark read as text from a marked payload: ``text``,
    ``boolean``, ``number``, ``null`` (also when absent), ``array`` or ``object``."""
    first = F.substring(raw, 1, 1)
    return (
        F.when(raw.isNull(), "null")
        .when(first == MARK, "text")
        .when(raw.isin("true", "false"), "boolean")
        .when(first == "{", "object")
        .when(first == "[", "array")
        .otherwise("number")  # digits, '-', or a non-finite number Spark quoted
    )


def text_of(raw: Column) -> Column:
    return F.substring(raw, 2, 1 << 30)


def number_of(raw: Column) -> Column:
    """The double a number's text stands for (NaN and infinities included)."""
    return (
        F.when(raw == _NON_FINITE[0], F.lit(float("nan")))
        .when(raw == _NON_FINITE[1], F.lit(float("inf")))
        .when(raw == _NON_FINITE[2], F.lit(float("-inf")))
        .when(kind_of(raw) == "number", raw.try_cast("double"))
    )


def scalar_object(raw: Column) -> Column:
    """True when ``raw`` (an object's JSON text, marked) maps text keys to numbers,
    booleans or text only (``dict[str, float | int | str | bool]``)."""
    values = F.map_values(last_wins(F.from_json(raw, "map<string, string>", _READ_OPTIONS)))
    return F.forall(values, lambda v: v.isNotNull() & ~F.substring(v, 1, 1).isin("{", "["))


# ------------------------------------------------------------------------------ timestamps

#: ``datetime.isoformat()``'s own shape with values Spark's cast reads the same way.
_FAST_ISO: Final = (
    r"^(?!0000)\d{4}-\d{2}-\d{2}T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{6})?"
    r"(?:Z|[+-](?:0\d|1[0-7]):[0-5]\d)\z"
)
#: CPython 3.11 ``_parse_hh_mm_ss_ff`` where an offset follows: its result may then be 1
#: (one stray character after a component, anything after six fraction digits).
_F: Final = r"(?:\d{6}.*+|\d{0,5})"  # a fraction: up to six digits, the rest skipped
_ANY: Final = "."  # one stray character
_TIME_BEFORE_OFFSET: Final = (
    rf"(?s)\d{{2}}(?:{_ANY}"
    rf"|:\d{{2}}(?:{_ANY}|:\d{{2}}(?:{_ANY}|[:.,]{_F})?|[.,]{_F})?"  # HH:MM[:SS]
    rf"|[.,]{_F}"  # HH.fff
    rf"|\d{{2}}(?:{_ANY}|[.,]{_F}|\d{{2}}(?:{_ANY}|[.,]{_F}|\d{{6}}.*+|\d{{2,5}})?)?"  # HHMM[SS]
    r")?"
)
#: The same parse where it must end the string (an offset, or a time without one).
_TIME_TO_END: Final = (
    r"\d{2}(?::\d{2}(?::\d{2}(?:[:.,]\d++)?|[.,]\d++)?|[.,]\d++"
    r"|\d{2}(?:[.,]\d++|\d{2}(?:[.,]\d++|\d{2,}+)?)?)?"
)
#: Hours, minutes, seconds and fraction digits of a time that matched one of the above:
#: extended (``HH:MM:SS``) or basic (``HHMMSS``), the fraction after ``.`` ``,`` or ``:``.
_EXTENDED: Final = r"^(\d{2})(?::(\d{2})(?::(\d{2}))?)?(?:[:.,](\d{0,6}))?"
_BASIC: Final = r"^(\d{2})(\d{2})?(\d{2})?(?:[.,](\d{0,6})|(\d{2,6}))?"
#: The date forms ``_find_isoformat_datetime_separator`` can cut.
_DATE: Final = r"^(\d{4})(?:-(\d{2})-(\d{2})|(\d{2})(\d{2})|-W(\d{2})(?:-(\d))?|W(\d{2})(\d)?)\z"
_MAX_OFFSET_SECONDS: Final = 24 * 3600
_FIRST: Final = "0001-01-01 00:00:00"
_LAST: Final = "9999-12-31 23:59:59.999999"


def _group(text: Column, pattern: str, index: int) -> Column:
    """Group ``index`` of ``pattern`` in ``text``; null when it did not take part."""
    got = F.regexp_extract(text, pattern, index)
    return F.when(got != "", got)


def _micros(digits: Column) -> Column:
    """Fraction digits (up to six, maybe none) as microseconds."""
    return F.coalesce(F.rpad(digits, 6, "0").try_cast("long"), F.lit(0).cast("long"))


def _with_hms(frame: DataFrame, text: str, out: str) -> DataFrame:
    """``{out}_h``, ``_m``, ``_s``, ``_u`` (hours, minutes, seconds, microseconds) of a
    time text that passed one of the time grammars (0 for what it lacks)."""
    time = F.col(text)
    extended = F.substring(time, 3, 1).isin(":", ".", ",") | (F.length(time) <= 3)
    frame = frame.select("*", extended.alias(f"{out}_ext"))
    extended = F.col(f"{out}_ext")
    parts = [
        F.when(extended, _group(time, _EXTENDED, i)).otherwise(_group(time, _BASIC, i))
        for i in (1, 2, 3, 4)
    ]
    # basic HHMMSS then digits: the fraction starts right after the seconds
    fraction = F.coalesce(parts[3], F.when(~extended, _group(time, _BASIC, 5)))
    h, m, s = (F.coalesce(p.try_cast("long"), F.lit(0).cast("long")) for p in parts[:3])
    return frame.select(
        "*",
        h.alias(f"{out}_h"),
        m.alias(f"{out}_m"),
        s.alias(f"{out}_s"),
        _micros(fraction).alias(f"{out}_u"),
    ).drop(f"{out}_ext")


def _separator_at(ts: Column) -> Column:
    """Where CPython 3.11 cuts date from time (``_find_isoformat_datetime_separator``)."""
    n = F.length(ts)

    def at(i: int) -> Column:  # the character at 0-based position i
        return F.substring(ts, i + 1, 1)

    week_run = F.length(F.regexp_extract(F.substring(ts, 8, 1 << 30), r"^\d*+", 0)) + 7
    return (
        F.when((at(4) == "-") & (at(5) == "W"),
            F.when((n > 8) & (at(8) == "-"),
                F.when(n == 9, F.lit(None))
                .when((n > 10) & at(10).rlike(r"^\d$"), 8)
                .otherwise(10))
            .otherwise(8))
        .when(at(4) == "-", 10)
        .when(at(4) == "W",
            F.when(week_run < 9, week_run).when(week_run % 2 == 0, 7).otherwise(8))
        .otherwise(8)
    )  # fmt: skip


def _with_date(frame: DataFrame, text: str, out: str) -> DataFrame:
    """``{out}``: the date of a date part (``YYYY-MM-DD``, ``YYYYMMDD``, ``YYYY-Www[-D]``,
    ``YYYYWww[D]``), null when it is not a valid date."""
    src = F.col(text)
    frame = frame.select(
        "*",
        *[_group(src, _DATE, i).try_cast("int").alias(f"{out}_{i}") for i in range(1, 10)],
    )
    g = [F.lit(None)] + [F.col(f"{out}_{i}") for i in range(1, 10)]
    year, month, day = g[1], F.coalesce(g[2], g[4]), F.coalesce(g[3], g[5])
    week, weekday = F.coalesce(g[6], g[8]), F.coalesce(g[7], g[9], F.lit(1))
    # (only well-formed text reaches a try_ conversion: a failed one costs an exception)
    calendar = F.when(
        year.isNotNull() & month.between(1, 12) & day.between(1, 31),
        F.try_to_date(F.format_string("%04d-%02d-%02d", year, month, day), "yyyy-MM-dd"),
    )
    jan1 = F.when(
        year.isNotNull(), F.try_to_date(F.format_string("%04d-01-01", year), "yyyy-MM-dd")
    )
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    thursday, wednesday = 5, 4  # F.dayofweek: 1 = Sunday
    long_year = (F.dayofweek(jan1) == thursday) | (leap & (F.dayofweek(jan1) == wednesday))
    jan4 = F.date_add(jan1, 3)
    monday1 = F.date_sub(jan4, (F.dayofweek(jan4) + 5) % 7)
    week_ok = (week >= 1) & ((week <= 52) | ((week == 53) & long_year))
    by_week = F.when(
        week_ok & (weekday >= 1) & (weekday <= 7),
        F.date_add(monday1, (week - 1) * 7 + weekday - 1),
    )
    got = F.when(year >= 1, F.when(week.isNotNull(), by_week).otherwise(calendar))
    return frame.select("*", got.alias(out)).drop(*[f"{out}_{i}" for i in range(1, 10)])


def with_timestamp(frame: DataFrame, text: str, out: str) -> DataFrame:
    """``frame`` with ``{out}`` and ``{out}_naive``: the timestamp text ``text`` as
    ``datetime.fromisoformat`` reads it.

    ``{out}`` is the UTC instant when the text is valid, carries an offset and is in
    range; ``{out}_naive`` is true when it is valid without one (the contract refuses
    those with "timestamp must carry a time zone")."""
    src = F.col(text)
    fast = src.rlike(_FAST_ISO)
    frame = frame.select("*", F.when(~fast, src).alias(f"{out}_s"), fast.alias(f"{out}_fast"))
    ts = F.col(f"{out}_s")  # null for the fast ones: the steps below skip them
    frame = frame.select("*", _separator_at(ts).alias(f"{out}_sep"))
    sep = F.col(f"{out}_sep")
    frame = frame.select(
        "*",
        F.substring(ts, 1, sep).alias(f"{out}_d"),
        (F.length(ts) > sep).alias(f"{out}_has_time"),  # a separator character, any
        F.substring(ts, sep + 2, 1 << 30).alias(f"{out}_rest"),
    )
    rest = F.col(f"{out}_rest")
    frame = frame.select("*", F.regexp_extract(rest, r"^[^Z+\-]*+", 0).alias(f"{out}_t"))
    time = F.col(f"{out}_t")
    frame = frame.select(
        "*",
        F.substring(rest, F.length(time) + 1, 1).alias(f"{out}_z"),
        F.substring(rest, F.length(time) + 2, 1 << 30).alias(f"{out}_o"),
    )
    frame = _with_date(frame, f"{out}_d", f"{out}_day")
    frame = _with_hms(frame, f"{out}_t", f"{out}_tm")
    frame = _with_hms(frame, f"{out}_o", f"{out}_om")
    day, zone, offset = F.col(f"{out}_day"), F.col(f"{out}_z"), F.col(f"{out}_o")
    has_time = F.col(f"{out}_has_time")
    h, m, s, us = (F.col(f"{out}_tm_{x}") for x in "hmsu")
    oh, om, osec, ous = (F.col(f"{out}_om_{x}") for x in "hmsu")
    readable = (
        (F.length(ts) >= 7)
        & day.isNotNull()
        & ~ts.contains("\x00")
        & (day <= F.lit("9999-12-31").cast("date"))
    )
    time_valid = (h <= 23) & (m <= 59) & (s <= 59)
    valid_naive = readable & (
        ~has_time | ((zone == "") & time.rlike(f"^(?:{_TIME_TO_END})\\z") & time_valid)
    )
    zone_ok = F.when(zone == "Z", offset == "").otherwise(
        (zone != "") & offset.rlike(f"^(?:{_TIME_TO_END})\\z")
    )
    sign = F.when(zone == "-", -1).otherwise(1)
    offset_us = F.when(zone == "Z", 0).otherwise(
        sign * ((oh * 3600 + om * 60 + osec) * 1_000_000 + ous)
    )
    local_us = F.unix_micros(F.to_timestamp(day)) + (h * 3600 + m * 60 + s) * 1_000_000 + us
    slow_ok = (
        readable
        & has_time
        & time.rlike(f"^(?:{_TIME_BEFORE_OFFSET})\\z")
        & zone_ok
        & time_valid
        & (F.abs(offset_us) < _MAX_OFFSET_SECONDS * 1_000_000)
    )
    frame = frame.select(
        "*",
        F.when(slow_ok, F.timestamp_micros(local_us - offset_us)).alias(f"{out}_slow"),
        F.coalesce(valid_naive, F.lit(False)).alias(f"{out}_vn"),
    )
    instant = F.when(F.col(f"{out}_fast"), src.try_cast("timestamp")).otherwise(
        F.col(f"{out}_slow")
    )
    frame = frame.select("*", instant.alias(f"{out}_i"))
    instant = F.col(f"{out}_i")
    in_range = (instant >= F.lit(_FIRST).cast("timestamp")) & (
        instant <= F.lit(_LAST).cast("timestamp")
    )
    naive = F.when(F.col(f"{out}_fast"), F.lit(False)).otherwise(F.col(f"{out}_vn"))
    helpers = [c for c in frame.columns if c.startswith(f"{out}_")]
    return frame.select(
        "*",
        F.when(in_range, instant).alias(out),
        F.coalesce(naive, F.lit(False)).alias(f"{out}_naive"),
    ).drop(*helpers)
