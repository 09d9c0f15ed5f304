"""The HTTP listener over real sockets against ``ledge run``: what it serves, every
bound and its status code, hostile input that never disturbs MQTT clients, Basic
authentication against a password file made by Debian's mosquitto_passwd, bearer
tokens, HTTPS with the MQTT listeners' TLS settings, and no HTTP code in a gateway
without ``[http]``."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.app.runtime import RuntimeConfig, file_warnings
from gateway.net.http import WRITE_HIGH
from gateway.net.http_settings import HTTPSettings
from tests.support.certs import Certs
from tests.support.clients import Paho
from tests.support.http_flood import SlowRequests
from tests.support.procs import LedgeProcess
from tests.support.wait import wait_for

HTTP_LIMITS = """
[http]
enabled = true
port = 0
request_timeout = 1.0
keepalive_timeout = 1.0
max_connections = 4
max_requests = 3
max_header_bytes = 2048
"""


def start(tmp_path: Path, http: str = HTTP_LIMITS, extra: str = "") -> LedgeProcess:
    config = tmp_path / "ledge.toml"
    config.write_text(f'[gateway]\nid = "gw1"\n{extra}\n{http}\n')
    return LedgeProcess(config=config).start(listeners=2)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[LedgeProcess]:
    proc = start(tmp_path)
    yield proc
    assert proc.stop() == 0


def http_port(proc: LedgeProcess) -> int:
    return proc.ports[1]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool


class Client:
    """A raw HTTP client: bytes out as given, responses read one at a time."""

    def __init__(
        self,
        port: int,
        timeout: float = 5.0,
        source: str = "127.0.0.1",
        receive_buffer: int | None = None,
    ) -> None:
        """``receive_buffer``: SO_RCVBUF, set before connecting (the window it offers)."""
        self.sock = socket.socket()
        try:
            if receive_buffer is not None:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self.sock.settimeout(timeout)
            self.sock.bind((source, 0))
            self.sock.connect(("127.0.0.1", port))
        except OSError:
            self.sock.close()
            raise
        self.file = self.sock.makefile("rb")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self, head: bool = False) -> Answer:
        status_line = self.file.readline()
        if not status_line:
            raise AssertionError("closed before a response")
        status = int(status_line.split(b" ")[1])
        headers: dict[str, str] = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.lower()] = value.strip()
        length = 0 if head else int(headers.get("content-length", "0"))
        body = self.file.read(length) if length else b""
        closed = False
        if headers.get("connection") == "close":
            try:
                closed = self.file.read(1) == b""
            except OSError:
                closed = True
        return Answer(status, headers, body, closed)

    def at_end(self) -> bool:
        """The server closed the connection (nothing more to read)."""
        try:
            return self.file.read(1) == b""
        except ConnectionResetError:
            return True


def exchange(port: int, request: bytes, timeout: float = 5.0) -> Answer:
    """Send raw bytes, read one response (and whether the server then closed)."""
    with Client(port, timeout) as client:
        client.send(request)
        return client.answer()


def get(port: int, path: str, headers: dict[str, str] | None = None) -> Answer:
    lines = [f"GET {path} HTTP/1.1", "Host: gw1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode())


@dataclass
class Canary:
    """An MQTT 5.0 subscriber and a QoS 1 publisher running throughout a test: every
    message must arrive, in order, and neither client may be disconnected."""

    port: int
    sent: int = 0
    error: str = ""
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.sub = Paho(self.port, "canary-sub").connect()
        self.sub.subscribe("canary/#", qos=1)
        self.pub = Paho(self.port, "canary-pub").connect()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.sent >= 5 or self.error, 10, "the canary to fly")

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.pub.publish("canary/tick", str(self.sent).encode(), qos=1)
            except (AssertionError, RuntimeError) as exc:  # reported by check()
                self.error = str(exc)
                return
            self.sent += 1
            self.stop.wait(0.02)

    def check(self) -> None:
        """Let a few more messages through, then stop and check them all."""
        more = self.sent + 10
        wait_for(lambda: self.sent >= more or self.error, 10, "the canary to keep flying")
        self.stop.set()
        self.thread.join(10)
        assert not self.error, self.error
        got = self.sub.wait_messages(self.sent, timeout=10)
        assert [int(m.payload) for m in got] == list(range(self.sent))
        assert not self.sub.disconnects and not self.pub.disconnects
        self.sub.disconnect()
        self.pub.disconnect()


# ----------------------------------------------------------------------------- serving


def test_metrics_status_and_page_are_served(gateway: LedgeProcess) -> None:
    port = http_port(gateway)
    metrics = get(port, "/metrics")
    assert metrics.status == 200
    assert metrics.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# TYPE ledge_messages_received_total counter" in metrics.body
    status = get(port, "/api/status")
    assert status.headers["content-type"] == "application/json"
    doc = json.loads(status.body)
    assert doc["gateway"] == "gw1" and doc["listeners"][0]["type"] == "tcp"
    page = get(port, "/")
    assert page.status == 200 and page.body.startswith(b"<!doctype html>")
    assert "script-src 'sha256-" in page.headers["content-security-policy"]
    for answer in (metrics, status, page):
        assert answer.headers["cache-control"] == "no-store"
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_head_answers_like_get_without_a_body(gateway: LedgeProcess) -> None:
    port = http_port(gateway)
    with Client(port) as client:
        client.send(b"HEAD /api/status HTTP/1.1\r\nHost: gw1\r\n\r\n")
        head = client.answer(head=True)
        client.send(b"GET /api/status HTTP/1.1\r\nHost: gw1\r\n\r\n")
        body = client.answer()  # the same connection: HEAD sent no body to skip
    assert head.status == 200 and head.body == b""
    assert int(head.headers["content-length"]) > 100
    assert body.status == 200 and json.loads(body.body)["gateway"] == "gw1"


def test_keep_alive_is_bounded_in_requests_and_idle_time(gateway: LedgeProcess) -> None:
    port = http_port(gateway)
    with Client(port) as client:
        answers = []
        for _ in range(3):  # max_requests = 3
            client.send(b"GET /metrics HTTP/1.1\r\nHost: gw1\r\n\r\n")
            answers.append(client.answer())
    assert [a.status for a in answers] == [200, 200, 200]
    assert "connection" not in answers[0].headers
    assert answers[-1].headers["connection"] == "close" and answers[-1].closed
    # Pipelined: the same bound, answered in order, the rest never read.
    with Client(port) as client:
        client.send(b"GET /api/status HTTP/1.1\r\nHost: gw1\r\n\r\n" * 50)
        statuses = [client.answer().status for _ in range(3)]
        assert statuses == [200, 200, 200]
        assert client.at_end()


def test_an_idle_keep_alive_connection_is_closed_at_the_keepalive_timeout(
    tmp_path: Path,
) -> None:
    proc = start(tmp_path, HTTP_LIMITS.replace("request_timeout = 1.0", "request_timeout = 60.0"))
    try:
        with Client(http_port(proc), timeout=30) as client:
            client.send(b"GET / HTTP/1.1\r\nHost: gw1\r\n\r\n")
            assert client.answer().status == 200
            started = time.monotonic()
            # Closed without a response: within the 30 s the read waits, so by the
            # keep-alive timeout (1 s), not the request timeout (60 s) ...
            assert client.at_end()
            # ... and not before it (a bound that holds however loaded the machine).
            assert time.monotonic() - started > 0.95
    finally:
        assert proc.stop() == 0


# ----------------------------------------------------------------------------- hostile


H = b"Host: gw1\r\n"
HOSTILE = [
    # (what, request, status)
    ("oversized headers", b"GET / HTTP/1.1\r\n" + H + b"X-Big: " + b"a" * 4000 + b"\r\n\r\n", 431),
    ("oversized request line", b"GET /" + b"a" * 4000 + b" HTTP/1.1\r\nHost: gw1\r\n\r\n", 431),
    ("POST", b"POST /metrics HTTP/1.1\r\nHost: gw1\r\nContent-Length: 4\r\n\r\nabcd", 405),
    ("DELETE", b"DELETE / HTTP/1.1\r\nHost: gw1\r\n\r\n", 405),
    ("made-up method", b"BREW /pot HTTP/1.1\r\nHost: gw1\r\n\r\n", 405),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    ("TLS on the plain port", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, 400),
    ("garbage", b"\x00\xff\r\n\r\n", 400),
    ("no Host in HTTP/1.1", b"GET / HTTP/1.1\r\n\r\n", 400),
    ("a body on GET", b"GET / HTTP/1.1\r\nHost: gw1\r\nContent-Length: 5\r\n\r\nhello", 413),
    ("chunked GET", b"GET / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     413),
    ("absolute form", b"GET http://evil.example/metrics HTTP/1.1\r\nHost: gw1\r\n\r\n", 400),
    ("traversal", b"GET /../../etc/passwd HTTP/1.1\r\nHost: gw1\r\n\r\n", 404),
    ("encoded traversal", b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: gw1\r\n\r\n", 404),
    ("traversal after a route", b"GET /metrics/../../etc/passwd HTTP/1.1\r\n" + H + b"\r\n", 404),
    ("double slash", b"GET //etc/passwd HTTP/1.1\r\nHost: gw1\r\n\r\n", 404),
    ("backslashes", b"GET /..\\..\\etc\\passwd HTTP/1.1\r\nHost: gw1\r\n\r\n", 404),
    ("NUL in the path", b"GET /metrics\x00.txt HTTP/1.1\r\nHost: gw1\r\n\r\n", 400),
    ("bad version", b"GET / HTTP/9.9\r\nHost: gw1\r\n\r\n", 505),
]  # fmt: skip


def test_hostile_requests_get_their_status_and_mqtt_clients_never_notice(
    gateway: LedgeProcess,
) -> None:
    port = http_port(gateway)
    canary = Canary(gateway.port)
    for what, request, status in HOSTILE:
        answer = exchange(port, request)
        assert answer.status == status, f"{what}: {answer.status}"
        assert b"root:" not in answer.body, what
        if status == 405:
            assert answer.headers["allow"] == "GET, HEAD", what
        if status in (400, 405, 413, 431, 505):
            assert answer.closed, f"{what}: the connection must be closed"
    assert get(port, "/metrics").status == 200  # still serving
    canary.check()


HEAD_REFUSALS = [
    # (what, request, status): h11 reads some of these and not others (no Host, a head
    # still arriving past the bound, a timeout); each must be answered all the same.
    ("headers over the bound", b"HEAD / HTTP/1.1\r\n" + H + b"X-Big: " + b"a" * 4000 + b"\r\n\r\n",
     431),
    ("headers over the bound, unfinished", b"HEAD / HTTP/1.1\r\n" + H + b"X-Big: " + b"a" * 4000,
     431),
    ("a body", b"HEAD / HTTP/1.1\r\nHost: gw1\r\nContent-Length: 5\r\n\r\nhello", 413),
    ("chunked", b"HEAD / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 413),
    ("no Host", b"HEAD / HTTP/1.1\r\n\r\n", 400),
    ("absolute form", b"HEAD http://evil.example/ HTTP/1.1\r\nHost: gw1\r\n\r\n", 400),
    ("bad version", b"HEAD / HTTP/9.9\r\nHost: gw1\r\n\r\n", 505),
    ("a head that never ends", b"HEAD / HTTP/1.1\r\nHost: gw1\r\n", 408),
    ("a header line without a colon", b"HEAD / HTTP/1.1\r\n" + H + b"no colon\r\n\r\n", 400),
    ("empty lines before it", b"\r\n\r\nHEAD / HTTP/1.1\r\n" + H + b"\r\n", 400),
]  # fmt: skip


@pytest.fixture(scope="module")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgeProcess]:
    """One gateway for tests that each use their own connections and leave no state."""
    proc = start(tmp_path_factory.mktemp("http"))
    yield proc
    assert proc.stop() == 0


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [(r, s) for _, r, s in HEAD_REFUSALS],
    ids=[what for what, _, _ in HEAD_REFUSALS],
)
def test_a_refused_head_request_gets_its_status_without_a_body(
    shared_gateway: LedgeProcess, request_bytes: bytes, status: int
) -> None:
    with Client(http_port(shared_gateway), timeout=30) as client:
        client.send(request_bytes)
        answer = client.answer(head=True)
        assert answer.status == status
        assert answer.headers["connection"] == "close"
        # Nothing follows the head: no body, then the end of the connection.
        assert answer.closed


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [(r, s) for _, r, s in HEAD_REFUSALS],
    ids=[what for what, _, _ in HEAD_REFUSALS],
)
def test_a_refused_head_request_after_another_request_gets_no_body_either(
    shared_gateway: LedgeProcess, request_bytes: bytes, status: int
) -> None:
    """The same HEAD requests pipelined behind a GET on one connection: h11, which
    cannot read some of them, has seen an HTTP/1.1 request there and would frame an
    answer without Content-Length as chunked -- a body ("0\\r\\n\\r\\n") after a HEAD."""
    with Client(http_port(shared_gateway), timeout=30) as client:
        client.send(b"GET /metrics HTTP/1.1\r\n" + H + b"\r\n" + request_bytes)
        assert client.answer().status == 200
        answer = client.answer(head=True)
        assert answer.status == status
        assert "transfer-encoding" not in answer.headers
        assert answer.headers["connection"] == "close"
        assert answer.closed  # nothing follows the head


def test_pipelined_answers_past_the_write_bound_wait_for_the_client_and_all_arrive(
    tmp_path: Path,
) -> None:
    """Requests pipelined on one connection by a client that reads nothing yet: the
    listener answers until its write buffer's bound (and the kernel's buffers) are full,
    then stops taking requests, and goes on once the client reads. Broken, it would hold
    every answer in memory, or stall for good after the first pause."""
    proc = start(
        tmp_path,
        HTTP_LIMITS.replace("max_requests = 3", "max_requests = 10000")
        .replace("request_timeout = 1.0", "request_timeout = 60.0")
        .replace("keepalive_timeout = 1.0", "keepalive_timeout = 60.0"),
    )
    try:
        port = http_port(proc)
        scrapes = 0

        def answered() -> int:
            """Answers given on the pipelined connection (not counting the scrapes)."""
            nonlocal scrapes
            body = get(port, "/metrics").body.decode()
            scrapes += 1
            found = re.search(r'ledge_http_responses_total\{code="200"\} (\d+)', body)
            return int(found.group(1)) - (scrapes - 1) if found else 0

        size = len(get(port, "/metrics").body)
        scrapes = 1
        # More than the kernel can hold for a reader with a small window (its send
        # buffer grows to 4 MiB at most) plus the listener's bound: it must stop.
        count = (5 * 2**20 + WRITE_HIGH) // size + 2
        with Client(port, timeout=30, receive_buffer=4096) as client:
            client.send((b"GET /metrics HTTP/1.1\r\n" + H + b"\r\n") * count)
            seen = [-1]

            def settled() -> bool:  # the same count twice running
                before, seen[0] = seen[0], answered()
                return seen[0] == before > 0

            wait_for(settled, 60, "the listener to stop answering the pipelined requests")
            assert seen[0] < count  # stopped at its bound, not all answers held
            statuses = [client.answer().status for _ in range(count)]
        assert statuses == [200] * count
    finally:
        assert proc.stop() == 0


def test_slowloris_gets_408_at_the_request_timeout_from_its_first_byte(
    gateway: LedgeProcess,
) -> None:
    port = http_port(gateway)
    canary = Canary(gateway.port)
    stop = threading.Event()
    with socket.create_connection(("127.0.0.1", port), 30) as sock:
        started = time.monotonic()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: gw1\r\nX-Slow: ")

        def trickle() -> None:
            # A byte every 0.1 s, for as long as it takes: never a second of silence.
            while not stop.wait(0.1):
                try:
                    sock.send(b"s")
                except OSError:
                    return

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        try:
            answer = sock.recv(65536)  # the answer, within the 30 s the read waits
        finally:
            stop.set()
            thread.join(5)
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    # request_timeout (1 s) runs from the first byte, whatever follows; and the answer
    # is not early (a bound that holds however loaded the machine).
    assert elapsed > 0.99, elapsed
    canary.check()


def series(body: bytes, name: str) -> float:
    """One series' value in a ``/metrics`` body (``name`` with its labels as written)."""
    m = re.search(rb"^" + re.escape(name.encode()) + rb" (\S+)$", body, re.M)
    assert m, f"{name} is not in /metrics"
    return float(m.group(1))


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    """Sockets a test opens, closed when it ends (however it ends)."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def held(opened: list[socket.socket], source: str, port: int) -> socket.socket:
    """A connection from ``source`` with a request head that has started, not finished."""
    sock = socket.create_connection(("127.0.0.1", port), 5, source_address=(source, 0))
    opened.append(sock)
    sock.sendall(b"GET / HTTP/1.1\r\n")
    return sock


def closed_by_server(sock: socket.socket, within: float = 10.0) -> bool:
    """The server closed ``sock`` (a reset or the end of the stream) within ``within`` s."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_full_listener_closes_the_oldest_unfinished_request_then_the_oldest_idle(
    tmp_path: Path, opened: list[socket.socket]
) -> None:
    proc = start(
        tmp_path,
        HTTP_LIMITS.replace("request_timeout = 1.0", "request_timeout = 60.0").replace(
            "keepalive_timeout = 1.0", "keepalive_timeout = 60.0"
        )
        + "unfinished_share = 1.0\nunfinished_grace = 60.0\n",
    )
    try:
        port = http_port(proc)
        canary = Canary(proc.port)
        # Four slots, four unfinished requests from four addresses: the listener is full
        # (it accepts in the order of connection, so these are in before the next ones).
        socks = [held(opened, f"127.0.0.{i + 2}", port) for i in range(4)]
        # Each newcomer (a keep-alive client, idle once answered, from an address of
        # its own) gets the slot of the oldest unfinished request, in order ...
        clients = []
        for i in range(4):
            client = Client(port, source=f"127.0.0.{i + 10}")
            opened.append(client.sock)
            client.send(b"GET /api/status HTTP/1.1\r\nHost: gw1\r\n\r\n")
            assert client.answer().status == 200
            assert closed_by_server(socks[i]), f"held connection {i} was not closed"
            clients.append(client)
        # ... and with none left, of the oldest idle keep-alive connection.
        assert get(port, "/metrics").status == 200
        assert clients[0].at_end()
        clients[1].send(b"GET /api/status HTTP/1.1\r\nHost: gw1\r\n\r\n")
        assert clients[1].answer().status == 200  # the others were left alone
        text = get(port, "/metrics").body
        assert b'ledge_http_connections_evicted_total{reason="listener_full"} 5' in text
        assert b"ledge_http_connections_refused_total 0" in text
        assert b'ledge_http_responses_total{code="503"}' not in text
        canary.check()
    finally:
        assert proc.stop() == 0


