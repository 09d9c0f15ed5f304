"""Home Assistant discovery, judged the way Home Assistant reads it: each entity's
``value_template`` rendered by Jinja2 (Home Assistant's template engine) against the
message the gateway publishes on its state topic, and each config's topic, ids and
classes as its MQTT integration expects them
(https://www.home-assistant.io/integrations/mqtt/#mqtt-discovery)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import jinja2
import pytest

from drivers import homeassistant
from drivers.model import Reading, reading_payload

#: The state a gateway with two bridges publishes (``gateway.metrics.view.gateway_state``).
STATE: dict[str, Any] = {
    "clients": 5,
    "messages_in": 15.5,
    "messages_out": 30.25,
    "dropped": 3,
    "rss_mib": 30.4,
    "uptime": 4242,
    "free_disk_mib": 512.5,
    "bridges": {
        "cloud eu": {"connected": True, "outbox": 4, "oldest_age": 1.2},
        "backup": {"connected": False, "outbox": 900, "oldest_age": 61.0},
    },
}

#: entity key -> (component, name, what its template renders from STATE, extra config)
MEASUREMENT = {"state_class": "measurement"}
DIAGNOSTIC = {"entity_category": "diagnostic"}
EXPECTED: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "clients": ("sensor", "clients connected", "5", {**MEASUREMENT, "icon": "mdi:lan-connect"}),
    "messages_in": ("sensor", "messages in", "15.5",
                    {"unit_of_measurement": "msg/s", **MEASUREMENT, "icon": "mdi:download"}),
    "messages_out": ("sensor", "messages out", "30.25",
                     {"unit_of_measurement": "msg/s", **MEASUREMENT, "icon": "mdi:upload"}),
    "dropped": ("sensor", "messages dropped", "3",
                {"state_class": "total_increasing", "icon": "mdi:delete-alert"}),
    "rss": ("sensor", "memory", "30.4", {"device_class": "data_size",
            "unit_of_measurement": "MiB", **MEASUREMENT, **DIAGNOSTIC}),
    "uptime": ("sensor", "uptime", "4242",
               {"device_class": "duration", "unit_of_measurement": "s", **DIAGNOSTIC}),
    "free_disk": ("sensor", "free disk", "512.5", {"device_class": "data_size",
                  "unit_of_measurement": "MiB", **MEASUREMENT, **DIAGNOSTIC}),
    "bridge_cloud_eu": ("binary_sensor", "bridge cloud eu", "ON",
                        {"device_class": "connectivity"}),
    "bridge_cloud_eu_outbox": ("sensor", "bridge cloud eu outbox", "4",
                               {"unit_of_measurement": "messages", **MEASUREMENT}),
    "bridge_cloud_eu_oldest": ("sensor", "bridge cloud eu oldest message", "1.2",
                               {"device_class": "duration", "unit_of_measurement": "s",
                                **MEASUREMENT}),
    "bridge_backup": ("binary_sensor", "bridge backup", "OFF", {"device_class": "connectivity"}),
    "bridge_backup_outbox": ("sensor", "bridge backup outbox", "900",
                             {"unit_of_measurement": "messages", **MEASUREMENT}),
    "bridge_backup_oldest": ("sensor", "bridge backup oldest message", "61.0",
                             {"device_class": "duration", "unit_of_measurement": "s",
                              **MEASUREMENT}),
}  # fmt: skip


DEVICE = {"identifiers": ["ledge_gw_1"], "name": "Ledge gw 1", "manufacturer": "Ledge"}


def render(template: str, payload: bytes) -> str:
    """What Home Assistant shows for ``payload`` (``value_json``: the payload as JSON)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    return env.from_string(template).render(value_json=json.loads(payload))


def configs(bridges: tuple[str, ...], disk: bool) -> dict[str, tuple[str, dict[str, Any]]]:
    out = {}
    for topic, payload in homeassistant.gateway_sensor_configs(
        "homeassistant", "gw 1", "ledge/gw 1/status", "ledge/gw 1/metrics", bridges, disk
    ):
        body = json.loads(payload)
        key = body["unique_id"].removeprefix("ledge_gw_1_")
        assert key not in out, f"two entities with the unique id {body['unique_id']}"
        out[key] = (topic, body)
    return out


