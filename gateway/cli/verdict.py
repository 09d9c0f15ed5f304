"""Healthy by the gateway's own measure: observed facts in, one check per thing out. Pure.

``ledge health`` (``gateway.cli.health``) probes the running gateway and hands what it
saw to ``verdict``: each listener's answer to a CONNECT, each configured bridge's state
and each configured sensor's silence, as read from ``$SYS``. The rules live here, so
the update service, provisioning and a person at a terminal share one definition:

- a listener is healthy when it answers a CONNECT with a CONNACK. A CONNACK that
  refuses the login (bad user name or password, not authorised) still proves the
  listener serves; one that says the server is unavailable or busy does not;
- a bridge is healthy when its state is ``connected``;
- a sensor is healthy when it has been heard within its interval (``[[serial]]
  heard_within``; a BLE device's ``away_after``, or for a GATT device its poll
  interval plus ``gatt_timeout`` when that is longer). The silence is read from ``$SYS``
  values published every ``broker.sys_interval`` seconds, so that much is allowed on
  top. A serial device without an interval is healthy while its port is open. A beacon
  reports presence: its being away is news, not a fault, so it is not checked.

No sockets, no clock: times arrive as numbers inside the facts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

#: CONNACK codes that say the server is not serving (MQTT 3.1.1 return code 3 "server
#: unavailable"; MQTT 5.0 0x88 "Server unavailable", 0x89 "Server busy", 0x9F
#: "Connection rate exceeded" is a refusal of this client, so it still serves).
NOT_SERVING_311: Final = frozenset({3})
NOT_SERVING_5: Final = frozenset({0x88, 0x89})
#: The bridge state that counts as healthy (``$SYS/broker/bridge/<name>/state``).
CONNECTED: Final = "connected"


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the verdict: what was checked, whether it passed, and why (or what)."""

    name: str
    ok: bool
    detail: str

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ListenerFact:
    """What a listener answered: the CONNACK's code (None: no CONNACK came, and
    ``error`` says why) and what else was checked on the way (a TLS handshake, a
    WebSocket upgrade)."""

    name: str
    address: str
    connack: int | None
    version: Literal[4, 5] = 4
    error: str = ""
    via: str = ""
    #: No CONNACK can come (a client certificate is required), and the TLS handshake
    #: completed: as far as a probe can see, it serves.
    handshake: bool = False


@dataclass(frozen=True, slots=True)
class BridgeFact:
    """A configured bridge and the state the gateway reports for it (None: none)."""

    name: str
    state: str | None


@dataclass(frozen=True, slots=True)
class SensorFact:
    """A configured sensor device. ``interval``: seconds within which it must be heard
    (0: no interval); ``silent``: seconds since it was last heard, or since the gateway
    started when it was not heard yet (None: the gateway does not report it);
    ``ever_heard``: it was heard at all; ``connected``: its port is open (None: the
    driver has no such notion); ``unchecked``: why it is not checked ("": it is)."""

    driver: str
    name: str
    interval: float
    silent: float | None
    ever_heard: bool
    connected: bool | None = None
    interval_key: str = ""
    unchecked: str = ""
    #: Why ``silent`` is None ("": the gateway did not report it).
    missing: str = ""


@dataclass(frozen=True, slots=True)
class MqttSnFact:
    """An MQTT-SN UDP transport and whether it answered SEARCHGW with GWINFO."""

    address: str
    answered: bool
    error: str = ""


def listener_check(fact: ListenerFact) -> Check:
    name = f"listener {fact.name}" if fact.name else f"listener {fact.address}"
    where = f"{fact.address}{f' ({fact.via})' if fact.via else ''}"
    if fact.connack is None and fact.handshake:
        return Check(name, True, f"{where}: TLS handshake completed (MQTT not checked)")
    if fact.connack is None:
        return Check(name, False, f"no CONNACK from {where}: {fact.error or 'no answer'}")
    code = fact.connack
    not_serving = NOT_SERVING_5 if fact.version == 5 else NOT_SERVING_311
    if code in not_serving:
        return Check(name, False, f"{where} answered CONNACK 0x{code:02X}: it is not serving")
    if code == 0:
        return Check(name, True, f"{where} accepted a CONNECT")
    return Check(
        name,
        True,
        f"{where} answered CONNACK 0x{code:02X} (login refused, so it serves; give "
        "LEDGE_HEALTH_USERNAME/LEDGE_HEALTH_PASSWORD to read bridges and sensors)",
    )


