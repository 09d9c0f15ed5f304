"""The gateway as a Home Assistant device: retained discovery for its health and each
bridge, one retained JSON state that every template reads, availability from the
gateway's status topic -- against ``ledge run`` with a bridge to Debian's Mosquitto."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Paho
from tests.support.procs import LedgeProcess, MosquittoProcess
from tests.support.prometheus import cloud_bridge
from tests.support.wait import wait_for

pytestmark = pytest.mark.skipif(not MosquittoProcess.available(), reason="Debian's mosquitto")


class Json:
    """``value_json`` as Home Assistant's templates see it: attributes and items."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __getattr__(self, name: str) -> Any:
        return wrap(self.value[name])

    def __getitem__(self, name: str) -> Any:
        return wrap(self.value[name])


def wrap(value: Any) -> Any:
    return Json(value) if isinstance(value, dict) else value


def render(template: str, state: dict[str, Any]) -> str:
    """Evaluate the templates Ledge writes ({{ expression }}, where the expression is
    a Jinja subset that reads the same in Python: attribute and item access, 'a' if
    c else 'b'). Anything else fails the test."""
    m = re.fullmatch(r"\{\{ (.+) \}\}", template)
    assert m, template
    assert re.fullmatch(r"[\w .'\"\[\]]+", m.group(1)), template
    return str(eval(m.group(1), {"__builtins__": {}}, {"value_json": Json(state)}))


def test_the_gateway_is_a_home_assistant_device(tmp_path: Path) -> None:
    cloud = MosquittoProcess(tmp_path).start()
    config = tmp_path / "ledge.toml"
    config.write_text(
        f"""
data_dir = "{tmp_path / "data"}"
[gateway]
id = "gw1"
health_interval = 1
[homeassistant]
enabled = true
{cloud_bridge(cloud.port, "up/#")}"""
    )
    proc = LedgeProcess(config=config).start()
    ha = Paho(proc.port, "homeassistant").connect()
    try:
        ha.subscribe("homeassistant/#")
        ha.subscribe("ledge/gw1/metrics")
        ha.subscribe("ledge/gw1/status")

        def latest(topic: str) -> bytes | None:
            found = [m.payload for m in list(ha.messages) if m.topic == topic]
            return found[-1] if found else None

        def state() -> dict[str, Any]:
            payload = latest("ledge/gw1/metrics")
            return json.loads(payload) if payload else {}

        wait_for(lambda: state().get("bridges", {}).get("cloud", {}).get("connected"), 10, "up")
        configs = {
            m.topic: json.loads(m.payload)
            for m in ha.messages
            if m.topic.startswith("homeassistant/") and m.retain
        }
        ours = {
            t: c for t, c in configs.items() if "/gw1/" in t and not t.endswith("/status/config")
        }
        keys = {t.split("/")[3] for t in ours}
        assert keys == {
            "clients", "messages_in", "messages_out", "dropped", "rss", "uptime", "free_disk",
            "bridge_cloud", "bridge_cloud_outbox", "bridge_cloud_oldest",
        }  # fmt: skip
        assert "homeassistant/binary_sensor/gw1/bridge_cloud/config" in ours
        assert len({c["unique_id"] for c in ours.values()}) == len(ours)
        for body in ours.values():
            assert body["availability_topic"] == "ledge/gw1/status"
            assert body["state_topic"] == "ledge/gw1/metrics"
            assert body["device"]["identifiers"] == ["ledge_gw1"]
        templates = {t.split("/")[3]: c["value_template"] for t, c in ours.items()}

        # Every template reads a value from the state as published.
        first = state()
        values = {k: render(t, first) for k, t in templates.items()}
        assert values["bridge_cloud"] == "ON"
        assert float(values["rss"]) > 5 and float(values["free_disk"]) > 1
        assert int(values["clients"]) == 1  # Home Assistant itself

        # A client connects and the uplink goes down: the next states say so.
        client = Paho(proc.port, "sensor-box").connect()
        cloud.stop()
        wait_for(lambda: render(templates["clients"], state()) == "2", 10, "two clients")
        wait_for(lambda: render(templates["bridge_cloud"], state()) == "OFF", 10, "bridge off")
        client.publish("up/x", b"1", qos=1)
        wait_for(lambda: render(templates["bridge_cloud_outbox"], state()) == "1", 10, "queued")
        assert latest("ledge/gw1/status") == b"online"
        client.disconnect()
    finally:
        cloud.stop()
        assert proc.stop() == 0
    # A clean stop marks the device unavailable (the bridge's will does it upstream).
    assert latest("ledge/gw1/status") == b"offline"
    ha.disconnect()
