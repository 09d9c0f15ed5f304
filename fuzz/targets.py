"""Fuzz targets: bytes in, and an exception only when Ledge has a bug.

``codec``: the bytes, cut into chunks, go to a ``PacketReader`` (3.1.1 or 5.0, with a
maximum packet size). It must yield packets, ``NEED_DATA`` or the codec's own
``MQTTError`` -- nothing else -- and every packet it yields must encode again.

``session``: the bytes are a program for the connection state machine of the pure
broker core: up to four connections send raw bytes or well-formed packets (CONNECT
with wills and credentials, SUBSCRIBE, PUBLISH with aliases, acknowledgements for
any id, DISCONNECT), the clock moves, password checks are answered, connections drop.
An ACL and a password file are configured on some runs. Invariants: the core never
raises; everything it writes to a client decodes in that client's protocol version;
a connection the core closed is closed; when everything has gone, every slot of the
pool is back.

``fastpath``: the codec's hot-path functions against the general codec. The bytes are
a PUBLISH (or anything) read by ``peek_publish`` from inside a larger buffer: what it
returns must be exactly what ``decode`` reads, and a plain PUBLISH that decodes must
be peeked. Then a PUBLISH template and an acknowledgement built from the bytes' choices
must be the bytes ``encode`` gives for the same packet value.

``websocket``: the WebSocket upgrade answer and frame reader, fed whole and in chunks.

``http``: one connection of the HTTP listener (h11 under our protocol) over a fake
transport and loop: raw bytes and request pieces in chunks, time moving, a client that
stops reading. Every answer is an HTTP/1.1 status line, buffers stay bounded, nothing
is written after close, and an idle connection is closed.

All are pure and deterministic (no clock, no sockets), so a crash reproduces from
its input alone. ``fuzz/__main__.py`` runs them under atheris (coverage-guided);
the test suite runs them with hypothesis and replays ``tests/vectors/fuzz/``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from gateway.broker.acl import parse_acl_file
from gateway.broker.auth import ListenerPolicy, PasswordAuthenticator, hash_password
from gateway.broker.core import Broker
from gateway.broker.settings import BrokerSettings
from gateway.broker.state import Connection, LoginAttempt, State
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    Connect,
    Disconnect,
    MQTTError,
    NeedData,
    Packet,
    PacketReader,
    PacketType,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
    Will,
    decode,
    encode,
)
from gateway.mqtt.fastpath import (
    PUBLISH_TYPE,
    encode_ack,
    encode_packet_id,
    peek_publish,
    publish_template,
)
from gateway.mqtt.properties import EMPTY, properties_body

LISTENER: Final = "fuzz"
MAX_CONNECTIONS: Final = 4

TOPICS: Final = ("a", "a/b", "a/b/c", "$SYS/x", "cmd/u1", "cmd/c2", "", "a/+", "#")
FILTERS: Final = ("a/#", "a/+", "#", "+/b/#", "$SYS/#", "cmd/%u", "a", "$share/g/a/#", "a//")
CLIENT_IDS: Final = ("c1", "c2", "c3", "", "u1")
ACL_TEXT: Final = """
topic read $SYS/#
pattern readwrite cmd/%c
user u1
topic readwrite a/#
topic deny a/b/c
"""
USERS: Final = {"u1": hash_password("p1", iterations=1)}


class Reader:
    """The fuzzer's bytes as a stream of choices; zeros once exhausted."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self) -> int:
        return self.byte() << 8 | self.byte()

    def take(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return chunk

    def pick(self, options: tuple[str, ...]) -> str:
        return options[self.byte() % len(options)]


# ----------------------------------------------------------------------------- codec


def fuzz_codec(data: bytes) -> int:
    """Returns the number of packets read (for the harness's statistics)."""
    r = Reader(data)
    version = MQTT_5 if r.byte() & 1 else MQTT_311
    max_size = (5, 64, 1024, 268_435_460)[r.byte() % 4]
    reader = PacketReader(max_size, version)
    count = 0
    while r.left:
        reader.receive_data(r.take(1 + r.byte() % 64))
        while True:
            try:
                packet = reader.next_packet()
            except MQTTError:
                return count  # the codec's own error: the connection would be closed
            if isinstance(packet, NeedData):
                break
            count += 1
            encode(packet, version)  # what was read can be written
    return count


# ----------------------------------------------------------------------------- fastpath


def fuzz_fastpath(data: bytes) -> int:
    """Returns 1 when the bytes were a plain PUBLISH the peek read, else 0."""
    r = Reader(data)
    version = MQTT_5 if r.byte() & 1 else MQTT_311
    first = PUBLISH_TYPE | (r.byte() & 0x0F)
    lead = r.take(r.byte() % 4)
    body = r.take(r.byte())
    trailing = r.take(r.byte() % 8)
    buf = lead + body + trailing
    start, end = len(lead), len(lead) + len(body)
    peeked = peek_publish(first, buf, start, end, version)
    try:
        packet = decode(first, body, version)
    except MQTTError:
        assert peeked is None, f"peeked {peeked} from a PUBLISH the codec refuses"
        packet = None
    if packet is not None:
        assert isinstance(packet, Publish)
        plain = (
            packet.qos < 2
            and not packet.dup
            and not packet.retain
            and packet.topic
            and packet.properties is EMPTY
        )
        if peeked is None:
            assert not plain, f"a plain PUBLISH was not peeked: {packet}"
        else:
            topic, qos, packet_id, payload_start = peeked
            got = (topic, qos, packet_id, bytes(buf[payload_start:end]))
            want = (packet.topic, packet.qos, packet.packet_id, packet.payload)
            assert got == want, f"peek {got} != decode {want}"
    _check_template(r, version)
    _check_ack(r, version)
    return 0 if peeked is None else 1


def _check_template(r: Reader, version: int) -> None:
    flags = r.byte()
    qos = flags % 3
    topic = (
        r.take(r.byte() % 12)
        .decode("utf-8", "replace")
        .replace("+", "p")
        .replace("#", "h")
        .replace("\x00", "z")
    )
    payload = r.take(r.byte() % 32)
    props = Properties()
    if version == MQTT_5 and flags & 0x10:
        props = Properties(user_properties=(("k", topic),), content_type="c")
    expiry = r.u16() if version == MQTT_5 and flags & 0x20 else None
    alias = r.byte() % 4 if version == MQTT_5 else 0
    sub_ids = tuple(1 + r.byte() for _ in range(r.byte() % 3)) if version == MQTT_5 else ()
    dup = bool(flags & 0x40) and qos > 0
    retain = bool(flags & 0x80)
    packet_id = 1 + r.u16() % 65_535 if qos else 0
    head, tail = publish_template(
        version,
        qos,
        retain,
        topic.encode(),
        payload,
        properties_body(props) if version == MQTT_5 else b"",
        dup=dup,
        expiry=expiry,
        alias=alias,
        sub_ids=sub_ids,
    )
    built = head + encode_packet_id(packet_id) + tail if qos else head
    if version == MQTT_5:
        # The template appends the per-delivery properties after the message's own.
        decoded = decode(built[0], built[_header_size(built) :], version)
        assert isinstance(decoded, Publish)
        want = props.with_(
            message_expiry_interval=expiry,
            topic_alias=alias or None,
            subscription_identifiers=sub_ids,
        )
        value = Publish(topic, payload, qos, retain, dup, packet_id, want)
        assert decoded == value, f"template {decoded} != {value}"
    else:
        value = Publish(topic, payload, qos, retain, dup, packet_id)
        assert built == encode(value, version), "template differs from encode"


def _header_size(packet: bytes) -> int:
    size = 2
    while packet[size - 1] & 0x80:
        size += 1
    return size


def _check_ack(r: Reader, version: int) -> None:
    kind = (PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP)[
        r.byte() % 4
    ]
    packet_id = 1 + r.u16() % 65_535
    reason = (0, 0x10, 0x87, 0x92)[r.byte() % 4] if version == MQTT_5 else 0
    cls: type[PubAck | PubRec | PubRel | PubComp] = {  # type: ignore[assignment]
        PacketType.PUBACK: PubAck,
        PacketType.PUBREC: PubRec,
        PacketType.PUBREL: PubRel,
        PacketType.PUBCOMP: PubComp,
    }[kind]
    assert encode_ack(kind, packet_id, reason, version) == encode(cls(packet_id, reason), version)


# ----------------------------------------------------------------------------- session


class Client:
    __slots__ = ("conn", "generation", "next_pid", "reader", "version")

    def __init__(self, conn: Connection, version: int) -> None:
        self.conn = conn
        self.generation = conn.generation
        self.version = version
        self.reader: PacketReader | None = None
        self.next_pid = 1


def fuzz_session(data: bytes) -> int:
    """Returns the number of operations run."""
    r = Reader(data)
    mode = r.byte()
    settings = BrokerSettings(
        max_connections=MAX_CONNECTIONS,
        max_packet_size=(128, 1024, 65_536)[mode % 3],
        topic_alias_maximum=(0, 2)[mode >> 2 & 1],
        receive_maximum=1 + (mode >> 3 & 3),
        max_inflight=1 + (mode >> 5 & 1),
        max_queued_messages=4,
        max_queued_bytes=4096,
        max_retained_messages=4,
        max_subscriptions_per_client=4,
        route_cache_size=4,
        sys_interval=0,
        connect_timeout=5,
        max_keepalive=10,
        slow_consumer_timeout=3,
        failed_login_delay=0.5 if mode >> 6 & 1 else 0,
        failed_login_delay_max=2,
    )
    now = 1000.0
    broker = Broker(settings, now=now)
    pending: list[LoginAttempt] = []
    if mode >> 7:
        acl = parse_acl_file(ACL_TEXT)
        auth = PasswordAuthenticator(bool(mode & 2), dict(USERS))
        broker.set_policies({LISTENER: ListenerPolicy(auth, acl)}, None, now)
        broker.verifier = pending.append
    clients: list[Client] = []
    ops = 0

    def drain() -> None:
        for client in list(clients):
            conn = client.conn
            if conn.generation != client.generation:
                raise AssertionError("a client's slot was reused under it")
            chunks = conn.take_output()
            if chunks:
                version = conn.version or client.version
                if client.reader is None:
                    client.reader = PacketReader(version=version)
                client.reader.version = version
                client.reader.receive_data(b"".join(chunks))
                while True:  # what the broker writes must be valid MQTT
                    if isinstance(client.reader.next_packet(), NeedData):
                        break
            if conn.state is State.CLOSING:
                broker.connection_lost(conn, now)  # as the shell does once flushed
                clients.remove(client)
        broker.take_dirty()

    while r.left and ops < 400:
        ops += 1
        op = r.byte() % 16
        if op == 0 or not clients:
            conn = broker.open_connection(f"10.0.0.{r.byte() % 3}:1", LISTENER, now)
            if conn is not None:
                clients.append(Client(conn, MQTT_5 if r.byte() & 1 else MQTT_311))
        else:
            client = clients[r.byte() % len(clients)]
            if op == 1:
                broker.data_received(client.conn, r.take(r.byte() % 48), now)
            elif op == 2:
                now += (0.1, 1.0, 5.0, 20.0, 100.0)[r.byte() % 5]
                broker.tick(now)
            elif op == 3:
                broker.connection_lost(client.conn, now)
                clients.remove(client)
            elif op == 4 and pending:
                attempt = pending.pop(r.byte() % len(pending))
                ok = None if r.byte() % 8 == 0 else attempt.check.run()
                broker.password_checked(attempt, ok, now)
            elif op == 5:
                broker.set_writable(client.conn, bool(r.byte() & 1), now)
            else:
                packet = _packet(r, op, client)
                try:
                    wire = encode(packet, client.version)
                except (MQTTError, ValueError, OverflowError):
                    continue  # not encodable: the raw op covers bytes like these
                cut = r.byte()
                if cut and cut < len(wire):  # split, as TCP may
                    broker.data_received(client.conn, wire[:cut], now)
                    wire = wire[cut:]
                broker.data_received(client.conn, wire, now)
        drain()
    for client in list(clients):
        broker.connection_lost(client.conn, now)
    clients.clear()
    now += 1e6
    broker.tick(now)
    drain()
    if len(broker.free) != MAX_CONNECTIONS or broker.connections:
        raise AssertionError("connection slots leaked")
    return ops


def _packet(r: Reader, op: int, client: Client) -> Packet:
    v5 = client.version == MQTT_5
    pid = 1 + r.byte() % 4
    props = Properties()
    if op == 6:
        will = None
        flags = r.byte()
        if flags & 1:
            will = Will(r.pick(TOPICS), b"w", flags >> 1 & 3, bool(flags & 8))
        user = r.pick(("u1", "u2")) if flags & 16 else None
        password = r.pick(("p1", "p2")).encode() if flags & 32 else None
        if v5:
            props = Properties(
                session_expiry_interval=(0, 5, 0xFFFFFFFF)[r.byte() % 3],
                receive_maximum=1 + r.byte() % 3,
                topic_alias_maximum=r.byte() % 3,
                maximum_packet_size=(None, 40, 1000)[r.byte() % 3],
                request_problem_information=r.byte() % 2,
            )
        return Connect(
            r.pick(CLIENT_IDS),
            client.version,
            bool(flags & 64),
            r.byte() % 4,
            will,
            user,
            password if (v5 or user) else None,
            props,
        )
    if op in (7, 8):
        options = r.byte()
        subs = tuple(
            SubscriptionRequest(
                r.pick(FILTERS),
                options & 3 if options & 3 < 3 else 1,
                bool(options & 4) and v5,
                bool(options & 8) and v5,
                (options >> 4 & 3) % 3 if v5 else 0,
            )
            for _ in range(1 + options % 2)
        )
        if op == 8:
            return Unsubscribe(pid, tuple(s.topic_filter for s in subs))
        if v5 and options & 64:
            props = Properties(subscription_identifiers=(1 + options % 3,))
        return Subscribe(pid, subs, props)
    if op in (9, 10, 11):
        flags = r.byte()
        qos = flags % 3
        topic = r.pick(TOPICS)
        if v5:
            props = Properties(
                topic_alias=(None, 1, 2, 3)[flags >> 2 & 3],
                message_expiry_interval=(None, 1)[flags >> 4 & 1],
            )
        return Publish(
            topic, b"p" * (r.byte() % 80), qos, bool(flags & 32), False, pid if qos else 0, props
        )
    acks: tuple[Callable[[int], Packet], ...] = (PubAck, PubRec, PubRel, PubComp)
    if op in (12, 13, 14):
        return acks[r.byte() % 4](pid)
    return Disconnect((0, 4, 0x81)[r.byte() % 3] if v5 else 0)


# ----------------------------------------------------------------------------- websocket


def fuzz_websocket(data: bytes) -> int:
    """The WebSocket upgrade and frame reader (sans-IO halves of ``gateway.net``): an
    upgrade request is answered with an HTTP status line whatever it holds, and frames
    fed in chunks give the same MQTT bytes, control frames and verdict as fed whole."""
    from gateway.net.websocket import BINARY, FrameReader, handshake

    r = Reader(data)
    if r.byte() & 1:
        answer = handshake(r.take(r.byte() * 8), "/mqtt")
        if not answer.response.startswith(b"HTTP/1.1 "):
            raise AssertionError(f"not an HTTP answer: {answer.response[:40]!r}")
        if (answer.error is None) != answer.response.startswith(b"HTTP/1.1 101 "):
            raise AssertionError("an accepted upgrade must answer 101, a refused one not")
    stream = r.take(r.left)
    whole = FrameReader()
    expected = whole.feed(stream)
    chunked = FrameReader()
    got = []
    pos = 0
    step = 1 + (stream[0] % 7 if stream else 0)
    while pos < len(stream):
        got.extend(chunked.feed(stream[pos : pos + step]))
        pos += step
    if b"".join(p for o, p in got if o == BINARY) != b"".join(
        p for o, p in expected if o == BINARY
    ):
        raise AssertionError("chunking changed the MQTT byte stream")
    if [e for e in got if e[0] != BINARY] != [e for e in expected if e[0] != BINARY]:
        raise AssertionError("chunking changed the control frames")
    if (chunked.error is None) != (whole.error is None):
        raise AssertionError("chunking changed the verdict")
    return len(expected)


# ----------------------------------------------------------------------------- http

#: Pieces of requests, so that the fuzzer gets past the request line often.
HTTP_PIECES: Final = (
    b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n",
    b"HEAD /metrics HTTP/1.1\r\nHost: gw\r\n\r\n",
    b"GET /api/status?x=1 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    b"GET /boom HTTP/1.0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /../etc/passwd HTTP/1.1\r\nHost: gw\r\n",
    b"Authorization: Bearer 0123456789abcdef\r\n",
    b"Authorization: Bearer wrong-token-wrong\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"X-Filler: " + b"y" * 300 + b"\r\n",
    b"\r\n",
)
HTTP_STATUSES: Final = frozenset({200, 400, 401, 404, 405, 408, 413, 429, 431, 500, 501, 505})


class _Timer:
    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[object, ...]):
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """The loop as the HTTP protocol sees it, with a clock the program moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_Timer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> _Timer:
        timer = _Timer(self.now + delay, callback, args)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t.when <= self.now and not t.cancelled]
        self.timers = [t for t in self.timers if t.when > self.now and not t.cancelled]
        for timer in due:
            timer.callback(*timer.args)


class _Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False
        self.reading = True
        self.eof = False

    def write(self, data: bytes) -> None:
        if self.closed or self.eof:
            raise AssertionError("written after the connection was closed")
        self.out += data

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed or self.eof

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 4711) if name == "peername" else default


def fuzz_http(data: bytes) -> int:
    """One HTTP connection (``gateway.net.http``) over a transport and loop that the
    program drives: bytes and request pieces in chunks, time moving, the client not
    reading. Invariants: nothing raises; every answer is an HTTP/1.1 status line with a
    status the listener uses; h11 never buffers more than the header bound plus one
    chunk; nothing is written after the connection is closed."""
    from types import SimpleNamespace
    from typing import cast

    from gateway.net.http import Credentials, HTTPProtocol, HTTPServer, Response
    from gateway.net.http_settings import HTTPSettings
    from gateway.net.server import Server

    r = Reader(data)
    flags = r.byte()
    settings = HTTPSettings(
        enabled=True,
        max_header_bytes=(1024, 8192)[flags & 1],
        max_requests=1 + (flags >> 1 & 7),
    )
    loop = _Loop()
    shell = cast(
        Server, SimpleNamespace(loop=loop, broker=SimpleNamespace(settings=BrokerSettings()))
    )

    def handler(path: str) -> Response | None:
        if path == "/boom":
            raise RuntimeError("a handler bug")
        return Response(200, b"fine\n") if path in ("/", "/metrics", "/api/status") else None

    token = "0123456789abcdef" if flags & 0x10 else None
    server = HTTPServer(shell, settings, handler, Credentials(None, token))
    transport = _Transport()
    proto = HTTPProtocol(server)
    proto.connection_made(transport)  # type: ignore[arg-type]
    largest = 0
    while r.left:
        op = r.byte() % 8
        if op < 3:
            chunk = r.take(1 + r.byte() % 64)
        elif op < 6:
            piece = HTTP_PIECES[r.byte() % len(HTTP_PIECES)]
            chunk = piece[: r.byte() % (len(piece) + 1)] if op == 5 else piece
        elif op == 6:
            loop.advance((0.5, 3.0, 6.0, 11.0)[r.byte() % 4])
            continue
        else:
            if r.byte() & 1:
                proto.pause_writing()
            else:
                proto.resume_writing()
            continue
        if transport.closed or transport.eof or not transport.reading:
            continue  # a real transport delivers nothing then
        largest = max(largest, len(chunk))
        proto.data_received(chunk)
        buffered = len(proto.conn.trailing_data[0])
        if buffered > settings.max_header_bytes + largest + 1:
            raise AssertionError(f"h11 holds {buffered} bytes")
    loop.advance(60.0)
    out = bytes(transport.out)
    statuses = [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", out)]
    if out and not out.startswith(b"HTTP/1.1 "):
        raise AssertionError(f"not an HTTP answer: {out[:40]!r}")
    unexpected = set(statuses) - HTTP_STATUSES
    if unexpected:
        raise AssertionError(f"unexpected statuses {unexpected}")
    if not (transport.closed or transport.eof):
        raise AssertionError("a connection idle for a minute is still open")
    return len(statuses)


def fuzz_mqttsn_codec(data: bytes) -> int:
    """The firmware bridge's codec and UART deframer (``fuzz/mqttsn.py``)."""
    from fuzz import mqttsn

    return mqttsn.fuzz_mqttsn_codec(data)


def fuzz_mqttsn_gateway(data: bytes) -> int:
    """The firmware bridge's gateway logic on a broker core (``fuzz/mqttsn.py``)."""
    from fuzz import mqttsn

    return mqttsn.fuzz_mqttsn_gateway(data)


def fuzz_landing_line(data: bytes) -> int:
    """Silver's judge of one landing line (``fuzz/landing.py``)."""
    from fuzz import landing

    return landing.fuzz_landing_line(data)


TARGETS: Final[dict[str, Callable[[bytes], int]]] = {
    "codec": fuzz_codec,
    "fastpath": fuzz_fastpath,
    "session": fuzz_session,
    "websocket": fuzz_websocket,
    "http": fuzz_http,
    "mqttsn_codec": fuzz_mqttsn_codec,
    "mqttsn_gateway": fuzz_mqttsn_gateway,
    "landing_line": fuzz_landing_line,
}
