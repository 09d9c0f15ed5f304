"""The collector: reads what the gateway already counts and feeds the pure view.

Each part of the gateway is read by a small adapter that is a ``MetricSource`` (and,
when it has something for the status page, a ``StatusSource``): the broker core's
``Stats`` and tables, the listeners, the store, the process, each bridge, the sensor
drivers, the taps, the HTTP listener. A new component plugs in the same way: give it
``samples()`` (and ``status()``) and ``Collector.register`` it; the view and the page
need no change. Nothing here runs on the message path: values are read when someone
asks (a scrape, a page load) and every ``TICK`` seconds for the rates and sparklines.

Metric names follow Prometheus conventions: ``ledge_`` prefix, ``_total`` counters,
base units (bytes, seconds), labels only from bounded sets (listener, protocol
version, bridge, driver, reason); process metrics use the standard ``process_*``
names every Prometheus client library exports.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from gateway import __version__
from gateway.app.runtime import ConfigError
from gateway.broker.state import State
from gateway.metrics.view import (
    BridgeStatus,
    DeviceStatus,
    ListenerStatus,
    MetricSource,
    Sample,
    Snapshot,
    StatusPart,
    StatusSource,
    ValueStatus,
    counter,
    exposition,
    gauge,
    message_rates,
    status_document,
)

if TYPE_CHECKING:
    import asyncio

    from drivers.model import Reading
    from gateway.app.runtime import RuntimeConfig
    from gateway.app.system_update import UpdateRecord
    from gateway.bridge.link import Bridge
    from gateway.broker.core import Broker
    from gateway.mqttsn.gateway import Gateway as SnGateway
    from gateway.net.http import Credentials, HTTPServer, Response
    from gateway.net.http_settings import HTTPSettings
    from gateway.net.server import Server
    from gateway.sensors.ble import BleSensors
    from gateway.sensors.ble import Device as BleDevice
    from gateway.sensors.hub import SensorHub
    from gateway.sensors.settings import SensorSettings
    from gateway.store.sqlite import Store
    from gateway.taps import TapPlane

log = logging.getLogger("ledge.metrics")

#: Seconds between the points behind message rates and sensor sparklines.
TICK: Final = 5.0
#: Points kept: rates over the last TICK * HISTORY seconds, sparklines of that many values.
HISTORY: Final = 60

#: MQTT protocol levels as people name them.
PROTOCOLS: Final = {3: "3.1", 4: "3.1.1", 5: "5.0"}


class Collector:
    """The registered sources, the history behind rates, and the two outputs."""

    def __init__(
        self,
        broker: Broker,
        gateway: str,
        clock: Callable[[], float],
        listeners: tuple[ListenerStatus, ...] = (),
    ) -> None:
        self.broker = broker
        self.gateway = gateway
        self.clock = clock
        self.listeners = listeners
        self.sources: list[MetricSource] = []
        self.status_sources: list[StatusSource] = []
        self._tickers: list[Callable[[], None]] = []
        self._points: deque[tuple[float, float, float]] = deque(maxlen=HISTORY + 1)
        self._timer: asyncio.TimerHandle | None = None
        self._failed: set[str] = set()

    def register(self, source: MetricSource) -> None:
        """Add a source; one that also has ``status()`` shows on the page, one with
        ``tick()`` is called every ``TICK`` seconds (to keep a short history)."""
        self.sources.append(source)
        if callable(getattr(source, "status", None)):
            self.status_sources.append(source)  # type: ignore[arg-type]
        tick = getattr(source, "tick", None)
        if callable(tick):
            self._tickers.append(tick)

    # ------------------------------------------------------------------ time

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.tick()
        self._timer = loop.call_later(TICK, self._on_timer, loop)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self.tick()
        self._timer = loop.call_later(TICK, self._on_timer, loop)

    def tick(self) -> None:
        st = self.broker.stats
        self._points.append((self.clock(), st.publish_received, st.publish_sent))
        for tick in self._tickers:
            tick()

    # ------------------------------------------------------------------ outputs

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        for source in self.sources:
            try:
                out.extend(source.samples())
            except Exception:
                self._source_failed(source)
        return out

    def _source_failed(self, source: object) -> None:
        name = type(source).__name__
        if name not in self._failed:  # once per kind of source, not once per scrape
            self._failed.add(name)
            log.exception("metrics: %s failed; its values are left out", name)

    def metrics(self) -> str:
        """The Prometheus text exposition of every source."""
        return exposition(self.samples())

    def snapshot(self) -> Snapshot:
        parts = []
        for source in self.status_sources:
            try:
                parts.append(source.status())
            except Exception:
                self._source_failed(source)
        return Snapshot(
            gateway=self.gateway,
            version=__version__,
            wall_time=time.time(),
            uptime=self.clock() - self.broker.started,
            listeners=self.listeners,
            samples=tuple(self.samples()),
            parts=tuple(parts),
            rates=message_rates(list(self._points)),
        )

    def status(self) -> dict[str, Any]:
        """The status document (``/api/status``)."""
        return status_document(self.snapshot())

    def respond(self, path: str) -> Response | None:
        """The HTTP routes: the status page, the status document, the metrics."""
        from gateway.net.http import Response

        if path == "/metrics":
            return Response(
                200, self.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8"
            )
        if path == "/api/status":
            body = json.dumps(self.status(), separators=(",", ":")).encode()
            return Response(200, body, "application/json")
        if path == "/":
            from gateway.metrics import page

            return Response(
                200,
                page.render(self.status()).encode(),
                "text/html; charset=utf-8",
                (("content-security-policy", page.CONTENT_SECURITY_POLICY),),
            )
        return None


# ----------------------------------------------------------------------------- sources


class BrokerSource:
    """The broker core: its ``Stats``, sessions, connections and listeners."""

    def __init__(
        self, broker: Broker, clock: Callable[[], float], server: Server | None = None
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.server = server

    def samples(self) -> Iterator[Sample]:
        b = self.broker
        st = b.stats
        yield gauge("ledge_build_info", "Ledge's version (always 1).", 1, version=__version__)
        yield gauge(
            "ledge_uptime_seconds",
            "Seconds since the gateway started.",
            round(self.clock() - b.started, 3),
        )
        clients: dict[tuple[str, int], int] = {}
        slow = 0
        for conn in b.connections.values():
            if conn.state is State.CONNECTED:
                key = (conn.listener, conn.version)
                clients[key] = clients.get(key, 0) + 1
                if not conn.writable:
                    slow += 1
        listeners = list(self.server.endpoints) if self.server is not None else []
        for label in listeners:
            for version in (4, 5):
                clients.setdefault((label, version), 0)
        for (listener, version), count in sorted(clients.items()):
            yield gauge(
                "ledge_clients_connected",
                "MQTT clients connected now, by listener and protocol version.",
                count,
                listener=listener,
                protocol=PROTOCOLS.get(version, str(version)),
            )
        yield gauge(
            "ledge_clients_maximum", "Most MQTT clients connected at once.", st.clients_maximum
        )
        yield gauge(
            "ledge_clients_limit",
            "Clients that may connect (broker.max_connections).",
            b.settings.max_connections,
        )
        yield gauge(
            "ledge_clients_slow",
            "Connected clients not reading their output now (slow consumers).",
            slow,
        )
        states = {"connected": 0, "offline": 0, "in_process": 0}
        for session in b.sessions.values():
            if session.sink is not None:
                states["in_process"] += 1
            elif session.conn is not None:
                states["connected"] += 1
            else:
                states["offline"] += 1
        for state, count in states.items():
            yield gauge("ledge_sessions", "Sessions, by state.", count, state=state)
        yield counter(
            "ledge_connections_total", "Network connections given a slot.", st.connections_total
        )
        yield counter(
            "ledge_connections_refused_total",
            "Network connections refused (pool, listener limit, handshake bound).",
            st.connections_refused,
        )
        yield gauge(
            "ledge_clients_connecting",
            "Network connections that have not finished CONNECT (and login) yet.",
            len(b.connecting),
        )
        for reason, count in (
            ("connecting_full", st.evicted_connecting_full),
            ("address_full", st.evicted_address_full),
        ):
            yield counter(
                "ledge_connections_evicted_total",
                "Connections closed before their CONNACK to admit a newer one, by reason.",
                count,
                reason=reason,
            )
        yield counter(
            "ledge_protocol_errors_total",
            "Connections closed for breaking the MQTT protocol.",
            st.protocol_errors,
        )
        yield counter(
            "ledge_packets_received_total", "MQTT packets received.", st.messages_received
        )
        yield counter("ledge_packets_sent_total", "MQTT packets sent.", st.messages_sent)
        yield counter(
            "ledge_messages_received_total", "PUBLISH messages received.", st.publish_received
        )
        yield counter("ledge_messages_sent_total", "PUBLISH messages delivered.", st.publish_sent)
        yield counter("ledge_received_bytes_total", "Bytes received.", st.bytes_received)
        yield counter("ledge_sent_bytes_total", "Bytes sent.", st.bytes_sent)
        for reason, value in (
            ("slow_consumer", st.dropped_slow_consumer),
            ("queue_full", st.dropped_queue_full),
            ("expired", st.dropped_expired),
            ("too_large", st.dropped_too_large),
            ("offline_qos0", st.dropped_offline_qos0),
        ):
            yield counter(
                "ledge_messages_dropped_total",
                "Messages the broker dropped by policy, by reason.",
                value,
                reason=reason,
            )
        yield counter(
            "ledge_messages_denied_total",
            "PUBLISH refused: ACL, $SYS, or a full store or outbox.",
            st.publish_denied,
        )
        yield gauge("ledge_subscriptions", "Subscriptions.", b.index.count)
        yield gauge("ledge_retained_messages", "Retained messages.", len(b.retained))
        yield gauge("ledge_retained_bytes", "Bytes of retained messages.", b.retained.bytes)
        yield counter(
            "ledge_retained_refused_total",
            "Retained messages refused: the retained store was full.",
            b.retained.refused,
        )
        if self.server is not None:
            for label, endpoint in self.server.endpoints.items():
                yield gauge(
                    "ledge_listener_handshakes",
                    "Connections in their TLS handshake or WebSocket upgrade now.",
                    len(endpoint.pending),
                    listener=label,
                )
                yield counter(
                    "ledge_listener_handshakes_refused_total",
                    "Connections closed because too many were in their handshake.",
                    endpoint.refused,
                    listener=label,
                )


class ProcessSource:
    """The process as the operating system sees it (Linux ``/proc``)."""

    def __init__(self, started_wall: float) -> None:
        self.started_wall = started_wall
        self.page = os.sysconf("SC_PAGE_SIZE")

    def samples(self) -> Iterator[Sample]:
        yield gauge(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds.",
            round(self.started_wall, 3),
        )
        times = os.times()
        yield counter(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            round(times.user + times.system, 3),
        )
        try:
            statm = Path("/proc/self/statm").read_text().split()
            fds = len(os.listdir("/proc/self/fd"))
        except OSError:  # not Linux: these are left out
            return
        yield gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            int(statm[1]) * self.page,
        )
        yield gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            int(statm[0]) * self.page,
        )
        yield gauge("process_open_fds", "Number of open file descriptors.", fds)
        import resource

        yield gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )


class StoreSource:
    """The store under ``data_dir``: its size, its bound, the disk, the writer's backlog."""

    def __init__(self, store: Store, broker: Broker) -> None:
        self.store = store
        self.broker = broker

    def samples(self) -> Iterator[Sample]:
        store = self.store
        size = 0
        for path in (store.path, store.path.with_name(store.path.name + "-wal")):
            with contextlib.suppress(OSError):
                size += path.stat().st_size
        yield gauge("ledge_store_size_bytes", "Size of the store (database and WAL).", size)
        yield gauge(
            "ledge_store_limit_bytes",
            "The store's bound, store.max_bytes (0: the disk).",
            store.settings.max_bytes,
        )
        try:
            stat = os.statvfs(store.directory)
            free = stat.f_bavail * stat.f_frsize
        except OSError:
            free = 0
        yield gauge("ledge_data_dir_free_bytes", "Free bytes on the disk of data_dir.", free)
        yield gauge(
            "ledge_store_full",
            "1 while QoS 1/2 messages that must be stored are refused (store or disk full).",
            1 if self.broker.store_full else 0,
        )
        yield gauge("ledge_store_backlog", "Changes waiting for the store's writer.", store.backlog)
        yield counter("ledge_store_commits_total", "Store transactions committed.", store.commits)


