"""``ledge health [--wait [SECONDS]] [--json]``: is the running gateway healthy by what
it is for?

Run on the device beside the gateway, with the config it runs on. It gathers the facts
here (sockets only) and lets ``gateway.cli.verdict.verdict`` judge them:

- every listener of the config gets a CONNECT (MQTT 3.1.1) on the loopback address
  when it listens on all addresses: over TCP; over TLS after a handshake that does not
  verify the certificate (serving is checked, not identity; a listener that requires a
  client certificate is checked up to its handshake); over WebSocket after the HTTP
  upgrade;
- the bridges' state and the sensors' silence are read from the retained ``$SYS``
  values over the first plain TCP listener that accepts the login;
- each MQTT-SN UDP transport gets a SEARCHGW and must answer GWINFO.

A login (``LEDGE_HEALTH_USERNAME`` / ``LEDGE_HEALTH_PASSWORD``) is used when given.
Exit 0 when healthy, 1 when not (within ``--wait``), 2 when the config cannot be used.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cli.verdict import (
    BridgeFact,
    Check,
    ListenerFact,
    MqttSnFact,
    SensorFact,
    healthy,
    report,
    text,
    verdict,
)
from gateway.mqtt import MQTT_311, ConnAck, Connect, Disconnect, NeedData, PacketReader, encode
from gateway.mqtt.errors import MQTTError

if TYPE_CHECKING:
    from gateway.app.runtime import ListenerSettings, RuntimeConfig
    from gateway.mqttsn.settings import UdpSettings
    from gateway.sensors.ble_settings import BleDeviceSettings

EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_CONFIG = 2
#: Seconds a probe waits for a connection or an answer.
PROBE_TIMEOUT = 3.0
#: Seconds between rounds of ``--wait`` (a polling interval, not a synchronisation).
RETRY_EVERY = 1.0
#: ``--wait`` without a number: the config's ``health.timeout``.
FROM_CONFIG = -1.0
USERNAME_ENV = "LEDGE_HEALTH_USERNAME"
PASSWORD_ENV = "LEDGE_HEALTH_PASSWORD"
SYS = "$SYS/broker/"
#: Loopback for a listener on every address.
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "health",
        help="whether the running gateway is healthy (listeners, bridges, sensors)",
        description="Check the running gateway by what it is for: every listener answers "
        "a CONNECT with a CONNACK (a refused login counts: it serves), every bridge is "
        "connected, every sensor was heard within its interval, every MQTT-SN UDP "
        "transport answers SEARCHGW. One line per check; exit 0 when all pass, 1 when "
        "not, 2 when the config cannot be used. A login comes from the environment: "
        f"{USERNAME_ENV} and {PASSWORD_ENV}.",
    )
    parser.add_argument("-c", "--config", type=Path, metavar="FILE", help="TOML config file")
    parser.add_argument(
        "--wait",
        nargs="?",
        type=_seconds,
        const=FROM_CONFIG,
        metavar="SECONDS",
        help="check again until healthy or SECONDS pass (without a number: the "
        "config's health.timeout, 300); default: check once",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the verdict as JSON: healthy, elapsed_seconds, checks (name, ok, detail)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not 0 or more seconds")
    return value


@dataclass(frozen=True, slots=True)
class Login:
    username: str | None
    password: str | None

    @classmethod
    def from_env(cls) -> Login:
        return cls(os.environ.get(USERNAME_ENV) or None, os.environ.get(PASSWORD_ENV) or None)


def main(args: argparse.Namespace) -> int:
    from gateway.app.config import Config, load_config
    from gateway.app.runtime import ConfigError

    try:
        config = (Config() if args.config is None else load_config(args.config)).to_runtime()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    wait: float | None = args.wait
    if wait == FROM_CONFIG:
        wait = config.health.timeout
    login = Login.from_env()
    started = time.monotonic()
    while True:
        checks = gather(config, login)
        elapsed = time.monotonic() - started
        if healthy(checks) or wait is None or elapsed >= wait:
            break
        failing = ", ".join(c.name for c in checks if not c.ok)
        print(
            f"ledge health: not healthy after {elapsed:.0f} s ({failing}); "
            f"checking again for up to {wait - elapsed:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(RETRY_EVERY)
    if args.json:
        print(json.dumps(report(checks, elapsed), indent=2))
    else:
        sys.stdout.write(text(checks))
        verdict_line = "healthy" if healthy(checks) else "NOT healthy"
        print(f"{verdict_line} ({sum(c.ok for c in checks)} of {len(checks)} checks pass)")
    return EXIT_OK if healthy(checks) else EXIT_UNHEALTHY


def gather(config: RuntimeConfig, login: Login) -> list[Check]:
    """Probe the gateway once and judge what was seen."""

    listeners = [probe_listener(lc, i, login) for i, lc in enumerate(config.listeners)]
    bridges: list[BridgeFact] = []
    sensors: list[SensorFact] = []
    unreadable = ""
    if config.bridges or config.serial or config.ble:
        values: dict[str, str] = {}
        try:
            values = read_sys(config, listeners, login)
        except _Unreadable as exc:
            unreadable = str(exc)
        bridges = [
            BridgeFact(b.name, values.get(f"{SYS}bridge/{b.name}/state")) for b in config.bridges
        ]
        sensors = sensor_facts(config, values, time.time())
        if config.broker.sys_interval == 0 and not unreadable and (config.serial or config.ble):
            # Bridges publish their state when it changes; sensors only with $SYS.
            sensors = [
                _replace_unreadable(s, "broker.sys_interval = 0: the gateway publishes no $SYS")
                for s in sensors
            ]
    mqttsn = [probe_mqttsn(u, config.mqttsn.gateway_id) for u in config.mqttsn.udp]
    return verdict(
        listeners,
        bridges,
        sensors,
        mqttsn,
        unreadable=unreadable,
        grace=config.broker.sys_interval,
    )


def _replace_unreadable(fact: SensorFact, why: str) -> SensorFact:
    return replace(fact, silent=None, missing=why)


# ---------------------------------------------------------------------- listeners


def _host(host: str) -> str:
    return _LOOPBACK.get(host, host)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def probe_listener(lc: ListenerSettings, index: int, login: Login) -> ListenerFact:
    """CONNECT to one listener and note the CONNACK (or why none came)."""

    host = _host(lc.host)
    address = _address(host, lc.port)
    name = lc.name or _address(lc.host or "0.0.0.0", lc.port)
    tls = lc.type in ("tls", "websocket-tls")
    websocket = lc.type.startswith("websocket")
    via = " + ".join(
        p
        for p in ("TLS, certificate not verified" if tls else "", "WebSocket" if websocket else "")
        if p
    )

    def fact(
        connack: int | None, error: str = "", note: str = via, handshake: bool = False
    ) -> ListenerFact:
        return ListenerFact(name, address, connack, MQTT_311, error, note, handshake)

    if lc.port == 0:
        return fact(None, f"listeners[{index}].port = 0 (any free port) cannot be probed")
    try:
        sock = socket.create_connection((host, lc.port), timeout=PROBE_TIMEOUT)
    except OSError as exc:
        return fact(None, f"nothing listens: {exc.strerror or exc}")
    try:
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            sock = context.wrap_socket(sock, server_hostname=host)
            if lc.require_certificate:
                # Without a client certificate the MQTT conversation cannot start; a
                # completed handshake is as far as a probe can see.
                return fact(None, "", f"{via}; requires a client certificate", handshake=True)
        send, receive = _raw(sock)
        if websocket:
            send, receive = _websocket(sock, host, lc.port, lc.path)
        return fact(connack_of(send, receive, login))
    except (OSError, MQTTError, ValueError) as exc:
        return fact(None, str(exc) or type(exc).__name__)
    finally:
        sock.close()


def _raw(sock: socket.socket) -> tuple[Callable[[bytes], None], Callable[[], bytes]]:
    def receive() -> bytes:
        data = sock.recv(4096)
        if not data:
            raise ConnectionError("the connection was closed without a CONNACK")
        return data

    return sock.sendall, receive


def _websocket(
    sock: socket.socket, host: str, port: int, path: str
) -> tuple[Callable[[bytes], None], Callable[[], bytes]]:
    """An RFC 6455 client: the upgrade, then one binary frame per send (masked, as a
    client must) and one frame's payload per receive."""
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {_address(host, port)}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: mqtt\r\n\r\n".encode()
    )
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        data = sock.recv(4096)
        if not data:
            raise ConnectionError("the WebSocket upgrade was not answered")
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 101 " not in f"{status} ":
        raise ConnectionError(f"WebSocket upgrade refused: {status}")
    pending = bytearray(rest)

    def send(data: bytes) -> None:
        mask = os.urandom(4)
        size = len(data)
        header = (
            bytes((0x82, 0x80 | size))
            if size < 126
            else bytes((0x82, 0xFE)) + size.to_bytes(2, "big")
        )
        sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def need(n: int) -> bytes:
        while len(pending) < n:
            data = sock.recv(4096)
            if not data:
                raise ConnectionError("the connection was closed without a CONNACK")
            pending.extend(data)
        out = bytes(pending[:n])
        del pending[:n]
        return out

    def receive() -> bytes:
        first, second = need(2)
        size = second & 0x7F
        if size == 126:
            size = int.from_bytes(need(2), "big")
        elif size == 127:
            size = int.from_bytes(need(8), "big")
        payload = need(size)
        if first & 0x0F == 0x8:
            raise ConnectionError("the WebSocket was closed without a CONNACK")
        return payload

    return send, receive


