"""Every numeric option has a maximum, and the gateway runs with each option at it.

A bound that validation accepts but the code cannot take is a trap: the config checks
out, then every connection fails (``broker.max_outbound_bytes`` above 2^31-1 once did,
in the transport's write-buffer limits). The test walks the config model, so an option
added later without a maximum, or with one the code cannot take, fails here.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from gateway.app.config import Config, parse_config
from gateway.app.runtime import ConfigError
from gateway.mqtt import MQTT_5, MQTT_311, Publish, Subscribe, SubscriptionRequest, encode
from tests.support.procs import LedgeProcess, MosquittoProcess
from tests.support.prometheus import metrics_text
from tests.support.raw import Raw

#: Numbers that are values rather than limits (a reading's scale and offset): finite,
#: with no maximum of their own.
VALUES = {
    "serial.fields.scale",
    "serial.fields.offset",
    "ble.fields.scale",
    "ble.fields.offset",
    "ble.characteristics.fields.scale",
    "ble.characteristics.fields.offset",
}
#: Numbers with no order: a serial line's stop bits (1, 1.5 or 2).
CHOICES = {"serial.stopbits"}


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def numeric_options(model: type[BaseModel], path: str = "") -> dict[str, tuple[type, Any]]:
    """``dotted.path -> (int or float, maximum or None)`` for every numeric option."""
    found: dict[str, tuple[type, Any]] = {}
    for name, field in model.model_fields.items():
        inner = _model_of(field.annotation)
        if inner is not None:
            found.update(numeric_options(inner, f"{path}{name}."))
            continue
        kind = next((t for t in (int, float) if field.annotation in (t, t | None)), None)
        if kind is None:
            continue
        maximum = next((m.le for m in field.metadata if getattr(m, "le", None) is not None), None)
        found[path + name] = (kind, maximum)
    return found


OPTIONS = numeric_options(Config)


def test_the_walk_sees_the_options() -> None:
    assert {"broker.max_outbound_bytes", "listeners.max_connections", "auth.failed_login_delay"}
    assert {"bridges.outbox.max_bytes", "serial.baudrate", "store.max_bytes"} <= set(OPTIONS)


@pytest.mark.parametrize("name", sorted(set(OPTIONS) - VALUES - CHOICES))
def test_every_numeric_option_has_a_maximum(name: str) -> None:
    assert OPTIONS[name][1] is not None, f"{name} has no maximum (le=...)"


@pytest.mark.parametrize("name", sorted(VALUES))
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_value_options_are_finite(name: str, value: str) -> None:
    key = name.rsplit(".", 1)[1]
    with pytest.raises(ConfigError):
        parse_config(_VALUE_CONFIGS[name.rsplit(".", 1)[0]].format(f"{key} = {value}"))


#: A device whose field sets the option ``{}`` stands for, per table of fields.
_VALUE_CONFIGS = {
    "serial.fields": '[[serial]]\nname = "s"\npath = "/dev/null"\nprotocol = "kv"\n'
    'fields = {{ t = {{ quantity = "temperature", unit = "C", {} }} }}\n',
    "ble.fields": '[[ble]]\nname = "b"\naddress = "A4:C1:38:12:34:56"\n'
    'fields = {{ temperature = {{ quantity = "temperature", {} }} }}\n',
    "ble.characteristics.fields": '[[ble]]\nname = "b"\naddress = "A4:C1:38:12:34:56"\n'
    'format = "gatt"\n[[ble.characteristics]]\nuuid = "2a19"\n'
    'fields = [{{ quantity = "battery", {} }}]\n',
}


def _at_maximum(section: str) -> dict[str, Any]:
    """The numeric options of ``section`` (a dotted prefix) at their maxima."""
    values: dict[str, Any] = {}
    for name, (kind, maximum) in OPTIONS.items():
        if not name.startswith(section + ".") or "." in name[len(section) + 1 :]:
            continue
        if maximum is None:
            continue
        values[name.rsplit(".", 1)[1]] = kind(maximum)
    return values


def _toml(values: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return f'"{v}"' if isinstance(v, str) else repr(v)

    return "".join(f"{k} = {value(v)}\n" for k, v in values.items())


def _round_trip(port: int, version: int, qos: int) -> None:
    sub = Raw(port, version=version)
    assert sub.connect(f"sub-{version}-{qos}").reason_code == 0
    sub.send(encode(Subscribe(1, (SubscriptionRequest("max/#", qos),)), version))
    sub.expect(1)
    pub = Raw(port, version=version)
    assert pub.connect(f"pub-{version}-{qos}").reason_code == 0
    pub.send(encode(Publish("max/t", b"at the limits", qos, packet_id=1 if qos else 0), version))
    got = sub.expect(1)[0]
    assert isinstance(got, Publish) and got.payload == b"at the limits", got
    sub.close()
    pub.close()


def test_the_gateway_serves_with_every_option_at_its_maximum(tmp_path: Path) -> None:
    """One gateway with every numeric option of the broker, listeners, auth, store,
    gateway, readings, taps, serial devices, bridges, the firmware bridge and HTTP at its
    maximum: it starts, serves MQTT 5.0 and 3.1.1 clients (QoS 0/1/2 round trips),
    reloads on SIGHUP, and its bridge reaches a real Mosquitto."""
    available = MosquittoProcess.available()
    remote = MosquittoProcess(tmp_path).start() if available else None
    try:
        code = _serve_at_maxima(tmp_path, remote)
    finally:
        if remote is not None:
            remote.stop()
    assert code == 0


def _serve_at_maxima(tmp_path: Path, remote: MosquittoProcess | None) -> int:
    """Run the gateway at every maximum against ``remote``; its exit code."""
    master, slave = os.openpty()
    taps = tmp_path / "taps.py"
    taps.write_text("")
    listener = _at_maximum("listeners") | {"host": "127.0.0.1", "port": 0}
    serial = _at_maximum("serial") | {
        "name": "s",
        "path": os.ttyname(slave),
        "protocol": "kv",
    }
    sections = {
        "broker": _at_maximum("broker"),
        "auth": _at_maximum("auth") | {"allow_anonymous": True},
        "store": _at_maximum("store"),
        "gateway": _at_maximum("gateway"),
        "readings": _at_maximum("readings"),
        "taps": _at_maximum("taps") | {"module": str(taps)},
        "http": _at_maximum("http") | {"enabled": True, "port": 0},
    }
    text = f'data_dir = "{tmp_path / "data"}"\n[[listeners]]\n{_toml(listener)}'
    text += "".join(f"[{name}]\n{_toml(values)}" for name, values in sections.items())
    text += f"[[serial]]\n{_toml(serial)}"
    if remote is not None:
        bridge = _at_maximum("bridges") | {"name": "up", "address": f"127.0.0.1:{remote.port}"}
        bridge["reconnect_min"] = 1.0  # the first attempt is at once either way
        text += f"[[bridges]]\n{_toml(bridge)}"
        text += f"[bridges.outbox]\n{_toml(_at_maximum('bridges.outbox'))}"
        rule = _at_maximum("bridges.rules") | {"filter": "up/#", "direction": "out"}
        text += f"[[bridges.rules]]\n{_toml(rule)}"
    # The firmware bridge at its maxima: its clients are broker sessions like any other.
    text += f"[mqttsn]\n{_toml(_at_maximum('mqttsn'))}"
    text += f'[[mqttsn.udp]]\nhost = "127.0.0.1"\n{_toml(_at_maximum("mqttsn.udp") | {"port": 0})}'
    config = tmp_path / "ledge.toml"
    config.write_text(text)
    parse_config(text)  # every maximum validates
    proc = LedgeProcess(config=config, listen=False).start(timeout=60)
    try:
        http = proc.wait_log(r"listening on 127\.0\.0\.1:\d+ \(http\)", 20)
        http_port = int(http.rsplit(":", 1)[1].split()[0])
        assert "ledge_http_connections 1" in metrics_text(http_port)
        for version in (MQTT_5, MQTT_311):
            for qos in (0, 1, 2):
                _round_trip(proc.port, version, qos)
        proc.signal(1)  # SIGHUP: the same options, reloaded
        proc.wait_log("reload", 10)
        if remote is not None:
            proc.wait_log(r"bridge up: connected to", 20)
    finally:
        code = proc.stop()
        os.close(master)
        os.close(slave)
    return code