def test_unfinished_requests_hold_only_their_share_of_the_listener(
    tmp_path: Path, opened: list[socket.socket]
) -> None:
    proc = start(tmp_path, HTTP_LIMITS + "unfinished_share = 0.5\nunfinished_grace = 0\n")
    try:
        port = http_port(proc)
        first = held(opened, "127.0.0.2", port)
        second = held(opened, "127.0.0.3", port)
        # Two of four slots are the share: the third unfinished request costs the oldest
        # its slot, though two are free (the grace is 0 here).
        third = held(opened, "127.0.0.4", port)
        assert closed_by_server(first)
        assert not closed_by_server(second, 0.2) and not closed_by_server(third, 0.2)
        second.close()
        third.close()
        # (A scrape is a newcomer too: read the count once the held ones are gone.)
        wait_for(
            lambda: b"ledge_http_connections_unfinished 0\n" in get(port, "/metrics").body,
            10,
            "the held connections to be gone",
        )
        text = get(port, "/metrics").body
        assert b'ledge_http_connections_evicted_total{reason="unfinished_full"} 1' in text
    finally:
        assert proc.stop() == 0


def test_one_address_holds_at_most_its_budget_of_connections(
    tmp_path: Path, opened: list[socket.socket]
) -> None:
    proc = start(tmp_path, HTTP_LIMITS.replace("max_connections = 4", "max_connections = 8")
                 + "max_connections_per_address = 2\n")  # fmt: skip
    try:
        port = http_port(proc)
        socks = [held(opened, "127.0.0.2", port) for _ in range(3)]
        assert closed_by_server(socks[0])  # its own oldest, with free slots all around
        other = held(opened, "127.0.0.3", port)  # another address is not concerned
        assert not closed_by_server(other, 0.2)
        text = get(port, "/metrics").body
        assert b'ledge_http_connections_evicted_total{reason="address_full"} 1' in text
    finally:
        assert proc.stop() == 0