class BridgeSource:
    """The cloud bridges: link state, outbox, and every count by reason."""

    def __init__(self, bridges: list[Bridge]) -> None:
        self.bridges = bridges

    def samples(self) -> Iterator[Sample]:
        wall = time.time()
        for b in self.bridges:
            o, st, bs = b.outbox, b.outbox.stats, b.stats
            name = b.name
            yield gauge(
                "ledge_bridge_connected",
                "1 while the bridge is connected.",
                1 if b.state == "connected" else 0,
                bridge=name,
            )
            yield gauge(
                "ledge_bridge_outbox_messages",
                "Messages waiting in the outbox.",
                o.count,
                bridge=name,
            )
            yield gauge(
                "ledge_bridge_outbox_bytes", "Bytes waiting in the outbox.", o.bytes, bridge=name
            )
            yield gauge(
                "ledge_bridge_outbox_limit_bytes",
                "The outbox's bound, outbox.max_bytes.",
                o.settings.max_bytes,
                bridge=name,
            )
            yield gauge(
                "ledge_bridge_outbox_oldest_age_seconds",
                "Age of the oldest message in the outbox (0: empty).",
                round(o.oldest_age(wall), 3),
                bridge=name,
            )
            yield gauge(
                "ledge_bridge_inflight",
                "Messages sent and not yet acknowledged.",
                b.inflight,
                bridge=name,
            )
            yield gauge(
                "ledge_bridge_window",
                "Messages that may be unacknowledged at once: the remote's receive "
                "maximum, at most max_inflight.",
                b.window,
                bridge=name,
            )
            yield counter(
                "ledge_bridge_messages_queued_total",
                "Messages that entered the outbox.",
                st.queued,
                bridge=name,
            )
            yield counter(
                "ledge_bridge_messages_sent_total",
                "Messages sent to the remote (again after a reconnect counts again).",
                st.sent,
                bridge=name,
            )
            yield counter(
                "ledge_bridge_messages_acknowledged_total",
                "Messages the remote acknowledged.",
                st.acknowledged,
                bridge=name,
            )
            yield counter(
                "ledge_bridge_messages_received_total",
                "Messages from the remote published locally.",
                bs.received,
                bridge=name,
            )
            for reason, value in (
                ("outbox_full", st.dropped_full),
                ("expired", st.dropped_expired),
                ("qos0_offline", bs.dropped_qos0_offline),
                ("rejected", bs.rejected),
                ("loop", bs.loops),
                ("echo", bs.echoes),
            ):
                yield counter(
                    "ledge_bridge_messages_dropped_total",
                    "Messages the bridge dropped, by reason (outbox_full: by the outbox "
                    "policy when_full).",
                    value,
                    bridge=name,
                    reason=reason,
                )
            yield counter(
                "ledge_bridge_messages_refused_total",
                "Publishers refused because the outbox was full (policy refuse).",
                st.refused,
                bridge=name,
            )
            yield counter(
                "ledge_bridge_connects_total",
                "Connections made to the remote.",
                bs.connects,
                bridge=name,
            )

    def status(self) -> StatusPart:
        wall = time.time()
        return StatusPart(
            bridges=tuple(
                BridgeStatus(
                    name=b.name,
                    state=b.state,
                    address=b.address,
                    last_error=b.last_error,
                    last_error_at=b.last_error_at,
                    since=b.since,
                    queued=b.outbox.count,
                    bytes=b.outbox.bytes,
                    max_messages=b.outbox.settings.max_messages,
                    max_bytes=b.outbox.settings.max_bytes,
                    oldest_age=b.outbox.oldest_age(wall),
                    sent=b.outbox.stats.sent,
                    acknowledged=b.outbox.stats.acknowledged,
                    dropped=b.drops,
                )
                for b in self.bridges
            )
        )