def connack_of(send: Callable[[bytes], None], receive: Callable[[], bytes], login: Login) -> int:
    """Send a CONNECT (MQTT 3.1.1, clean session) and return the CONNACK's return code."""
    password = login.password.encode() if login.password is not None else None
    send(
        encode(
            Connect(
                f"ledge-health-{os.getpid()}", MQTT_311, True, 30, None, login.username, password
            ),
            MQTT_311,
        )
    )
    reader = PacketReader(version=MQTT_311)
    while True:
        reader.receive_data(receive())
        packet = reader.next_packet()
        if isinstance(packet, NeedData):
            continue
        if not isinstance(packet, ConnAck):
            raise ValueError(f"answered a CONNECT with {type(packet).__name__}, not CONNACK")
        if packet.reason_code == 0:
            send(encode(Disconnect(), MQTT_311))  # a clean goodbye, not a lost connection
        return packet.reason_code


# ---------------------------------------------------------------------- $SYS


class _Unreadable(Exception):
    """Why the bridges' and sensors' state could not be read."""


def read_sys(config: RuntimeConfig, listeners: list[ListenerFact], login: Login) -> dict[str, str]:
    """The retained ``$SYS`` values of the bridges and sensors, over the first plain TCP
    listener that accepted the login."""
    from gateway.cli.bridge import collect

    tried = []
    for lc, fact in zip(config.listeners, listeners, strict=True):
        if lc.type != "tcp":
            continue
        if fact.connack != 0:
            tried.append(
                f"{fact.address} "
                + (
                    f"refused the login (CONNACK 0x{fact.connack:02X})"
                    if fact.connack
                    else "did not answer"
                )
            )
            continue
        filters = (f"{SYS}bridge/+/state", f"{SYS}sensors/+/+/#")
        try:
            return collect(_host(lc.host), lc.port, login.username, login.password, filters)
        except (OSError, MQTTError, RuntimeError) as exc:
            tried.append(f"{fact.address}: {exc}")
    if not tried:
        raise _Unreadable("no plain TCP listener to read $SYS from")
    hint = f" (set {USERNAME_ENV}/{PASSWORD_ENV})" if "login" in " ".join(tried) else ""
    raise _Unreadable("cannot read $SYS: " + "; ".join(tried) + hint)


