"""The pipeline benchmark's floor runs DuckDB's own query in Spark SQL: it must be the same
query, row for row, or the floor measures other work."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyspark.sql import SparkSession

from bench import pipeline_reference as reference
from bench.pipeline import duckdb_reference, spark_reference
from pipeline.generate import BAD_RECEIVED, Message, Spec, generate, write_landing
from pipeline.records import landing_line, received_text


def _rows(parquet: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """(gateway, device, quantity, UTC start) -> (count, min, max, mean), read by DuckDB."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    got = con.execute(
        "SELECT gw, device, quantity, CAST(start AS TIMESTAMP), n, min, max, mean "
        f"FROM read_parquet('{parquet}')"
    ).fetchall()
    rows = {tuple(r[:4]): tuple(r[4:]) for r in got}
    assert len(rows) == len(got), "a key twice"
    return rows


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated fleet's landing files, with lines made to catch a loose translation."""
    # every fault the generator makes: redeliveries, reused sequence numbers, payloads
    # that are not JSON, booleans, numbers beyond a double, text values, bad timestamps,
    # a receive time that cannot be read
    messages, _ = generate(Spec())
    # and lines where a looser translation would keep other rows: a sequence number used
    # by two messages (the first to arrive is kept), and one of 19 digits (left out)
    made = [
        ("7", datetime(2026, 1, 1, 12, 0, 1, tzinfo=UTC), 1.5),
        ("7", datetime(2026, 1, 1, 12, 0, 2, tzinfo=UTC), 99.0),
        ("1234567890123456789", datetime(2026, 1, 1, 12, 0, 3, tzinfo=UTC), 50.0),
    ]
    # A receive time that cannot be read leaves the line out (the pipeline quarantines it),
    # in both engines and before the copies are told apart: kept, it would sort first in
    # Spark and last in DuckDB.
    unreadable = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    made += [("8", unreadable, 99.0), ("8", datetime(2026, 1, 1, 12, 0, 4, tzinfo=UTC), 2.5)]
    made += [("9", unreadable, 77.0)]
    for seq, received, value in made:
        payload = json.dumps({"value": value, "timestamp": received.isoformat()}).encode()
        device = {"7": "made0", "8": "made1", "9": "made2"}.get(seq, "made0")
        line = landing_line(
            f"ledge/gwx/serial/{device}/temperature", payload, 1, False, "gwx", seq, received
        )
        if received == unreadable:
            line = line.replace(received_text(received), BAD_RECEIVED)
        messages.append(Message(received, line))
    assert sum(BAD_RECEIVED in m.line for m in messages) == 3  # (the generator's own, too)
    root = tmp_path_factory.mktemp("fleet")
    write_landing(root, messages)
    return root / "landing"


def test_duckdbs_query_in_spark_sql_gives_duckdbs_rows(
    spark: SparkSession, landing: Path, tmp_path: Path
) -> None:
    duckdb_reference(landing, tmp_path, threads=2)
    spark_reference(spark, landing, tmp_path)
    _same_rows(tmp_path, "spark")


def test_the_single_pass_reference_gives_duckdbs_rows(
    spark: SparkSession, landing: Path, tmp_path: Path
) -> None:
    """The plain PySpark reference ``make pipeline-bench`` times the pipeline against
    computes what DuckDB computes, row for row (malformed receive times included)."""
    duckdb_reference(landing, tmp_path, threads=2)
    reference.run(spark, landing, tmp_path)
    _same_rows(tmp_path, "reference")


def _same_rows(out: Path, name: str) -> None:
    """DuckDB's rows and ``name``'s under ``out``, for both buckets, are the same."""
    for bucket in ("minute", "hour"):
        duck = _rows(str(out / f"duckdb_{bucket}.parquet"))
        ours = _rows(f"{out / f'{name}_{bucket}'}/*.parquet")
        assert duck and any(n > 1 for n, *_ in duck.values())
        for device, want in (("made0", [(1, 1.5, 1.5, 1.5)]), ("made1", [(1, 2.5, 2.5, 2.5)])):
            kept = [v for k, v in duck.items() if k[:3] == ("gwx", device, "temperature")]
            assert kept == want, (device, kept)
        assert not [k for k in duck if k[1] == "made2"]
        assert sorted(ours) == sorted(duck), bucket
        for key, (n, low, high, mean) in duck.items():
            got = ours[key]
            assert got[:3] == (n, low, high), (bucket, key, got, duck[key])
            # (the mean's last bits depend on the order the rows are added in)
            same = mean == got[3] or math.isclose(mean, got[3], rel_tol=1e-12)
            assert same, (bucket, key, got, duck[key])