class SensorSource:
    """The sensor drivers: serial counts here (BLE's in ``BleSource``); per device of
    every driver (on the page only) its state, last values and, sampled every ``TICK``,
    their recent history."""

    def __init__(self, hub: SensorHub) -> None:
        self.hub = hub
        self.history: dict[tuple[str, str, str], deque[float]] = {}
        self._seen: dict[tuple[str, str, str], object] = {}

    def samples(self) -> Iterator[Sample]:
        sensors = self.hub.sensors.values()
        connected = sum(1 for s in sensors if s.port.connected)
        for state, count in (("connected", connected), ("disconnected", len(sensors) - connected)):
            yield gauge(
                "ledge_sensor_devices",
                "Configured sensor devices, by state.",
                count,
                driver="serial",
                state=state,
            )
        yield counter(
            "ledge_sensor_lines_total",
            "Lines read from serial devices.",
            sum(s.stats.lines for s in sensors),
            driver="serial",
        )
        yield counter(
            "ledge_sensor_readings_total",
            "Readings made.",
            sum(s.stats.readings for s in sensors),
            driver="serial",
        )
        yield counter(
            "ledge_sensor_bad_lines_total",
            "Input skipped as unreadable, by reason.",
            sum(s.stats.bad_lines for s in sensors),
            driver="serial",
            reason="unreadable",
        )
        yield counter(
            "ledge_sensor_skipped_bytes_total",
            "Bytes skipped as garbage (lines longer than max_line).",
            sum(s.stats.garbage_bytes for s in sensors),
            driver="serial",
        )

    def _devices(self) -> Iterator[tuple[str, str, DeviceState, dict[str, Reading]]]:
        """Every device as (driver, name, its state, newest reading per quantity)."""
        for name, sensor in self.hub.sensors.items():
            yield "serial", name, DeviceState(sensor.port.connected), sensor.last
        ble = self.hub.ble
        if ble is not None:
            for name, device in ble.devices.items():
                yield "ble", name, _ble_state(device), device.last

    def tick(self) -> None:
        """Add each quantity's newest numeric reading (if new) to its history."""
        for driver, name, _state, last in self._devices():
            for quantity, reading in last.items():
                key = (driver, name, quantity)
                if self._seen.get(key) is reading:
                    continue
                self._seen[key] = reading
                value = reading.value
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                history = self.history.get(key)
                if history is None:
                    history = self.history[key] = deque(maxlen=HISTORY)
                history.append(float(value))

    def status(self) -> StatusPart:
        devices = []
        for driver, name, state, last in self._devices():
            seen = max((r.timestamp.timestamp() for r in last.values()), default=None)
            devices.append(
                DeviceStatus(
                    driver=driver,
                    name=name,
                    online=state.online,
                    state=state.words,
                    presence=state.presence,
                    last_seen=seen,
                    values=tuple(
                        ValueStatus(
                            quantity,
                            reading.value,
                            reading.unit,
                            tuple(self.history.get((driver, name, quantity), ())),
                        )
                        for quantity, reading in sorted(last.items())
                    ),
                )
            )
        return StatusPart(devices=tuple(devices))