def test_closing_connections_are_bounded_too(tmp_path: Path, opened: list[socket.socket]) -> None:
    """A refused request's connection lingers to close (so that its answer is not lost
    to a reset) but holds no slot: clients that never close their end cannot pile up
    open sockets past ``max_connections`` of them (the oldest is closed at once)."""
    proc = start(tmp_path)  # max_connections = 4
    try:
        port = http_port(proc)
        before = series(get(port, "/metrics").body, "process_open_fds")
        for _ in range(40):
            client = Client(port)
            opened.append(client.sock)
            client.send(b"\x00garbage\r\n\r\n")
            assert client.answer().status == 400  # answered, the end left open
        now = series(get(port, "/metrics").body, "process_open_fds")
        assert now - before <= 4 + 1, (before, now)  # the lingering ones, and this scrape
    finally:
        assert proc.stop() == 0


def test_slow_requests_from_one_address_never_lock_a_scraper_out(tmp_path: Path) -> None:
    """The tester's attack: twenty slow requests from 127.0.0.2, each reopened as the
    listener closes it, while a scraper on 127.0.0.1 reads /metrics 48 times (at the
    defaults: 16 connections, 4 per address)."""
    proc = start(tmp_path, "[http]\nenabled = true\nport = 0\n")
    try:
        port = http_port(proc)
        with SlowRequests(port, "127.0.0.2", count=20) as attack:
            wait_for(lambda: attack.closed >= 40 or attack.error, 30, "the attack to churn")
            answers = [get(port, "/metrics") for _ in range(48)]
            assert not attack.error, attack.error
        assert [a.status for a in answers] == [200] * 48
        # 127.0.0.2 never held more than its 4 slots: the scrape itself is the fifth.
        assert max(series(a.body, "ledge_http_connections") for a in answers) <= 5
        text = get(port, "/metrics").body
        evicted = series(text, 'ledge_http_connections_evicted_total{reason="address_full"}')
        assert evicted >= 40
        assert b'ledge_http_responses_total{code="503"}' not in text
        # Every eviction is counted; the log says so once a minute per address.
        lines = re.findall(r"closing a connection from 127\.0\.0\.2", proc.log)
        assert len(lines) == 1, lines
    finally:
        assert proc.stop() == 0


