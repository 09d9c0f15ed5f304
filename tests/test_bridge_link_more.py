"""The cloud bridge's link as the cloud sees it and as the operator reads it: what the
bridge says in CONNECT, its status topic and will, how it backs off between attempts,
the lines it logs, and TLS.

As in tests/test_bridge_link.py, a Ledge gateway bridges to another Ledge gateway
standing in for the cloud, both in this process on loopback, the link through aiomqtt
(paho); the cloud's broker shows what arrived (its sessions and connections). The
backoff's jitter and the link's monotonic clock are replaced where a test needs exact
delays; nothing waits on wall-clock windows."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from gateway.app.root import Gateway
from gateway.bridge import link
from gateway.broker.auth import hash_password
from gateway.broker.local import LocalClient
from gateway.broker.state import Session
from tests.support.certs import Certs, _signed, make_certs
from tests.support.wait import async_wait_for
from tests.test_bridge_link import (
    CLOUD,
    Inbox,
    bridge_of,
    port_of,
    publisher,
    run,
    started,
    subscriber,
)

#: Fast backoff unless a test says otherwise.
QUICK = "reconnect_min = 0.05\nreconnect_max = 0.2\n"
#: Rules: readings up, commands down, and the status topic up (``ledge/gw1/status``).
RULES = (
    '[[bridges.rules]]\nfilter = "sensors/#"\nremote_prefix = "fleet/gw1/"\nqos = 1\n'
    '[[bridges.rules]]\nfilter = "commands/#"\ndirection = "in"\n'
    'local_prefix = "cloud/"\nremote_prefix = "fleet/gw1/"\nqos = 1\n'
)
STATUS_RULE = '[[bridges.rules]]\nfilter = "ledge/gw1/status"\nremote_prefix = "fleet/"\nqos = 2\n'
#: Where the cloud sees the bridge's status.
STATUS = "fleet/ledge/gw1/status"


def edge(
    address: str,
    options: str = "",
    *,
    protocol: str = "5.0",
    backoff: str = QUICK,
    rules: str = RULES + STATUS_RULE,
) -> str:
    """The edge gateway's config: one bridge ``up`` with ``options`` (bridge keys)."""
    return (
        '[gateway]\nid = "gw1"\n[[listeners]]\nname = "mqtt"\nhost = "127.0.0.1"\nport = 0\n'
        f'[[bridges]]\nname = "up"\naddress = "{address}"\nprotocol = "{protocol}"\n'
        + backoff
        + options
        + rules
    )


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def session_at(cloud: Gateway, client_id: str = "ledge-gw1-up") -> Session:
    assert cloud.broker is not None
    return cloud.broker.sessions[client_id]


def with_password_file(tmp_path: Path, extra: str = "") -> str:
    """The cloud's config, user ``edge`` with password ``right`` and nobody anonymous."""
    path = tmp_path / "passwd"
    path.write_text(f"edge:{hash_password('right', 1).encode()}\n")
    path.chmod(0o600)
    return (
        CLOUD.format(port=0)
        + f'[auth]\npassword_file = "{path}"\nallow_anonymous = false\n'
        + "failed_login_delay = 0\n"
        + extra
    )


def bridge_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """What the bridge logged (level, text), in order."""
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ledge.bridge"]


class Jitter:
    """Stands in for link.py's ``random``: records every (low, high) it is asked to
    pick a delay between, and picks the low end (so tests wait little)."""

    def __init__(self) -> None:
        self.bounds: list[tuple[float, float]] = []

    def uniform(self, low: float, high: float) -> float:
        self.bounds.append((low, high))
        return low

    def highs(self) -> list[float]:
        return [high for _, high in self.bounds]


