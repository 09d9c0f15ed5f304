"""Home Assistant MQTT discovery: config messages that announce each sensor. Pure.

Each (device, quantity) becomes one Home Assistant sensor, grouped under a
device per sensor device, linked to the gateway; availability follows both the
gateway's status topic and the device's own (online/offline, retained).
"""

from __future__ import annotations

import json
from typing import Any, Final

#: quantity -> (Home Assistant device_class, usual unit)
DEVICE_CLASSES: Final[dict[str, str]] = {
    "temperature": "temperature",
    "humidity": "humidity",
    "pressure": "pressure",
    "illuminance": "illuminance",
    "lux": "illuminance",
    "co2": "carbon_dioxide",
    "voltage": "voltage",
    "current": "current",
    "power": "power",
    "energy": "energy",
    "battery": "battery",
    "speed": "speed",
    "altitude": "distance",
    "pm25": "pm25",
    "pm10": "pm10",
}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in text)


def sensor_config(
    *,
    discovery_prefix: str,
    gateway: str,
    driver: str,
    device: str,
    quantity: str,
    unit: str,
    numeric: bool,
    state_topic: str,
    json_payload: bool,
    gateway_status_topic: str,
    device_status_topic: str,
) -> tuple[str, bytes]:
    """``(config topic, config payload)`` for one sensor."""
    node = _slug(f"{gateway}_{device}")
    object_id = _slug(quantity)
    unique = f"ledge_{node}_{object_id}"
    body: dict[str, Any] = {
        "name": quantity.replace("_", " "),
        "unique_id": unique,
        "object_id": unique,
        "state_topic": state_topic,
        "availability": [{"topic": gateway_status_topic}, {"topic": device_status_topic}],
        "availability_mode": "all",
        "device": {
            "identifiers": [f"ledge_{node}"],
            "name": device,
            "manufacturer": "Ledge",
            "model": driver,
            "via_device": f"ledge_{_slug(gateway)}",
        },
    }
    if json_payload:
        body["value_template"] = "{{ value_json.value }}"
    if unit:
        body["unit_of_measurement"] = unit
    if numeric:
        body["state_class"] = "measurement"
    device_class = DEVICE_CLASSES.get(quantity.lower())
    if device_class:
        body["device_class"] = device_class
    topic = f"{discovery_prefix}/sensor/{node}/{object_id}/config"
    return topic, json.dumps(body, separators=(",", ":")).encode()


def gateway_config(discovery_prefix: str, gateway: str, status_topic: str) -> tuple[str, bytes]:
    """The gateway itself as a connectivity sensor (the device the sensors hang off)."""
    node = _slug(gateway)
    body = {
        "name": "connectivity",
        "unique_id": f"ledge_{node}_status",
        "state_topic": status_topic,
        "payload_on": "online",
        "payload_off": "offline",
        "device_class": "connectivity",
        "device": {
            "identifiers": [f"ledge_{node}"],
            "name": f"Ledge {gateway}",
            "manufacturer": "Ledge",
        },
    }
    return (
        f"{discovery_prefix}/binary_sensor/{node}/status/config",
        json.dumps(body, separators=(",", ":")).encode(),
    )


#: The gateway's own health as Home Assistant entities: (component, key, name, value
#: template, extra config). They read one retained JSON state message.
GATEWAY_ENTITIES: Final[tuple[tuple[str, str, str, str, dict[str, Any]], ...]] = (
    ("sensor", "clients", "clients connected", "{{ value_json.clients }}",
     {"state_class": "measurement", "icon": "mdi:lan-connect"}),
    ("sensor", "messages_in", "messages in", "{{ value_json.messages_in }}",
     {"unit_of_measurement": "msg/s", "state_class": "measurement", "icon": "mdi:download"}),
    ("sensor", "messages_out", "messages out", "{{ value_json.messages_out }}",
     {"unit_of_measurement": "msg/s", "state_class": "measurement", "icon": "mdi:upload"}),
    ("sensor", "dropped", "messages dropped", "{{ value_json.dropped }}",
     {"state_class": "total_increasing", "icon": "mdi:delete-alert"}),
    ("sensor", "rss", "memory", "{{ value_json.rss_mib }}",
     {"device_class": "data_size", "unit_of_measurement": "MiB", "state_class": "measurement",
      "entity_category": "diagnostic"}),
    ("sensor", "uptime", "uptime", "{{ value_json.uptime }}",
     {"device_class": "duration", "unit_of_measurement": "s", "entity_category": "diagnostic"}),
)  # fmt: skip


def gateway_sensor_configs(
    discovery_prefix: str,
    gateway: str,
    status_topic: str,
    state_topic: str,
    bridges: tuple[str, ...] = (),
    disk: bool = False,
) -> list[tuple[str, bytes]]:
    """The gateway as a device: its health (clients, message rates, drops, memory,
    uptime, free disk under ``data_dir``) and each bridge's link and outbox, all read
    from ``state_topic`` and available while ``status_topic`` says online."""
    node = _slug(gateway)
    device = {"identifiers": [f"ledge_{node}"], "name": f"Ledge {gateway}", "manufacturer": "Ledge"}
    entities = list(GATEWAY_ENTITIES)
    if disk:
        entities.append(
            ("sensor", "free_disk", "free disk", "{{ value_json.free_disk_mib }}",
             {"device_class": "data_size", "unit_of_measurement": "MiB",
              "state_class": "measurement", "entity_category": "diagnostic"})
        )  # fmt: skip
    for bridge in bridges:
        ref = f"value_json.bridges[{json.dumps(bridge)}]"
        slug = _slug(bridge)
        entities += [
            ("binary_sensor", f"bridge_{slug}", f"bridge {bridge}",
             f"{{{{ 'ON' if {ref}.connected else 'OFF' }}}}",
             {"device_class": "connectivity"}),
            ("sensor", f"bridge_{slug}_outbox", f"bridge {bridge} outbox",
             f"{{{{ {ref}.outbox }}}}",
             {"unit_of_measurement": "messages", "state_class": "measurement"}),
            ("sensor", f"bridge_{slug}_oldest", f"bridge {bridge} oldest message",
             f"{{{{ {ref}.oldest_age }}}}",
             {"device_class": "duration", "unit_of_measurement": "s",
              "state_class": "measurement"}),
        ]  # fmt: skip
    out = []
    for component, key, name, template, extra in entities:
        unique = f"ledge_{node}_{key}"
        body: dict[str, Any] = {
            "name": name,
            "unique_id": unique,
            "object_id": unique,
            "state_topic": state_topic,
            "value_template": template,
            "availability_topic": status_topic,
            "device": device,
            **extra,
        }
        topic = f"{discovery_prefix}/{component}/{node}/{key}/config"
        out.append((topic, json.dumps(body, separators=(",", ":")).encode()))
    return out
