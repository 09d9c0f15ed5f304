"""SIGHUP changes the bridges and the HTTP listener of a running gateway: ``ledge run``
as a process, Debian's Mosquitto as the upstreams (two of them, to move a bridge from
one to the other), paho clients on both sides that stay connected throughout."""

from __future__ import annotations

import http.client
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.model import health_from_message
from gateway.cli.bridge import collect
from tests.support.clients import Paho
from tests.support.procs import LedgeProcess, MosquittoProcess, free_port
from tests.support.wait import wait_for


@pytest.fixture
def upstreams(tmp_path: Path) -> Iterator[list[MosquittoProcess]]:
    """Two Mosquittos, each with $SYS every second (to count their clients)."""
    brokers = [MosquittoProcess(tmp_path, "sys_interval 1\n") for _ in range(2)]
    yield brokers
    for broker in brokers:
        broker.stop()


def bridge(name: str, port: int, *rules: str, extra: str = "") -> str:
    return (
        f'[[bridges]]\nname = "{name}"\naddress = "127.0.0.1:{port}"\n'
        f"reconnect_min = 0.05\nreconnect_max = 0.5\n{extra}\n" + "".join(rules)
    )


def rule(filter: str, remote_prefix: str = "") -> str:
    return f'[[bridges.rules]]\nfilter = "{filter}"\nremote_prefix = "{remote_prefix}"\n'


def write(config: Path, *tables: str) -> Path:
    config.write_text('[broker]\nsys_interval = 0.2\n[gateway]\nid = "gw1"\n' + "".join(tables))
    return config


def bridge_values(proc: LedgeProcess, name: str) -> dict[str, str]:
    prefix = f"$SYS/broker/bridge/{name}/"
    values = collect("127.0.0.1", proc.port)
    return {k.removeprefix(prefix): v for k, v in values.items() if k.startswith(prefix)}


def wait_bridge(proc: LedgeProcess, name: str, key: str, value: str) -> None:
    wait_for(lambda: bridge_values(proc, name).get(key) == value, 10, f"{name} {key} = {value}")


def reload(proc: LedgeProcess) -> str:
    """SIGHUP, and the log line saying what the reload did."""
    before = sum("config reloaded" in line for line in proc.lines)
    proc.signal(signal.SIGHUP)
    wait_for(
        lambda: sum("config reloaded" in line for line in proc.lines) > before, 20, "the reload"
    )
    return [line for line in proc.lines if "config reloaded" in line][-1]


def clients_connected(watch: Paho) -> bytes:
    """The upstream's own count of connected clients (its last $SYS value)."""
    counts = [m.payload for m in watch.messages if m.topic == "$SYS/broker/clients/connected"]
    return counts[-1] if counts else b""


def first_arrivals(watch: Paho, topic: str) -> list[int]:
    """The numbers in the payloads on ``topic``, each once, in order of first arrival
    (QoS 1 may deliver a message twice across a reconnect)."""
    return list(dict.fromkeys(int(m.payload[:5]) for m in list(watch.messages) if m.topic == topic))


# ---------------------------------------------------------------------- bridges


