"""Every numeric option is bounded at both ends, each bound holds exactly, and the
rules between options (a minimum below its maximum, ids and ports in range) refuse
what breaks them.

The options are found by walking the config model (``tests.test_option_bounds``), so
an option added later without a lower bound, or in a table this module has no
template for, fails here. Each bound is tried on both sides: the value at the bound
is accepted, the nearest value beyond it is refused with an error naming the key.
Declarations can be wrong too (a minimum of 0 where 0 means nothing useful): the
gateway is run with every option at its minimum and must serve real clients.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from gateway.app.config import Config, parse_config
from gateway.app.runtime import ConfigError
from tests.support.clients import Paho
from tests.support.procs import LedgeProcess
from tests.support.wait import wait_for
from tests.test_option_bounds import CHOICES, OPTIONS, VALUES, _model_of, _toml

BRIDGE = '[[bridges]]\nname = "up"\naddress = "127.0.0.1:1883"\n'
RULE = '[[bridges.rules]]\nfilter = "a/#"\n'

#: The table each option sits in, as TOML with what the table needs besides; ``{}``
#: is where the option goes.
TEMPLATES: dict[str, str] = {
    "broker": "[broker]\n{}",
    "auth": "[auth]\n{}",
    "store": "[store]\n{}",
    "gateway": "[gateway]\n{}",
    "health": "[health]\n{}",
    "readings": "[readings]\n{}",
    "taps": '[taps]\nmodule = "{taps}"\n{}',
    "bluetooth": "[bluetooth]\n{}",
    "http": "[http]\n{}",
    "mqttsn": "[mqttsn]\n{}",
    "listeners": "[[listeners]]\n{}",
    "serial": '[[serial]]\nname = "s"\npath = "/dev/null"\nprotocol = "kv"\n{}',
    "serial.fields": '[[serial]]\nname = "s"\npath = "/dev/null"\nprotocol = "kv"\n'
    '[serial.fields.t]\nquantity = "temperature"\n{}',
    "ble": '[[ble]]\nname = "b"\naddress = "A4:C1:38:12:34:56"\n{}',
    "ble.fields": '[[ble]]\nname = "b"\naddress = "A4:C1:38:12:34:56"\n'
    '[ble.fields.temperature]\nquantity = "temperature"\n{}',
    "ble.characteristics.fields": '[[ble]]\nname = "b"\naddress = "A4:C1:38:12:34:56"\n'
    'format = "gatt"\n[[ble.characteristics]]\nuuid = "2a19"\n'
    '[[ble.characteristics.fields]]\nquantity = "battery"\n{}',
    "bridges": BRIDGE + '{}[[bridges.rules]]\nfilter = "a/#"\n',
    "bridges.outbox": BRIDGE + '[[bridges.rules]]\nfilter = "a/#"\n[bridges.outbox]\n{}',
    "bridges.rules": BRIDGE + '[[bridges.rules]]\nfilter = "a/#"\n{}',
    "mqttsn.udp": "[[mqttsn.udp]]\n{}",
    "mqttsn.serial": '[[mqttsn.serial]]\nname = "r"\npath = "/dev/null"\n{}',
}

#: ``X_max`` must not be below ``X`` (or ``X_min``): found by name, so a new pair is
#: held to the rule as soon as it is declared.
PAIRS = sorted(
    (low, name)
    for name in OPTIONS
    if name.endswith("_max")
    for low in (name.removesuffix("_max"), name.removesuffix("_max") + "_min")
    if low in OPTIONS
) + sorted(
    (name, name.removesuffix("_min") + "_max")
    for name in OPTIONS
    if name.endswith("_min") and name.removesuffix("_min") + "_max" in OPTIONS
)
PAIRS = sorted(set(PAIRS))

BOUNDED = sorted(set(OPTIONS) - VALUES - CHOICES)


def _field(name: str) -> Any:
    model: type[BaseModel] = Config
    *tables, leaf = name.split(".")
    for table in tables:
        inner = _model_of(model.model_fields[table].annotation)
        assert inner is not None, table
        model = inner
    return model.model_fields[leaf]


def bounds(name: str) -> dict[str, Any]:
    """The declared bounds of ``name``: ``ge``, ``gt``, ``le``, ``lt`` that are set."""
    found: dict[str, Any] = {}
    for meta in _field(name).metadata:
        for key in ("ge", "gt", "le", "lt"):
            value = getattr(meta, key, None)
            if value is not None:
                found[key] = value
    return found


def config(name: str, value: Any, taps: str = "/dev/null", **others: Any) -> str:
    table, leaf = name.rsplit(".", 1)
    lines = f"{leaf} = {value!r}\n" + "".join(f"{k} = {v!r}\n" for k, v in others.items())
    return TEMPLATES[table].replace("{taps}", taps).replace("{}", lines)


def _partner_values(name: str, value: Any) -> dict[str, Any]:
    """The other option of a min/max pair set so the pair's rule holds at ``value``."""
    for low, high in PAIRS:
        if name in (low, high):
            other = high if name == low else low
            if other.rsplit(".", 1)[0] == name.rsplit(".", 1)[0]:
                return {other.rsplit(".", 1)[1]: value}
    return {}


