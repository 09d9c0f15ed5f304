"""``ledge ble``: ``scan`` (what advertises nearby, ``drivers.ble.scan``) and
``reset-counter`` (let an encrypted device's lower counters in again, after it
restarted its counter).

``reset-counter`` reaches the running gateway the way ``ledge bridge status`` does:
over MQTT, on the first listener of the config (or ``--broker``). It publishes on
``<prefix>/<gateway>/ble/<name>/reset-counter`` and prints the gateway's answer from
``.../reset-counter/result``. Whoever may publish under ``<prefix>/<gateway>/ble/<name>/``
may already publish that device's readings: protect both with the ACL.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any, Final

from gateway.app.config import Config, load_config
from gateway.app.runtime import ConfigError
from gateway.cli.target import add_target_args, target
from gateway.mqtt import (
    MQTT_5,
    ConnAck,
    Connect,
    NeedData,
    PacketReader,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from gateway.mqtt.errors import MQTTError
from gateway.sensors.ble_settings import RESET_COUNTER

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: Seconds to wait for the gateway's answer.
ANSWER_WITHIN: Final = 5.0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from drivers.ble import scan

    ble = commands.add_parser(
        "ble",
        help="Bluetooth LE tools (scan, reset-counter)",
        description="Bluetooth LE tools.",
    )
    sub = ble.add_subparsers(dest="ble_command", metavar="COMMAND", required=True)
    scan.add_parser(sub)
    reset = sub.add_parser(
        "reset-counter",
        help="let an encrypted device's lower counters in again (after it restarted)",
        description="An encrypted device's adverts are accepted only with an encryption "
        "counter above the last accepted one. After the device restarted its counter (a "
        "battery change, a firmware update) its adverts are refused as replays until this "
        "command tells the running gateway to forget the counter: the next authenticated "
        "advert sets it again. The gateway is reached over MQTT (the first listener of the "
        "config, or --broker).",
    )
    reset.add_argument("device", metavar="DEVICE", help="the device's address (or its name)")
    add_target_args(reset)


def main(args: argparse.Namespace) -> int:
    if args.ble_command == "scan":
        from drivers.ble import scan

        return scan.run(args)
    return reset_counter(args)


def reset_counter(args: argparse.Namespace) -> int:
    def fail(message: str, code: int) -> int:
        print(f"ledge ble reset-counter: {message}", file=sys.stderr)
        return code

    try:
        config = Config() if args.config is None else load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    runtime = config.to_runtime()
    wanted = args.device.upper()
    device = next(
        (d for d in runtime.ble if (d.address or "").upper() == wanted or d.name == args.device),
        None,
    )
    where = args.config or "the default config"
    if device is None:
        return fail(f"no [[ble]] device with address or name {args.device!r} in {where}", 2)
    if device.bindkey is None:
        return fail(f"{device.name} has no bindkey in {where}: it has no counter to reset", 2)
    try:
        to = target(args, config)
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    host, port = to.host, to.port
    sensors = runtime.sensors
    topic = f"{sensors.prefix}/{sensors.gateway}/ble/{device.name}/{RESET_COUNTER}"
    try:
        answer = request(host, port, topic, to.username, to.password)
    except (OSError, MQTTError, RuntimeError) as exc:
        return fail(f"{host}:{port}: {exc}", EXIT_FAILED)
    if not answer.get("ok"):
        return fail(f"the gateway says: {answer.get('error', answer)}", EXIT_FAILED)
    previous = answer.get("previous")
    was = "none accepted yet" if previous is None else f"it was {previous}"
    print(
        f"{device.name} ({device.address}): encryption counter reset ({was}); "
        "the next authenticated advert sets it"
    )
    return EXIT_OK


def request(
    host: str, port: int, topic: str, username: str | None, password: str | None
) -> dict[str, Any]:
    """Publish on ``topic`` (QoS 1) and return the JSON the gateway answers on
    ``topic/result``; RuntimeError when it refuses or does not answer in time."""
    reader = PacketReader(version=MQTT_5)
    client_id = f"ledge-ble-{os.getpid()}"
    result_topic = f"{topic}/result"
    deadline = time.monotonic() + ANSWER_WITHIN
    with socket.create_connection((host, port), timeout=ANSWER_WITHIN) as sock:
        secret = password.encode() if password is not None else None
        sock.sendall(encode(Connect(client_id, MQTT_5, True, 30, None, username, secret), MQTT_5))
        sock.sendall(encode(Subscribe(1, (SubscriptionRequest(result_topic, 1),)), MQTT_5))
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise RuntimeError(
                    f"no answer on {result_topic} within {ANSWER_WITHIN:g} s (is the gateway "
                    "running this config?)"
                )
            sock.settimeout(wait)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise RuntimeError("the gateway closed the connection")
            reader.receive_data(data)
            while not isinstance(packet := reader.next_packet(), NeedData):
                if isinstance(packet, ConnAck) and packet.reason_code >= 0x80:
                    raise RuntimeError(
                        f"connection refused (reason code 0x{packet.reason_code:02X})"
                    )
                if isinstance(packet, SubAck):
                    code = packet.reason_codes[0]
                    if code >= 0x80:
                        raise RuntimeError(
                            f"may not subscribe to {result_topic} (reason code 0x{code:02X})"
                        )
                    sock.sendall(encode(Publish(topic, b"", qos=1, packet_id=2), MQTT_5))
                elif isinstance(packet, PubAck) and packet.reason_code >= 0x80:
                    raise RuntimeError(
                        f"may not publish to {topic} (reason code 0x{packet.reason_code:02X})"
                    )
                elif isinstance(packet, Publish) and packet.topic == result_topic:
                    if packet.qos:
                        sock.sendall(encode(PubAck(packet.packet_id), MQTT_5))
                    try:
                        answer = json.loads(packet.payload)
                    except ValueError:
                        raise RuntimeError(f"not JSON on {result_topic}") from None
                    if not isinstance(answer, dict):
                        raise RuntimeError(f"not a JSON object on {result_topic}")
                    return answer
