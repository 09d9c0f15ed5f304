"""The firmware bridge over real UDP sockets, against independent MQTT-SN clients.

``ledge run`` serves MQTT-SN on a free loopback UDP port. The MQTT-SN side is the
PyPI client ``mqtt-sn-12`` (its ``mqtt_sn_pub`` / ``mqtt_sn_sub`` commands and its
``MqttSnClient`` class, tested by its author against EMQX and HiveMQ Edge); the MQTT
side is paho-mqtt or Debian's ``mosquitto_sub`` connected to the same Ledge.

Where ``mqtt-sn-12`` has no call for a step, the test uses that library's own packet
classes over its own socket (said at each place): its client has no wake-up (PINGREQ
with a client id) and never acknowledges a QoS 1 delivery (``polling`` compares the
QoS with a flag constant). QoS 1 and 2 deliveries to a device are tested with the
other PyPI client, ``mqttsn`` (0.0.4, from the Eclipse RSMB client).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mqttsn12.client.MqttSnClient import (  # type: ignore[import-untyped]
    MqttSnClient,
    MqttSnListener,
    MqttSnMessage,
)
from mqttsn12.packets import PingReqPacket  # type: ignore[import-untyped]

from gateway.mqttsn.codec import decode
from gateway.mqttsn.encoding import encode
from gateway.mqttsn.packets import (
    ConnAck,
    Connect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    ReturnCode,
    SubAck,
    Subscribe,
)
from gateway.mqttsn.packets import Disconnect as SnDisconnect
from tests.support.clients import Paho
from tests.support.procs import LedgeProcess, free_port
from tests.support.prometheus import metrics_text, promtool_problems, scrape
from tests.support.wait import wait_for

BIN = Path(sys.executable).parent
PREDEFINED = {7: "plant/boiler/temperature"}


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Listener(MqttSnListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.messages: list[tuple[str | None, bytes]] = []

    def message_arrived(self, msg: MqttSnMessage) -> None:
        self.messages.append((msg.get_topic_name(), bytes(msg.get_payload())))


class Gateway:
    """``ledge run`` with MQTT (TCP) and MQTT-SN (UDP) on free loopback ports."""

    def __init__(self, tmp: Path, extra: str = "", mqttsn: str = "") -> None:
        self.adv_port = free_udp_port()
        config = tmp / "ledge.toml"
        config.write_text(
            "[[listeners]]\nport = 0\n"
            f"{extra}\n"
            "[mqttsn]\n"
            'predefined_topics = { 7 = "plant/boiler/temperature" }\n'
            "retry_interval = 0.5\nmax_retries = 3\nadvertise_interval = 1\n"
            f"{mqttsn}\n"
            "[[mqttsn.udp]]\nport = 0\n"
            f'broadcast = ["127.0.0.1:{self.adv_port}"]\n'
        )
        self.proc = LedgeProcess(config=config, listen=False)

    def __enter__(self) -> Gateway:
        self.proc.start(listeners=2)
        self.mqtt_port, self.sn_port = self.proc.ports[0], self.proc.ports[1]
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stop() == 0, self.proc.log

    def client(self, client_id: str, keep_alive: int = 30) -> MqttSnClient:
        c = MqttSnClient()
        c.set_client_id(client_id)
        c.set_keep_alive(keep_alive)
        c.set_timeout(5)
        c.open("127.0.0.1", self.sn_port)
        return c

    def watcher(self, topic: str = "#", qos: int = 1) -> Paho:
        w = Paho(self.mqtt_port, f"watch-{os.getpid()}-{free_port()}", version=4).connect()
        w.subscribe(topic, qos)
        return w


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    with Gateway(tmp_path) as g:
        yield g


def sn_pub(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "mqtt_sn_pub"), "-h", "127.0.0.1", "-p", str(port), "--timeout", "5", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )


# ---------------------------------------------------------------------- publishing


def test_mqtt_sn_pub_at_every_qos_reaches_an_mqtt_subscriber(gw: Gateway) -> None:
    """QoS 0, 1 and 2 with REGISTER of a normal topic, QoS -1 without a connection on a
    predefined topic id, a short topic name; paho sees each once."""
    w = gw.watcher()
    for args in (
        ["-t", "sensors/t0", "-m", "zero", "-q", "0"],
        ["-t", "sensors/t1", "-m", "one", "-q", "1"],
        ["-t", "sensors/t2", "-m", "two", "-q", "2"],
        ["-T", "7", "-m", "80.5", "-q", "-1"],
        ["-t", "xy", "-m", "short", "-q", "1"],
        ["-t", "sensors/r", "-m", "kept", "-q", "1", "-r"],
    ):
        out = sn_pub(gw.sn_port, *args)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        assert "error" not in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
    got = w.wait_messages(6)
    assert sorted((m.topic, m.payload) for m in got) == sorted(
        [
            ("sensors/t0", b"zero"),
            ("sensors/t1", b"one"),
            ("sensors/t2", b"two"),
            ("plant/boiler/temperature", b"80.5"),
            ("xy", b"short"),
            ("sensors/r", b"kept"),
        ]
    )
    late = gw.watcher("sensors/r")  # retained: a new subscriber gets it at once
    assert [(m.topic, m.payload, m.retain) for m in late.wait_messages(1)] == [
        ("sensors/r", b"kept", True)
    ]
    w.disconnect()
    late.disconnect()


def test_an_unregistered_topic_id_is_rejected_invalid_topic_id(gw: Gateway) -> None:
    c = gw.client("bad-topic")
    c.send_connect()
    with pytest.raises(Exception, match="invalid topic ID"):
        c.send_publish_with_id(4242, 0, b"x", 1)  # normal topic id never registered
    c.send_disconnect()
    c.close()


# ---------------------------------------------------------------------- subscribing


def test_wildcard_subscription_registers_topics_before_delivery(gw: Gateway) -> None:
    mqtt = Paho(gw.mqtt_port, "pub-wild", version=4).connect()
    c = gw.client("sub-wild")
    c.send_connect()
    listener = Listener()
    c.send_subscribe("cmd/+/set", 0, listener)
    mqtt.publish("cmd/led/set", b"on", qos=1)
    mqtt.publish("cmd/fan/set", b"off", qos=1)

    def polled() -> bool:
        c.polling()
        return len(listener.messages) >= 2

    wait_for(polled, 10, "two deliveries")
    # mqtt-sn-12 learned each topic from our REGISTER: it names them.
    assert listener.messages == [("cmd/led/set", b"on"), ("cmd/fan/set", b"off")]
    c.send_disconnect()
    c.close()
    mqtt.disconnect()


def test_mqtt_sn_sub_gets_a_retained_message_on_subscribe(gw: Gateway) -> None:
    mqtt = Paho(gw.mqtt_port, "pub-ret", version=4).connect()
    mqtt.publish("state/door", b"open", qos=1, retain=True)
    out = subprocess.run(
        [str(BIN / "mqtt_sn_sub"), "-p", str(gw.sn_port), "-t", "state/#", "-1", "--timeout", "5"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["open"]
    mqtt.disconnect()


def test_predefined_and_short_topic_subscriptions(gw: Gateway) -> None:
    mqtt = Paho(gw.mqtt_port, "pub-pre", version=4).connect()
    c = gw.client("sub-pre")
    c.send_connect()
    pre, short = Listener(), Listener()
    c.send_subscribe_predefined(7, 0, pre)
    c.send_subscribe("zz", 0, short)
    mqtt.publish("plant/boiler/temperature", b"81", qos=1)
    mqtt.publish("zz", b"short!", qos=1)

    def polled() -> bool:
        c.polling()
        return bool(pre.messages and short.messages)

    wait_for(polled, 10, "deliveries on predefined and short topics")
    assert [m[1] for m in pre.messages] == [b"81"]
    assert [m[1] for m in short.messages] == [b"short!"]
    c.send_disconnect()
    c.close()
    mqtt.disconnect()


def test_qos1_and_qos2_deliveries_to_a_device_are_acknowledged(gw: Gateway) -> None:
    """With the ``mqttsn`` PyPI client, which runs PUBACK and PUBREC/PUBREL/PUBCOMP."""
    from mqttsn.client import Callback, Client  # type: ignore[import-untyped]

    got: list[tuple[int, bytes]] = []
    done = threading.Event()

    class Cb(Callback):  # type: ignore[misc]
        def message_arrived(self, topic: object, payload: bytes, qos: int, *a: object) -> bool:
            got.append((qos, bytes(payload)))
            if len(got) >= 2:
                done.set()
            return True

    client = Client(b"rsmb-client", port=gw.sn_port, host="127.0.0.1")
    client.register_callback(Cb())
    client.connect()
    rc, _topic_id = client.subscribe("qq", qos=2)  # a short topic name: no REGISTER
    assert rc == 0
    mqtt = Paho(gw.mqtt_port, "pub-qq", version=4).connect()
    mqtt.publish("qq", b"at-least-once", qos=1)
    mqtt.publish("qq", b"exactly-once", qos=2)
    assert done.wait(10), got
    assert got == [(1, b"at-least-once"), (2, b"exactly-once")]

    def settled() -> bool:  # nothing left in flight at the gateway: every ack arrived
        return "retransmitted" not in gw.proc.log and "lost" not in gw.proc.log

    assert settled()
    client.sock.close()
    mqtt.disconnect()


# ---------------------------------------------------------------------- wills, sleep


def test_a_device_lost_on_keep_alive_has_its_will_published(gw: Gateway) -> None:
    w = gw.watcher("status/#")
    c = gw.client("will-dev", keep_alive=1)
    c.set_will("status/will-dev", "offline", 1, False)
    c.send_connect()
    c.datagram_socket.close()  # the device dies: no DISCONNECT, nothing more
    got = w.wait_messages(1, timeout=10)
    assert [(m.topic, m.payload) for m in got] == [("status/will-dev", b"offline")]
    gw.proc.wait_log(r"client 'will-dev' at .* lost: keep alive of 1 s")
    w.disconnect()


def test_a_sleeping_device_gets_its_buffered_messages_when_it_wakes(gw: Gateway) -> None:
    mqtt = Paho(gw.mqtt_port, "pub-sleep", version=4).connect()
    c = gw.client("sleeper")
    c.send_connect()
    listener = Listener()
    c.send_subscribe("to/sleeper/#", 0, listener)
    c.send_disconnect(60)  # DISCONNECT with a duration: asleep
    mqtt.publish("to/sleeper/a", b"first", qos=1)
    mqtt.publish("to/sleeper/b", b"second", qos=1)
    gw.proc.wait_log(r"'ledge-|pub-sleep")  # the publisher is in
    # mqtt-sn-12's client has no wake-up call, and PingReqPacket.set_client_id stores
    # bytes its encode() cannot take: the field is set directly, the library encodes.
    wake = PingReqPacket()
    wake.client_id = "sleeper"
    c.send_packet(wake.encode())

    def polled() -> bool:
        c.polling()
        return len(listener.messages) >= 2

    wait_for(polled, 10, "buffered messages after waking")
    assert listener.messages == [("to/sleeper/a", b"first"), ("to/sleeper/b", b"second")]
    # ... then PINGRESP (6.14): back to sleep.
    assert c.wait_for(True, 0x17) == bytes.fromhex("0217")
    c.send_connect()  # back to active; nothing is delivered twice
    for _ in range(5):
        c.polling()
    assert len(listener.messages) == 2
    c.send_disconnect()
    c.close()
    mqtt.disconnect()


# ---------------------------------------------------------------------- discovery


def test_advertise_is_broadcast_and_searchgw_answered(gw: Gateway) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", gw.adv_port))
        s.settimeout(5)
        data, _ = s.recvfrom(100)
    # ADVERTISE (5.4.1): Length 5, MsgType 0x00, GwId 1, Duration 1 s.
    assert data == bytes.fromhex("0500010001")
    c = gw.client("searcher")
    c.send_search_gateway(1)  # raises unless a GWINFO comes back
    c.close()


# ---------------------------------------------------------------------- hostile input


def test_malformed_datagrams_are_logged_with_source_and_offset(gw: Gateway) -> None:
    bad = (b"\x00", b"\x05\x0c\x00", b"\x02\xff", b"\x07\x04\x04\x01\x00\x3c\xff")
    with _socket_on("127.0.0.1") as s:
        for data in bad:  # one line per source a minute: the first of these
            s.sendto(data, ("127.0.0.1", gw.sn_port))
    with _socket_on("127.0.0.2") as s:
        port = s.getsockname()[1]
        s.sendto(bad[-1], ("127.0.0.1", gw.sn_port))
    line = gw.proc.wait_log(r"unreadable message from 127\.0\.0\.2:%d at byte 6: ClientId" % port)  # noqa: UP031
    assert "not UTF-8" in line
    assert len([x for x in gw.proc.lines if "unreadable message from 127.0.0.1:" in x]) == 1
    out = sn_pub(gw.sn_port, "-t", "still/works", "-m", "yes", "-q", "1")
    assert out.returncode == 0, out.stderr


def test_a_connect_flood_from_many_addresses_cannot_evict_devices(tmp_path: Path) -> None:
    with Gateway(tmp_path, mqttsn="max_clients = 3") as gw:
        devices = [gw.client(f"dev{i}") for i in range(3)]
        for i, d in enumerate(devices):
            d.send_connect()
            d.send_register(f"alive/{i}")  # heard from after the CONNACK: proven
        refused = 0
        for i in range(200):
            # From 200 source addresses across 127.0.0.0/8 (all loopback).
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((f"127.0.{1 + i // 250}.{2 + i % 250}", 0))
                s.settimeout(2)
                cid = f"flood{i}".encode()
                # CONNECT (5.4.4): Length, 0x04, flags CleanSession, ProtocolId, Duration 60.
                connect = bytes((6 + len(cid), 0x04, 0x04, 0x01, 0x00, 0x3C)) + cid
                s.sendto(connect, ("127.0.0.1", gw.sn_port))
                reply, _ = s.recvfrom(10)
                refused += reply == CONGESTION
        assert refused == 200
        for i, d in enumerate(devices):  # every established device still publishes
            d.send_publish(f"alive/{i}", b"yes", 1)
            d.send_disconnect()
            d.close()
        gw.proc.wait_log(r"refusing CONNECT of 'flood0': all 3 client slots held by established")


ACCEPTED = b"\x03\x05\x00"  # CONNACK accepted (5.4.5)
CONGESTION = b"\x03\x05\x01"  # CONNACK rejected: congestion


def _connect_from(
    s: socket.socket, client_id: str, port: int, duration: int = 0, timeout: float = 5
) -> bytes:
    """A raw CONNECT (5.4.4), CleanSession, no Will, from ``s``: the CONNACK's bytes
    (``b""`` when none comes within ``timeout``)."""
    s.settimeout(timeout)
    cid = client_id.encode()
    head = bytes((6 + len(cid), 0x04, 0x04, 0x01)) + duration.to_bytes(2, "big")
    s.sendto(head + cid, ("127.0.0.1", port))
    try:
        reply, _ = s.recvfrom(16)
    except TimeoutError:
        return b""
    return reply


def _socket_on(host: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    return s


def _http_port(gw: Gateway) -> int:
    line = gw.proc.wait_log(r"listening on 127\.0\.0\.1:\d+ \(http\)")
    return int(line.rsplit(":", 1)[1].split()[0])


def _flood(port: int, addresses: int = 8, each: int = 128) -> list[bytes]:
    """The attack from the field: ``each`` CONNECTs with a keep-alive of 65535 s from
    each of ``addresses`` loopback addresses, then silence. The sockets stay open (a
    port the kernel reused would be the same client). The CONNACKs, in order."""
    sockets = [_socket_on(f"127.8.0.{1 + n % addresses}") for n in range(addresses * each)]
    try:
        return [
            _connect_from(s, f"flood{n}", port, duration=65535, timeout=2)
            for n, s in enumerate(sockets)
        ]
    finally:
        for s in sockets:
            s.close()


def _newcomer_publishes(gw: Gateway, client_id: str) -> None:
    """A well-behaved new device (mqtt-sn-12's mqtt_sn_pub) connects and publishes at
    QoS 1, trying again while the gateway answers congestion, as devices do."""

    def published() -> bool:
        out = sn_pub(gw.sn_port, "-i", client_id, "-t", f"alive/{client_id}", "-m", "hi", "-q", "1")
        return out.returncode == 0

    wait_for(published, 30, f"{client_id} connected and published")


def test_the_eight_address_flood_leaves_a_new_device_served_on_the_defaults(
    tmp_path: Path,
) -> None:
    """128 CONNECTs with a keep-alive of 65535 s from each of 8 addresses against the
    shipped defaults: the CONNECT rates and the unproven share keep the pool for real
    devices; a device connected before keeps working, a new one is served, and the
    refusals write a line per address, not a line per datagram."""
    with Gateway(tmp_path, extra="[http]\nenabled = true\nport = 0\n") as gw:
        http = _http_port(gw)
        w = gw.watcher("alive/#")
        steady = gw.client("steady", keep_alive=300)
        steady.send_connect()
        steady.send_register("alive/steady")
        try:
            replies = _flood(gw.sn_port)
            assert set(replies) <= {ACCEPTED, CONGESTION}
            assert replies.count(CONGESTION) > 0
            _newcomer_publishes(gw, "newcomer")
            steady.send_publish("alive/steady", b"yes", 1)
            got = w.wait_messages(2)
            assert sorted((m.topic, m.payload) for m in got) == [
                ("alive/newcomer", b"hi"),
                ("alive/steady", b"yes"),
            ]
            steady.send_disconnect()
        finally:
            steady.close()
        w.disconnect()
        m = scrape(http)
        refused = m["ledge_mqttsn_clients_refused_total"]
        assert refused >= replies.count(CONGESTION)
        assert m["ledge_mqttsn_clients_refused_rate_total"] > 0
        lines = [line for line in gw.proc.lines if "refusing CONNECT" in line]
        assert 1 <= len(lines) <= 8 + 1, lines  # a line per address, one for the sum


def test_the_pool_itself_keeps_room_for_new_devices_when_the_flood_fills_it(
    tmp_path: Path,
) -> None:
    """The same flood with the CONNECT rates out of the way: it fills all 1,024 slots
    (the per-address limit makes room by evicting the address's own oldest), and each
    newcomer takes the slot of the oldest client not heard from since its CONNACK."""
    rates = "max_connect_rate = 1000000\nmax_connect_rate_per_address = 1000000"
    with Gateway(tmp_path, extra="[http]\nenabled = true\nport = 0\n", mqttsn=rates) as gw:
        http = _http_port(gw)
        w = gw.watcher("alive/#")
        steady = gw.client("steady", keep_alive=300)
        steady.send_connect()
        steady.send_register("alive/steady")
        try:
            replies = _flood(gw.sn_port, each=129)
            assert replies == [ACCEPTED] * (8 * 129)
            m = scrape(http)
            assert m['ledge_mqttsn_clients{state="connected"}'] == 1024
            _newcomer_publishes(gw, "newcomer")
            steady.send_publish("alive/steady", b"yes", 1)
            got = w.wait_messages(2)
            assert sorted((m.topic, m.payload) for m in got) == [
                ("alive/newcomer", b"hi"),
                ("alive/steady", b"yes"),
            ]
            steady.send_disconnect()
        finally:
            steady.close()
        w.disconnect()
        m = scrape(http)
        # 1,023 free slots; the other 9 flood CONNECTs and the newcomer evicted one each.
        assert m["ledge_mqttsn_clients_evicted_unproven_total"] == 8 * 129 - 1023 + 1
        assert m["ledge_mqttsn_clients_refused_total"] == 0
        gw.proc.wait_log(r"client 'flood0' at 127\.8\.0\.1:\d+ \(.*\), silent for")


def test_a_sleeping_devices_messages_cannot_be_taken_from_another_address(
    gw: Gateway,
) -> None:
    """A device on 127.0.0.1 subscribes and sleeps; a PINGREQ naming it from
    127.0.0.66 gets DISCONNECT and nothing else, is logged and counted; the device
    itself, waking from a new port, gets its message."""
    mqtt = Paho(gw.mqtt_port, "pub-victim", version=4).connect()
    c = gw.client("victim-1")
    c.send_connect()
    listener = Listener()
    c.send_subscribe("to/victim/#", 0, listener)
    c.send_disconnect(60)  # asleep
    mqtt.publish("to/victim/a", b"secret", qos=1)
    gw.proc.wait_log(r"'pub-victim'")
    with _socket_on("127.0.0.66") as thief:
        thief.settimeout(5)
        thief.sendto(b"\x0a\x16victim-1", ("127.0.0.1", gw.sn_port))  # PINGREQ (5.4.19)
        reply, _ = thief.recvfrom(64)
        assert reply == b"\x02\x18"  # DISCONNECT: no connection here
        thief.settimeout(0.2)
        with pytest.raises(TimeoutError):
            thief.recvfrom(64)  # and nothing else: no PUBLISH, no PINGRESP
    gw.proc.wait_log(r"127\.0\.0\.66:\d+ \(.*\): PINGREQ waking 'victim-1' refused")
    assert _woken(c, "victim-1", listener) == [("to/victim/a", b"secret")]
    c.close()
    mqtt.disconnect()


def _woken(c: Any, client_id: str, listener: Listener) -> list[tuple[str | None, bytes]]:
    """The sleeping device ``c`` wakes itself (PINGREQ with its client id, see
    test_a_sleeping_device_gets_its_buffered_messages...): what it then receives."""
    wake = PingReqPacket()
    wake.client_id = client_id
    c.send_packet(wake.encode())

    def polled() -> bool:
        c.polling()
        return bool(listener.messages)

    wait_for(polled, 10, "the buffered message after waking")
    return listener.messages


def test_a_connect_cannot_take_a_sleeping_devices_messages_from_another_address(
    tmp_path: Path,
) -> None:
    """The same device asleep; a CONNECT with its client id from 127.0.0.66, clean
    session or not, gets CONNACK 0x01 and nothing else -- no PUBLISH of what waits --
    counted as a wake refused and logged; the device, waking itself, gets its message."""
    with Gateway(tmp_path, extra="[http]\nenabled = true\nport = 0\n") as gw:
        http = _http_port(gw)
        mqtt = Paho(gw.mqtt_port, "pub-victim", version=4).connect()
        c = gw.client("victim-2")
        c.send_connect()
        listener = Listener()
        c.send_subscribe("to/victim/#", 1, listener)
        c.send_disconnect(60)  # asleep
        mqtt.publish("to/victim/a", b"secret", qos=1)
        gw.proc.wait_log(r"'pub-victim'")
        with _socket_on("127.0.0.66") as thief:
            thief.settimeout(5)
            for clean in (True, False):
                thief.sendto(encode(Connect("victim-2", 60, clean)), ("127.0.0.1", gw.sn_port))
                reply, _ = thief.recvfrom(64)
                assert decode(reply) == ConnAck(ReturnCode.CONGESTION)
            thief.settimeout(0.2)
            with pytest.raises(TimeoutError):
                thief.recvfrom(64)  # and nothing else: no PUBLISH
        gw.proc.wait_log(r"127\.0\.0\.66:\d+ \(.*\): refusing CONNECT of 'victim-2': it is asleep")
        assert scrape(http)["ledge_mqttsn_wakes_refused_total"] == 2
        assert _woken(c, "victim-2", listener) == [("to/victim/a", b"secret")]
        c.close()
        mqtt.disconnect()


@pytest.mark.skipif(not shutil.which("mosquitto_sub"), reason="Debian's mosquitto-clients")
def test_mosquitto_sub_sees_a_device_publish(gw: Gateway) -> None:
    sub = subprocess.Popen(
        ["mosquitto_sub", "-p", str(gw.mqtt_port), "-t", "dev/#", "-C", "1", "-v", "-W", "10"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        gw.proc.wait_log(r"connected from 127\.0\.0\.1:\d+ \(MQTT")

        def sent() -> bool:
            sn_pub(gw.sn_port, "-t", "dev/hello", "-m", "world", "-q", "1")
            return True

        sent()
        out, _ = sub.communicate(timeout=15)
    finally:
        if sub.poll() is None:
            sub.kill()
    assert out.strip() == "dev/hello world"


def test_mqtt_sn_over_ipv6(tmp_path: Path) -> None:
    """An IPv6 socket ("::1"); mqtt-sn-12 speaks IPv4 only, so the datagrams here are
    written from the specification's layouts (5.4.4 CONNECT, 5.4.5 CONNACK)."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    config = tmp_path / "ledge6.toml"
    config.write_text('[[listeners]]\nport = 0\n[[mqttsn.udp]]\nhost = "::1"\nport = 0\n')
    proc = LedgeProcess(config=config, listen=False).start()
    try:
        line = proc.wait_log(r"listening on ::1:(\d+) \(mqtt-sn over udp\)")
        port = int(line.rsplit(":", 1)[1].split()[0])
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.settimeout(5)
            s.sendto(bytes.fromhex("0a040401003c") + b"six1", ("::1", port))
            assert s.recv(16) == bytes.fromhex("030500")  # CONNACK accepted
        proc.wait_log(r"client 'six1' connected from \[::1\]:\d+")
    finally:
        proc.stop()


def test_prometheus_metrics_count_a_real_client_and_a_malformed_datagram(tmp_path: Path) -> None:
    """``/metrics`` of ``ledge run`` with ``[http]``: mqtt_sn_pub's CONNECT, REGISTER and
    PUBLISH, a QoS -1 PUBLISH and a malformed datagram, counted without client labels."""
    with Gateway(tmp_path, extra="[http]\nenabled = true\nport = 0\n") as gw:
        line = gw.proc.wait_log(r"listening on 127\.0\.0\.1:\d+ \(http\)")
        http = int(line.rsplit(":", 1)[1].split()[0])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"\x05\x0c\x00", ("127.0.0.1", gw.sn_port))
        for args in (
            ["-i", "meter-1", "-t", "a/b", "-m", "1", "-q", "1"],
            ["-T", "7", "-m", "2", "-q", "-1"],
        ):
            out = sn_pub(gw.sn_port, *args)
            assert out.returncode == 0, out.stderr

        def counted() -> dict[str, float]:
            m = scrape(http)
            done = m["ledge_mqttsn_messages_qos_minus_one_total"] == 1
            return m if done and m["ledge_mqttsn_packets_malformed_total"] == 1 else {}

        m = wait_for(counted, 5, "the QoS -1 PUBLISH and the malformed datagram counted")
        assert m["ledge_mqttsn_connects_total"] == 1
        # CONNECT, REGISTER, PUBLISH, DISCONNECT, the QoS -1 PUBLISH (not the malformed one)
        assert m["ledge_mqttsn_packets_received_total"] >= 5
        assert m["ledge_mqttsn_packets_sent_total"] >= 4  # CONNACK, REGACK, PUBACK, DISCONNECT
        assert m['ledge_mqttsn_messages_dropped_total{reason="queue_full"}'] == 0
        assert not any("meter-1" in series for series in m)
        assert not promtool_problems(metrics_text(http))


# ---------------------------------------------------------------------- negative paths


class RawDevice:
    """A device written from the specification's messages (the project's codec, which
    the vector tests pin to the specification's layouts), for the steps the PyPI
    clients cannot take: refusing a REGISTER, losing a registration, sleeping with a
    message in flight, answering congestion."""

    def __init__(self, gw: Gateway, host: str = "127.0.0.1") -> None:
        self.sock = _socket_on(host)
        self.sock.settimeout(5)
        self.to = ("127.0.0.1", gw.sn_port)
        self.next_id = 0

    def send(self, packet: Packet) -> None:
        self.sock.sendto(encode(packet), self.to)

    def receive(self) -> Packet:
        data, _ = self.sock.recvfrom(2048)
        return decode(data)

    def expect(self, kind: type[Any]) -> Any:
        packet = self.receive()
        assert isinstance(packet, kind), packet
        return packet

    def nothing(self, seconds: float) -> None:
        self.sock.settimeout(seconds)
        try:
            with pytest.raises(TimeoutError):
                self.sock.recvfrom(2048)
        finally:
            self.sock.settimeout(5)

    def msg_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def connect(self, client_id: str) -> None:
        self.send(Connect(client_id, 60))
        assert self.expect(ConnAck).return_code == ReturnCode.ACCEPTED

    def subscribe(self, topic: str, qos: int) -> int:
        self.send(Subscribe(self.msg_id(), topic, qos))
        ack = self.expect(SubAck)
        assert ack.return_code == ReturnCode.ACCEPTED
        return int(ack.topic_id)

    def close(self) -> None:
        self.sock.close()


def test_over_udp_a_refused_regack_drops_one_message_and_the_next_is_delivered(
    gw: Gateway,
) -> None:
    mqtt = Paho(gw.mqtt_port, "pub-regack", version=4).connect()
    dev = RawDevice(gw)
    dev.connect("picky")
    dev.subscribe("cmd/#", 1)
    mqtt.publish("cmd/unwanted", b"1", qos=1)
    reg = dev.expect(Register)
    assert reg.topic_name == "cmd/unwanted"
    dev.send(RegAck(0, reg.msg_id, ReturnCode.NOT_SUPPORTED))
    mqtt.publish("cmd/wanted", b"2", qos=1)
    reg = dev.expect(Register)
    assert reg.topic_name == "cmd/wanted"
    dev.send(RegAck(reg.topic_id, reg.msg_id))
    pub = dev.expect(Publish)
    assert (pub.topic_id, pub.data) == (reg.topic_id, b"2")
    dev.send(PubAck(pub.topic_id, pub.msg_id))
    dev.nothing(1.2)  # past retry_interval (0.5 s): the refused topic is not asked again
    dev.close()
    mqtt.disconnect()


def test_over_udp_a_lost_registration_is_registered_again_in_order(gw: Gateway) -> None:
    mqtt = Paho(gw.mqtt_port, "pub-reg", version=4).connect()
    dev = RawDevice(gw)
    dev.connect("forgetful")
    dev.subscribe("cmd/#", 1)
    for n in (b"1", b"2"):
        mqtt.publish("cmd/a", n, qos=1)
    reg = dev.expect(Register)
    dev.send(RegAck(reg.topic_id, reg.msg_id))
    first = dev.expect(Publish)
    dev.send(PubAck(first.topic_id, first.msg_id, ReturnCode.INVALID_TOPIC_ID))
    again = dev.expect(Register)
    assert again.topic_name == "cmd/a"
    dev.send(RegAck(again.topic_id, again.msg_id))
    got = []
    for _ in range(2):
        pub = dev.expect(Publish)
        got.append(pub.data)
        dev.send(PubAck(pub.topic_id, pub.msg_id))
    assert got == [b"1", b"2"]
    dev.close()
    mqtt.disconnect()


def test_over_udp_a_message_in_flight_at_sleep_comes_again_at_wake(gw: Gateway) -> None:
    mqtt = Paho(gw.mqtt_port, "pub-flight", version=4).connect()
    dev = RawDevice(gw)
    dev.connect("napper")
    tid = dev.subscribe("to/napper", 1)
    mqtt.publish("to/napper", b"in flight", qos=1)
    first = dev.expect(Publish)
    dev.send(SnDisconnect(60))  # asleep without acknowledging it
    while not isinstance(got := dev.receive(), SnDisconnect):
        assert isinstance(got, Publish) and got.msg_id == first.msg_id  # a resend in between
    dev.nothing(1.2)  # asleep: no resends (retry_interval is 0.5 s)
    dev.send(PingReq("napper"))
    again = dev.expect(Publish)
    assert (again.dup, again.msg_id, again.topic_id, again.data) == (
        True,
        first.msg_id,
        tid,
        b"in flight",
    )
    dev.send(PubAck(tid, again.msg_id))
    assert dev.expect(PingResp) == PingResp()
    dev.close()
    mqtt.disconnect()


def test_over_udp_a_device_answering_congestion_gets_the_next_message(gw: Gateway) -> None:
    mqtt = Paho(gw.mqtt_port, "pub-busy", version=4).connect()
    dev = RawDevice(gw)
    dev.connect("busy")
    tid = dev.subscribe("busy", 2)
    mqtt.publish("busy", b"1", qos=2)
    first = dev.expect(Publish)
    mqtt.publish("busy", b"2", qos=2)
    dev.send(PubAck(tid, first.msg_id, ReturnCode.CONGESTION))
    second = dev.expect(Publish)
    assert (second.data, second.dup) == (b"2", False)
    dev.send(PubRec(second.msg_id))
    assert dev.expect(PubRel) == PubRel(second.msg_id)
    dev.send(PubComp(second.msg_id))
    dev.nothing(1.2)
    dev.close()
    mqtt.disconnect()


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("192.168.1.255", ("192.168.1.255", 1884)),
        ("192.168.1.255:1885", ("192.168.1.255", 1885)),
        ("ff02::1", ("ff02::1", 1884)),
        ("[ff02::1]", ("ff02::1", 1884)),
        ("[ff02::1]:1885", ("ff02::1", 1885)),
        ("ff02::1%eth0", ("ff02::1%eth0", 1884)),  # the reference's example
    ],
)
def test_a_broadcast_address_with_or_without_its_port(text: str, target: tuple[str, int]) -> None:
    """``mqttsn.udp.broadcast``: "host" or "host:port", IPv6 in brackets when a port
    follows; without a port, the listener's."""
    from gateway.net.mqttsn import _target

    assert _target(text, 1884) == target
