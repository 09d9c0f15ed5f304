"""Silver's JVM judge (``pipeline/java/LineJudge.java``) against the Python judge.

The same generated landing lines go through ``silver.judged`` twice in the tests'
session: with the JVM judge registered (it judges the lines it recognises, Python the
rest) and with it dropped (Python judges every line). Every column of every row must be
the same. The lines are a bridge's reading lines, each with something changed at the
edges of what the JVM judge takes: the topic's names, the marks, the receive time, the
payload (every number, unit and timestamp text of ``canonical_text``), the late-data
horizon and the plausibility bounds; then the hostile lines of the judge's fuzz test.
The JVM judge must take a good share of them, or the comparison would prove nothing.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import json
import tomllib
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline import session as S
from pipeline.config import PipelineConfig
from pipeline.transforms import silver
from pipeline.transforms.judge import JVM_JUDGE
from tests.test_pipeline_judge import landing_line, marked_line
from tests.test_pipeline_payload import canonical_text

CFG = PipelineConfig()
RECEIVED = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)

# ---------------------------------------------------------------------------- the lines

NAMES = st.one_of(
    st.sampled_from(["gw1", "serial", "env", "temperature", "status", "health", "x" * 128]),
    st.sampled_from(["", "$sys", "a$", "a+b", "a#", "x" * 129, "é", "温度", "😀", "a b", "\x7f"]),
    st.text(max_size=5),
)
#: Receive times: the lander's form, then others fromisoformat reads (or not).
RECEIVED_TEXT = st.one_of(
    st.just("2026-11-21T10:00:00.123456Z"),
    st.sampled_from(
        [
            "2026-11-21T10:00:00Z", "2026-11-21T10:00:00.123Z", "2026-11-21T10:00:00+01:00",
            "2026-11-21T10:00:00-23:59", "2026-11-21T10:00:00.12Z", "2026-11-21T10:00:00",
            "2026-11-21 10:00:00Z", "2026-02-29T10:00:00Z", "2024-02-29T10:00:00Z",
            "2026-11-31T10:00:00Z", "2026-11-21T24:00:00Z", "0001-01-01T00:00:00+01:00",
            "2026-11-21T10:00:00+24:00", "2026-11-21T10:00:00.1234567Z", "2026-11-21T10:00Z",
            "2026-11-21t10:00:00z", "\uff12026-11-21T10:00:00Z", "yesterday", "",
        ]
    ),
)  # fmt: skip
SEQ = st.one_of(
    st.integers(0, 10**18 - 1).map(str),
    st.sampled_from(["0", "007", "", "x", "1" * 19, "-1", "+1", "1.0", "\u0661", "\uff11", " 1"]),
)


def stamp_near(offset_minutes: int) -> str:
    """A timestamp ``offset_minutes`` from the receive time, in the gateway's form."""
    return (RECEIVED + timedelta(minutes=offset_minutes)).isoformat()


#: Timestamps around the receive time: plausible, ahead by more than the tolerance,
#: before ``earliest``, and days late (the horizon is three days).
NEAR = st.one_of(
    st.integers(-5 * 24 * 60, 10).map(stamp_near),
    st.sampled_from(["1999-12-31T23:59:59+00:00", "2000-01-01T00:00:00Z", stamp_near(5)]),
    st.sampled_from([stamp_near(6), stamp_near(-3 * 24 * 60 - 600), stamp_near(-4 * 24 * 60)]),
)


@st.composite
def payloads(draw: st.DrawFn) -> str:
    """The gateway's payload shape, with every kind of value and timestamp."""
    if draw(st.booleans()):
        return draw(canonical_text())
    value = draw(st.sampled_from(["21.5", "-0", "-0.0", "7", "true", '"on"', "1e5", "0.1e-3"]))
    unit = json.dumps(draw(st.sampled_from(["°C", "", "V", "%"])), ensure_ascii=False)
    return f'{{"value":{value},"unit":{unit},"timestamp":"{draw(NEAR)}"}}'


