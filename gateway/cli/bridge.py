"""``ledge bridge status`` and ``ledge bridge test``: look at the cloud bridges.

``status`` asks the running gateway over MQTT (the retained values under
``$SYS/broker/bridge/``), so it works wherever a client can reach a listener.
``test`` needs no gateway at all: it reads the config and says which rule of which
bridge maps a topic to what, and why the others do not.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

from gateway.app.config import Config, load_config
from gateway.app.runtime import ConfigError
from gateway.bridge.rules import explain, map_in, map_out
from gateway.cli.target import add_target_args, target
from gateway.mqtt import (
    MQTT_5,
    ConnAck,
    Connect,
    NeedData,
    PacketReader,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from gateway.mqtt.errors import MQTTError

PREFIX = "$SYS/broker/bridge/"
#: Stop collecting once nothing new arrived for this long ...
QUIET = 0.3
#: ... or after this long in all.
LONGEST = 3.0
#: The order ``status`` prints the values in.
FIELDS = (
    "state",
    "address",
    "queued",
    "bytes",
    "oldest message age",
    "inflight",
    "window",
    "sent",
    "acknowledged",
    "received",
    "dropped",
    "dropped/full",
    "dropped/expired",
    "dropped/qos 0 offline",
    "dropped/rejected",
    "dropped/loops",
    "refused",
    "connects",
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bridge = commands.add_parser(
        "bridge",
        help="inspect the cloud bridges",
        description="Inspect the cloud bridges of a config or of a running gateway.",
    )
    sub = bridge.add_subparsers(dest="bridge_command", metavar="COMMAND", required=True)
    status = sub.add_parser(
        "status",
        help="state and counters of each bridge of the running gateway",
        description="Connect to the running gateway (the first listener of the config, or "
        "--broker) and print each bridge's state, outbox and counters from "
        "$SYS/broker/bridge/. Counters are as fresh as broker.sys_interval.",
    )
    add_target_args(status)
    test = sub.add_parser(
        "test",
        help="which rule maps a topic, to what, and why the others do not",
        description="For each bridge of the config, say which rule maps TOPIC across the "
        "bridge and to which topic, and why the other rules do not. Exit 0 when some "
        "bridge carries it, 1 when none does.",
    )
    test.add_argument("topic", metavar="TOPIC")
    test.add_argument("-c", "--config", type=Path, metavar="FILE", help="TOML config file")
    test.add_argument(
        "--in",
        dest="inbound",
        action="store_true",
        help="TOPIC is a remote topic coming in (default: a local topic going out)",
    )


def main(args: argparse.Namespace) -> int:
    try:
        config = Config() if args.config is None else load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.bridge_command == "test":
        return _test(config, args.topic, args.inbound)
    return _status(config, args)


# ---------------------------------------------------------------------- test


def _test(config: Config, topic: str, inbound: bool) -> int:
    if not config.bridges:
        print("no bridges are configured")
        return 1
    carried = False
    direction = "in from the remote" if inbound else "out to the remote"
    for bridge in config.bridges:
        rules = bridge.to_settings().rules
        mapper = map_in if inbound else map_out
        mapped = mapper(rules, topic, 2, False)
        verdict = f"-> {mapped.topic!r} (rule {mapped.index + 1})" if mapped else "not carried"
        print(f"bridge {bridge.name} ({direction}): {verdict}")
        for line in explain(rules, topic, outbound=not inbound):
            print(f"  {line}")
        carried = carried or mapped is not None
    return 0 if carried else 1


# ---------------------------------------------------------------------- status


def _status(config: Config, args: argparse.Namespace) -> int:
    try:
        to = target(args, config)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    host, port = to.host, to.port
    try:
        values = collect(host, port, to.username, to.password)
    except (OSError, MQTTError, RuntimeError) as exc:
        print(f"cannot read bridge status from {host}:{port}: {exc}", file=sys.stderr)
        return 1
    bridges: dict[str, dict[str, str]] = {}
    for topic, value in values.items():
        name, _, key = topic.removeprefix(PREFIX).partition("/")
        bridges.setdefault(name, {})[key] = value
    configured = [b.name for b in config.bridges] if args.config is not None else []
    names = configured + sorted(set(bridges) - set(configured))
    if not names:
        print(f"the gateway at {host}:{port} reports no bridges")
        return 0
    for name in names:
        got = bridges.get(name)
        if got is None:
            print(f"bridge {name}: not reported by the gateway at {host}:{port}")
            continue
        print(f"bridge {name}")
        for key in (*FIELDS, *sorted(set(got) - set(FIELDS))):
            if key in got:
                unit = " s" if key == "oldest message age" else ""
                print(f"  {key:<24} {got[key]}{unit}")
    return 0


def collect(
    host: str,
    port: int,
    username: str | None = None,
    password: str | None = None,
    filters: tuple[str, ...] = (PREFIX + "#",),
) -> dict[str, str]:
    """The retained values under ``filters`` (``$SYS/broker/bridge/#``) of a running
    gateway."""
    reader = PacketReader(version=MQTT_5)
    client_id = f"ledge-status-{os.getpid()}"
    with socket.create_connection((host, port), timeout=LONGEST) as sock:
        sock.sendall(
            encode(
                Connect(
                    client_id,
                    MQTT_5,
                    True,
                    30,
                    None,
                    username,
                    password.encode() if password is not None else None,
                ),
                MQTT_5,
            )
        )
        requests = tuple(SubscriptionRequest(f, 0) for f in filters)
        sock.sendall(encode(Subscribe(1, requests), MQTT_5))
        values: dict[str, str] = {}
        deadline = time.monotonic() + LONGEST
        quiet_until = time.monotonic() + LONGEST
        while True:
            now = time.monotonic()
            wait = min(deadline, quiet_until) - now
            if wait <= 0:
                return values
            sock.settimeout(wait)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return values
            if not data:
                raise RuntimeError("the gateway closed the connection")
            reader.receive_data(data)
            while not isinstance(packet := reader.next_packet(), NeedData):
                if isinstance(packet, ConnAck) and packet.reason_code >= 0x80:
                    raise RuntimeError(
                        f"connection refused (reason code 0x{packet.reason_code:02X})"
                    )
                if isinstance(packet, SubAck):
                    quiet_until = time.monotonic() + QUIET
                elif isinstance(packet, Publish):
                    values[packet.topic] = packet.payload.decode(errors="replace")
                    quiet_until = time.monotonic() + QUIET
