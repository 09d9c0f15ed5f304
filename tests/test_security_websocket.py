"""MQTT over WebSockets: the frame reader byte by byte and fuzzed, the upgrade, and real
clients (paho, plain and TLS) and raw frames against ``ledge run``."""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.mqtt import MQTT_311, Connect, encode
from gateway.net.websocket import (
    BINARY,
    CLOSE,
    PING,
    PONG,
    FrameReader,
    handshake,
    unmask,
)
from tests.support.certs import Certs
from tests.support.clients import Paho
from tests.support.procs import LedgeProcess


def client_frame(opcode: int, payload: bytes, fin: bool = True, mask: bytes = b"abcd") -> bytes:
    """A masked client frame (RFC 6455 section 5.2)."""
    head = bytes(((0x80 if fin else 0) | opcode,))
    n = len(payload)
    if n < 126:
        head += bytes((0x80 | n,))
    elif n < 65_536:
        head += bytes((0x80 | 126,)) + n.to_bytes(2, "big")
    else:
        head += bytes((0x80 | 127,)) + n.to_bytes(8, "big")
    return head + mask + unmask(payload, mask, 0)


# ----------------------------------------------------------------------- sans-IO


def test_unmask_is_its_own_inverse_at_any_offset() -> None:
    data = os.urandom(1001)
    for offset in range(4):
        assert unmask(unmask(data, b"\x01\x02\x03\x04", offset), b"\x01\x02\x03\x04", offset) == (
            data
        )
    assert unmask(b"\x00\x00\x00\x00\x00", b"wxyz", 1) == b"xyzwx"


def test_fragmented_binary_message_with_a_ping_between_streams_out_in_order() -> None:
    data = (
        client_frame(BINARY, b"hello ", fin=False)
        + client_frame(PING, b"p")
        + client_frame(0, b"big ", fin=False)
        + client_frame(0, b"world" * 30_000)
    )
    whole = FrameReader().feed(data)
    assert b"".join(p for op, p in whole if op == BINARY) == b"hello big " + b"world" * 30_000
    assert [(op, p) for op, p in whole if op != BINARY] == [(PING, b"p")]
    reader = FrameReader()
    byte_wise = [e for i in range(len(data)) for e in reader.feed(data[i : i + 1])]
    assert b"".join(p for op, p in byte_wise if op == BINARY) == b"".join(
        p for op, p in whole if op == BINARY
    )
    assert reader.error is None


@pytest.mark.parametrize(
    ("frame", "code", "why"),
    [
        (client_frame(0x1, b"text"), 1003, "text frame"),
        (client_frame(BINARY, b"x")[:1] + b"\x01x", 1002, "not masked"),
        (bytes((0xC2, 0x81)) + b"abcdx", 1002, "reserved bits"),
        (client_frame(0x3, b""), 1002, "unknown opcode"),
        (client_frame(PING, b"x", fin=False), 1002, "control frame fragmented"),
        (client_frame(PING, b"x" * 126), 1002, "control frame fragmented or too long"),
        (client_frame(0, b"x"), 1002, "continuation without a message"),
        (client_frame(BINARY, b"a", fin=False) + client_frame(BINARY, b"b"), 1002, "new message"),
        (client_frame(CLOSE, b"\x03"), 1002, "one-byte payload"),
        (b"\x82\xff\x80" + b"\x00" * 7 + b"abcd", 1002, "top bit"),
    ],
)
def test_protocol_violations_close_with_the_rfc_6455_code(
    frame: bytes, code: int, why: str
) -> None:
    reader = FrameReader()
    reader.feed(frame)
    assert reader.error is not None
    assert reader.error.code == code and why in reader.error.reason


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=8))
def test_any_bytes_in_any_chunks_give_the_same_events_and_never_raise(
    data: bytes, cuts: list[int]
) -> None:
    whole = FrameReader()
    expected = whole.feed(data)
    chunked = FrameReader()
    got = []
    points = sorted({min(c, len(data)) for c in cuts})
    for a, b in zip([0, *points], [*points, len(data)], strict=True):
        got.extend(chunked.feed(data[a:b]))
    joined = [(op, b"".join(p for o, p in got if o == BINARY)) for op in (BINARY,)]
    assert joined == [(BINARY, b"".join(p for o, p in expected if o == BINARY))]
    assert [e for e in got if e[0] != BINARY] == [e for e in expected if e[0] != BINARY]
    assert (chunked.error is None) == (whole.error is None)