class Clock:
    """Stands in for link.py's ``time``: a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def closing(*gateways: Gateway) -> None:
    for gw in gateways:
        await gw.close()


# ---------------------------------------------------------------------- CONNECT


@pytest.mark.parametrize("protocol", ["5.0", "3.1.1"])
def test_the_cloud_gets_the_configured_client_id_credentials_keepalive_expiry_and_will(
    protocol: str, tmp_path: Path
) -> None:
    options = (
        'client_id = "edge-7"\nusername = "edge"\npassword = "right"\n'
        "keepalive = 17\nsession_expiry = 1234\n"
    )

    async def story() -> None:
        cloud = await started(with_password_file(tmp_path))
        gw = await started(edge(f"127.0.0.1:{port_of(cloud)}", options, protocol=protocol))
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            session = session_at(cloud, "edge-7")  # the configured id, not ledge-gw1-up
            assert session.username == "edge"  # and its password was right
            assert session.protocol_version == (5 if protocol == "5.0" else 4)
            assert session.conn is not None and session.conn.keep_alive == 17
            assert session.conn.peer_receive_max == 65_535  # takes what the cloud can send
            # MQTT 5 asks for session_expiry; 3.1.1 asks for a persistent session
            # (clean session 0), which this cloud keeps for ever.
            assert session.expiry_interval == (1234 if protocol == "5.0" else 0xFFFF_FFFF)
            will = session.conn.will
            assert will is not None
            assert (will.topic, will.payload, will.qos, will.retain) == (
                STATUS,
                b"offline",
                1,
                True,
            )
        finally:
            await closing(gw, cloud)

    run(story)


@pytest.mark.parametrize(
    ("protocol", "options", "kept"),
    [
        ("5.0", "", True),
        ("5.0", "clean_start = true\n", False),
        ("5.0", "session_expiry = 0\n", False),
        ("3.1.1", "", True),
        ("3.1.1", "clean_start = true\n", False),
    ],
)
def test_a_command_sent_while_the_gateway_was_away_comes_down_unless_the_session_is_clean(
    protocol: str, options: str, kept: bool
) -> None:
    """clean_start = false (and a session_expiry with MQTT 5) has the cloud keep the
    bridge's session while it is away, so a QoS 1 command sent meanwhile comes down
    when it is back; a clean start, or an expiry of 0, loses it."""

    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        address = f"127.0.0.1:{port_of(cloud)}"
        config = edge(address, options, protocol=protocol, rules=RULES)
        gw = await started(config)
        try:
            bridge = bridge_of(gw)
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            conn = session_at(cloud).conn
            assert conn is not None and conn.will is None  # no status rule: no will
            await gw.close()
            cloud_publish = publisher(cloud)
            cloud_publish("fleet/gw1/commands/while-away", b"1")
            gw = await started(config)
            down = subscriber(gw, "device", "cloud/#")
            bridge = bridge_of(gw)
            await async_wait_for(lambda: bridge.state == "connected", 10, "back")
            cloud_publish("fleet/gw1/commands/after", b"2")
            await async_wait_for(lambda: "cloud/commands/after" in down.topics(), 10, "after")
            expected = ["cloud/commands/after"]
            assert down.topics() == (["cloud/commands/while-away", *expected] if kept else expected)
        finally:
            await closing(gw, cloud)

    run(story)


# ---------------------------------------------------------------------- status and will


def test_the_status_is_online_while_linked_the_will_says_offline_when_the_link_dies() -> None:
    """Retained ``online`` at every connect; the cloud publishes the will (retained
    ``offline``) when the connection dies without DISCONNECT; a gateway that stops
    says ``offline`` itself, and that is what the cloud keeps."""

    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        assert cloud.broker is not None
        seen = Inbox()
        LocalClient(cloud.broker, "watch", seen).subscribe(STATUS, 2, 0.0, retain_as_published=True)
        gw = await started(edge(f"127.0.0.1:{port_of(cloud)}"))
        bridge = bridge_of(gw)
        online = (STATUS, b"online", 1, True)
        offline = (STATUS, b"offline", 1, True)
        try:
            await async_wait_for(lambda: seen.got, 10, "the bridge's status")
            assert seen.got == [online]
            client = bridge._client
            assert client is not None
            client.paho.socket().shutdown(socket.SHUT_RDWR)  # the network dies
            await async_wait_for(lambda: len(seen.got) >= 3, 10, "the will, then back online")
            assert seen.got == [online, offline, online]
            assert bridge.stats.connects == 2
            await gw.close()
            await async_wait_for(lambda: len(seen.got) >= 4, 10, "offline at the stop")
            assert seen.got[3] == offline
            late = Inbox()
            LocalClient(cloud.broker, "late", late).subscribe(STATUS, 2, 0.0)
            assert late.got == [offline]  # retained
        finally:
            await closing(gw, cloud)

    run(story)


def test_a_gateway_stopped_while_its_link_comes_up_stops_and_the_cloud_keeps_offline() -> None:
    """A stop (SIGTERM, or a reload that replaces the bridge) in any of the event-loop
    turns between the CONNACK and the link's first message: the gateway stops within
    its bound and the cloud keeps ``offline``. On Python 3.11 a cancel that came in the
    same turn as a SUBACK was lost inside aiomqtt's ``subscribe`` (``asyncio.wait_for``):
    in about one stop in four the link then said ``online`` after ``offline`` and ran on,
    and the gateway's close never returned."""

    async def once(turns: int) -> tuple[bool, list[bytes]]:
        cloud = await started(CLOUD.format(port=0))
        assert cloud.broker is not None
        gw = await started(edge(f"127.0.0.1:{port_of(cloud)}"))
        bridge = bridge_of(gw)
        try:
            # Turn by turn (each sleep(0) is one turn of the event loop, not a wait for
            # time), so that the stop lands exactly ``turns`` turns after the CONNACK.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while bridge.stats.connects < 1:
                assert loop.time() < deadline, "no CONNACK within 10 s"
                await asyncio.sleep(0)
            for _ in range(turns):
                await asyncio.sleep(0)
            closed = asyncio.ensure_future(gw.close())
            done, _ = await asyncio.wait({closed}, timeout=10)
            late = Inbox()
            LocalClient(cloud.broker, "late", late).subscribe(STATUS, 2, 0.0)
            await async_wait_for(lambda: late.got, 10, "the retained status")
            return closed in done, [payload for _, payload, _, _ in late.got]
        finally:
            if bridge._task is not None:
                bridge._task.cancel()
            await cloud.close()

    async def story() -> None:
        for turns in range(24):  # every turn from the CONNACK to the link's first send, twice
            stopped, status = await once(turns % 12)
            assert stopped, f"the gateway did not stop ({turns % 12} turns after the CONNACK)"
            assert status == [b"offline"], f"{turns % 12} turns after the CONNACK"

    run(story)