@dataclass(frozen=True, slots=True)
class DeviceState:
    online: bool
    #: In words ("": connected or disconnected, by ``online``).
    words: str = ""
    #: What it reports is its presence (a beacon): away is not a fault.
    presence: bool = False


def _ble_online(device: BleDevice) -> bool:
    """A GATT device while connected; an advertising one while it is heard."""
    if device.gatt is not None:
        return device.gatt.connected
    return device.presence.home is not False


def _ble_state(device: BleDevice) -> DeviceState:
    """A GATT device is connected or not; an advertising one is present, away, or not
    heard yet (since the gateway started)."""
    if device.gatt is not None:
        return DeviceState(device.gatt.connected)
    home = device.presence.home
    words = "not heard yet" if home is None else "present" if home else "away"
    return DeviceState(home is not False, words, device.settings.beacon_like)


class BleSource:
    """The BLE driver (``[bluetooth]`` and ``[[ble]]``): adverts, readings, errors by
    reason summed over devices, devices heard, and the adapter's watchdog."""

    def __init__(self, ble: BleSensors) -> None:
        self.ble = ble

    def samples(self) -> Iterator[Sample]:
        ble = self.ble
        devices = ble.devices.values()
        present = sum(1 for d in devices if _ble_online(d))
        for state, count in (("present", present), ("away", len(devices) - present)):
            yield gauge(
                "ledge_sensor_devices",
                "Configured sensor devices, by state.",
                count,
                driver="ble",
                state=state,
            )
        yield counter(
            "ledge_sensor_readings_total",
            "Readings made.",
            sum(d.stats.readings for d in devices),
            driver="ble",
        )
        counts = ble.counts
        yield counter("ledge_ble_adverts_total", "BLE adverts received.", counts["adverts"])
        yield counter(
            "ledge_ble_device_adverts_total",
            "Adverts of configured devices (summed over devices).",
            sum(d.stats.adverts for d in devices),
        )
        yield counter(
            "ledge_ble_callback_errors_total",
            "Adverts the driver failed on (a bug, logged): not queued or not read.",
            counts["callback errors"],
        )
        yield counter(
            "ledge_ble_replay_state_write_errors_total",
            "Failed writes of the encryption counters file (data_dir/ble-counters.json).",
            counts.get("counter save errors", 0),
        )
        gatt = [d.gatt for d in devices if d.gatt is not None]
        yield gauge(
            "ledge_ble_gatt_connected",
            "GATT devices connected now.",
            sum(1 for g in gatt if g.connected),
        )
        yield counter(
            "ledge_ble_gatt_sessions_total",
            "GATT connections made (summed over devices).",
            sum(g.sessions for g in gatt),
        )
        yield counter(
            "ledge_ble_adverts_repeated_total",
            "Adverts of configured devices that repeated one already read.",
            sum(d.stats.repeats for d in devices),
        )
        yield counter(
            "ledge_ble_adverts_dropped_total",
            "Adverts dropped, by reason (queue_full: bluetooth.queue_size).",
            counts["dropped"],
            reason="queue_full",
        )
        errors: dict[str, int] = {}
        for d in devices:
            for reason, count in d.stats.errors.items():
                errors[reason] = errors.get(reason, 0) + count
        for reason, count in sorted(errors.items()):
            yield counter(
                "ledge_ble_errors_total",
                "Adverts and GATT values not read, and GATT failures, by reason.",
                count,
                reason=reason,
            )
        yield gauge(
            "ledge_ble_unknown_devices",
            "Devices heard that are not configured (at most bluetooth.max_devices).",
            len(ble.unknown),
        )
        yield counter(
            "ledge_ble_unknown_devices_evicted_total",
            "Unknown devices forgotten to make room (least recently heard first).",
            counts["unknown evicted"],
        )
        yield counter(
            "ledge_ble_devices_refused_total",
            "Devices not adopted: bluetooth.max_devices were adopted already.",
            counts["devices refused"],
        )
        w = ble.watchdog
        adapter = ble.settings.adapter
        for state in type(w.state):
            yield gauge(
                "ledge_ble_adapter_state",
                "1 for the adapter's state now (the watchdog's view).",
                1 if w.state is state else 0,
                adapter=adapter,
                state=state.value,
            )
        for action, value in (
            ("restart", w.counts.restarts),
            ("power_cycle", w.counts.power_cycles),
        ):
            yield counter(
                "ledge_ble_adapter_resets_total",
                "Adapter resets by the watchdog, by action.",
                value,
                adapter=adapter,
                action=action,
            )
        yield counter(
            "ledge_ble_adapter_failures_total",
            "Times the adapter was reported failed (resets did not bring adverts back).",
            w.counts.failures,
            adapter=adapter,
        )
        yield counter(
            "ledge_ble_adapter_retries_total",
            "Times the watchdog tried a failed or absent adapter again (with backoff).",
            w.counts.retries,
            adapter=adapter,
        )
        yield counter(
            "ledge_ble_adapter_recoveries_total",
            "Times adverts came back after the watchdog stepped in.",
            w.counts.recoveries,
            adapter=adapter,
        )
        for what, value in (("bluez", w.counts.bluez_lost), ("adapter", w.counts.adapter_lost)):
            yield counter(
                "ledge_ble_adapter_lost_total",
                "Times BlueZ or the adapter went away, by what.",
                value,
                adapter=adapter,
                what=what,
            )

    def status(self) -> StatusPart:
        state = self.ble.adapter_state()
        if state["state"] in ("failed", "absent"):
            why = f": {state['reason']}" if state["reason"] else ""
            return StatusPart(warnings=(f"BLE adapter {state['adapter']} {state['state']}{why}",))
        return StatusPart()