@st.composite
def bridge_line(draw: st.DrawFn) -> str:
    """A bridge's reading line as the lander writes it, with one or two things changed."""
    levels = ["gw1", "serial", "env", "temperature"]
    record: dict[str, Any] = {
        "topic": "",
        "payload": draw(payloads()),
        "qos": 1,
        "retain": False,
        "gateway": "gw1",
        "seq": draw(st.integers(0, 10**6).map(str)),
        "received": "2026-11-21T10:00:00.123456Z",
    }
    ascii_only = False
    for _ in range(draw(st.integers(0, 2))):
        change = draw(st.integers(0, 9))
        if change == 0:
            levels[draw(st.integers(0, len(levels) - 1))] = draw(NAMES)
        elif change == 1:
            levels = levels[: draw(st.integers(1, 4))] + draw(st.lists(NAMES, max_size=2)) or ["x"]
        elif change == 2:
            record["seq"] = draw(SEQ)
        elif change == 3:
            record["received"] = draw(RECEIVED_TEXT)
        elif change == 4:
            record["gateway"] = draw(st.one_of(NAMES, st.just(None)))
        elif change == 5:
            record[draw(st.sampled_from(["qos", "retain"]))] = draw(
                st.sampled_from([0, 1, 2, True, False, "1", None])
            )
        elif change == 6:
            ascii_only = True
        elif change == 7:
            record["topic"] = None  # replaced below: another prefix
            levels = [draw(st.sampled_from(["ledge2", "ledg", "Ledge", ""])), *levels]
        elif change == 8:
            keys = draw(st.permutations(list(record)))
            record = {k: record[k] for k in keys}
        else:
            record["payload"] = draw(st.sampled_from(['{"value":1}', "online", '"x"']))
    prefix = [] if record["topic"] is None else ["ledge"]
    record["topic"] = "/".join(prefix + levels)
    record = {k: v for k, v in record.items() if v is not None}
    return json.dumps(record, ensure_ascii=ascii_only, separators=(",", ":"))


def own_line(**changed: Any) -> str:
    """The line the lander writes for a bridge's reading, with ``changed`` fields."""
    record = {
        "topic": "ledge/gw1/serial/env/temperature",
        "payload": '{"value":21.5,"unit":"°C","timestamp":"2026-11-21T10:00:00+00:00"}',
        "qos": 1, "retain": False, "gateway": "gw1", "seq": "42",
        "received": "2026-11-21T10:00:00.123456Z",
    }  # fmt: skip
    record.update(changed)
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


#: The edges of what the JVM judge takes, each on its own.
EDGES = [
    own_line(),
    *[own_line(seq=seq) for seq in ("0", "007", "00", "1" * 18, "1" * 19, "\u0661", "\uff11")],
    *[
        own_line(topic=f"ledge/{name}/serial/env/temperature")
        for name in ("x" * 128, "x" * 129, "$x", "x$", "a+", "#", "é", "温度", "\ufffd", "�")
    ],
    *[own_line(topic=t) for t in ("ledge/gw1/serial/env/status", "ledge/gw1/health", "ledge")],
    *[own_line(received=r) for r in ("2026-11-21T10:00:00Z", "2026-11-21T10:00:00")],
    *[own_line(qos=q) for q in (0, 2, True)],
    own_line(retain=True),
    *[
        own_line(payload=f'{{"value":1,"unit":"","timestamp":"2026-11-21T09:59:59{f}{z}"}}')
        for f in ("", ".1", ".12", ".123", ".1234", ".12345", ".123456", ".1234567", ".")
        for z in ("Z", "+00:00", "-01:30")
    ],
    *[own_line(received=f"2026-11-21T10:00:00{f}Z") for f in (".1", ".12", ".123", ".1234")],
    own_line(payload='{"value":-0,"unit":"","timestamp":"2026-11-21T10:00:00.5+00:00"}'),
    own_line(payload='{"value":-0.0,"unit":"","timestamp":"2026-11-21T09:59:59.999Z"}'),
    own_line(payload='{"value":1e308,"unit":"","timestamp":"2026-11-21T10:00:00Z"}'),
    own_line(payload='{"value":123456789012345678,"unit":"","timestamp":"2026-11-21T10:00:00Z"}'),
]