# ---------------------------------------------------------------------- backoff


def test_the_backoff_doubles_from_reconnect_min_up_to_reconnect_max_jittered_below(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jitter = Jitter()
    monkeypatch.setattr(link, "random", jitter)

    async def story() -> None:
        backoff = "reconnect_min = 0.01\nreconnect_max = 0.08\n"
        gw = await started(edge(f"127.0.0.1:{closed_port()}", backoff=backoff))
        try:
            await async_wait_for(lambda: len(jitter.bounds) >= 6, 10, "six attempts")
            assert jitter.highs()[:6] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.08, 0.08])
            for low, high in jitter.bounds:
                assert low == pytest.approx(high / 2)
        finally:
            await gw.close()

    run(story)


def test_the_backoff_holds_at_reconnect_max_through_thousands_of_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An uplink down for a day fails thousands of times in a row; the link keeps
    trying at ``reconnect_max`` (here tiny, so that 1,100 failures take a moment)."""
    jitter = Jitter()
    monkeypatch.setattr(link, "random", jitter)

    async def story() -> None:
        backoff = "reconnect_min = 0.000001\nreconnect_max = 0.000002\n"
        gw = await started(edge(f"127.0.0.1:{closed_port()}", backoff=backoff))
        try:
            await async_wait_for(lambda: len(jitter.bounds) >= 1100, 60, "1,100 attempts")
            assert jitter.highs()[1000:1100] == [0.000002] * 100
            bridge = bridge_of(gw)
            assert bridge._task is not None and not bridge._task.done()
        finally:
            await gw.close()

    run(story)
    assert link.backoff(1.0, 60.0, 10**6) == 60.0
    assert [link.backoff(0.5, 3.0, n) for n in range(5)] == [0.5, 0.5, 1.0, 2.0, 3.0]


def test_a_connection_that_lasted_stable_seconds_resets_the_backoff_a_shorter_one_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cloud that accepts and drops at once must not be hammered at reconnect_min; one
    that held the link for STABLE_SECONDS is retried from reconnect_min again."""
    jitter, clock = Jitter(), Clock()
    monkeypatch.setattr(link, "random", jitter)
    monkeypatch.setattr(link, "time", clock)

    async def story() -> None:
        port = closed_port()
        backoff = "reconnect_min = 0.02\nreconnect_max = 0.16\n"
        gw = await started(edge(f"127.0.0.1:{port}", backoff=backoff))
        bridge = bridge_of(gw)
        cloud: Gateway | None = None
        try:
            await async_wait_for(lambda: len(jitter.bounds) >= 3, 10, "three failures")
            assert jitter.highs()[:3] == pytest.approx([0.02, 0.04, 0.08])
            for lasted, then in ((link.STABLE_SECONDS - 0.5, 0.16), (link.STABLE_SECONDS, 0.02)):
                cloud = await started(CLOUD.format(port=port))
                await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
                before = len(jitter.bounds)
                clock.now += lasted
                await cloud.close()
                cloud = None

                def lost(known: int = before) -> bool:
                    return len(jitter.bounds) > known

                await async_wait_for(lost, 10, "the link lost")
                assert jitter.highs()[before] == pytest.approx(then), lasted
            # after the reset, doubling starts again from reconnect_min
            await async_wait_for(lambda: len(jitter.bounds) >= before + 3, 10, "failures")
            assert jitter.highs()[before : before + 3] == pytest.approx([0.02, 0.02, 0.04])
        finally:
            await closing(gw, *([cloud] if cloud is not None else []))

    run(story)