def _request(path: str = "/mqtt", protocol: str | None = "mqtt", **headers: str) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        "Host: x",
        "Upgrade: websocket",
        "Connection: keep-alive, Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if protocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_accept_key_is_the_rfc_6455_example() -> None:
    """RFC 6455 section 1.3: key "dGhlIHNhbXBsZSBub25jZQ==" gives this accept value."""
    request = _request().split(b"Sec-WebSocket-Key: ")
    request[1] = b"dGhlIHNhbXBsZSBub25jZQ==" + request[1][request[1].index(b"\r\n") :]
    answer = handshake(b"Sec-WebSocket-Key: ".join(request), "/mqtt")
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in answer.response


@pytest.mark.parametrize(
    ("request_bytes", "status", "subprotocol"),
    [
        (_request(), b"101", "mqtt"),
        (_request(protocol="wamp, mqttv3.1"), b"101", "mqttv3.1"),
        (_request(protocol=None), b"101", None),  # no list offered: accepted as MQTT
        (_request(protocol="wamp"), b"400", None),
        (_request(path="/other"), b"404", None),
        (_request().replace(b"Version: 13", b"Version: 8"), b"426", None),
        (_request().replace(b"Upgrade: websocket", b"Upgrade: h2c"), b"426", None),
        (b"POST /mqtt HTTP/1.1\r\n\r\n", b"400", None),
    ],
    # Named: the requests carry a random key, and every worker must collect the same ids.
    ids=[
        "mqtt",
        "mqttv3.1-of-two",
        "no-list",
        "wamp-only",
        "other-path",
        "version-8",
        "h2c",
        "post",
    ],
)
def test_upgrade_answers(request_bytes: bytes, status: bytes, subprotocol: str | None) -> None:
    answer = handshake(request_bytes, "/mqtt")
    assert answer.response.split(b" ")[1] == status
    assert answer.subprotocol == subprotocol
    assert (answer.error is None) == (status == b"101")


# ----------------------------------------------------------------------- real sockets