# ----------------------------------------------------------------------------- auth


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd")
def test_basic_auth_against_a_mosquitto_password_file_and_a_bearer_token(
    tmp_path: Path,
) -> None:
    passwd = tmp_path / "http-passwd"
    subprocess.run(
        ["mosquitto_passwd", "-c", "-b", str(passwd), "prometheus", "s3cret-scrape"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    passwd.chmod(0o600)
    token_file = tmp_path / "token"
    token_file.write_text("tok-0123456789abcdef\n")
    token_file.chmod(0o600)
    proc = start(
        tmp_path,
        HTTP_LIMITS.replace("max_requests = 3", "max_requests = 100")
        + f'password_file = "{passwd}"\ntoken_file = "{token_file}"\n',
        extra="[auth]\nfailed_login_delay = 2.0\nfailed_login_delay_max = 2.0\n",
    )
    try:
        port = http_port(proc)
        anonymous = get(port, "/metrics")
        assert anonymous.status == 401
        challenge = anonymous.headers["www-authenticate"]
        assert 'Basic realm="ledge"' in challenge and 'Bearer realm="ledge"' in challenge
        assert b"ledge_" not in anonymous.body
        assert get(port, "/", basic("prometheus", "s3cret-scrape")).status == 200
        assert get(port, "/metrics", basic("prometheus", "s3cret-scrape")).status == 200
        assert get(port, "/metrics", {"Authorization": "Bearer tok-0123456789abcdef"}).status == 200
        wrong = get(port, "/metrics", basic("prometheus", "guess"))
        assert wrong.status == 401
        # The address now waits out its delay: no password check, 429 and when to retry.
        throttled = get(port, "/metrics", basic("prometheus", "s3cret-scrape"))
        assert throttled.status == 429 and throttled.headers["retry-after"] in ("1", "2")
        wait_for(
            lambda: get(port, "/api/status", basic("prometheus", "s3cret-scrape")).status == 200,
            5,
            "the delay to pass",
        )
        assert get(port, "/metrics", {"Authorization": "Bearer wrong-token-xxxxxx"}).status == 401
        assert "s3cret" not in proc.log and "tok-0123" not in proc.log
    finally:
        assert proc.stop() == 0


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd")
@pytest.mark.parametrize("only", ["token_file", "password_file"])
def test_either_credential_alone_closes_the_listener_to_anonymous_requests(
    tmp_path: Path, only: str
) -> None:
    """Broken, a listener given only a token (or only a password file) would serve
    metrics and status to anyone: the tests above configure both at once."""
    secret = tmp_path / "secret"
    if only == "token_file":
        secret.write_text("tok-0123456789abcdef\n")
        good = {"Authorization": "Bearer tok-0123456789abcdef"}
    else:
        subprocess.run(
            ["mosquitto_passwd", "-c", "-b", str(secret), "prometheus", "s3cret-scrape"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        good = basic("prometheus", "s3cret-scrape")
    secret.chmod(0o600)
    proc = start(tmp_path, HTTP_LIMITS + f'{only} = "{secret}"\n')
    try:
        port = http_port(proc)
        for path in ("/", "/metrics", "/api/status"):
            anonymous = get(port, path)
            assert anonymous.status == 401, path
            assert b"ledge_" not in anonymous.body
        # Two requests on one connection: the listener reads on after the first's check
        # (a password's is done off the event loop, and reading waits for it meanwhile;
        # the second finds it remembered).
        with Client(port, timeout=10) as client:
            auth = "".join(f"{k}: {v}\r\n" for k, v in good.items()).encode()
            for _ in range(2):
                client.send(b"GET /api/status HTTP/1.1\r\n" + H + auth + b"\r\n")
                assert client.answer().status == 200
        assert get(port, "/metrics", good).status == 200
        assert "without authentication" not in proc.log
    finally:
        assert proc.stop() == 0


def test_an_open_listener_on_the_lan_is_warned_about(tmp_path: Path) -> None:
    proc = start(tmp_path, HTTP_LIMITS.replace("port = 0", 'port = 0\nhost = "0.0.0.0"'))
    try:
        proc.wait_log(r"serves metrics and status without authentication")
    finally:
        proc.stop()


# ----------------------------------------------------------------------------- https


def test_https_with_the_listeners_tls_settings(tmp_path: Path, certs: Certs) -> None:
    proc = start(
        tmp_path,
        HTTP_LIMITS
        + f'certfile = "{certs.server_cert}"\nkeyfile = "{certs.server_key}"\n'
        + f'cafile = "{certs.ca}"\nrequire_certificate = true\ntls_version = "tlsv1.3"\n',
    )
    try:
        port = http_port(proc)
        context = ssl.create_default_context(cafile=str(certs.ca))
        context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
        conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=5)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        assert b"ledge_http_connections 1" in response.read()
        assert conn.sock is not None and conn.sock.version() == "TLSv1.3"
        conn.close()
        # Without a client certificate the handshake fails: nothing is served.
        bare = ssl.create_default_context(cafile=str(certs.ca))
        c = http.client.HTTPSConnection("localhost", port, context=bare, timeout=5)
        try:
            with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
                c.request("GET", "/metrics")
                c.getresponse().read()
        finally:
            c.close()
        # Plain HTTP to the HTTPS port gets no answer but a closed connection.
        with socket.create_connection(("127.0.0.1", port), 5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: gw1\r\n\r\n")
            sock.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert not sock.recv(100).startswith(b"HTTP/")
    finally:
        assert proc.stop() == 0


def test_sighup_serves_a_renewed_https_certificate_and_applies_changed_limits(
    tmp_path: Path, certs: Certs
) -> None:
    """The TLS options are the MQTT listeners': a reload reads the files again, with the
    rest of ``[http]`` unchanged or changed (the listener is then made again on the same
    port, with the new limits)."""
    cert = tmp_path / "server.crt"
    key = tmp_path / "server.key"
    cert.write_bytes(certs.server_cert.read_bytes())
    key.write_bytes(certs.server_key.read_bytes())
    key.chmod(0o600)
    tls = f'certfile = "{cert}"\nkeyfile = "{key}"\n'
    proc = start(tmp_path, HTTP_LIMITS + tls)

    def served_cn() -> str:
        context = ssl.create_default_context(cafile=str(certs.ca))
        with (
            socket.create_connection(("127.0.0.1", http_port(proc)), 5) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            peer: Any = sock.getpeercert()
            return str(dict(x[0] for x in peer["subject"])["commonName"])

    try:
        port = http_port(proc)
        assert served_cn() == "ledge-server"
        cert.write_bytes(certs.renewed_cert.read_bytes())
        key.write_bytes(certs.renewed_key.read_bytes())
        proc.signal(signal.SIGHUP)
        line = proc.wait_log("config reloaded", 20)
        assert line.endswith(": no changes"), line  # the same listener, renewed files
        assert served_cn() == "ledge-server-renewed"
        config = tmp_path / "ledge.toml"
        config.write_text(config.read_text().replace("max_connections = 4", "max_connections = 5"))
        proc.signal(signal.SIGHUP)
        wait_for(lambda: proc.log.count("config reloaded") == 2, 20, "the second reload")
        line = [line for line in proc.lines if "config reloaded" in line][-1]
        assert line.endswith(": http"), line
        # A new listener, on the socket of the old (port 0 kept its port).
        assert proc.log.count(f"listening on 127.0.0.1:{port} (https)") == 2
        assert served_cn() == "ledge-server-renewed"
    finally:
        assert proc.stop() == 0


def test_readable_http_secrets_are_warned_about_while_the_listener_is_on(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-token-of-twenty-chars\n")
    token.chmod(0o644)
    on = RuntimeConfig(http=HTTPSettings(enabled=True, token_file=str(token)))
    assert file_warnings(on) == [
        f"token file {token} can be read by its group or others (mode 0644): chmod 600 it"
    ]
    assert file_warnings(RuntimeConfig(http=HTTPSettings(token_file=str(token)))) == []
    assert file_warnings(RuntimeConfig()) == []


# ----------------------------------------------------------------------------- cost


def test_a_gateway_without_http_never_loads_its_code(tmp_path: Path) -> None:
    """Every import is logged (PYTHONPROFILEIMPORTTIME, kept by the exec'd gateway): neither
    h11 nor the HTTP listener nor the metrics package may appear, even after a client
    has been served."""
    env_proc = LedgeProcess()
    os.environ["PYTHONPROFILEIMPORTTIME"] = "1"
    try:
        env_proc.start()
    finally:
        del os.environ["PYTHONPROFILEIMPORTTIME"]
    try:
        Paho(env_proc.port, "someone").connect().disconnect()
        assert "gateway.net.server" in env_proc.log  # imports are being logged
        for module in ("h11", "gateway.net.http", "gateway.metrics"):
            assert not re.search(rf"\| +{re.escape(module)}(\.|$)", env_proc.log, re.M), module
    finally:
        assert env_proc.stop() == 0