def test_when_the_first_address_refuses_the_next_one_is_tried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ledge.bridge")

    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        refusing = f"127.0.0.1:{closed_port()}"
        working = f"127.0.0.1:{port_of(cloud)}"
        gw = await started(edge(refusing, f'addresses = ["{working}"]\n'))
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            assert bridge.address == working
            [(level, first), *_] = bridge_lines(caplog)
            assert level == logging.WARNING
            assert first.startswith(f"bridge up: cannot connect to {refusing} (")
        finally:
            await closing(gw, cloud)

    run(story)


# ---------------------------------------------------------------------- log lines


def test_an_unreachable_cloud_is_a_warning_naming_bridge_address_and_reason_then_debug(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="ledge.bridge")
    jitter = Jitter()
    monkeypatch.setattr(link, "random", jitter)

    async def story() -> None:
        address = f"127.0.0.1:{closed_port()}"
        backoff = "reconnect_min = 0.4\nreconnect_max = 0.4\n"  # jittered: 0.2 s
        gw = await started(edge(address, backoff=backoff))
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: len(bridge_lines(caplog)) >= 2, 10, "two attempts")
            reason = "[Errno 111] Connection refused"
            line = f"bridge up: cannot connect to {address} ({reason}); retrying in 0.2 s"
            assert bridge_lines(caplog)[:2] == [
                (
                    logging.WARNING,
                    line + " (further identical failures are logged at debug level)",
                ),
                (logging.DEBUG, line),
            ]
            assert bridge.last_error == reason
            assert bridge.last_error_at is not None
            assert bridge.address == address
            assert bridge.stats.connects == 0
        finally:
            await gw.close()

    run(story)


@pytest.mark.parametrize(
    ("protocol", "options", "reason"),
    [
        ("5.0", 'username = "edge"\npassword = "wrong"\n', "[code:134] Bad user name or password"),
        ("5.0", "", "[code:135] Not authorized"),
        (
            "3.1.1",
            'username = "edge"\npassword = "wrong"\n',
            "[code:134] Bad user name or password",
        ),
    ],
)
def test_a_refused_login_is_a_warning_naming_the_bridge_and_the_clouds_reason(
    protocol: str,
    options: str,
    reason: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ledge.bridge")

    async def story() -> None:
        cloud = await started(with_password_file(tmp_path))
        address = f"127.0.0.1:{port_of(cloud)}"
        gw = await started(edge(address, options, protocol=protocol))
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge_lines(caplog), 10, "a refusal")
            [(level, text), *_] = bridge_lines(caplog)
            assert level == logging.WARNING
            assert text.startswith(f"bridge up: cannot connect to {address} ({reason}); ")
            assert bridge.last_error == reason
            assert bridge.state != "connected" and bridge.stats.connects == 0
        finally:
            await closing(gw, cloud)

    run(story)