@pytest.fixture(scope="module")
def ws_ledge(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[LedgeProcess]:
    config = tmp_path_factory.mktemp("ws") / "ledge.toml"
    config.write_text(
        '[[listeners]]\nport = 0\ntype = "websocket"\n'
        '[[listeners]]\nport = 0\ntype = "websocket-tls"\npath = "/secure"\n'
        f'certfile = "{certs.server_cert}"\nkeyfile = "{certs.server_key}"\n'
        "[broker]\nconnect_timeout = 2\n"
    )
    proc = LedgeProcess(config=config, listen=False).start(listeners=2)
    yield proc
    assert proc.stop() == 0


@pytest.mark.parametrize("version", [5, 4])
def test_paho_over_websockets_plain_and_tls(
    ws_ledge: LedgeProcess, certs: Certs, version: int
) -> None:
    ws, wss = ws_ledge.ports
    sub = Paho(ws, f"ws-sub-{version}", version, transport="websockets").connect()
    sub.subscribe(f"ws/{version}/#", 1)
    pub = Paho(
        wss, f"wss-pub-{version}", version, transport="websockets", ws_path="/secure",
        ca=str(certs.ca),
    ).connect()  # fmt: skip
    payload = os.urandom(200_000)  # many frames' worth
    pub.publish(f"ws/{version}/big", payload, 1)
    pub.publish(f"ws/{version}/small", b"x", 1)
    got = sub.wait_messages(2)
    assert [(m.topic, m.payload) for m in got] == [
        (f"ws/{version}/big", payload),
        (f"ws/{version}/small", b"x"),
    ]
    sub.disconnect()
    pub.disconnect()


def _upgraded(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(_request())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101 ")
    assert b"Sec-WebSocket-Protocol: mqtt\r\n" in head
    return sock


def _read_frames(sock: socket.socket, at_least: int) -> bytes:
    data = b""
    while len(data) < at_least:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_mqtt_split_across_fragmented_frames_with_a_ping(ws_ledge: LedgeProcess) -> None:
    connect = encode(Connect("raw-ws", MQTT_311), MQTT_311)
    with _upgraded(ws_ledge.ports[0]) as sock:
        sock.sendall(
            client_frame(BINARY, connect[:3], fin=False)
            + client_frame(PING, b"are you there")
            + client_frame(0, connect[3:], fin=True)
        )
        data = _read_frames(sock, 2 + 13 + 2 + 4)
        pong = bytes((0x80 | PONG, 13)) + b"are you there"
        connack = bytes((0x80 | BINARY, 4)) + b"\x20\x02\x00\x00"
        assert data == pong + connack


def test_text_frame_is_closed_with_1003(ws_ledge: LedgeProcess) -> None:
    with _upgraded(ws_ledge.ports[0]) as sock:
        sock.sendall(client_frame(0x1, b"not binary"))
        data = _read_frames(sock, 4)
        assert data[:4] == bytes((0x80 | CLOSE, 2 + len(data) - 4))[:2] + (1003).to_bytes(2, "big")
        assert sock.recv(100) == b""
    ws_ledge.wait_log("text frame")


def test_wrong_path_gets_404(ws_ledge: LedgeProcess) -> None:
    with socket.create_connection(("127.0.0.1", ws_ledge.ports[0]), timeout=5) as sock:
        sock.sendall(_request(path="/nope"))
        assert _read_frames(sock, 12).startswith(b"HTTP/1.1 404 ")


def test_upgrade_never_completed_is_closed_at_the_deadline(ws_ledge: LedgeProcess) -> None:
    with socket.create_connection(("127.0.0.1", ws_ledge.ports[0]), timeout=6) as sock:
        sock.sendall(b"GET /mqtt HTTP/1.1\r\n")  # and nothing more
        assert sock.recv(100) == b""
    ws_ledge.wait_log("WebSocket upgrade not completed in time")


def test_websocket_listener_port_is_all_it_serves(tmp_path: Path) -> None:
    """A WebSocket listener does not speak raw MQTT: a CONNECT is an HTTP error."""
    config = tmp_path / "c.toml"
    config.write_text('[[listeners]]\nport = 0\ntype = "websocket"\n')
    proc = LedgeProcess(config=config, listen=False).start()
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=5) as sock:
            sock.sendall(encode(Connect("x", MQTT_311), MQTT_311) + b"\r\n\r\n")
            assert _read_frames(sock, 12).startswith(b"HTTP/1.1 400 ")
    finally:
        assert proc.stop() == 0


def test_nothing_after_a_close_frame_is_read_even_in_later_chunks() -> None:
    """RFC 6455 5.5.1. Found by the fuzzer (tests/vectors/fuzz/websocket-frames-after-
    close-in-a-later-chunk.bin): frames arriving after a Close in a later chunk were read."""
    mask = b"\x01\x02\x03\x04"
    close = b"\x88\x82" + mask + unmask(b"\x03\xe8", mask, 0)
    data = b"\x82\x82" + mask + unmask(b"\xc0\x00", mask, 0)
    reader = FrameReader()
    assert reader.feed(close) == [(CLOSE, b"\x03\xe8")]
    assert reader.feed(data) == []