def drawn(strategy: st.SearchStrategy[str], times: int) -> list[str]:
    """Many lines drawn by hypothesis, to be judged in one Spark job."""
    out: list[str] = []

    @settings(
        max_examples=times * settings().max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(text: str) -> None:
        out.append(text)

    collect()
    return out


# ---------------------------------------------------------------------------- the runs


@contextlib.contextmanager
def python_judge_only(spark: SparkSession) -> Iterator[None]:
    """The session without the JVM judge, then with it again."""
    spark.sql(f"DROP TEMPORARY FUNCTION {JVM_JUDGE}")
    try:
        yield
    finally:
        assert S.register_judge(spark)


def judged_rows(spark: SparkSession, lines: list[str]) -> list[dict[str, Any]]:
    rows = [
        {"line": t, "file": f"f{i:06d}", "landing_date": date(2026, 11, 21)}
        for i, t in enumerate(lines)
    ]
    frame = spark.createDataFrame(rows, silver.LINES)
    out = silver.judged(frame, CFG)
    # (times as numbers: Python's datetime stops at year 1, a judged time may not)
    kinds = dict(out.dtypes)
    plain = out.select(
        *[
            F.unix_micros(c).alias(c) if kinds[c] == "timestamp"
            else F.unix_date(c).alias(c) if kinds[c] == "date" else F.col(c)
            for c in out.columns
        ]
    )  # fmt: skip
    return [r.asDict(recursive=True) for r in plain.orderBy("file").collect()]


def taken_by_jvm(spark: SparkSession, lines: list[str]) -> int:
    """How many of ``lines`` the JVM judge judges itself (not null)."""
    frame = spark.createDataFrame([(t,) for t in lines], "line string")
    fast = silver.jvm_judged(F.col("line"), CFG)
    return int(frame.select(F.count(fast)).first()[0])  # type: ignore[index]


def test_the_session_has_the_jvm_judge(spark: SparkSession) -> None:
    """This machine has a JDK: the tests' session must have the judge, or the
    comparison below would compare the Python judge with itself."""
    assert spark.catalog.functionExists(JVM_JUDGE)
    assert S.judge_jar().is_file()


def test_the_jvm_judge_judges_as_the_python_judge_does(spark: SparkSession) -> None:
    lines = drawn(bridge_line(), 15) + drawn(marked_line() | landing_line(), 3)
    # the gateway's own lines, as the lander writes them, are the JVM judge's to take
    lines += [own_line(payload=p, seq=str(i)) for i, p in enumerate(drawn(payloads(), 3))]
    lines += EDGES
    taken = taken_by_jvm(spark, lines)
    # (about a fifth: the rest were changed past what it takes, and go to Python. In 40
    # draws it took 388 to 508 of 2,162 lines: a bound at a fifth failed one run in ten.)
    assert len(lines) // 10 < taken < len(lines) - len(lines) // 10, (taken, len(lines))
    with_jvm = judged_rows(spark, lines)
    with python_judge_only(spark):
        python = judged_rows(spark, lines)
    wrong = [
        f"{line}\n  JVM:    {a}\n  Python: {b}"
        for line, a, b in zip(lines, with_jvm, python, strict=True)
        if a != b
    ]
    assert not wrong, f"{len(wrong)} of {len(lines)} lines differ:\n" + "\n".join(wrong[:10])


def test_a_line_that_is_not_utf8_is_quarantined_whole_by_either_judge(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A damaged landing file: a byte that is not UTF-8 in one line (Spark reads the
    bytes as they are). That line is quarantined with its reason, the next is a reading,
    with the JVM judge and without it."""
    good = own_line().encode()
    damaged = good.replace("°C".encode(), b"\xb0C")
    (tmp_path / "l.jsonl").write_bytes(damaged + b"\n" + good.replace(b'"42"', b'"43"') + b"\n")
    lines = spark.read.text(str(tmp_path)).select(
        F.col("value").alias("line"),
        F.lit("f").alias("file"),
        F.current_date().alias("landing_date"),
    )
    # kept as its bytes (plain base64, as every payload_base64: no line breaks) and as text
    # that other Parquet readers can read
    shown, b64 = damaged.decode(errors="replace"), base64.b64encode(damaged).decode()
    # (the line's bytes as stored too: PySpark replaces bad bytes itself as it collects)
    wanted = [
        ("quarantine", "unreadable landing line (not UTF-8 text)", None, shown, b64,
         shown.encode()),
        ("reading", None, 43, None, None, None),
    ]  # fmt: skip
    columns = (
        "kind", F.col("extra.reason"), "seq", "line", "extra.payload_base64",
        F.col("line").cast("binary"),
    )  # fmt: skip
    assert [tuple(r) for r in silver.judged(lines, CFG).select(*columns).collect()] == wanted
    with python_judge_only(spark):
        assert [tuple(r) for r in silver.judged(lines, CFG).select(*columns).collect()] == wanted


def test_silver_judges_in_python_alone_without_the_jvm_judge(spark: SparkSession) -> None:
    line = json.dumps(
        {"topic": "ledge/gw1/serial/env/t", "payload": '{"value":1,"unit":"V",'
         '"timestamp":"2026-11-21T10:00:00Z"}', "qos": 1, "retain": False,
         "gateway": "gw1", "seq": "5", "received": "2026-11-21T10:00:00.123456Z"},
        separators=(",", ":"),
    )  # fmt: skip
    frame = spark.createDataFrame([(line, "f", date(2026, 11, 21))], silver.LINES)
    with python_judge_only(spark):
        plan = silver.judged(frame, CFG)
        assert JVM_JUDGE not in plan._jdf.queryExecution().analyzed().toString()
        [row] = plan.collect()
    assert (row["kind"], row["value"], row["unit"], row["seq"]) == ("reading", 1.0, "V", 5)


def test_a_horizon_beyond_an_int_is_judged_alike(spark: SparkSession) -> None:
    """The JVM judge takes the horizon as an int: a larger one (any date is in reach)
    must not fail the job."""
    cfg = PipelineConfig(horizon_days=2**40)
    line = own_line(payload='{"value":1,"unit":"","timestamp":"1999-11-21T10:00:00Z"}')
    frame = spark.createDataFrame([(line, "f", date(2026, 11, 21))], silver.LINES)
    assert frame.select(silver.jvm_judged(F.col("line"), cfg).isNotNull()).first()[0]  # type: ignore[index]
    [row] = silver.judged(frame, cfg).collect()
    assert (row["kind"], row["implausible"], row["day"]) == ("reading", True, date(2026, 11, 21))


# ------------------------------------------------------------------------- the jar


def test_a_session_without_javac_judges_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A JRE alone (no javac beside java): no jar, and the session gets no judge."""
    jre = tmp_path / "jre" / "bin"
    jre.mkdir(parents=True)
    java = S.java_binary()
    assert java is not None
    (jre / "java").symlink_to(java)
    monkeypatch.setattr(S, "java_binary", lambda: jre / "java")
    monkeypatch.setenv("LEDGE_PIPELINE_CACHE", str(tmp_path / "cache"))
    with caplog.at_level("INFO", logger=S.__name__):
        assert S.ready_judge() is None
    assert "no javac" in caplog.text
    assert "spark.jars" not in S.settings("local[2]", {}, judge=None)


def test_the_source_is_installed_with_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A wheel carries the Java source (package data); a source gone judges in Python."""
    data = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["pipeline"]
    relative = S.JUDGE_SOURCE.relative_to(Path(S.__file__).parent).as_posix()
    assert any(fnmatch.fnmatch(relative, p) for p in patterns), patterns
    monkeypatch.setattr(S, "JUDGE_SOURCE", tmp_path / "LineJudge.java")
    with caplog.at_level("INFO", logger=S.__name__):
        assert S.ready_judge() is None
    assert "is missing" in caplog.text


def test_the_jar_is_compiled_once_per_source_and_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGE_PIPELINE_CACHE", str(tmp_path))
    jar = S.ready_judge()
    assert jar is not None and jar.parent == tmp_path
    made = jar.stat().st_mtime_ns
    assert S.ready_judge() == jar and jar.stat().st_mtime_ns == made  # kept, not made again
    edited = tmp_path / "LineJudge.java"
    edited.write_text(S.JUDGE_SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(S, "JUDGE_SOURCE", edited)
    assert S.judge_jar() != jar  # another source, another jar
    conf = S.settings("local[2]", {"spark.jars": "/opt/own.jar"}, judge=jar)
    assert conf["spark.jars"] == f"/opt/own.jar,{jar}"  # after the user's own
    # ... and after spark-defaults.conf's, which the session's value would replace
    (tmp_path / "spark-defaults.conf").write_text(
        "# jars\nspark.jars\t/opt/a.jar,/opt/b.jar  \nspark.jarsx /no\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    conf = S.settings("local[2]", {}, judge=jar)
    assert conf["spark.jars"] == f"/opt/a.jar,/opt/b.jar,{jar}"
    assert S.settings("local[2]", {"spark.jars": ""}, judge=jar)["spark.jars"] == str(jar)
