"""BLE sensors in: adverts -> decoders -> publishing policy -> readings; GATT devices;
the scanner watchdog. Loaded only when BLE is configured.

Composes the pure pieces in ``drivers.parsers.ble`` and ``drivers.ble`` (decoders,
per-device state, policy, watchdog) with the bleak transports, and publishes through
the sensor hub's in-process client (topics, Home Assistant, status) like the serial
devices do.
"""

from __future__ import annotations

import asyncio
import collections
import fnmatch
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Protocol

from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData

from drivers.ble import counters
from drivers.ble.gatt import Characteristic, GattDevice
from drivers.ble.policy import Presence, Publisher
from drivers.ble.scanner import SCAN_ERRORS, Scanner
from drivers.ble.tracker import DeviceDecoder, Outcome, format_named
from drivers.ble.watchdog import Action, State, Watchdog
from drivers.mapping import DeviceMap
from drivers.model import Reading, now_utc
from drivers.parsers import Sample
from drivers.parsers.ble import FORMATS, passive_patterns, recognise
from drivers.parsers.ble.base import AdvertError, Context
from drivers.parsers.ble.bthome import UUID as BTHOME_UUID
from drivers.parsers.ble.ccm import Cipher, parse_key
from drivers.parsers.ble.gatt import parse_value
from gateway.broker.local import LocalClient
from gateway.broker.ratelog import RateLimitedLog
from gateway.sensors.ble_settings import (
    BEACON_FORMATS,
    GATT_PRESETS,
    RESET_COUNTER,
    BleDeviceSettings,
)
from gateway.sensors.settings import BluetoothSettings, SensorSettings

log = logging.getLogger("ledge.ble")

#: Adverts handled per event-loop iteration before yielding to other work.
DRAIN_BATCH: Final = 256
#: Seconds between policy, presence and watchdog checks.
TICK: Final = 1.0


class Hub(Protocol):
    """What BLE devices publish through: ``gateway.sensors.SensorHub``, which imports
    this module (only when BLE is configured), so this one names it by shape."""

    settings: SensorSettings
    client: LocalClient
    clock: Callable[[], float]

    def _base(self, driver: str, device: str) -> str: ...

    def publish_readings(self, readings: list[Reading]) -> None: ...

    def publish_status(self, driver: str, device: str, online: bool) -> None: ...

    def silent_since(self, heard: float | None) -> str: ...


@dataclass(slots=True)
class DeviceStats:
    adverts: int = 0
    readings: int = 0
    repeats: int = 0
    suppressed: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class Device:
    """One configured (or found) BLE device; what its settings leave unsaid comes from
    ``[bluetooth]``."""

    def __init__(
        self, settings: BleDeviceSettings, fmt_name: str, section: BluetoothSettings
    ) -> None:
        self.settings = settings
        self.name = settings.name
        self.stats = DeviceStats()
        self.publisher = Publisher(
            section.min_interval if settings.min_interval is None else settings.min_interval,
            section.heartbeat if settings.heartbeat is None else settings.heartbeat,
        )
        self.away_after = section.away_after if settings.away_after is None else settings.away_after
        self.presence = Presence(self.away_after)
        #: Publish presence ("home"/"away") as a reading: beacons do unless told not to.
        self.reports_presence = (
            settings.format in BEACON_FORMATS or settings.beacon is not None
            if settings.presence is None
            else settings.presence
        )
        self.mapping = DeviceMap(settings.name, "ble", settings.fields, settings.only_mapped)
        self.decoder: DeviceDecoder | None = None
        #: What ``ble-counters.json`` keeps of the bindkey ("": none).
        self.key_fingerprint = ""
        if fmt_name not in ("gatt", *GATT_PRESETS):
            cipher = None
            if settings.bindkey:
                key = parse_key(settings.bindkey)
                cipher = Cipher(key)
                self.key_fingerprint = counters.fingerprint(key)
            address = settings.address or "00:00:00:00:00:00"
            self.decoder = DeviceDecoder(Context(address, cipher=cipher), format_named(fmt_name))
        self.gatt: GattDevice | None = None
        self.rssi: int | None = None
        #: The newest reading of each quantity (for the status page).
        self.last: dict[str, Reading] = {}
        #: When (the hub's clock) a GATT value last came; None: none yet.
        self.gatt_heard: float | None = None

    @property
    def heard(self) -> float | None:
        """When the device was last heard: an advert it sent, or a GATT value."""
        times = [t for t in (self.presence.last_heard, self.gatt_heard) if t is not None]
        return max(times, default=None)

    def count(self, reason: str) -> None:
        self.stats.errors[reason] = self.stats.errors.get(reason, 0) + 1


