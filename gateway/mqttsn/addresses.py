"""Where a datagram came from, as the limits and the logs count it.

A UDP address is ``(host, port, ...)``; a serial line's is its name. Limits count a
*source*: the IPv4 address, or the IPv6 /64 (one host usually has a whole /64 to pick
from), as the broker's per-address limits do; a serial line is one wired coordinator.
"""

from __future__ import annotations

from gateway.broker.logins import address_key
from gateway.mqttsn.state import Address, Key


def source(address: Address) -> str | None:
    """What ``max_clients_per_address`` counts for a UDP ``(host, port, ...)``: the IPv4
    address, or the IPv6 /64. ``None`` for a serial line (its name)."""
    if not isinstance(address, tuple) or not address or not isinstance(address[0], str):
        return None
    host: str = address[0]
    return address_key(f"[{host}]:0") if ":" in host else host


def origin(key: Key) -> tuple[str, object, bytes]:
    """Where a client may wake from: its transport, its source (IPv4 address, IPv6
    /64, or the serial line) and its node behind a forwarder; any source port."""
    transport, address, node_id = key
    found = source(address)
    return (transport, address if found is None else found, node_id)


def log_source(key: Key) -> str:
    """What refusal lines are limited by: the source IP (/64), or the serial line."""
    found = source(key[1])
    return found if found is not None else f"{key[0]} {key[1]}"


def address_text(address: Address) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


def where(key: Key) -> str:
    """``key`` for a log line: ``10.0.0.2:5000 node 0a (udp)``."""
    transport, address, node_id = key
    node = f" node {node_id.hex()}" if node_id else ""
    return f"{address_text(address)}{node} ({transport})"
