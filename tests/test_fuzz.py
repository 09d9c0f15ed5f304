"""Fuzzing in the suite: the fuzz targets (``fuzz/targets.py``) under hypothesis, a
short coverage-guided atheris run, and every crash ever found replayed by name.

The long run is ``make fuzz``; a crash it finds is copied into ``tests/vectors/fuzz/``
as ``<target>-<what went wrong>.bin`` and replayed here from then on.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.targets import (
    TARGETS,
    fuzz_codec,
    fuzz_fastpath,
    fuzz_http,
    fuzz_session,
    fuzz_websocket,
)

REPO = Path(__file__).resolve().parents[1]
VECTORS = sorted((REPO / "tests" / "vectors" / "fuzz").glob("*.bin"))


@pytest.mark.parametrize("vector", VECTORS, ids=[v.stem for v in VECTORS])
def test_fuzz_regression_vector(vector: Path) -> None:
    target = vector.stem.split("-", 1)[0]
    TARGETS[target](vector.read_bytes())


def test_regression_vectors_are_named_after_their_target() -> None:
    assert VECTORS, "tests/vectors/fuzz/ is empty"
    for vector in VECTORS:
        assert vector.stem.split("-", 1)[0] in TARGETS, vector.name


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_codec_target_holds_on_arbitrary_bytes(data: bytes) -> None:
    fuzz_codec(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_fastpath_target_holds_on_arbitrary_bytes(data: bytes) -> None:
    fuzz_fastpath(data)


def test_fastpath_target_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is live: a peek that reads the packet identifier wrong is caught."""
    from fuzz import targets
    from gateway.mqtt.fastpath import peek_publish

    def off_by_one(*args: Any) -> tuple[str, int, int, int] | None:
        peeked = peek_publish(*args)
        return None if peeked is None else (peeked[0], peeked[1], peeked[2] + 1, peeked[3])

    monkeypatch.setattr(targets, "peek_publish", off_by_one)
    # MQTT 3.1.1 QoS 1 PUBLISH on "a", packet id 1, payload "x".
    with pytest.raises(AssertionError, match="peek"):
        fuzz_fastpath(bytes([0, 0x02, 0, 6, 0, 1, 0x61, 0, 1, 0x78]))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=1024))
def test_session_target_holds_on_arbitrary_programs(data: bytes) -> None:
    fuzz_session(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=1024))
def test_websocket_target_holds_on_arbitrary_bytes(data: bytes) -> None:
    fuzz_websocket(data)


def test_session_target_can_fail() -> None:
    """The invariants are live: a broker that leaks a slot is caught."""
    from gateway.broker import core

    original = core.Broker.connection_lost

    def leaky(self: core.Broker, conn: object, now: float) -> None:
        original(self, conn, now)  # type: ignore[arg-type]
        if self.free:
            self.free.pop()

    core.Broker.connection_lost = leaky  # type: ignore[method-assign]
    try:
        with pytest.raises(AssertionError, match="slots leaked"):
            fuzz_session(bytes([0, 0, 0, 0, 3, 0]))
    finally:
        core.Broker.connection_lost = original  # type: ignore[method-assign]


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris")
def test_short_coverage_guided_run(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fuzz", "--runs", "4000", "--quiet", "--workdir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "crashes: none" in out.stdout
    for target in TARGETS:
        assert f"fuzz {target}: 4,00" in out.stdout, out.stdout


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=1024))
def test_http_target_holds_on_arbitrary_programs(data: bytes) -> None:
    fuzz_http(data)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(3, 4), st.integers(0, 10), st.integers(0, 255)), max_size=40),
    st.integers(0, 255),
)
def test_http_target_holds_on_request_pieces(ops: list[tuple[int, int, int]], flags: int) -> None:
    fuzz_http(bytes([flags, *[b for op in ops for b in op]]))


def test_http_target_can_fail() -> None:
    """The invariants are live: a listener that forgets its header bound is caught."""
    from gateway.net import http

    original = http.HTTPProtocol.__init__

    def unbounded(self: http.HTTPProtocol, server: http.HTTPServer) -> None:
        original(self, server)
        self.conn._max_incomplete_event_size = 10**9

    http.HTTPProtocol.__init__ = unbounded  # type: ignore[method-assign]
    try:
        program = bytes([0]) + bytes([3, 9]) * 60  # filler headers, never a blank line
        with pytest.raises(AssertionError, match="h11 holds"):
            fuzz_http(program)
    finally:
        http.HTTPProtocol.__init__ = original  # type: ignore[method-assign]


@given(st.binary(max_size=512))
def test_landing_line_target_holds_on_arbitrary_bytes(data: bytes) -> None:
    TARGETS["landing_line"](data)


def test_landing_line_target_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariants are live: a reason quoting a lone surrogate unescaped is caught."""
    from pipeline.transforms import judge

    monkeypatch.setattr(judge, "storable", lambda text: True)  # nothing is ever escaped
    payload = b'{"value":1,"timestamp":"\\ud800"}'
    with pytest.raises((UnicodeEncodeError, pa.ArrowException)):
        TARGETS["landing_line"](b"\x01" + payload)