def test_every_gateway_entity_shows_its_value_from_the_state_the_gateway_publishes() -> None:
    got = configs(("cloud eu", "backup"), disk=True)
    assert list(got) == list(EXPECTED)
    state = json.dumps(STATE).encode()
    for key, (component, name, shown, extra) in EXPECTED.items():
        topic, body = got[key]
        # <discovery_prefix>/<component>/<node_id>/<object_id>/config
        assert topic == f"homeassistant/{component}/gw_1/{key}/config"
        template = body.pop("value_template")
        assert render(template, state) == shown, key
        assert body == {
            "name": name,
            "unique_id": f"ledge_gw_1_{key}",
            "object_id": f"ledge_gw_1_{key}",
            "state_topic": "ledge/gw 1/metrics",
            "availability_topic": "ledge/gw 1/status",
            "device": {
                "identifiers": ["ledge_gw_1"],
                "name": "Ledge gw 1",
                "manufacturer": "Ledge",
            },
            **extra,
        }, key


def test_without_bridges_or_a_store_the_gateway_has_its_six_entities() -> None:
    assert list(configs((), disk=False)) == [
        "clients", "messages_in", "messages_out", "dropped", "rss", "uptime"
    ]  # fmt: skip


def test_a_bridge_name_that_needs_quoting_is_read_back_by_its_template() -> None:
    name = 'a "quoted" [name]'
    got = configs((name,), disk=False)
    state = {**STATE, "bridges": {name: {"connected": True, "outbox": 7, "oldest_age": 0.5}}}
    payload = json.dumps(state).encode()
    slug = "bridge_a__quoted___name_"
    assert render(got[slug][1]["value_template"], payload) == "ON"
    assert render(got[f"{slug}_outbox"][1]["value_template"], payload) == "7"
    assert render(got[f"{slug}_oldest"][1]["value_template"], payload) == "0.5"


@pytest.mark.parametrize(
    ("quantity", "device_class"),
    [
        ("temperature", "temperature"),
        ("lux", "illuminance"),
        ("CO2", "carbon_dioxide"),  # looked up whatever its case
        ("altitude", "distance"),
        ("pm25", "pm25"),
        ("battery", "battery"),
        ("wind", None),  # no class Home Assistant knows: none is claimed
    ],
)
def test_a_sensor_claims_the_device_class_of_its_quantity(
    quantity: str, device_class: str | None
) -> None:
    _, payload = homeassistant.sensor_config(
        discovery_prefix="homeassistant", gateway="gw1", driver="ble", device="t",
        quantity=quantity, unit="", numeric=True, state_topic="s", json_payload=True,
        gateway_status_topic="g", device_status_topic="d",
    )  # fmt: skip
    assert json.loads(payload).get("device_class") == device_class


def test_a_sensors_template_shows_the_value_of_the_reading_the_gateway_publishes() -> None:
    reading = Reading(
        device="env", quantity="temperature", value=21.5, unit="°C",
        timestamp=datetime(2026, 12, 7, tzinfo=UTC), driver="serial", metadata={"rssi": -60},
    )  # fmt: skip
    _, payload = homeassistant.sensor_config(
        discovery_prefix="homeassistant", gateway="gw1", driver="serial", device="env",
        quantity="temperature", unit="°C", numeric=True, state_topic="s", json_payload=True,
        gateway_status_topic="g", device_status_topic="d",
    )  # fmt: skip
    assert render(json.loads(payload)["value_template"], reading_payload(reading)) == "21.5"


def test_ids_keep_what_home_assistant_allows_in_a_node_id_and_replace_the_rest() -> None:
    """Letters, digits, ``_`` and ``-`` are allowed in a node id; anything else (a dot, a
    space, a slash: the topic's separator) becomes ``_``."""
    topic, payload = homeassistant.gateway_config("homeassistant", "edge-1.b c/d", "s")
    assert topic == "homeassistant/binary_sensor/edge-1_b_c_d/status/config"
    assert json.loads(payload)["unique_id"] == "ledge_edge-1_b_c_d_status"