def test_a_bridge_moved_to_another_upstream_delivers_its_outbox_there_in_order(
    tmp_path: Path, upstreams: list[MosquittoProcess]
) -> None:
    """The outbox holds messages (its upstream is gone) when SIGHUP points the bridge at
    another upstream with other rules: every queued message arrives there, in order,
    under the topic it was mapped to when queued; the new rules apply to what follows.
    An MQTT client of the gateway stays connected and keeps getting messages."""
    a, b = (u.start() for u in upstreams)
    config = tmp_path / "ledge.toml"
    # 64 KiB of the outbox in memory: most of the queue waits on disk across the change.
    outbox = "outbox = { memory_bytes = 65536 }\n"
    write(config, bridge("cloud", a.port, rule("t/#", "up/"), extra=outbox))
    proc = LedgeProcess("--data-dir", str(tmp_path / "data"), config=config).start()
    total = 300
    try:
        proc.wait_log("bridge cloud: connected to")
        watch_a = Paho(a.port, "watch-a").connect()
        watch_a.subscribe("up/#", 1)
        watch_b = Paho(b.port, "watch-b").connect()
        watch_b.subscribe("#", 1)
        local = Paho(proc.port, "local").connect()
        local.subscribe("#", 1)
        pub = Paho(proc.port, "pub").connect()
        pub.publish("t/first", b"00000 before", 1)
        wait_for(lambda: first_arrivals(watch_a, "up/t/first") == [0], 10, "A to get it")
        a.stop()
        proc.wait_log("bridge cloud: lost 127.0.0.1")
        for i in range(total):
            pub.publish("t/q", b"%05d" % i + b"x" * 1000, 1)
        wait_bridge(proc, "cloud", "queued", str(total))

        write(config, bridge("cloud", b.port, rule("u/#", "new/"), extra=outbox))
        line = reload(proc)
        assert "bridge cloud changed" in line, line
        wait_for(lambda: len(first_arrivals(watch_b, "up/t/q")) >= total, 30, "the outbox at B")
        assert first_arrivals(watch_b, "up/t/q") == list(range(total))
        # Now t/ no longer goes up and u/ does; the outbox is in order, so once u/x is
        # there, t/after would be too had it been queued.
        pub.publish("t/after", b"00001 not bridged", 1)
        pub.publish("u/x", b"00002 new rule", 1)
        wait_for(lambda: first_arrivals(watch_b, "new/u/x") == [2], 10, "u/x at B")
        assert first_arrivals(watch_b, "up/t/after") == []
        wait_bridge(proc, "cloud", "queued", "0")
        values = bridge_values(proc, "cloud")
        assert values["dropped"] == "0" and values["address"] == f"127.0.0.1:{b.port}"
        assert values["connects"] == "2"  # the counters carried on: A once, B once

        # The gateway's own client never noticed: connected throughout, everything came.
        got = {m.topic for m in local.wait_messages(total + 3)}
        assert {"t/first", "t/q", "t/after", "u/x"} <= got

        # A change while messages flow: none falls between the old bridge and the new.
        published = 0
        done = threading.Event()

        def stream() -> None:
            nonlocal published
            while not done.is_set():
                pub.publish("u/s", b"%05d" % published, 1)
                published += 1

        streamer = threading.Thread(target=stream)
        streamer.start()
        try:
            wait_for(lambda: published >= 20, 10, "the stream to start")
            extra = outbox + "keepalive = 30\n"
            write(config, bridge("cloud", b.port, rule("u/#", "new/"), extra=extra))
            assert "bridge cloud changed" in reload(proc)
            after = published
            wait_for(lambda: published >= after + 20, 10, "the stream to go on")
        finally:
            done.set()
            streamer.join()
        wait_for(
            lambda: len(first_arrivals(watch_b, "new/u/s")) >= published, 20, "the stream at B"
        )
        assert first_arrivals(watch_b, "new/u/s") == list(range(published))
        assert local.disconnects == [] and pub.disconnects == []
        for client in (watch_a, watch_b, local, pub):
            client.close()
    finally:
        assert proc.stop() == 0