class MqttSnSource:
    """The firmware bridge (``[mqttsn]``): its clients, packets and drops by reason."""

    def __init__(self, gateway: SnGateway) -> None:
        self.gateway = gateway

    def samples(self) -> Iterator[Sample]:
        from gateway.mqttsn.state import State as SnState

        gw, st = self.gateway, self.gateway.stats
        states = {"connected": 0, "asleep": 0, "disconnected": 0}
        for client in gw.by_id.values():
            if client.state in (SnState.ACTIVE, SnState.AWAKE):
                states["connected"] += 1
            elif client.state is SnState.ASLEEP:
                states["asleep"] += 1
            elif client.state is SnState.DISCONNECTED:
                states["disconnected"] += 1
        for state, count in states.items():
            yield gauge("ledge_mqttsn_clients", "MQTT-SN clients, by state.", count, state=state)
        yield gauge(
            "ledge_mqttsn_clients_limit",
            "MQTT-SN clients the gateway keeps (mqttsn.max_clients).",
            gw.settings.max_clients,
        )
        yield counter("ledge_mqttsn_connects_total", "MQTT-SN CONNECTs accepted.", st.connects)
        yield counter(
            "ledge_mqttsn_clients_refused_total",
            "MQTT-SN clients refused (pool, client id, authorisation, will).",
            st.clients_refused,
        )
        yield counter(
            "ledge_mqttsn_clients_lost_total",
            "MQTT-SN clients lost: keep-alive or retries ran out.",
            st.clients_lost,
        )
        yield counter(
            "ledge_mqttsn_clients_evicted_total",
            "Remembered MQTT-SN clients forgotten to make room in the pool.",
            st.clients_evicted,
        )
        yield counter(
            "ledge_mqttsn_clients_evicted_silent_total",
            "Connected MQTT-SN clients without a keep-alive evicted for a newcomer (pool full).",
            st.clients_evicted_silent,
        )
        yield counter(
            "ledge_mqttsn_clients_refused_per_address_total",
            "MQTT-SN CONNECTs refused: their source IP has mqttsn.max_clients_per_address.",
            st.clients_refused_per_address,
        )
        yield counter(
            "ledge_mqttsn_clients_refused_rate_total",
            "MQTT-SN CONNECTs refused: over mqttsn.max_connect_rate(_per_address).",
            st.clients_refused_rate,
        )
        yield gauge(
            "ledge_mqttsn_clients_unproven",
            "MQTT-SN clients not heard from since their CONNACK.",
            len(gw.unproven),
        )
        yield counter(
            "ledge_mqttsn_clients_evicted_unproven_total",
            "MQTT-SN clients silent since their CONNACK evicted for a newcomer.",
            st.clients_evicted_unproven,
        )
        yield counter(
            "ledge_mqttsn_wakes_refused_total",
            "PINGREQs and CONNECTs naming a sleeping MQTT-SN client from elsewhere than it"
            " connected from, refused.",
            st.wakes_refused,
        )
        yield counter(
            "ledge_mqttsn_packets_received_total",
            "MQTT-SN messages received.",
            st.messages_received,
        )
        yield counter("ledge_mqttsn_packets_sent_total", "MQTT-SN messages sent.", st.messages_sent)
        yield counter(
            "ledge_mqttsn_packets_malformed_total",
            "MQTT-SN datagrams or frames that could not be read.",
            st.malformed,
        )
        yield counter(
            "ledge_mqttsn_packets_without_connection_total",
            "MQTT-SN messages that need a connection from a sender without one (answered"
            " DISCONNECT: after a gateway restart, or a wake from elsewhere).",
            st.not_connected,
        )
        yield counter(
            "ledge_mqttsn_retransmissions_total",
            "Messages sent to devices again (Tretry).",
            st.retransmissions,
        )
        yield counter(
            "ledge_mqttsn_messages_qos_minus_one_total",
            "QoS -1 (connectionless) PUBLISH accepted.",
            st.qos_minus_one,
        )
        yield counter(
            "ledge_mqttsn_messages_refused_total",
            "PUBLISH from devices refused (ACL, $SYS, topic, a full store).",
            st.publish_refused,
        )
        for reason, value in (
            ("queue_full", st.dropped_queue_full),
            ("topic_table_full", st.dropped_topic_table),
            ("offline_qos0", st.dropped_offline_qos0),
            ("too_large", st.dropped_too_large),
        ):
            yield counter(
                "ledge_mqttsn_messages_dropped_total",
                "Messages for MQTT-SN clients dropped by policy, by reason.",
                value,
                reason=reason,
            )