class BleSensors:
    """Every BLE device of the gateway, one scanner, one watchdog."""

    def __init__(
        self, hub: Hub, settings: BluetoothSettings, devices: tuple[BleDeviceSettings, ...]
    ) -> None:
        self.hub = hub
        self.settings = settings
        self.clock = hub.clock
        self.devices: dict[str, Device] = {}
        self.by_address: dict[str, Device] = {}
        self.by_beacon: dict[str, Device] = {}
        #: Addresses that proved to belong to a configured beacon (phones rotate them).
        self.beacon_aliases: collections.OrderedDict[str, Device] = collections.OrderedDict()
        #: Devices heard that are not configured: address -> (name, rssi, format), LRU.
        self.unknown: collections.OrderedDict[str, tuple[str, int, str]] = collections.OrderedDict()
        self.slots = asyncio.Semaphore(settings.gatt_concurrency)
        for ds in devices:
            self._add(ds)
        self.advert_devices = any(d.decoder is not None for d in self.devices.values())
        self.queue: collections.deque[tuple[BLEDevice, AdvertisementData, float]] = (
            collections.deque(maxlen=settings.queue_size)
        )
        self.counts: dict[str, int] = {
            "adverts": 0,
            "dropped": 0,
            "unknown evicted": 0,
            "devices refused": 0,
            "callback errors": 0,
        }
        self.watchdog = Watchdog(settings.watchdog, settings.watchdog_backoff_max)
        formats = [FORMATS[n] for n in self._format_names()]
        self.scanner = Scanner(
            settings.adapter,
            settings.scanning,
            passive_patterns(formats),
            self._on_advert,
            self._needs_active(),
        )
        self._draining = False
        self._tasks: list[asyncio.Task[None]] = []
        self._action: asyncio.Task[None] | None = None
        #: A return of BlueZ or the adapter heard during a repair: acted on after it.
        self._again: Action | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._published_state = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Problem lines: one per (device, reason) or adapter problem a minute, the
        #: rest counted (and said in the next line).
        self.problems = RateLimitedLog(log)
        data_dir = hub.settings.data_dir
        #: Where the encryption counters survive a restart (None: they do not).
        self.counters_path = Path(data_dir) / counters.FILE_NAME if data_dir else None
        self._counters_dirty = False
        self._counters_saved_at = float("-inf")
        self._saving: asyncio.Task[None] | None = None
        self._load_counters()

    def _needs_active(self) -> str:
        """Why active scanning is needed ("": it is not): devices whose format sends its
        values in scan responses (a device of format "auto" is not known to)."""
        names = sorted(
            d.name
            for d in self.devices.values()
            if d.settings.format in FORMATS and FORMATS[d.settings.format].active_scan
        )
        if not names:
            return ""
        why = (
            f"{', '.join(names)} send values in scan responses, "
            "which passive scanning never asks for"
        )
        if self.settings.scanning == "passive":
            log.warning("ble %s: scanning = passive, but %s", self.settings.adapter, why)
        return why

    def _format_names(self) -> list[str]:
        names: set[str] = {d.settings.format for d in self.devices.values()}
        if "auto" in names or self.settings.any_bthome:
            names.update(FORMATS)
        return sorted(n for n in names if n in FORMATS)

    def _add(self, ds: BleDeviceSettings) -> Device:
        fmt = ds.format
        if fmt in GATT_PRESETS and not ds.characteristics:
            ds = replace(ds, characteristics=GATT_PRESETS[fmt])
        device = Device(ds, fmt, self.settings)
        self.devices[ds.name] = device
        if ds.address:
            self.by_address[ds.address.upper()] = device
        if ds.beacon:
            self.by_beacon[ds.beacon.lower()] = device
        if ds.gatt:
            device.gatt = GattDevice(
                ds,
                self.settings.adapter,
                self.slots,
                self.settings.gatt_timeout,
                (self.settings.reconnect_min, self.settings.reconnect_max),
                functools.partial(self._gatt_value, device),
                functools.partial(self._gatt_state, device),
                functools.partial(self._gatt_error, device),
            )
        return device

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        now = self.clock()
        hub = self.hub
        for device in self.devices.values():
            device.presence.start()
            hub.publish_status("ble", device.name, False)
            if device.key_fingerprint:
                # Not the retained message: a reset is an act, not a state to replay.
                hub.client.subscribe(
                    f"{hub._base('ble', device.name)}/{RESET_COUNTER}", 1, now, retained=False
                )
            gatt = device.gatt
            if gatt is not None:
                if device.settings.command_uuid:
                    hub.client.subscribe(
                        f"{hub._base('ble', device.name)}/command", 1, now, retained=False
                    )
                if device.settings.characteristics:
                    self._tasks.append(loop.create_task(gatt.run(), name=f"ble gatt {device.name}"))
        self.scanner.bluez.on_bluez = self._bluez_presence
        self.scanner.bluez.on_adapter = self._adapter_presence
        self.watchdog.start(now)
        self._tasks.append(loop.create_task(self._first_start(), name="ble scanner"))
        self._timer = loop.call_later(TICK, self._tick)

    async def _first_start(self) -> None:
        try:
            await self.scanner.bluez.connect()
        except SCAN_ERRORS as exc:
            log.error("ble %s: cannot reach the system bus: %s", self.settings.adapter, exc)
        await self._scanner_action(Action.RESTART)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for device in self.devices.values():
            if device.gatt is not None:
                device.gatt.stop()
        tasks = [*self._tasks, *([self._action] if self._action else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for device in self.devices.values():
            gatt = device.gatt
            if gatt is not None and gatt.client is not None:
                await gatt._disconnect(gatt.client)
        try:
            async with asyncio.timeout(5):
                await self.scanner.stop()
        except TimeoutError:
            log.warning("ble %s: the scanner did not stop within 5 s", self.settings.adapter)
        self.scanner.close()
        if self._saving is not None:
            await asyncio.gather(self._saving, return_exceptions=True)
        if self._counters_dirty:
            self._save_counters_now()
        for name in self.devices:
            self.hub.publish_status("ble", name, False)

    # ------------------------------------------------------------------ adverts in

    def _on_advert(self, device: BLEDevice, adv: AdvertisementData) -> None:
        """bleak's callback: queue and return (bounded; policy: drop oldest, counted)."""
        try:
            queue = self.queue
            if len(queue) == queue.maxlen:
                self.counts["dropped"] += 1
            assert self._loop is not None
            queue.append((device, adv, self._loop.time()))
            if not self._draining:
                self._draining = True
                self._loop.call_soon(self._drain)
        except Exception as exc:  # never out of the scanner callback
            self.counts["callback errors"] += 1
            self._warn(
                "adapter/callback", "ble: advert from %s not queued: %r", device.address, exc
            )

    def _drain(self) -> None:
        queue = self.queue
        stamp = now_utc()
        readings: list[Reading] = []
        for _ in range(min(len(queue), DRAIN_BATCH)):
            device, adv, at = queue.popleft()
            try:
                self._advert(device, adv, at, stamp, readings)
            except Exception as exc:  # a bug must not stop the scanner: count and log it
                self.counts["callback errors"] += 1
                self._warn(
                    "adapter/callback",
                    "ble: advert from %s failed: %r (service data %r, manufacturer data %r)",
                    device.address,
                    exc,
                    adv.service_data,
                    adv.manufacturer_data,
                )
        if readings:
            self.hub.publish_readings(readings)
        if queue:
            asyncio.get_running_loop().call_soon(self._drain)
        else:
            self._draining = False

    def _advert(
        self,
        ble_device: BLEDevice,
        adv: AdvertisementData,
        at: float,
        stamp: Any,
        readings: list[Reading],
    ) -> None:
        self.counts["adverts"] += 1
        address = ble_device.address.upper()
        device = self.by_address.get(address) or self.beacon_aliases.get(address)
        if device is None:
            device = self._stranger(address, adv)
            if device is None:
                if not self.advert_devices:
                    self._heard(at)
                return
        stats = device.stats
        decoder = device.decoder
        outcome: Outcome | None = None
        if decoder is not None:
            outcome = decoder.feed(
                adv.service_data, adv.manufacturer_data, adv.local_name or "", at
            )
            if outcome is not None:
                stats.repeats += outcome.repeats
                if outcome.problems:
                    self._problems(device, outcome, adv)
        self._heard(at)  # the scanner works, whoever sent this
        if decoder is not None and decoder.keyed and (outcome is None or not outcome.authenticated):
            # A device with a bindkey is heard only through adverts it authenticated:
            # anyone can send its address (and replay its adverts), so nothing else
            # changes its state -- not heard, no RSSI, no presence, no status.
            return
        if outcome is not None and outcome.authenticated:
            self._counters_dirty = True
        stats.adverts += 1
        device.rssi = adv.rssi
        if device.gatt is not None:
            device.gatt.ble_device = ble_device
        if device.presence.heard(at):
            self._arrived(device, readings, stamp)
        samples: list[Sample] = []
        events: frozenset[str] = frozenset()
        if outcome is not None:
            samples = outcome.samples
            events = outcome.events
        if device.settings.rssi:
            samples.append(Sample("rssi", adv.rssi, "dBm"))
        if samples:
            self._publish(device, device.publisher.offer(samples, events, at), stamp, readings)

    def _heard(self, at: float) -> None:
        action = self.watchdog.heard(at)
        if action is Action.RECOVERED:
            log.warning(
                "ble %s: adverts again, the adapter works (%s scanning)",
                self.settings.adapter,
                self.scanner.mode,
            )
            self._adapter_changed()

    def _stranger(self, address: str, adv: AdvertisementData) -> Device | None:
        """An advert from an address no device is configured with: a configured beacon
        under a new address, a BTHome device to adopt, or an unknown device (LRU)."""
        s = self.settings
        unknown = self.unknown
        entry = unknown.get(address)
        if entry is not None:
            unknown.move_to_end(address)
        if self.by_beacon:
            ctx = Context(address)
            fmt = recognise(adv.service_data, adv.manufacturer_data, ctx)
            if fmt is not None and fmt.name in BEACON_FORMATS:
                for source in fmt.sources:
                    data = (
                        adv.service_data.get(str(source.key))
                        if source.kind == "service"
                        else adv.manufacturer_data.get(int(source.key))
                    )
                    if data is None:
                        continue
                    try:
                        identity = source.decode(data, ctx).identity
                    except AdvertError:
                        continue
                    device = self.by_beacon.get((identity or "").lower())
                    if device is not None:
                        self.beacon_aliases[address] = device
                        if len(self.beacon_aliases) > s.max_devices:
                            self.beacon_aliases.popitem(last=False)
                        unknown.pop(address, None)
                        return device
        if s.any_bthome and BTHOME_UUID in adv.service_data and self._allowed(address):
            auto = sum(
                1
                for d in self.devices.values()
                if d.settings.address and d.name.startswith("bthome_")
            )
            if auto < s.max_devices:
                unknown.pop(address, None)
                return self._adopt(address)
            self.counts["devices refused"] += 1
        if entry is None:
            unknown[address] = (adv.local_name or "", adv.rssi, "")
            if len(unknown) > s.max_devices:
                unknown.popitem(last=False)
                self.counts["unknown evicted"] += 1
        return None

    def _allowed(self, address: str) -> bool:
        allow = self.settings.allow
        return not allow or any(fnmatch.fnmatchcase(address, p.upper()) for p in allow)

    def _adopt(self, address: str) -> Device:
        name = "bthome_" + address.replace(":", "").lower()
        device = self._add(BleDeviceSettings(name, address=address, format="bthome"))
        device.presence.start()
        log.info("ble: BTHome device %s adopted as %s", address, name)
        return device

    def _warn(self, source: str, message: str, *args: object) -> None:
        """A problem line, at most one per ``source`` a minute (the rest counted)."""
        self.problems(self.clock(), source, message, *args)

    def _problems(self, device: Device, outcome: Outcome, adv: AdvertisementData) -> None:
        for problem in outcome.problems:
            device.count(problem.reason)
            if problem.reason == "decrypt_retry":
                log.info("%s: %s", device.name, problem)
                continue
            self._warn(
                f"{device.name}/{problem.reason}",
                "%s (%s): %s: %s; service data %s, manufacturer data %s",
                device.name,
                device.settings.address or device.settings.beacon,
                problem.reason,
                problem,
                {k: v.hex() for k, v in adv.service_data.items()},
                {f"0x{k:04x}": v.hex() for k, v in adv.manufacturer_data.items()},
            )

    def _publish(
        self, device: Device, samples: list[Sample], stamp: Any, readings: list[Reading]
    ) -> None:
        if not samples:
            return
        got, problems = device.mapping.readings(samples, stamp)
        for problem in problems:
            device.count("invalid_value")
            self._warn(f"{device.name}/invalid_value", "%s: %s", device.name, problem)
        device.stats.readings += len(got)
        last = device.last
        for reading in got:
            last[reading.quantity] = reading
        readings.extend(got)

    def _arrived(self, device: Device, readings: list[Reading], stamp: Any) -> None:
        log.info("ble: %s is home", device.name)
        self.hub.publish_status("ble", device.name, True)
        if device.reports_presence:
            self._publish(device, [Sample("presence", "home", "")], stamp, readings)

    # ------------------------------------------------------------------ encryption counters

    def _keyed(self) -> dict[str, Device]:
        """Devices with a bindkey, by address: those whose counters are kept."""
        return {
            d.settings.address.upper(): d
            for d in self.devices.values()
            if d.key_fingerprint and d.decoder is not None and d.settings.address
        }

    def _load_counters(self) -> None:
        keyed = self._keyed()
        if not keyed:
            return
        path = self.counters_path
        if path is None:
            log.warning(
                "ble: no data_dir: the encryption counters of %d device(s) live in memory "
                "only; after a restart the first authenticated advert of each is believed, "
                "a recorded one too",
                len(keyed),
            )
            return
        try:
            stored = counters.load(path)
        except (OSError, counters.CounterFileError) as exc:
            log.error("ble: %s: %s; the encryption counters start afresh", path, exc)
            self._counters_dirty = True  # replaced with a good file at the first save
            return
        restored = 0
        for address, device in keyed.items():
            entry = stored.get(address)
            if entry is None or device.decoder is None:
                continue
            fingerprint, counter = entry
            if fingerprint != device.key_fingerprint:
                log.warning(
                    "ble: %s (%s): the bindkey changed: its encryption counter starts afresh",
                    device.name,
                    address,
                )
                self._counters_dirty = True
                continue
            device.decoder.counter = counter
            restored += 1
        if len(stored) != restored:
            self._counters_dirty = True  # devices no longer configured are dropped
        log.info("ble: encryption counters of %d device(s) read from %s", restored, path)

    def _counter_snapshot(self) -> counters.Counters:
        return {
            address: (device.key_fingerprint, device.decoder.counter)
            for address, device in self._keyed().items()
            if device.decoder is not None and device.decoder.counter is not None
        }

    def _save_counters_due(self, now: float) -> None:
        """Write the counters (in a thread: the disk may be slow) when they changed and
        ``counter_save_interval`` has passed since the last write; one write at a time."""
        if not self._counters_dirty or self.counters_path is None:
            return
        if self._saving is not None and not self._saving.done():
            return
        if now - self._counters_saved_at < self.settings.counter_save_interval:
            return
        assert self._loop is not None
        self._counters_saved_at = now
        self._counters_dirty = False
        self._saving = self._loop.create_task(
            self._save_counters(self.counters_path, self._counter_snapshot()),
            name="ble counters",
        )

    async def _save_counters(self, path: Path, snapshot: counters.Counters) -> None:
        try:
            await asyncio.to_thread(counters.save, path, snapshot)
        except OSError as exc:
            self._counter_save_failed(path, exc)

    def _save_counters_now(self) -> None:
        """At shutdown: the last write, in the loop (nothing else is left to do)."""
        if self.counters_path is None:
            return
        self._counters_dirty = False
        try:
            counters.save(self.counters_path, self._counter_snapshot())
        except OSError as exc:
            self._counter_save_failed(self.counters_path, exc)

    def _counter_save_failed(self, path: Path, exc: OSError) -> None:
        self._counters_dirty = True  # tried again at the next interval
        self.counts["counter save errors"] = self.counts.get("counter save errors", 0) + 1
        self._warn("adapter/counters", "ble: encryption counters not written to %s: %s", path, exc)

    # ------------------------------------------------------------------ timer

    def _tick(self) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(TICK, self._tick)
        now = self.clock()
        stamp = now_utc()
        readings: list[Reading] = []
        for device in self.devices.values():
            presence = device.presence
            if device.decoder is not None and presence.check(now):
                log.info("ble: %s is away (not heard for %g s)", device.name, device.away_after)
                self.hub.publish_status("ble", device.name, False)
                if device.reports_presence:
                    self._publish(device, [Sample("presence", "away", "")], stamp, readings)
            due = device.publisher.due(now, bool(presence.home))
            if due:
                self._publish(device, due, stamp, readings)
        if readings:
            self.hub.publish_readings(readings)
        self._save_counters_due(now)
        action = self.watchdog.tick(now)
        if action is not None:
            self._act(action)

    def _act(self, action: Action, *, again: bool = False) -> None:
        if action is Action.REPORT_FAILED:
            log.error(
                "ble %s: adapter failed: %s; retrying with backoff up to %g s",
                self.settings.adapter,
                self.watchdog.reason,
                self.settings.watchdog_backoff_max,
            )
            self._adapter_changed()
            return
        if self._action is not None and not self._action.done():
            # One repair at a time. A return of BlueZ or the adapter during one is
            # kept and acted on when it ends: the repair may have looked for the
            # adapter a moment before it came (it would then wait out the backoff).
            if again:
                self._again = action
            return
        assert self._loop is not None
        self._action = self._loop.create_task(self._scanner_action(action))
        self._action.add_done_callback(self._act_again)

    def _act_again(self, task: asyncio.Task[None]) -> None:
        action, self._again = self._again, None
        if action is not None and not task.cancelled():
            self._act(action)

    async def _scanner_action(self, action: Action) -> None:
        adapter = self.settings.adapter
        if action is Action.RESTART:
            if self.watchdog.state is State.RESTARTED:
                log.warning("ble %s: %s: restarting discovery", adapter, self.watchdog.reason)
        elif action is Action.POWER_CYCLE:
            log.warning(
                "ble %s: still no adverts after restarting discovery: power-cycling the adapter",
                adapter,
            )
        self._adapter_changed()
        try:
            if action in (Action.RESTART,):
                await self.scanner.restart()
            else:
                await self.scanner.power_cycle()
        except SCAN_ERRORS as exc:
            self._warn(
                f"adapter/{action.value}", "ble %s: %s failed: %s", adapter, action.value, exc
            )
            self.counts[f"{action.value} errors"] = self.counts.get(f"{action.value} errors", 0) + 1
            if not self.scanner.running:
                await self._not_scanning(exc)
        self._adapter_changed()

    async def _not_scanning(self, exc: BaseException) -> None:
        """The scanner is stopped after a failed start: the adapter is failed now (not
        after the silence watchdog's three steps), with the reason."""
        try:
            # Also (re)connects the watch on BlueZ, whose signals say when it is back.
            await self.scanner.bluez.connect()
        except SCAN_ERRORS as bus_error:
            reason = f"cannot reach the system bus: {bus_error}"
        else:
            reason = f"the scanner did not start: {exc}"
        if self.watchdog.start_failed(self.clock(), reason) is Action.REPORT_FAILED:
            self._act(Action.REPORT_FAILED)

    # ------------------------------------------------------------------ BlueZ watch

    def _bluez_presence(self, present: bool) -> None:
        self._lost_or_back(present, "bluez", "BlueZ (org.bluez)")

    def _adapter_presence(self, present: bool) -> None:
        self._lost_or_back(present, "adapter", f"adapter {self.settings.adapter}")

    def _lost_or_back(self, present: bool, what: str, label: str) -> None:
        now = self.clock()
        if present:
            log.warning("ble: %s is back: restarting the scanner", label)
            self._act(self.watchdog.back(now), again=True)
        else:
            log.error("ble: %s is gone; the adapter is failed until it is back", label)
            self.watchdog.lost(now, what)
            self.scanner.running = False
            self._adapter_changed()

    # ------------------------------------------------------------------ reporting

    def adapter_state(self) -> dict[str, Any]:
        w = self.watchdog
        return {
            "adapter": self.settings.adapter,
            "state": w.state.value,
            "mode": self.scanner.mode,
            "reason": w.reason if w.state is not State.SCANNING else "",
            "restarts": w.counts.restarts,
            "power_cycles": w.counts.power_cycles,
            "failures": w.counts.failures,
            "retries": w.counts.retries,
            "recoveries": w.counts.recoveries,
            "bluez_lost": w.counts.bluez_lost,
            "adapter_lost": w.counts.adapter_lost,
            "adverts": self.counts["adverts"],
            "dropped": self.counts["dropped"],
        }

    def _adapter_changed(self) -> None:
        """Publish the adapter's state (retained) when it changed."""
        body = self.adapter_state()
        key = f"{body['state']}/{body['mode']}"
        if key == self._published_state and body["state"] == State.SCANNING:
            return
        self._published_state = key
        hub = self.hub
        hub.client.publish(
            f"{hub.settings.prefix}/{hub.settings.gateway}/ble/adapter",
            json.dumps(body, separators=(",", ":")).encode(),
            self.clock(),
            qos=1,
            retain=True,
        )

    def health(self) -> dict[str, Any]:
        return {"ble": self.adapter_state()}

    def sys_values(self) -> dict[str, str]:
        out: dict[str, str] = {}
        base = "sensors/ble/adapter/"
        for key, value in self.adapter_state().items():
            out[base + key.replace("_", " ")] = str(value)
        out[base + "queue dropped"] = str(self.counts["dropped"])
        out[base + "unknown devices"] = str(len(self.unknown))
        for key in ("unknown evicted", "devices refused", "callback errors"):
            out[base + key] = str(self.counts[key])
        out[base + "counter save errors"] = str(self.counts.get("counter save errors", 0))
        for name, device in self.devices.items():
            st = device.stats
            prefix = f"sensors/ble/{name}/"
            out[prefix + "adverts"] = str(st.adverts)
            out[prefix + "readings"] = str(st.readings)
            out[prefix + "repeats"] = str(st.repeats)
            out[prefix + "present"] = "1" if device.presence.home else "0"
            out[prefix + "silent since"] = self.hub.silent_since(device.heard)
            if device.rssi is not None:
                out[prefix + "rssi"] = str(device.rssi)
            if device.gatt is not None:
                out[prefix + "connected"] = "1" if device.gatt.connected else "0"
                out[prefix + "sessions"] = str(device.gatt.sessions)
            for reason, count in st.errors.items():
                out[prefix + "errors/" + reason] = str(count)
        return out

    # ------------------------------------------------------------------ GATT

    def _gatt_value(self, device: Device, char: Characteristic, data: bytes) -> None:
        now = self.clock()
        try:
            samples = parse_value(data, char.fields)
        except AdvertError as exc:
            device.count(exc.reason)
            self._warn(
                f"{device.name}/{exc.reason}",
                "%s (%s): characteristic %s: %s: %r", device.name, device.settings.address,
                char.uuid, exc, data.hex(),
            )  # fmt: skip
            return
        device.gatt_heard = now
        readings: list[Reading] = []
        self._publish(device, device.publisher.offer(samples, (), now), now_utc(), readings)
        if readings:
            self.hub.publish_readings(readings)

    def _gatt_state(self, device: Device, connected: bool) -> None:
        log.info("ble: %s %s", device.name, "connected" if connected else "disconnected")
        self.hub.publish_status("ble", device.name, connected)

    def _gatt_error(self, device: Device, reason: str, text: str) -> None:
        device.count(reason)
        self._warn(
            f"{device.name}/{reason}",
            "%s (%s): GATT %s: %s; retrying with backoff",
            device.name,
            device.settings.address,
            reason,
            text,
        )

    def command(self, name: str, topic: str, payload: bytes) -> bool:
        """A message on ``.../ble/<name>/command`` (or ``.../reset-counter``); False
        when no such device."""
        device = self.devices.get(name)
        if device is not None and topic.rsplit("/", 1)[-1] == RESET_COUNTER:
            self._reset_counter(device, topic)
            return True
        if device is None or device.gatt is None or not device.settings.command_uuid:
            return False
        assert self._loop is not None
        self._tasks.append(
            self._loop.create_task(self._write(device, topic, payload), name=f"ble write {name}")
        )
        self._tasks = [t for t in self._tasks if not t.done()]
        return True

    def _reset_counter(self, device: Device, topic: str) -> None:
        """The explicit reset: forget the device's last accepted encryption counter, so
        that its next authenticated advert (whatever its counter) is believed. Who may
        publish here may also publish the device's readings: the same ACL guards both."""
        result: dict[str, object]
        decoder = device.decoder
        if decoder is None or not decoder.keyed:
            result = {"ok": False, "error": f"{device.name} has no bindkey: no counter to reset"}
        else:
            previous = decoder.reset_counter()
            log.warning(
                "ble: %s (%s): encryption counter reset on request (it was %s); the next "
                "authenticated advert sets it",
                device.name,
                device.settings.address,
                previous,
            )
            self._counters_dirty = True
            self._counters_saved_at = float("-inf")  # written at the next tick
            result = {"ok": True, "address": device.settings.address, "previous": previous}
        self.hub.client.publish(
            f"{topic}/result",
            json.dumps(result, separators=(",", ":")).encode(),
            self.clock(),
            qos=1,
        )

    async def _write(self, device: Device, topic: str, payload: bytes) -> None:
        assert device.gatt is not None
        result: dict[str, object]
        try:
            written = await device.gatt.write(payload)
        except OSError as exc:
            device.count("write_failed")
            log.warning("%s: command not written: %s", device.name, exc)
            result = {"ok": False, "error": str(exc)}
        else:
            result = {"ok": True, "bytes": written}
        self.hub.client.publish(
            f"{topic}/result",
            json.dumps(result, separators=(",", ":")).encode(),
            self.clock(),
            qos=1,
        )