def test_sighup_adds_and_removes_bridges_and_leaves_unchanged_ones_alone(
    tmp_path: Path, upstreams: list[MosquittoProcess]
) -> None:
    a, b = (u.start() for u in upstreams)
    config = write(
        tmp_path / "ledge.toml",
        bridge("keep", a.port, rule("k/#")),
        bridge("gone", b.port, rule("g/#")),
    )
    proc = LedgeProcess(config=config).start()
    try:
        proc.wait_log("bridge keep: connected to")
        proc.wait_log("bridge gone: connected to")
        watch_a = Paho(a.port, "watch-a").connect()
        watch_a.subscribe("#", 1)
        watch_b = Paho(b.port, "watch-b").connect()
        watch_b.subscribe("$SYS/broker/clients/connected")
        wait_for(lambda: clients_connected(watch_b) == b"2", 10, "B: watcher and bridge")
        pub = Paho(proc.port, "pub").connect()
        pub.publish("k/1", b"00001", 1)
        wait_for(lambda: first_arrivals(watch_a, "k/1") == [1], 10, "k/1 at A")

        write(config, bridge("keep", a.port, rule("k/#")), bridge("new", a.port, rule("n/#")))
        line = reload(proc)
        assert "bridge gone removed" in line and "bridge new added" in line, line
        assert "keep" not in line, line
        # The removed bridge's link is closed: its upstream counts the watcher alone.
        wait_for(lambda: clients_connected(watch_b) == b"1", 10, "B: the bridge gone")
        # Its $SYS values went with it; the new bridge connects and carries its branch.
        wait_for(lambda: bridge_values(proc, "gone") == {}, 10, "gone's $SYS values cleared")
        proc.wait_log("bridge new: connected to")
        pub.publish("n/1", b"00002", 1)
        pub.publish("g/1", b"00003", 1)  # nobody carries g/ now
        pub.publish("k/2", b"00004", 1)
        wait_for(lambda: first_arrivals(watch_a, "n/1") == [2], 10, "n/1 at A")
        wait_for(lambda: first_arrivals(watch_a, "k/2") == [4], 10, "k/2 at A")
        # The unchanged bridge was not touched: one connection since the start.
        wait_bridge(proc, "keep", "acknowledged", "2")
        assert bridge_values(proc, "keep")["connects"] == "1"
        assert bridge_values(proc, "new")["state"] == "connected"
        assert pub.disconnects == []
        for client in (watch_a, watch_b, pub):
            client.close()
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize("store", [True, False], ids=["data_dir", "memory"])
def test_a_removed_bridges_outbox_waits_in_the_store_until_it_is_configured_again(
    tmp_path: Path, upstreams: list[MosquittoProcess], store: bool
) -> None:
    """With a data_dir, what a removed bridge had queued goes up when a bridge of that
    name is configured again, before anything new. Without one, it is dropped: logged,
    and counted in the health report."""
    up = upstreams[0]
    up.port = free_port()  # nothing listens there yet
    health = '[gateway]\nid = "gw1"\nhealth_interval = 0.2\n'

    def configure(*bridges: str) -> None:
        config.write_text("[broker]\nsys_interval = 0.2\n" + health + "".join(bridges))

    config = tmp_path / "ledge.toml"
    configure(bridge("cloud", up.port, rule("t/#")))
    args = ("--data-dir", str(tmp_path / "data")) if store else ()
    proc = LedgeProcess(*args, config=config).start()
    try:
        watch_health = Paho(proc.port, "health").connect()
        watch_health.subscribe("ledge/gw1/health", 1)
        pub = Paho(proc.port, "pub").connect()
        for i in range(5):
            pub.publish("t/q", b"%05d" % i, 1)
        wait_bridge(proc, "cloud", "queued", "5")

        configure()
        assert "bridge cloud removed" in reload(proc)
        if store:
            proc.wait_log(
                r"bridge cloud removed: link closed; its outbox \(5 message\(s\)\) is kept"
            )
        else:
            proc.wait_log(
                r"bridge cloud removed: link closed; its outbox \(5 message\(s\), in memory"
            )

            def dropped() -> int:
                reports = [
                    health_from_message(m.topic, m.payload)[1] for m in watch_health.messages
                ]
                return sum(h.dropped for h in reports)

            wait_for(lambda: dropped() == 5, 10, "five drops in the health reports")
        pub.publish("t/q", b"00099 while removed", 1)  # no bridge carries it

        up.start(up.port)
        watch = Paho(up.port, "watch").connect()
        watch.subscribe("t/#", 1)
        configure(bridge("cloud", up.port, rule("t/#")))
        assert "bridge cloud added" in reload(proc)
        pub.publish("t/q", b"00005", 1)
        wait_for(lambda: 5 in first_arrivals(watch, "t/q"), 10, "a new message")
        assert first_arrivals(watch, "t/q") == ([0, 1, 2, 3, 4, 5] if store else [5])
        wait_bridge(proc, "cloud", "queued", "0")
        for client in (watch, watch_health, pub):
            client.close()
    finally:
        assert proc.stop() == 0


