"""Sensors in: serial devices -> readings -> topics, Home Assistant discovery, downlink.

Composes the pure pieces in ``drivers`` (line framing, parsers, the Reading
contract) with the serial transport and the broker's in-process client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from drivers import homeassistant
from drivers.lines import Garbage, LineFramer
from drivers.mapping import DeviceMap, FieldMap
from drivers.model import Reading, now_utc, reading_payload, reading_topic
from drivers.parsers import ParseError, Sample, jsonl, kv, nmea
from drivers.serial import PortSettings, SerialPort
from gateway.broker.core import Broker
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.sensors.settings import SensorSettings, SerialSettings

if TYPE_CHECKING:
    from gateway.sensors.ble import BleSensors

log = logging.getLogger("ledge.sensors")

PARSERS: Final[dict[str, Callable[[bytes], list[Sample]]]] = {
    "nmea": nmea.parse,
    "jsonl": jsonl.parse,
    "kv": kv.parse,
}

#: Problem lines logged per device per minute before the rest are only counted.
LOG_BUDGET: Final = 10


@dataclass(slots=True)
class DeviceStats:
    lines: int = 0
    readings: int = 0
    bad_lines: int = 0
    garbage_bytes: int = 0


class SerialSensor:
    """One serial device: bytes -> lines -> samples -> readings, with its own log budget."""

    def __init__(self, hub: SensorHub, settings: SerialSettings) -> None:
        self.hub = hub
        self.settings = settings
        self.framer = LineFramer(settings.max_line)
        self.parse = PARSERS[settings.protocol]
        self.mapping = DeviceMap(
            settings.name,
            "serial",
            {
                k: FieldMap(f.quantity, f.unit, f.scale, f.offset)
                for k, f in settings.fields.items()
            },
            settings.only_mapped,
        )
        self.stats = DeviceStats()
        #: The newest reading of each quantity (for the status page).
        self.last: dict[str, Reading] = {}
        #: When (the hub's clock) the newest reading was made; None: none yet.
        self.heard: float | None = None
        self._budget = LOG_BUDGET
        self._budget_reset = 0.0
        self._suppressed = 0
        self.port = SerialPort(
            settings.name,
            PortSettings(
                settings.path,
                settings.baudrate,
                settings.bytesize,
                settings.parity,
                settings.stopbits,
            ),
            self._data,
            self._state,
        )

    def _problem(self, message: str, *args: object) -> None:
        now = self.hub.clock()
        if now >= self._budget_reset:
            if self._suppressed:
                log.warning(
                    "%s: %d more problem lines in the last minute were not logged",
                    self.settings.name,
                    self._suppressed,
                )
            self._budget = LOG_BUDGET
            self._budget_reset = now + 60
            self._suppressed = 0
        if self._budget > 0:
            self._budget -= 1
            log.warning(message, *args)
        else:
            self._suppressed += 1

    def _data(self, data: bytes) -> None:
        name = self.settings.name
        stamp = now_utc()
        readings: list[Reading] = []
        for item in self.framer.feed(data):
            if isinstance(item, Garbage):
                self.stats.garbage_bytes += item.size
                self._problem(
                    "%s: skipped %d bytes at byte offset %d: %s",
                    name,
                    item.size,
                    item.offset,
                    item.reason,
                )
                continue
            self.stats.lines += 1
            try:
                samples = self.parse(item.data)
            except ParseError as exc:
                self.stats.bad_lines += 1
                self._problem(
                    "%s: skipped unreadable line at byte offset %d (column %d): %s: %r",
                    name,
                    item.offset,
                    exc.column,
                    exc.reason,
                    item.data[:80],
                )
                continue
            got, problems = self.mapping.readings(samples, stamp)
            for problem in problems:
                self._problem("%s: line at byte offset %d: %s", name, item.offset, problem)
            readings.extend(got)
        if readings:
            self.heard = self.hub.clock()
            self.stats.readings += len(readings)
            last = self.last
            for reading in readings:
                last[reading.quantity] = reading
            self.hub.publish_readings(readings)

    def _state(self, connected: bool) -> None:
        self.framer.reset()
        self.hub.publish_status("serial", self.settings.name, connected)


class SensorHub:
    """All configured sensors, publishing through one in-process client."""

    def __init__(
        self,
        broker: Broker,
        settings: SensorSettings,
        clock: Callable[[], float],
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.clock = clock
        self.client = LocalClient(broker, f"ledge-sensors-{settings.gateway}", self._command)
        self.sensors = {s.name: SerialSensor(self, s) for s in settings.serial}
        self.ble: BleSensors | None = None
        if settings.uses_ble:
            # Imported here: a gateway without BLE devices never loads bleak.
            from gateway.sensors.ble import BleSensors

            self.ble = BleSensors(self, settings.bluetooth, settings.ble)
        self.announced: set[tuple[str, str, str]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.gateway_status = f"{settings.prefix}/{settings.gateway}/status"
        #: When (the hub's clock) the hub started: devices not heard yet are silent since.
        self.started = clock()

    # ------------------------------------------------------------------ life cycle

    def silent_since(self, heard: float | None) -> str:
        """The wall-clock time (Unix, to a tenth of a second) since which a device has not
        been heard: its newest reading, or the hub's start when none came yet. Taken
        from the monotonic clock at each call, so a step of the wall clock moves it too
        and ``now - silent since`` stays the true silence (``ledge health`` reads it)."""
        since = self.started if heard is None else heard
        return f"{time.time() - (self.clock() - since):.1f}"

    def sys_values(self) -> dict[str, str]:
        """Per device: lines read, readings made, unreadable lines, garbage bytes skipped,
        and since when it has been silent."""
        out: dict[str, str] = {}
        for name, sensor in self.sensors.items():
            st = sensor.stats
            base = f"sensors/serial/{name}/"
            out[base + "connected"] = "1" if sensor.port.connected else "0"
            out[base + "silent since"] = self.silent_since(sensor.heard)
            out[base + "lines"] = str(st.lines)
            out[base + "readings"] = str(st.readings)
            out[base + "bad lines"] = str(st.bad_lines)
            out[base + "garbage bytes"] = str(st.garbage_bytes)
        if self.ble is not None:
            out.update(self.ble.sys_values())
        return out

    def health(self) -> dict[str, Any]:
        """What the gateway's health report adds for the sensors."""
        return self.ble.health() if self.ble is not None else {}

    def start(self) -> None:
        now = self.clock()
        self.broker.sys_sources.append(self.sys_values)
        self.client.publish(self.gateway_status, b"online", now, qos=1, retain=True)
        if self.settings.homeassistant:
            topic, payload = homeassistant.gateway_config(
                self.settings.discovery_prefix, self.settings.gateway, self.gateway_status
            )
            self.client.publish(topic, payload, now, qos=1, retain=True)
        for sensor in self.sensors.values():
            if sensor.settings.commands:
                self.client.subscribe(
                    f"{self._base('serial', sensor.settings.name)}/command", 1, now, retained=False
                )
            self.publish_status("serial", sensor.settings.name, False)
            self._tasks.append(
                asyncio.get_running_loop().create_task(
                    sensor.port.run(), name=f"serial {sensor.settings.name}"
                )
            )
        if self.ble is not None:
            self.ble.start()

    async def stop(self) -> None:
        for sensor in self.sensors.values():
            sensor.port.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ble is not None:
            await self.ble.stop()
        now = self.clock()
        for name in self.sensors:
            self.publish_status("serial", name, False)
        self.client.publish(self.gateway_status, b"offline", now, qos=1, retain=True)

    # ------------------------------------------------------------------ uplink

    def _base(self, driver: str, device: str) -> str:
        return f"{self.settings.prefix}/{self.settings.gateway}/{driver}/{device}"

    def publish_readings(self, readings: list[Reading]) -> None:
        s = self.settings
        now = self.clock()
        for reading in readings:
            topic = reading_topic(reading, s.gateway, s.prefix)
            self.client.publish(
                topic, reading_payload(reading, s.plain_payload), now, qos=s.qos, retain=s.retain
            )
            if s.homeassistant:
                key = (reading.driver, reading.device, reading.quantity)
                if key not in self.announced:
                    self.announced.add(key)
                    self._announce(reading, topic, now)

    def _announce(self, reading: Reading, state_topic: str, now: float) -> None:
        s = self.settings
        topic, payload = homeassistant.sensor_config(
            discovery_prefix=s.discovery_prefix,
            gateway=s.gateway,
            driver=reading.driver,
            device=reading.device,
            quantity=reading.quantity,
            unit=reading.unit,
            numeric=isinstance(reading.value, int | float) and not isinstance(reading.value, bool),
            state_topic=state_topic,
            json_payload=not s.plain_payload,
            gateway_status_topic=self.gateway_status,
            device_status_topic=f"{self._base(reading.driver, reading.device)}/status",
        )
        self.client.publish(topic, payload, now, qos=1, retain=True)

    def publish_status(self, driver: str, device: str, online: bool) -> None:
        self.client.publish(
            f"{self._base(driver, device)}/status",
            b"online" if online else b"offline",
            self.clock(),
            qos=1,
            retain=True,
        )

    # ------------------------------------------------------------------ downlink

    def _command(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
        # Called inside the broker's delivery: act on the next loop iteration.
        asyncio.get_running_loop().call_soon(self._run_command, msg.topic, msg.payload)

    def _run_command(self, topic: str, payload: bytes) -> None:
        driver, device = topic.split("/")[-3:-1]
        if driver == "ble":
            if self.ble is not None:
                self.ble.command(device, topic, payload)
            return
        sensor = self.sensors.get(device)
        result: dict[str, object]
        if sensor is None:
            return
        data = payload + sensor.settings.command_newline.encode()
        try:
            written = sensor.port.write(data)
        except OSError as exc:
            result = {"ok": False, "error": str(exc)}
            log.warning("%s: command not written: %s", device, exc)
        else:
            result = {"ok": written == len(data), "bytes": written}
        self.client.publish(
            f"{topic}/result",
            json.dumps(result, separators=(",", ":")).encode(),
            self.clock(),
            qos=1,
        )