class SystemUpdateSource:
    """The outcome of the last system update (the SD-card image's record, as the gateway
    read it last: at start or at a SIGHUP)."""

    def __init__(self, record: Callable[[], UpdateRecord | None]) -> None:
        self.record = record

    def samples(self) -> Iterator[Sample]:
        r = self.record()
        if r is None:
            return
        yield gauge(
            "ledge_system_update_info",
            "The last system update (always 1): kept (committed) or given up "
            "(rolled-back), the slot it went to and the one it came from.",
            1,
            outcome=r.outcome,
            slot=r.slot,
            previous=r.previous,
        )
        when = r.timestamp
        if when is not None:
            yield gauge(
                "ledge_system_update_timestamp_seconds",
                "When the last system update was kept or given up (Unix time).",
                when,
            )

    def status(self) -> StatusPart:
        r = self.record()
        if r is not None and r.outcome == "rolled-back":
            return StatusPart(warnings=(r.summary(),))
        return StatusPart()


class TapSource:
    """The taps' plane: its bounded queue and what the handlers did."""

    def __init__(self, plane: TapPlane) -> None:
        self.plane = plane

    def samples(self) -> Iterator[Sample]:
        st = self.plane.stats
        yield counter("ledge_taps_queued_total", "Messages queued for the taps.", st.queued)
        yield counter("ledge_taps_handled_total", "Tap handler calls that returned.", st.handled)
        yield counter("ledge_taps_failed_total", "Tap handler calls that raised.", st.failed)
        yield counter(
            "ledge_taps_dropped_total",
            "Messages dropped for the taps: their queue was full.",
            st.dropped,
        )
        yield gauge("ledge_taps_waiting", "Messages waiting for the taps.", len(self.plane.queue))
        yield gauge(
            "ledge_taps_queue_limit",
            "The taps' queue bound, taps.queue_size.",
            self.plane.queue_size,
        )


