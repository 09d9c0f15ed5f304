"""Composition root: validated config -> core -> listeners, signals, reload, shutdown.

``ledge run`` validates the config (pydantic, in ``gateway.cli.main``) and then replaces
itself with ``python -m gateway.app``, which reads the validated config from the
environment. This module never imports pydantic, so the long-running process
carries none of the validator's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import __version__
from gateway.app.runtime import (
    RUNTIME_ENV,
    ConfigError,
    ListenerSettings,
    RuntimeConfig,
    StartupError,
    build_authenticator,
    build_policies,
    file_warnings,
    listener_label,
)
from gateway.broker.auth import Authenticator, ListenerPolicy
from gateway.broker.core import Broker
from gateway.net.server import ListenerSpec, Server

if TYPE_CHECKING:
    from gateway.app.sdnotify import Notifier
    from gateway.app.system_update import UpdateRecord
    from gateway.bridge.link import Bridge
    from gateway.bridge.sequence import Sequence
    from gateway.bridge.settings import BridgeSettings
    from gateway.metrics.collect import Metrics
    from gateway.net.http_settings import HTTPSettings
    from gateway.net.mqttsn import MqttSnShell
    from gateway.sensors.hub import SensorHub
    from gateway.store.sqlite import Snapshot, Store
    from gateway.taps import TapPlane

log = logging.getLogger("ledge")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: A reload validates the file in a child process; it must answer within this time.
RELOAD_TIMEOUT = 60.0

#: Store back-pressure: with this many operations waiting for the writer, reading from
#: clients pauses until the backlog is down to the low mark.
STORE_BACKLOG_HIGH = 50_000
STORE_BACKLOG_LOW = 10_000

#: The wall clock is compared with the monotonic clock this often; a difference beyond
#: CLOCK_STEP seconds means someone set the clock (a Raspberry Pi has no RTC: it boots
#: with the time of its last shutdown and is set at the first NTP synchronisation).
CLOCK_CHECK_INTERVAL = 5.0
CLOCK_STEP = 2.0


def setup_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(level.upper())


def release_free_memory() -> None:
    """Hand memory freed during start-up (import-time compilation, config parsing)
    back to the OS: glibc keeps it otherwise, and on a small device it is RSS.

    Everything alive now (modules, the preallocated connection pool) lives as long
    as the process: ``gc.freeze`` keeps the collector from walking it again and
    again, which would show up as latency spikes.
    """
    gc.collect()
    gc.freeze()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


class Gateway:
    """The running gateway: one broker, its listeners, and (later) drivers and bridges."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.broker: Broker | None = None
        self.server: Server | None = None
        self.addresses: list[tuple[str, int]] = []
        self._stop = asyncio.Event()
        self._reloading: asyncio.Task[None] | None = None
        #: The last system update's outcome, read at start (None: none recorded).
        self.system_update: UpdateRecord | None = None
        self.store: Store | None = None
        self._write_failing = False
        self.sensors: SensorHub | None = None
        self.taps: TapPlane | None = None
        self.bridges: list[Bridge] = []
        self.mqttsn: MqttSnShell | None = None
        self._snapshot: Snapshot | None = None
        self._sequence: Sequence | None = None
        #: The store's last reservation of sequence numbers and the highest number in
        #: its outboxes at start-up: where numbering starts when a reload adds the
        #: first bridge.
        self._sequence_base = (0, 0)
        #: The highest store batch committed, and reloads waiting for one.
        self._committed_upto = 0
        self._commit_waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: Messages lost with the in-memory outboxes of bridges a reload removed.
        self._removed_drops = 0
        self._health_timer: asyncio.TimerHandle | None = None
        self._drops_reported = 0
        self.metrics: Metrics | None = None
        #: The gateway's wall clock is ``loop.time() + wall_offset``: the system clock at
        #: start-up, then moving with the monotonic clock, so the times it puts in the
        #: store and the outboxes keep their distances when the system clock is set.
        #: When it is, the offset and everything stored move together (_check_clock).
        self.wall_offset = 0.0
        self._clock_timer: asyncio.TimerHandle | None = None
        #: The service manager (systemd), when Ledge runs as a Type=notify service.
        self.notifier: Notifier | None = None
        self._watchdog_timer: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        self.wall_offset = time.time() - loop.time()
        if config.data_dir is not None:
            os.makedirs(config.data_dir, exist_ok=True)
        from gateway.net import descriptors

        handshakes = sum(lc.type != "tcp" for lc in config.listeners)
        settings = descriptors.fit(config.broker, len(config.listeners), handshakes)
        self.broker = Broker(
            settings,
            build_authenticator(config.allow_anonymous, config.password_file),
            version=f"ledge {__version__}",
            now=loop.time(),
        )
        self.server = Server(self.broker, loop)
        self.broker.policies = build_policies(config.listeners)
        self.broker.verifier = self.server.verify
        for warning in file_warnings(config):
            log.warning("%s", warning)
        if config.data_dir is not None:
            self._open_store(loop, Path(config.data_dir))
        else:
            log.info("no data_dir: sessions and retained messages live in memory only")
        for i, listener in enumerate(config.listeners):
            spec = listener_spec(listener, i)
            try:
                self.addresses.extend(await self.server.listen(spec))
            except OSError as exc:
                await self.server.close(0)
                where = f"{listener.host}:{listener.port}"
                raise ConfigError(
                    config.config_path or "<command line>",
                    [f"listeners[{i}]: cannot listen on {where}: {exc.strerror or exc}"],
                ) from None
        await self._start_mqttsn()
        self._start_bridges()
        self._start_sensors_and_taps(loop)
        self._report_system_update(loop)
        if (config.http is not None and config.http.enabled) or config.sensors.homeassistant:
            self.metrics = await self._start_metrics(config)
        self._schedule_health(loop)
        if self.store is not None or self.bridges:
            self._clock_timer = loop.call_later(CLOCK_CHECK_INTERVAL, self._check_clock)
        self._snapshot = None
        release_free_memory()
        log.info(
            "ledge %s started (pid %d, event loop %s)",
            __version__,
            os.getpid(),
            type(loop).__module__.split(".")[0],
        )

    async def _start_metrics(self, config: RuntimeConfig) -> Metrics:
        # Imported here: without [http] or Home Assistant the metrics code never loads.
        from gateway.metrics.collect import start_metrics

        assert self.broker is not None and self.server is not None
        return await start_metrics(
            config,
            self.broker,
            self.server,
            store=self.store,
            bridges=self.bridges,
            sensors=self.sensors,
            taps=self.taps,
            mqttsn=self.mqttsn.gateway if self.mqttsn is not None else None,
            system_update=lambda: self.system_update,
        )

    # ------------------------------------------------------------------ sensors, taps

    def _start_sensors_and_taps(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.broker is not None
        config = self.config
        if config.sensors.serial or config.sensors.homeassistant or config.sensors.uses_ble:
            # Imported here: a gateway without sensors never loads the drivers.
            from gateway.sensors.hub import SensorHub

            self.sensors = SensorHub(self.broker, config.sensors, loop.time)
            self.sensors.start()
        if config.taps.module is not None:
            from gateway import taps

            try:
                taps.load_module(config.taps.module)
            except Exception as exc:
                raise StartupError(f"taps.module {config.taps.module!r}: {exc}") from exc
            if not taps.REGISTRY:
                log.warning("taps.module %s declares no @on_message tap", config.taps.module)
            self.taps = taps.TapPlane(
                self.broker,
                loop.time,
                list(taps.REGISTRY),
                config.taps.queue_size,
            )
            self.taps.start()

    # ------------------------------------------------------------------ firmware bridge

    async def _start_mqttsn(self) -> None:
        config = self.config
        if not (config.mqttsn.udp or config.mqttsn.serial):
            return
        # Imported here: a gateway without [mqttsn] transports never loads MQTT-SN.
        from gateway.app.runtime import build_acl
        from gateway.net.mqttsn import MqttSnShell

        assert self.server is not None
        acl = build_acl(config.acl_file) if config.acl_file is not None else None
        self.mqttsn = MqttSnShell(self.server, config.mqttsn, acl)
        try:
            self.addresses.extend(await self.mqttsn.start())
        except OSError as exc:
            await self.mqttsn.close()
            raise ConfigError(
                config.config_path or "<command line>",
                [f"mqttsn.udp: cannot listen: {exc.strerror or exc}"],
            ) from None

    # ------------------------------------------------------------------ bridges

    def _start_bridges(self) -> None:
        config = self.config
        snapshot = self._snapshot
        if snapshot is not None:
            for name, rows in snapshot.outbox.items():
                if name not in {b.name for b in config.bridges}:
                    log.warning(
                        "the store holds an outbox of %d message(s) for bridge %r, which is "
                        "not configured: kept until it is configured again",
                        len(rows),
                        name,
                    )
        for settings in config.bridges:
            bridge = self._new_bridge(settings)
            if snapshot is not None:
                bridge.outbox.restore(snapshot.outbox.get(settings.name, ()))
            bridge.start()
            self.bridges.append(bridge)

    def _new_bridge(self, settings: BridgeSettings) -> Bridge:
        # Imported here: a gateway without bridges never loads aiomqtt and paho.
        from gateway.bridge.link import Bridge
        from gateway.bridge.sequence import Sequence

        assert self.broker is not None and self.server is not None
        if self._sequence is None:
            if self.store is None:
                # No store: start at the wall clock in microseconds (gateway.bridge.sequence).
                self._sequence = Sequence(time.time_ns() // 1000)
            else:
                # The first bridge, added by a reload: nothing is reserved yet, so the
                # first number taken writes a reservation in its own store batch, which
                # commits before that number can travel (see Sequence.take).
                stored, highest = self._sequence_base
                start = max(stored, highest + 1, 1)
                self._sequence = Sequence(start, start)
        if self.store is None:
            log.warning(
                "bridge %s: no data_dir, so its outbox lives in memory and is lost on restart",
                settings.name,
            )
        config = self.config
        return Bridge(
            settings,
            gateway=config.sensors.gateway,
            prefix=config.sensors.prefix,
            broker=self.broker,
            sequence=self._sequence,
            store=self.store,
            wall=self.wall,
        )

    # ------------------------------------------------------------------ system update

    def _report_system_update(self, loop: asyncio.AbstractEventLoop) -> None:
        """The last system update's outcome (the SD-card image's record), at start and
        when it changed by a SIGHUP: in the log and retained on
        <prefix>/<gateway>/system-update (the metrics read ``self.system_update``)."""
        from gateway.app.system_update import read_record

        record = read_record(self.config.gateway.system_update_file)
        if record is None or record == self.system_update:
            return
        self.system_update = record
        assert self.broker is not None
        if record.outcome == "committed":
            log.info("%s", record.summary())
        else:
            log.warning("%s", record.summary())
        sensors = self.config.sensors
        self.broker.publish_local(
            f"{sensors.prefix}/{sensors.gateway}/system-update",
            record.payload(),
            loop.time(),
            qos=1,
            retain=True,
        )

    # ------------------------------------------------------------------ health

    def _schedule_health(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.config.health_interval > 0:
            self._health_timer = loop.call_later(self.config.health_interval, self._health)

    def _health(self) -> None:
        """Publish <prefix>/<gateway>/health: what was dropped since the last report."""
        broker, server = self.broker, self.server
        assert broker is not None and server is not None
        loop = server.loop
        dropped = broker.stats.drops() + sum(b.drops for b in self.bridges) + self._removed_drops
        if self.taps is not None:
            dropped += self.taps.stats.dropped
        body = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "dropped": max(0, dropped - self._drops_reported),
            "queued": sum(b.outbox.count for b in self.bridges),
            "uptime": round(loop.time() - broker.started, 3),
        }
        if self.sensors is not None:
            body.update(self.sensors.health())
        self._drops_reported = dropped
        sensors = self.config.sensors
        broker.publish_local(
            f"{sensors.prefix}/{sensors.gateway}/health",
            json.dumps(body, separators=(",", ":")).encode(),
            loop.time(),
            qos=1,
        )
        self._schedule_health(loop)

    # ------------------------------------------------------------------ store

    def _open_store(self, loop: asyncio.AbstractEventLoop, directory: Path) -> None:
        # Imported here: a gateway without a data_dir never loads SQLite.
        from gateway.store.restore import restore
        from gateway.store.sqlite import Store, StoreError

        store = Store(directory, self.config.store)
        try:
            snapshot = store.open()
        except StoreError as exc:
            raise StartupError(str(exc)) from None
        assert self.broker is not None and self.server is not None
        restore(self.broker, snapshot, loop.time(), loop.time() + self.wall_offset)
        self._snapshot = snapshot  # the bridges take their outboxes from it
        from gateway.bridge.sequence import META_KEY, Sequence

        self._sequence_base = (int(snapshot.meta.get(META_KEY, "0")), snapshot.outbox_max_seq)
        if self.config.bridges:
            # Reserve the first block of sequence numbers before anything can use one.
            self._sequence, reserve = Sequence.resume(*self._sequence_base)
            store.set_meta_now(META_KEY, str(reserve))
        store.start(
            loop.call_soon_threadsafe, self._committed, self._store_failed, self._store_fullness
        )
        self.store = store
        self.server.after_core = self._seal
        log.info(
            "store %s (durability: %s%s)",
            store.path,
            self.config.store.durability,
            "" if self.config.store.durability == "power" else ", no fsync",
        )

    def _seal(self) -> None:
        """After every event: hand what the core journaled to the store writer."""
        assert self.broker is not None and self.store is not None and self.server is not None
        batch = self.broker.seal_batch()
        if batch is None:
            return
        self.store.submit(batch[0], batch[1], self.wall_offset)
        if self.store.backlog > STORE_BACKLOG_HIGH and not self.server.reading_paused:
            log.warning(
                "store is %d changes behind: pausing reads from clients", self.store.backlog
            )
            self.server.pause_reading(True)

    def _committed(self, upto: int) -> None:
        broker, server, store = self.broker, self.server, self.store
        assert broker is not None and server is not None and store is not None
        if self._write_failing:
            self._write_failing = False
            log.warning("store writes again")
        broker.store_full = store.full
        broker.batch_committed(upto)
        self._committed_upto = max(self._committed_upto, upto)
        if self._sequence is not None:
            self._sequence.commit(upto)
        for bridge in self.bridges:
            bridge.committed(upto)
        if self._commit_waiters:
            waiting = []
            for batch, future in self._commit_waiters:
                if batch > upto:
                    waiting.append((batch, future))
                elif not future.done():
                    future.set_result(None)
            self._commit_waiters = waiting
        if self.mqttsn is not None:
            self.mqttsn.committed(upto)
        if server.reading_paused and store.backlog < STORE_BACKLOG_LOW:
            log.info("store caught up: reading from clients again")
            server.pause_reading(False)

    def _store_fullness(self, full: bool) -> None:
        assert self.broker is not None
        if full:
            log.error(
                "store nearly full (store.max_bytes or the disk): refusing QoS 1/2 messages "
                "for persistent sessions until there is room"
            )
        else:
            log.warning("store has room again: QoS 1/2 messages for persistent sessions accepted")
        self.broker.store_full = full or self._write_failing

    def _store_failed(self, error: str) -> None:
        assert self.broker is not None
        self._write_failing = True
        if not self.broker.store_full:
            log.error(
                "store cannot write (%s): refusing QoS 1/2 messages for persistent sessions "
                "until it can; retrying",
                error,
            )
        self.broker.store_full = True

    # ------------------------------------------------------------------ clock

    def wall(self) -> float:
        """The gateway's wall clock (see ``wall_offset``)."""
        assert self.server is not None
        return self.server.loop.time() + self.wall_offset

    def _check_clock(self) -> None:
        """Follow a step of the system clock: stored and queued wall-clock times move
        with it, so a session expiry or a message expiry keeps its remaining time (it
        would otherwise run out at once when the clock jumps forward at the first
        synchronisation, or last longer after a jump back)."""
        assert self.server is not None and self.broker is not None
        loop = self.server.loop
        step = time.time() - (loop.time() + self.wall_offset)
        if abs(step) >= CLOCK_STEP:
            log.warning(
                "the system clock was set %s by %.1f s: stored times follow it",
                "forward" if step > 0 else "back",
                abs(step),
            )
            batch_id = 0
            if self.store is not None:
                # Here: the journal's module is loaded only with a store.
                from gateway.broker.journal import StepClock

                self._seal()  # what is journaled so far is in the old time frame
                journal = self.broker.journal
                assert journal is not None
                journal.ops.append(StepClock(step))
                batch = self.broker.seal_batch()
                assert batch is not None
                batch_id = batch[0]
                self.wall_offset += step
                self.store.submit(batch[0], batch[1], self.wall_offset)
            else:
                self.wall_offset += step
            for bridge in self.bridges:
                bridge.outbox.shift_wall(step, batch_id)
        self._clock_timer = loop.call_later(CLOCK_CHECK_INTERVAL, self._check_clock)

    # ------------------------------------------------------------------ service manager

    def notify_ready(self, notifier: Notifier) -> None:
        """Start-up finished: tell systemd, and keep its watchdog fed from the event loop
        (a hung loop stops the keep-alives and systemd restarts the gateway)."""
        self.notifier = notifier
        where = ", ".join(f"{host}:{port}" for host, port in self.addresses)
        notifier.ready(f"serving MQTT on {where}" if where else "running")
        if notifier.watchdog_interval > 0:
            self._watchdog()

    def _watchdog(self) -> None:
        assert self.notifier is not None and self.server is not None
        self.notifier.watchdog()
        self._watchdog_timer = self.server.loop.call_later(
            self.notifier.watchdog_interval, self._watchdog
        )

    def stop(self) -> None:
        if self.notifier is not None and not self._stop.is_set():
            self.notifier.stopping()
        self._stop.set()

    async def wait(self) -> None:
        await self._stop.wait()

    async def close(self) -> None:
        reloading = self._reloading
        if reloading is not None and not reloading.done():
            # A reload halfway through a bridge or the HTTP listener: everything it
            # started is in the lists closed below.
            reloading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reloading
        for timer in (self._health_timer, self._clock_timer, self._watchdog_timer):
            if timer is not None:
                timer.cancel()
        if self.metrics is not None:
            await self.metrics.close()
        if self.sensors is not None:
            await self.sensors.stop()
        if self.taps is not None:
            await self.taps.stop()
        for bridge in self.bridges:
            await bridge.stop()
        if self.mqttsn is not None:
            await self.mqttsn.close()
        server, broker, store = self.server, self.broker, self.store
        if server is not None:
            log.info("shutting down")
            await server.close()
        if store is not None and broker is not None and server is not None:
            batch = broker.seal_batch()
            if batch is not None:
                store.submit(batch[0], batch[1], self.wall_offset)
            # Commits what is queued, checkpoints the WAL and closes the file.
            await asyncio.get_running_loop().run_in_executor(None, store.close)

    # ------------------------------------------------------------------ reload

    def reload(self) -> None:
        """SIGHUP: re-read the config file and apply what can change while running (and
        the system update record: ledge-update-commit reloads the gateway after it
        writes one)."""
        if self.broker is None:
            log.info("SIGHUP ignored: still starting")
            return
        self._report_system_update(asyncio.get_running_loop())
        if self.config.config_path is None:
            log.info("SIGHUP ignored: running on the embedded default config")
            return
        if self._reloading is not None and not self._reloading.done():
            log.info("SIGHUP ignored: a reload is already running")
            return
        if self.broker.before_input is not None:  # not yet run by the next input
            self._reload_files()
        self._reloading = asyncio.get_running_loop().create_task(self._reload_notifying())

    async def _reload_notifying(self) -> None:
        notifier = self.notifier
        if notifier is not None:
            notifier.reloading()
        try:
            await self._reload()
        except Exception:
            # Not expected (every known failure is reported and kept from applying);
            # what was applied before it stays, and the next SIGHUP can run.
            log.exception("reload failed halfway")
        finally:
            if notifier is not None and not self._stop.is_set():
                notifier.ready("configuration reloaded")

    def sighup_arrived(self) -> None:
        """Called by the signal handler itself, between two bytecodes: it only asks the
        broker to read the password and ACL files again before its next input."""
        if self.broker is not None and self.config.config_path is not None:
            self.broker.before_input = self._reload_files

    def _reload_files(self) -> None:
        """The password and ACL files the running config names, read and applied before
        the broker reads any more input after SIGHUP (or from the loop's signal callback,
        whichever comes first): a revoked permission holds for every packet processed
        after the signal arrived, not only after the config file's validation in a child
        process (some 0.3 s). The config file itself (new file names among the rest)
        follows when that validation is done."""
        broker, server = self.broker, self.server
        assert broker is not None and server is not None
        broker.before_input = None
        config = self.config
        started = time.perf_counter()
        try:
            auth = build_authenticator(config.allow_anonymous, config.password_file)
            policies = build_policies(config.listeners)
        except (ValueError, OSError, ConfigError) as exc:
            log.error("reload of the password and ACL files failed, keeping them: %s", exc)
            return
        broker.authenticator = auth
        broker.set_policies(policies, None, server.loop.time())
        log.info(
            "password and ACL files read again and applied in %.1f ms",
            (time.perf_counter() - started) * 1000,
        )

    async def _reload(self) -> None:
        path = self.config.config_path
        assert path is not None
        cmd = [
            sys.executable,
            "-m",
            "gateway",
            "check-config",
            path,
            "--print-runtime",
            *self.config.override_args,
        ]
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            async with asyncio.timeout(RELOAD_TIMEOUT):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            log.error("reload failed, keeping the running config: validation timed out")
            return
        if proc.returncode != 0:
            log.error(
                "reload failed, keeping the running config:\n%s", err.decode(errors="replace")
            )
            return
        try:
            new = RuntimeConfig.from_json(out.decode())
            auth = build_authenticator(new.allow_anonymous, new.password_file)
            policies = build_policies(new.listeners)
            specs = self._listener_changes(new)
        except (ValueError, KeyError, OSError, ConfigError) as exc:
            log.error("reload failed, keeping the running config: %s", exc)
            return
        changed, ignored = self.apply(new, auth, policies, specs)
        changed += await self._reload_bridges(new.bridges)
        changed += await self._reload_http(new.http)
        log.info(
            "config reloaded from %s: %s%s",
            new.config_path,
            ", ".join(changed) or "no changes",
            f" (restart needed for: {', '.join(ignored)})" if ignored else "",
        )

    def _listener_changes(self, new: RuntimeConfig) -> list[ListenerSpec]:
        """The running listeners whose connection-time settings changed (their TLS
        files are read again even when unchanged: renewed certificates take effect)."""
        specs = []
        for i, (old, now) in enumerate(zip(self.config.listeners, new.listeners, strict=False)):
            if old.identity() == now.identity() and (now != old or now.certfile is not None):
                spec = listener_spec(now, i)
                if spec.tls is not None:
                    from gateway.net.tls import server_context

                    server_context(spec.tls)  # a certificate that does not load fails here
                specs.append(spec)
        return specs

    def apply(
        self,
        new: RuntimeConfig,
        auth: Authenticator,
        policies: dict[str, ListenerPolicy] | None = None,
        specs: list[ListenerSpec] | None = None,
    ) -> tuple[list[str], list[str]]:
        """Take the reloadable parts of ``new`` for the broker, the listeners and the
        log; returns what changed and what needs a restart. (Bridges and the HTTP
        listener follow: ``_reload_bridges``, ``_reload_http``.)"""
        broker = self.broker
        server = self.server
        assert broker is not None and server is not None
        current = broker.settings
        changed = {
            name: getattr(new.broker, name)
            for name in new.reloadable
            if getattr(new.broker, name) != getattr(current, name)
        }
        ignored = [
            name
            for name in current.__dataclass_fields__
            if name not in new.reloadable and getattr(new.broker, name) != getattr(current, name)
        ]
        broker.settings = replace(current, **changed)
        broker.authenticator = auth
        listeners = self.config.listeners
        if [lc.identity() for lc in new.listeners] != [lc.identity() for lc in listeners]:
            ignored.append("listeners (host, port, name, type)")
        elif policies is not None:
            # Password and ACL files are read again whether or not their names changed,
            # and so are certificates (a renewed one serves new connections).
            if new.listeners != listeners:
                changed["listeners"] = new.listeners
            broker.set_policies(policies, None, server.loop.time())
            for spec in specs or ():
                server.update_listener(spec)
            listeners = new.listeners
            for warning in file_warnings(new):
                log.warning("%s", warning)
        setup_logging(new.log_level)
        # Bridges and [http] stay what runs until their own reload has run.
        self.config = replace(
            new,
            listeners=listeners,
            broker=broker.settings,
            bridges=self.config.bridges,
            http=self.config.http,
        )
        return sorted(changed), ignored

    # ------------------------------------------------------------------ reload: bridges

    async def _reload_bridges(self, wanted: tuple[BridgeSettings, ...]) -> list[str]:
        """``[[bridges]]`` on reload, matched by name; returns what changed.

        A removed bridge stops (its link disconnects) and its outbox stays in the store
        under its name, so configuring it again resumes it (as after a restart); without
        a store its messages are dropped and counted in the health report. A changed
        bridge reconnects with its new settings and keeps its outbox: what was queued
        goes up first, in order, to the topics it was mapped to when it was queued
        (under the rules of that time). A new bridge starts; a bridge whose settings
        did not change is not touched."""
        running = {b.name: b for b in self.bridges}
        names = {settings.name for settings in wanted}
        done: list[str] = []
        for bridge in [b for b in self.bridges if b.name not in names]:
            await self._remove_bridge(bridge)
            done.append(f"bridge {bridge.name} removed")
        for settings in wanted:
            old = running.get(settings.name)
            if old is None:
                if await self._add_bridge(settings):
                    done.append(f"bridge {settings.name} added")
            elif old.settings != settings:
                await old.stop()  # its link; messages still enter its outbox meanwhile
                # From here to start() nothing yields to the loop, so no message falls
                # between the old local subscriptions and the new.
                bridge = old.successor(settings)
                bridge.start()
                self.bridges[self.bridges.index(old)] = bridge
                done.append(f"bridge {settings.name} changed")
        order = {settings.name: i for i, settings in enumerate(wanted)}
        self.bridges.sort(key=lambda b: order[b.name])  # in place: the metrics read it
        self.config = replace(self.config, bridges=tuple(b.settings for b in self.bridges))
        if self.bridges and self._clock_timer is None and self.server is not None:
            self._clock_timer = self.server.loop.call_later(CLOCK_CHECK_INTERVAL, self._check_clock)
        return done

    async def _remove_bridge(self, bridge: Bridge) -> None:
        await bridge.stop()
        bridge.detach()
        bridge.forget_sys()
        self.bridges.remove(bridge)
        queued = bridge.outbox.count
        if self.store is not None:
            self._seal()  # its last changes go to the store now
            log.warning(
                "bridge %s removed: link closed; its outbox (%d message(s)) is kept in the "
                "store and goes up when a bridge named %r is configured again",
                bridge.name,
                queued,
                bridge.name,
            )
        else:
            self._removed_drops += queued
            log.warning(
                "bridge %s removed: link closed; its outbox (%d message(s), in memory: "
                "no data_dir) is dropped",
                bridge.name,
                queued,
            )

    async def _add_bridge(self, settings: BridgeSettings) -> bool:
        """Start a bridge a reload added, with what the store holds under its name (an
        outbox kept from when it was removed, or from an earlier run). False: the
        store could not be read; the bridge stays out until the next SIGHUP."""
        rows: list[tuple[int, int, float]] = []
        if self.store is not None:
            import sqlite3

            try:
                rows = await self._stored_outbox(settings.name)
            except (TimeoutError, OSError, sqlite3.Error) as exc:
                log.error(
                    "bridge %s not added: cannot read its outbox from the store (%s); "
                    "the next SIGHUP tries again",
                    settings.name,
                    exc or "timed out",
                )
                return False
        bridge = self._new_bridge(settings)
        bridge.outbox.restore(rows)
        bridge.start()
        self.bridges.append(bridge)
        if rows:
            log.info("bridge %s: %d message(s) from the store to send", settings.name, len(rows))
        return True

    async def _stored_outbox(self, name: str) -> list[tuple[int, int, float]]:
        """``(pos, size, created)`` of each row the store holds for bridge ``name``,
        once everything handed to the store so far is committed (a bridge removed a
        moment ago may still have changes on their way)."""
        from gateway.bridge.outbox import PAGE
        from gateway.store.settings import OUTBOX_ENTRY_OVERHEAD

        store, broker = self.store, self.broker
        assert store is not None and broker is not None and broker.journal is not None
        self._seal()
        target = broker.journal.batch_id - 1  # every batch sealed so far
        if self._committed_upto < target:
            future = asyncio.get_running_loop().create_future()
            waiter = (target, future)
            self._commit_waiters.append(waiter)
            try:
                async with asyncio.timeout(RELOAD_TIMEOUT):
                    await future
            finally:
                if waiter in self._commit_waiters:
                    self._commit_waiters.remove(waiter)

        def read() -> list[tuple[int, int, float]]:
            index: list[tuple[int, int, float]] = []
            first = 0
            while True:
                page = store.read_outbox(name, first, PAGE)
                index.extend(
                    (pos, len(topic) + len(payload) + len(props) + OUTBOX_ENTRY_OVERHEAD, made)
                    for pos, _seq, topic, payload, _qos, _retain, props, made, _ends in page
                )
                if len(page) < PAGE:
                    return index
                first = page[-1][0] + 1

        return await asyncio.get_running_loop().run_in_executor(None, read)

    # ------------------------------------------------------------------ reload: HTTP

    async def _reload_http(self, new: HTTPSettings | None) -> list[str]:
        """``[http]`` on reload; returns what changed.

        Changed settings (host, port, TLS, password or token file, limits, on or off):
        the listener is made again with them; the new one listens before the old one
        closes (on the same address it takes over the socket), the old one's
        connections are closed. Unchanged settings: the password, token and TLS files
        are read again. When the new listener cannot open (its port is taken, a file
        does not load), the old one keeps serving and the log says why; the next
        SIGHUP tries again. MQTT is not touched either way."""
        old = self.config.http
        server = self.server
        assert server is not None
        metrics = self.metrics
        running = metrics.http if metrics is not None else None
        wanted = new if new is not None and new.enabled else None
        where = self.config.config_path or "<command line>"
        try:
            if wanted is None:
                if metrics is not None and running is not None:
                    await metrics.stop_http()
                    if metrics.homeassistant is None:
                        await metrics.close()
                        self.metrics = None
                    log.info("http: listener closed")
            elif metrics is None:
                # Raises ConfigError when it cannot listen, having closed what it opened.
                self.metrics = await self._start_metrics(replace(self.config, http=wanted))
            elif running is None or running.settings != wanted:
                await metrics.serve_http(server, wanted, where)
            else:
                metrics.refresh_http(where)
        except (OSError, ConfigError) as exc:
            keeping = (
                f"the listener on {running.settings.host}:{running.settings.port}"
                if running is not None
                else "it off"
            )
            why = exc.strerror or exc if isinstance(exc, OSError) else exc
            target = "" if wanted is None else f" (on {wanted.host}:{wanted.port})"
            log.error("reload of [http] failed%s, keeping %s: %s", target, keeping, why)
            return []
        self.config = replace(self.config, http=new)
        return [] if new == old else ["http"]


def listener_spec(listener: ListenerSettings, index: int) -> ListenerSpec:
    """What the shell needs to open (or update) one configured listener."""
    return ListenerSpec(
        listener.host,
        listener.port,
        listener_label(listener, index),
        listener.type,
        listener.path,
        listener if listener.type in ("tls", "websocket-tls") else None,
    )


async def run(config: RuntimeConfig, ready: Callable[[Gateway], None] | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    gateway = Gateway(config)
    loop = asyncio.get_running_loop()
    notifier = None
    if "NOTIFY_SOCKET" in os.environ:
        # Imported here: only a gateway started by systemd (Type=notify) loads it.
        from gateway.app.sdnotify import Notifier

        notifier = Notifier.from_environ(os.environ)
    # Handlers first: a signal that arrives while listeners open is handled, not fatal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, gateway.stop)
    loop.add_signal_handler(signal.SIGHUP, gateway.reload)
    # The loop hears of SIGHUP only at its next iteration, after input already read in
    # this one; a Python-level handler around the loop's flags the broker at once.
    loop_handler = signal.getsignal(signal.SIGHUP)

    def on_sighup(signum: int, frame: Any) -> None:
        gateway.sighup_arrived()
        if callable(loop_handler):
            loop_handler(signum, frame)

    signal.signal(signal.SIGHUP, on_sighup)
    await gateway.start()
    if notifier is not None:
        gateway.notify_ready(notifier)
    if ready is not None:
        ready(gateway)
    try:
        await gateway.wait()
    finally:
        # Handlers stay installed while closing (the loop removes them when it
        # closes): a second SIGTERM must not kill the process halfway through
        # telling clients.
        await gateway.close()
    return 0


def run_forever(config: RuntimeConfig) -> int:
    """Start the event loop (uvloop when installed) and run the gateway."""
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is optional
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run(config))


def main() -> int:
    """``python -m gateway.app``: the gateway process ``ledge run`` execs into."""
    text = os.environ.pop(RUNTIME_ENV, None)
    if text is None:
        print("gateway.app is started by `ledge run`", file=sys.stderr)
        return 2
    config = RuntimeConfig.from_json(text)
    setup_logging(config.log_level)
    try:
        return run_forever(config)
    except (ConfigError, StartupError) as exc:
        print(exc, file=sys.stderr)
        return 2