def accepted(name: str, value: Any) -> None:
    parse_config(config(name, value, **_partner_values(name, value)))


def refused(name: str, value: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(config(name, value, **_partner_values(name, value)))
    return str(info.value)


def test_every_table_with_options_has_a_template() -> None:
    tables = {name.rsplit(".", 1)[0] for name in OPTIONS}
    assert tables <= set(TEMPLATES), tables - set(TEMPLATES)


@pytest.mark.parametrize("name", BOUNDED)
def test_every_numeric_option_has_a_lower_bound(name: str) -> None:
    found = bounds(name)
    assert "ge" in found or "gt" in found, f"{name} has no minimum (ge=... or gt=...)"


@pytest.mark.parametrize("name", BOUNDED)
def test_each_bound_holds_exactly_and_names_the_key(name: str) -> None:
    kind = OPTIONS[name][0]
    found = bounds(name)
    leaf = name.rsplit(".", 1)[1]
    below: Any
    if "ge" in found:
        lowest = kind(found["ge"])
        accepted(name, lowest)
        below = lowest - 1 if kind is int else math.nextafter(float(lowest), -math.inf)
    else:
        below = kind(found["gt"])
        accepted(name, below + 1 if kind is int else math.nextafter(float(below), math.inf))
    assert leaf in refused(name, below)
    highest = kind(found["le"])
    accepted(name, highest)
    above = highest + 1 if kind is int else math.nextafter(float(highest), math.inf)
    assert leaf in refused(name, above)


def test_the_pairs_are_found() -> None:
    assert ("auth.failed_login_delay", "auth.failed_login_delay_max") in PAIRS
    assert ("bridges.reconnect_min", "bridges.reconnect_max") in PAIRS


@pytest.mark.parametrize(("low", "high"), PAIRS)
def test_a_maximum_below_its_minimum_is_refused(low: str, high: str) -> None:
    table = low.rsplit(".", 1)[0]
    lo, hi = low.rsplit(".", 1)[1], high.rsplit(".", 1)[1]
    kind = OPTIONS[low][0]
    small, big = kind(2), kind(3)
    parse_config(TEMPLATES[table].replace("{}", f"{lo} = {small!r}\n{hi} = {small!r}\n"))
    parse_config(TEMPLATES[table].replace("{}", f"{lo} = {small!r}\n{hi} = {big!r}\n"))
    with pytest.raises(ConfigError) as info:
        parse_config(TEMPLATES[table].replace("{}", f"{lo} = {big!r}\n{hi} = {small!r}\n"))
    assert hi in str(info.value)


#: Bounds a protocol fixes, written here from the specifications, not read from the
#: declarations (a wrong declaration moves the derived tests above along with it):
#: (lowest, highest); ``None`` where the protocol leaves the end to the gateway.
PROTOCOL_BOUNDS: dict[str, tuple[int | None, int | None]] = {
    # MQTT 5.0 3.2.2.3.3: Receive Maximum is a Two Byte Integer and 0 is a Protocol Error.
    "broker.receive_maximum": (1, 0xFFFF),
    "broker.topic_alias_maximum": (0, 0xFFFF),  # 3.2.2.3.8, a Two Byte Integer
    "broker.max_keepalive": (0, 0xFFFF),  # 3.1.2.10, Keep Alive: two bytes
    "bridges.keepalive": (0, 0xFFFF),
    "broker.max_inflight": (1, 0xFFFF),  # packet identifiers 1..65535 (2.2.1)
    "bridges.max_inflight": (1, 0xFFFF),
    # 3.1.2.11.2, Session Expiry Interval: a Four Byte Integer.
    "broker.max_session_expiry_interval": (0, 0xFFFFFFFF),
    "broker.persistent_session_expiry": (0, 0xFFFFFFFF),
    "bridges.session_expiry": (0, 0xFFFFFFFF),
    # 1.5.5: a Variable Byte Integer's largest value, plus the fixed header's 5 bytes.
    "broker.max_packet_size": (None, 268_435_455 + 5),
    "bridges.rules.qos": (0, 2),
    "readings.qos": (0, 2),
    # MQTT-SN 1.2: GwId is one octet (5.3.3); ADVERTISE's Duration two (5.4.1); the
    # long Length field two (5.2.1); topic ids 1..0xFFFE (5.3.11).
    "mqttsn.gateway_id": (0, 0xFF),
    "mqttsn.advertise_interval": (0, 0xFFFF),
    "mqttsn.max_message_size": (None, 0xFFFF),
    "mqttsn.max_topics_per_client": (1, 0xFFFE),
    # TCP and UDP ports; 0 asks the system for a free one.
    "listeners.port": (0, 0xFFFF),
    "http.port": (0, 0xFFFF),
    "mqttsn.udp.port": (0, 0xFFFF),
}


@pytest.mark.parametrize("name", sorted(PROTOCOL_BOUNDS))
def test_the_bounds_a_protocol_fixes_are_the_ones_held(name: str) -> None:
    lowest, highest = PROTOCOL_BOUNDS[name]
    leaf = name.rsplit(".", 1)[1]
    if lowest is not None:
        accepted(name, lowest)
        assert leaf in refused(name, lowest - 1)
    if highest is not None:
        accepted(name, highest)
        assert leaf in refused(name, highest + 1)


@pytest.mark.parametrize(
    ("topic_id", "ok"), [(0, False), (1, True), (0xFFFE, True), (0xFFFF, False), (-1, False)]
)
def test_predefined_topic_ids_are_1_to_65534(topic_id: int, ok: bool) -> None:
    """0x0000 and 0xFFFF are reserved (MQTT-SN 1.2 section 5.3.11)."""
    text = f'[mqttsn]\npredefined_topics = {{ {topic_id} = "a/b" }}\n'
    if ok:
        assert parse_config(text).mqttsn.predefined_topics == {topic_id: "a/b"}
    else:
        with pytest.raises(ConfigError, match=r"mqttsn\.predefined_topics"):
            parse_config(text)


ADDRESSES = {
    "bridges.address": '[[bridges]]\nname = "up"\naddress = "{}"\n' + RULE,
    "bridges.addresses": '[[bridges]]\nname = "up"\naddresses = ["{}"]\n' + RULE,
    "mqttsn.udp.broadcast": '[[mqttsn.udp]]\nbroadcast = ["{}"]\n',
}


@pytest.mark.parametrize("where", sorted(ADDRESSES))
@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("127.0.0.1:1", True),
        ("127.0.0.1:65535", True),
        ("[::1]:8883", True),
        ("127.0.0.1:0", False),
        ("127.0.0.1:65536", False),
        ("127.0.0.1:-1", False),
        ("[::1]:0", False),
    ],
)
def test_ports_in_addresses_are_1_to_65535(where: str, address: str, ok: bool) -> None:
    text = ADDRESSES[where].format(address)
    if ok:
        parse_config(text)
    else:
        with pytest.raises(ConfigError, match="port"):
            parse_config(text)


