#!/usr/bin/python3
"""Wait until a Ledge gateway is healthy: its MQTT listener answers a CONNECT with a
CONNACK and each named cloud bridge reports ``connected`` under ``$SYS/broker/bridge/``.

Installed by the Ansible role ``ledge`` and run on the gateway after a restart or
reload. Python's standard library only: it must work whichever Ledge version is
installed, including one just rolled back to.

    ledge-health --port 1883 [--bridge NAME ...] [--timeout 120]
    (LEDGE_HEALTH_USERNAME / LEDGE_HEALTH_PASSWORD when the listener needs a login)

Exit 0 when healthy within the timeout; 1 otherwise, saying what was missing.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time

STATE = "$SYS/broker/bridge/+/state"


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def _packet(kind: int, body: bytes) -> bytes:
    # MQTT 3.1.1 section 2.2.3: the remaining length as a variable byte integer.
    out = bytearray([kind])
    n = len(body)
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out) + body


def _read_packet(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    while True:
        if len(buf) >= 2:
            length, mult, i = 0, 1, 1
            while i < len(buf) and i <= 4:
                length += (buf[i] & 0x7F) * mult
                mult *= 128
                if not buf[i] & 0x80:
                    break
                i += 1
            else:
                i = -1
            if i > 0 and len(buf) >= i + 1 + length:
                kind, body = buf[0], bytes(buf[i + 1 : i + 1 + length])
                del buf[: i + 1 + length]
                return kind, body
        data = sock.recv(4096)
        if not data:
            raise ConnectionError("the gateway closed the connection")
        buf += data


def probe(port: int, bridges: list[str], user: str | None, password: str | None) -> str:
    """'' when healthy, else what is missing."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError as exc:
        return f"nothing listens on port {port}: {exc}"
    with sock:
        flags = 0x02 | (0x80 if user else 0) | (0x40 if user and password else 0)
        body = _string("MQTT") + bytes([4, flags]) + struct.pack("!H", 30)
        body += _string(f"ledge-health-{os.getpid()}")
        if user:
            body += _string(user)
            if password:
                body += _string(password)
        buf = bytearray()
        try:
            sock.sendall(_packet(0x10, body))
            kind, ack = _read_packet(sock, buf)
        except OSError as exc:
            return f"no CONNACK on port {port}: {exc}"
        if kind != 0x20 or len(ack) != 2:
            return f"port {port} answered a CONNECT with packet type 0x{kind:02X}, not CONNACK"
        if not bridges:
            return ""
        if ack[1] != 0:
            return (
                f"CONNACK refused the login (return code {ack[1]}): give the probe a user "
                "(ledge_health_username/ledge_health_password) to read the bridges' state"
            )
        sock.sendall(_packet(0x82, struct.pack("!H", 1) + _string(STATE) + b"\x00"))
        states: dict[str, str] = {}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and set(bridges) - set(states):
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                kind, body = _read_packet(sock, buf)
            except TimeoutError:
                break
            if kind >> 4 == 3:  # PUBLISH, QoS 0
                (size,) = struct.unpack("!H", body[:2])
                topic = body[2 : 2 + size].decode(errors="replace")
                states[topic.split("/")[-2]] = body[2 + size :].decode(errors="replace")
        down = [
            f"{b} is {states.get(b, 'unknown')}" for b in bridges if states.get(b) != "connected"
        ]
        return "bridge " + ", ".join(down) if down else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="a TCP listener's port")
    parser.add_argument("--bridge", action="append", default=[], help="a bridge that must connect")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
    args = parser.parse_args()
    user = os.environ.get("LEDGE_HEALTH_USERNAME") or None
    password = os.environ.get("LEDGE_HEALTH_PASSWORD") or None
    started = time.monotonic()
    while True:
        problem = probe(args.port, args.bridge, user, password)
        took = time.monotonic() - started
        if not problem:
            print(f"healthy after {took:.1f} s")
            return 0
        if took > args.timeout:
            print(f"not healthy within {args.timeout:.0f} s: {problem}", file=sys.stderr)
            return 1
        time.sleep(1)  # polling interval while waiting for the gateway, not synchronisation


if __name__ == "__main__":
    sys.exit(main())