def bridge_check(fact: BridgeFact, unreadable: str) -> Check:
    name = f"bridge {fact.name}"
    if unreadable:
        return Check(name, False, f"state unknown: {unreadable}")
    if fact.state is None:
        return Check(name, False, "not reported by the gateway (is the config it runs older?)")
    if fact.state != CONNECTED:
        return Check(name, False, f"{fact.state}, not {CONNECTED}")
    return Check(name, True, CONNECTED)


def _seconds(value: float) -> str:
    return f"{value:.0f} s"


def sensor_check(fact: SensorFact, unreadable: str, grace: float) -> Check:
    """``grace``: how stale the reported silence may be (``broker.sys_interval``)."""
    name = f"{fact.driver} {fact.name}"
    if fact.unchecked:
        return Check(name, True, f"not checked: {fact.unchecked}")
    if unreadable:
        return Check(name, False, f"not known: {unreadable}")
    if fact.connected is False:
        return Check(name, False, "port not open")
    if fact.interval <= 0:
        return Check(name, True, "port open (no interval to hold it to)")
    if fact.silent is None:
        why = fact.missing or "not reported by the gateway (is the config it runs older?)"
        return Check(name, False, f"silence not known: {why}")
    limit = fact.interval + grace
    key = f" ({fact.interval_key} {fact.interval:g} s)" if fact.interval_key else ""
    if fact.silent > limit:
        if fact.ever_heard:
            return Check(name, False, f"silent for {_seconds(fact.silent)}{key}")
        return Check(
            name, False, f"not heard since the gateway started {_seconds(fact.silent)} ago{key}"
        )
    if not fact.ever_heard:
        return Check(name, True, f"not heard yet, {_seconds(fact.silent)} since start{key}")
    return Check(name, True, f"heard {_seconds(fact.silent)} ago{key}")


def mqttsn_check(fact: MqttSnFact) -> Check:
    name = f"mqttsn {fact.address}"
    if fact.answered:
        return Check(name, True, "answered SEARCHGW with GWINFO")
    return Check(name, False, f"no GWINFO for a SEARCHGW: {fact.error or 'no answer'}")


def verdict(
    listeners: Iterable[ListenerFact],
    bridges: Iterable[BridgeFact] = (),
    sensors: Iterable[SensorFact] = (),
    mqttsn: Iterable[MqttSnFact] = (),
    *,
    unreadable: str = "",
    grace: float = 0.0,
) -> list[Check]:
    """One check per listener, bridge, sensor and MQTT-SN transport, in that order.
    ``unreadable``: why the bridges' and sensors' state could not be read ("": it was)."""
    return [
        *(listener_check(f) for f in listeners),
        *(bridge_check(f, unreadable) for f in bridges),
        *(sensor_check(f, unreadable, grace) for f in sensors),
        *(mqttsn_check(f) for f in mqttsn),
    ]


def healthy(checks: Iterable[Check]) -> bool:
    return all(c.ok for c in checks)


def report(checks: list[Check], elapsed: float) -> dict[str, Any]:
    """The machine-readable verdict (``ledge health --json``)."""
    return {
        "healthy": healthy(checks),
        "elapsed_seconds": round(elapsed, 1),
        "checks": [c.as_json() for c in checks],
    }


def text(checks: Iterable[Check]) -> str:
    """One line per check: ``ok`` or ``FAILED``, what, and the detail."""
    return "".join(f"{'ok' if c.ok else 'FAILED':<6} {c.name}: {c.detail}\n" for c in checks)