def test_the_first_bridge_added_by_sighup_numbers_its_messages_durably(
    tmp_path: Path, upstreams: list[MosquittoProcess]
) -> None:
    """A gateway started without bridges gets one by SIGHUP: its sequence numbers are
    reserved in the store before they travel (a restart numbers above them), and QoS 0
    bypassing the outbox goes up once the reservation is committed."""
    up = upstreams[0].start()
    config = write(tmp_path / "ledge.toml")
    data = str(tmp_path / "data")
    proc = LedgeProcess("--data-dir", data, config=config).start()
    watch = Paho(up.port, "watch").connect()
    watch.subscribe("t/#", 1)

    def seq(topic: str) -> int:
        got = [m for m in list(watch.messages) if m.topic == topic]
        return int(dict(got[0].properties.UserProperty)["ledge-seq"]) if got else 0

    try:
        write(config, bridge("cloud", up.port, rule("t/#"), extra='qos0 = "bypass"'))
        assert "bridge cloud added" in reload(proc)
        proc.wait_log("bridge cloud: connected to")
        pub = Paho(proc.port, "pub").connect()
        pub.publish("t/one", b"1", 1)
        wait_for(lambda: seq("t/one"), 10, "t/one upstream")

        def qos0_arrives() -> bool:
            pub.publish("t/zero", b"0", 0)
            return any(m.topic == "t/zero" for m in list(watch.messages))

        wait_for(qos0_arrives, 10, "QoS 0 upstream")
        pub.close()
    finally:
        assert proc.stop() == 0
    proc = LedgeProcess("--data-dir", data, config=config).start()
    try:
        proc.wait_log("bridge cloud: connected to")
        pub = Paho(proc.port, "pub").connect()
        pub.publish("t/two", b"2", 1)
        wait_for(lambda: seq("t/two"), 10, "t/two upstream")
        assert seq("t/two") > seq("t/one")
        pub.close()
        watch.close()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- HTTP


def get(port: int, path: str = "/metrics", token: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_the_http_listener_follows_sighup_while_mqtt_clients_stay_connected(
    tmp_path: Path,
) -> None:
    """Each SIGHUP re-makes the HTTP listener with the changed ``[http]``: a new port
    (the old one refuses), a port that is taken (the old listener keeps serving, the
    log says why), a token on the same port, off, and on again. One MQTT client stays
    connected all along and gets a message after every reload."""
    first, second = free_port(), free_port()
    token = tmp_path / "token"
    token.write_text("a-token-of-twenty-chars\n")
    token.chmod(0o600)
    config = tmp_path / "ledge.toml"

    def http_table(text: str) -> None:
        write(config, f"[http]\n{text}\n")

    http_table(f"enabled = true\nport = {first}")
    proc = LedgeProcess(config=config).start()
    sub = Paho(proc.port, "sub").connect()
    sub.subscribe("t/#", 1)
    pub = Paho(proc.port, "pub").connect()
    sent = 0

    def message_still_flows() -> None:
        nonlocal sent
        sent += 1
        pub.publish("t/x", b"%d" % sent, 1)
        sub.wait_messages(sent)
        assert sub.disconnects == [] and pub.disconnects == []

    try:
        assert get(first)[0] == 200
        message_still_flows()

        http_table(f"enabled = true\nport = {second}")
        assert "http" in reload(proc)
        assert refused(first)
        status, body = get(second)
        assert status == 200 and b"ledge_connections_total " in body
        message_still_flows()

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            http_table(f"enabled = true\nport = {busy}")
            reload(proc)
            proc.wait_log(
                rf"reload of \[http\] failed \(on 127.0.0.1:{busy}\), keeping the listener "
                rf"on 127.0.0.1:{second}: .*ddress already in use"
            )
            assert get(second)[0] == 200
            message_still_flows()

        # Same port, now with a token: the listener is made again on the same socket.
        http_table(f'enabled = true\nport = {second}\ntoken_file = "{token}"')
        assert "http" in reload(proc)
        assert get(second)[0] == 401
        status, body = get(second, token="a-token-of-twenty-chars")
        assert status == 200
        # The counters carried on across the listeners: the 200s of the two before.
        assert b'ledge_http_responses_total{code="200"} 3' in body
        assert b'ledge_http_responses_total{code="401"} 1' in body
        message_still_flows()

        http_table(f"enabled = false\nport = {second}")
        assert "http" in reload(proc)
        assert refused(second)
        message_still_flows()

        http_table(f"enabled = true\nport = {first}")
        assert "http" in reload(proc)
        assert get(first)[0] == 200
        message_still_flows()
        sub.close()
        pub.close()
    finally:
        assert proc.stop() == 0