def sensor_facts(config: RuntimeConfig, values: dict[str, str], now: float) -> list[SensorFact]:
    """Each configured sensor device with its interval and what ``$SYS`` says of it."""

    def silent(base: str) -> float | None:
        since = values.get(base + "silent since")
        try:
            return None if since is None else max(0.0, now - float(since))
        except ValueError:
            return None

    facts = []
    for i, s in enumerate(config.serial):
        base = f"{SYS}sensors/serial/{s.name}/"
        connected = values.get(base + "connected")
        facts.append(
            SensorFact(
                "serial",
                s.name,
                s.heard_within,
                silent(base),
                values.get(base + "readings", "0") != "0",
                None if connected is None else connected == "1",
                f"serial[{i}].heard_within",
            )
        )
    for i, d in enumerate(config.ble):
        base = f"{SYS}sensors/ble/{d.name}/"
        interval, key, unchecked = _ble_interval(config, d, i)
        heard = (
            values.get(base + "adverts", "0") != "0" or values.get(base + "readings", "0") != "0"
        )
        facts.append(SensorFact("ble", d.name, interval, silent(base), heard, None, key, unchecked))
    return facts


def _ble_interval(config: RuntimeConfig, d: BleDeviceSettings, i: int) -> tuple[float, str, str]:
    """A BLE device's interval, the key it comes from, and why it is not checked."""
    from gateway.sensors.ble_settings import GATT_FORMATS

    bt = config.bluetooth
    if d.beacon_like:
        return 0.0, "", "a beacon reports presence; its being away is not a fault"
    if d.format == "gatt" and not d.characteristics:
        return 0.0, "", "it only takes commands (no characteristics)"
    away, key = (
        (d.away_after, f"ble[{i}].away_after")
        if d.away_after is not None
        else (bt.away_after, "bluetooth.away_after")
    )
    if d.format in GATT_FORMATS:
        polled = d.poll_interval + bt.gatt_timeout
        if polled > away:
            return polled, f"ble[{i}].poll_interval + bluetooth.gatt_timeout", ""
    return away, key, ""