def _at_minimum(table: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in BOUNDED:
        if name.rsplit(".", 1)[0] != table:
            continue
        kind = OPTIONS[name][0]
        found = bounds(name)
        if "ge" in found:
            values[name.rsplit(".", 1)[1]] = kind(found["ge"])
        else:
            low = found["gt"]
            values[name.rsplit(".", 1)[1]] = low + 1 if kind is int else max(low * 2, 0.001)
    return values


def test_the_gateway_serves_with_every_option_at_its_minimum(tmp_path: Path) -> None:
    """The broker, listener, auth, store, gateway, readings, taps and firmware bridge
    options all at their minima: the gateway starts and serves an MQTT 5.0 client
    (a real paho, which checks what the CONNACK announces) its own messages at QoS
    0, 1 and 2, the one client its minimum pool takes."""
    master, slave = os.openpty()
    taps = tmp_path / "taps.py"
    taps.write_text("")
    listener = _at_minimum("listeners") | {"host": "127.0.0.1", "port": 0}
    serial = _at_minimum("serial") | {"name": "s", "path": os.ttyname(slave), "protocol": "kv"}
    tables = {
        "broker": _at_minimum("broker"),
        "auth": _at_minimum("auth") | {"allow_anonymous": True},
        "store": _at_minimum("store"),
        "gateway": _at_minimum("gateway"),
        "readings": _at_minimum("readings"),
        "taps": _at_minimum("taps") | {"module": str(taps)},
        "mqttsn": _at_minimum("mqttsn"),
    }
    text = f'data_dir = "{tmp_path / "data"}"\n[[listeners]]\n{_toml(listener)}'
    text += "".join(f"[{name}]\n{_toml(values)}" for name, values in tables.items())
    text += f"[[serial]]\n{_toml(serial)}"
    udp = _at_minimum("mqttsn.udp") | {"host": "127.0.0.1", "port": 0}
    text += f"[[mqttsn.udp]]\n{_toml(udp)}"
    (tmp_path / "ledge.toml").write_text(text)
    parse_config(text)  # every minimum validates
    proc = LedgeProcess(config=tmp_path / "ledge.toml", listen=False).start(timeout=60)
    try:
        client = Paho(proc.port, "m", version=5).connect()
        client.subscribe("m/#", 2)
        for qos in (0, 1, 2):
            client.publish("m/t", f"q{qos}".encode(), qos=qos)

            def back(n: int = qos) -> bool:
                return len(client.messages) > n

            wait_for(back, 10, f"the QoS {qos} message back")
        assert [m.payload for m in client.messages] == [b"q0", b"q1", b"q2"]
        assert not client.disconnects
        client.disconnect()
    finally:
        proc.stop()
        os.close(master)
        os.close(slave)