class HTTPSource:
    """The HTTP listener itself."""

    def __init__(self, http: HTTPServer) -> None:
        self.http = http

    def samples(self) -> Iterator[Sample]:
        http = self.http
        st = http.stats
        yield gauge("ledge_http_connections", "HTTP connections open now.", len(http.admission))
        yield gauge(
            "ledge_http_connections_unfinished",
            "HTTP connections without a complete request now.",
            http.admission.unfinished,
        )
        yield counter("ledge_http_connections_total", "HTTP connections accepted.", st.accepted)
        yield counter(
            "ledge_http_connections_refused_total",
            "HTTP connections refused (503): every connection was being answered, or "
            "too many were in their TLS handshake.",
            st.refused,
        )
        for reason, count in st.evicted.items():
            yield counter(
                "ledge_http_connections_evicted_total",
                "HTTP connections waiting for a request closed to admit a newer one, by reason.",
                count,
                reason=reason,
            )
        yield counter(
            "ledge_http_request_timeouts_total",
            "HTTP requests whose head did not arrive in time.",
            st.timeouts,
        )
        yield counter(
            "ledge_http_auth_failures_total",
            "HTTP requests with wrong credentials.",
            st.auth_failures,
        )
        for code, count in sorted(st.responses.items()):
            yield counter(
                "ledge_http_responses_total",
                "HTTP responses, by status code.",
                count,
                code=str(code),
            )


# ----------------------------------------------------------------------------- wiring