# ---------------------------------------------------------------------- MQTT-SN


def probe_mqttsn(udp: UdpSettings, gateway_id: int) -> MqttSnFact:
    """SEARCHGW to one UDP transport; it must answer GWINFO (MQTT-SN 1.2, 6.1)."""
    from gateway.mqttsn.codec import decode
    from gateway.mqttsn.encoding import encode as sn_encode
    from gateway.mqttsn.packets import GwInfo, SearchGw

    host = _host(udp.host)
    address = _address(host, udp.port)
    if udp.port == 0:
        return MqttSnFact(address, False, "port 0 (any free port) cannot be probed")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(PROBE_TIMEOUT)
        try:
            # Connected, so a port nobody listens on is told at once (ICMP unreachable).
            sock.connect((host, udp.port))
            sock.send(sn_encode(SearchGw(0)))
            deadline = time.monotonic() + PROBE_TIMEOUT
            while time.monotonic() < deadline:
                data = sock.recv(2048)
                try:
                    packet = decode(data)
                except ValueError:
                    continue
                if isinstance(packet, GwInfo):
                    if packet.gw_id != gateway_id:
                        return MqttSnFact(address, False, f"GWINFO from gateway {packet.gw_id}")
                    return MqttSnFact(address, True)
        except ConnectionRefusedError:
            return MqttSnFact(address, False, "nothing listens")
        except OSError as exc:
            return MqttSnFact(address, False, str(exc) or type(exc).__name__)
    return MqttSnFact(address, False, "no answer")