def test_each_loss_of_a_link_that_worked_is_a_warning_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same problem twice in a row is logged once; but a link that came back in
    between makes the next loss news."""
    caplog.set_level(logging.DEBUG, logger="ledge.bridge")

    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        address = f"127.0.0.1:{port_of(cloud)}"
        gw = await started(edge(address))
        bridge = bridge_of(gw)
        try:
            for connects in (1, 2):

                def up(count: int = connects) -> bool:
                    return bridge.stats.connects == count

                await async_wait_for(up, 10, "connected")
                await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
                client = bridge._client
                assert client is not None
                client.paho.socket().shutdown(socket.SHUT_RDWR)
            await async_wait_for(lambda: bridge.stats.connects == 3, 10, "back again")
            # all the way: stopped while the link subscribes, the gateway may never stop
            # (the cancellation is lost in aiomqtt.subscribe on Python 3.11)
            await async_wait_for(lambda: bridge.state == "connected", 10, "back again")
            losses = [(lv, t) for lv, t in bridge_lines(caplog) if " lost " in t]
            assert [lv for lv, _ in losses] == [logging.WARNING, logging.WARNING]
            for _, text in losses:
                assert text.startswith(f"bridge up: lost {address} (")
                assert text.endswith(" (further identical failures are logged at debug level)")
        finally:
            await closing(gw, cloud)

    run(story)


def test_the_connected_line_names_address_client_id_window_and_the_waiting_messages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ledge.bridge")

    async def story() -> None:
        port = closed_port()
        gw = await started(edge(f"127.0.0.1:{port}", 'client_id = "edge-7"\nmax_inflight = 3\n'))
        bridge = bridge_of(gw)
        cloud: Gateway | None = None
        try:
            publish = publisher(gw)
            for i in range(3):
                publish("sensors/t", str(i).encode())
            cloud = await started(CLOUD.format(port=port) + "[broker]\nreceive_maximum = 5\n")
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            assert (
                logging.INFO,
                f"bridge up: connected to 127.0.0.1:{port} as edge-7 "
                "(receive maximum 5, window 3, 3 message(s) waiting)",
            ) in bridge_lines(caplog)
        finally:
            await closing(gw, *([cloud] if cloud is not None else []))

    run(story)


# ---------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    made = make_certs(tmp_path_factory.mktemp("certs"))
    # A server certificate from the same CA for another name than the address.
    _signed(
        made.directory,
        "elsewhere",
        (made.ca, made.directory / "ledge-test-ca.key"),
        "subjectAltName=DNS:elsewhere.example\nextendedKeyUsage=serverAuth\n",
    )
    return made


def tls_cloud(certs: Certs, server: str = "ledge-server") -> str:
    """The cloud with one TLS listener that wants a client certificate from the CA."""
    where = certs.directory
    return (
        '[gateway]\nid = "cloud"\n[[listeners]]\nname = "mqtts"\nhost = "127.0.0.1"\n'
        f'port = 0\ntype = "tls"\ncertfile = "{where / server}.crt"\n'
        f'keyfile = "{where / server}.key"\ncafile = "{certs.ca}"\nrequire_certificate = true\n'
    )


def tls_options(certs: Certs, ca: Path | None = None, extra: str = "") -> str:
    return (
        f'[bridges.tls]\nenabled = true\nca_file = "{ca or certs.ca}"\n'
        f'cert_file = "{certs.client_cert}"\nkey_file = "{certs.client_key}"\n{extra}'
    )


def test_over_mutual_tls_the_bridge_shows_its_certificate_and_trusts_the_ca_file(
    certs: Certs,
) -> None:
    async def story() -> None:
        cloud = await started(tls_cloud(certs))
        # [bridges.tls] is a table of its own: the rules (an array) come after it.
        config = edge(f"127.0.0.1:{port_of(cloud)}", rules="") + tls_options(certs) + RULES
        gw = await started(config)
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            conn = session_at(cloud).conn
            assert conn is not None and conn.identity == "sensor-1"  # the client certificate
        finally:
            await closing(gw, cloud)

    run(story)


# paho (2.x, ``_ssl_wrap_socket``) does not close the socket of a failed TLS handshake:
# the garbage collector does, with a ResourceWarning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    ("server", "ca", "insecure", "problem"),
    [
        ("ledge-server", "stranger-ca", False, "certificate verify failed"),
        ("elsewhere", "ledge-test-ca", False, "certificate verify failed: IP address mismatch"),
        ("elsewhere", "ledge-test-ca", True, None),
    ],
)
def test_a_cloud_certificate_is_verified_by_ca_and_name_unless_insecure(
    certs: Certs,
    server: str,
    ca: str,
    insecure: bool,
    problem: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ledge.bridge")

    async def story() -> None:
        cloud = await started(tls_cloud(certs, server))
        address = f"127.0.0.1:{port_of(cloud)}"
        tls = tls_options(
            certs, certs.directory / f"{ca}.crt", f"insecure = {str(insecure).lower()}\n"
        )
        gw = await started(edge(address, rules="") + tls + RULES)
        bridge = bridge_of(gw)
        try:
            if problem is None:
                await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
                return
            await async_wait_for(lambda: bridge_lines(caplog), 10, "a failure")
            [(level, text), *_] = bridge_lines(caplog)
            assert level == logging.WARNING
            assert text.startswith(f"bridge up: cannot connect to {address} (")
            assert problem in text and problem in bridge.last_error
            assert bridge.stats.connects == 0
        finally:
            await closing(gw, cloud)

    run(story)