class HomeAssistantGateway:
    """The gateway as a Home Assistant device: retained discovery messages once, then
    its health as one retained JSON state message every ``interval`` seconds."""

    def __init__(
        self,
        collector: Collector,
        settings: SensorSettings,
        bridges: tuple[str, ...],
        disk: bool,
        interval: float,
    ) -> None:
        from gateway.broker.local import LocalClient

        self.collector = collector
        self.settings = settings
        self.bridges = bridges
        self.disk = disk
        self.interval = interval
        self.client = LocalClient(collector.broker, f"ledge-metrics-{settings.gateway}")
        base = f"{settings.prefix}/{settings.gateway}"
        self.status_topic = f"{base}/status"
        self.state_topic = f"{base}/metrics"
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        from drivers.homeassistant import gateway_sensor_configs

        s = self.settings
        now = self.collector.clock()
        for topic, payload in gateway_sensor_configs(
            s.discovery_prefix, s.gateway, self.status_topic, self.state_topic,
            self.bridges, self.disk,
        ):  # fmt: skip
            self.client.publish(topic, payload, now, qos=1, retain=True)
        self._publish(loop)

    def _publish(self, loop: asyncio.AbstractEventLoop) -> None:
        from gateway.metrics.view import gateway_state

        window = max(1, round(self.interval / TICK))
        state = gateway_state(self.collector.status(), window)
        self.client.publish(
            self.state_topic,
            json.dumps(state, separators=(",", ":")).encode(),
            self.collector.clock(),
            qos=0,
            retain=True,
        )
        self._timer = loop.call_later(self.interval, self._publish, loop)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Metrics:
    """What ``[http]`` and Home Assistant discovery run: the collector, the HTTP
    listener, the Home Assistant device."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.http: HTTPServer | None = None
        self.homeassistant: HomeAssistantGateway | None = None
        self._http_source: HTTPSource | None = None

    async def close(self) -> None:
        self.collector.stop()
        if self.homeassistant is not None:
            self.homeassistant.stop()
        if self.http is not None:
            await self.http.close()

    async def serve_http(self, server: Server, settings: HTTPSettings, where: str) -> None:
        """Serve HTTP with ``settings``, in place of the listener running now (a reload).

        The new listener opens first (on the same host and port it takes over the
        running one's socket); only then does the old one close, with its
        connections. When the new one cannot open (the port is taken, a password,
        token or TLS file does not load) the old one keeps serving and the error
        (``OSError``, ``ConfigError``) is raised. The counters carry on."""
        from gateway.net.http import HTTPServer

        old = self.http
        credentials = _credentials(where, settings)
        new = HTTPServer(server, settings, self.collector.respond, credentials, old)
        await new.listen()
        self.http = new
        if old is not None:
            await old.close()
        if self._http_source is None:
            self._http_source = HTTPSource(new)
            self.collector.register(self._http_source)
        self._http_source.http = new

    def refresh_http(self, where: str) -> None:
        """The running listener's password, token and TLS files read again (a reload
        that left ``[http]`` as it was): a renewed certificate or a changed password
        applies to the next connection or request. An error leaves them as they were."""
        http = self.http
        assert http is not None
        credentials = _credentials(where, http.settings)
        if http.settings.https:
            http.update_tls(http.settings)
        http.credentials = credentials

    async def stop_http(self) -> None:
        """Close the HTTP listener and its connections (a reload turned it off)."""
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self._http_source is not None:
            self.collector.sources.remove(self._http_source)
            self._http_source = None


async def start_metrics(
    config: RuntimeConfig,
    broker: Broker,
    server: Server,
    *,
    store: Store | None = None,
    bridges: list[Bridge] | None = None,
    sensors: SensorHub | None = None,
    taps: TapPlane | None = None,
    mqttsn: SnGateway | None = None,
    system_update: Callable[[], UpdateRecord | None] | None = None,
) -> Metrics:
    """Build the collector over what is running, open the HTTP listener when enabled,
    and announce the gateway to Home Assistant when discovery is enabled."""
    loop = server.loop
    clock = loop.time
    listeners = tuple(
        ListenerStatus(label, endpoint.kind, _bound(listener))
        for (label, endpoint), listener in zip(
            server.endpoints.items(), server.listeners, strict=False
        )
    )
    collector = Collector(broker, config.sensors.gateway, clock, listeners)
    collector.register(BrokerSource(broker, clock, server))
    collector.register(ProcessSource(time.time() - (clock() - broker.started)))
    if store is not None:
        collector.register(StoreSource(store, broker))
    if bridges is not None:
        # The gateway's own list: bridges a reload adds or removes are seen.
        collector.register(BridgeSource(bridges))
    if sensors is not None:
        collector.register(SensorSource(sensors))
        if sensors.ble is not None:
            collector.register(BleSource(sensors.ble))
    if mqttsn is not None:
        collector.register(MqttSnSource(mqttsn))
    if taps is not None:
        collector.register(TapSource(taps))
    if system_update is not None:
        collector.register(SystemUpdateSource(system_update))
    metrics = Metrics(collector)
    collector.start(loop)
    http = config.http
    if http is not None and http.enabled:
        where = config.config_path or "<command line>"
        try:
            await metrics.serve_http(server, http, where)
        except OSError as exc:
            collector.stop()
            raise ConfigError(
                where, [f"http: cannot listen on {http.host}:{http.port}: {exc.strerror or exc}"]
            ) from None
        except ConfigError:
            collector.stop()
            raise
    if config.sensors.homeassistant:
        metrics.homeassistant = HomeAssistantGateway(
            collector,
            config.sensors,
            tuple(b.name for b in bridges or ()),
            store is not None,
            config.health_interval or 60.0,
        )
        metrics.homeassistant.start(loop)
    return metrics


def _bound(listener: asyncio.Server) -> str:
    sockets = listener.sockets
    if not sockets:
        return ""
    host, port = sockets[0].getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _credentials(where: str, http: HTTPSettings) -> Credentials:
    """Who may read, from the files ``http`` names (``where``: the config file, for
    errors)."""
    from gateway.broker.auth import PasswordAuthenticator, PasswordFileError, parse_password_file
    from gateway.net.http import Credentials, read_token

    users = None
    if http.password_file is not None:
        try:
            users = PasswordAuthenticator(
                False, parse_password_file(Path(http.password_file).read_text(encoding="utf-8"))
            )
        except (OSError, UnicodeDecodeError, PasswordFileError) as exc:
            raise ConfigError(where, [f"http.password_file: {exc}"]) from None
    token = None
    if http.token_file is not None:
        try:
            token = read_token(Path(http.token_file))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(where, [f"http.token_file: {exc}"]) from None
    return Credentials(users, token)
