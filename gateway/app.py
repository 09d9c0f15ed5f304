"""Composition root: config -> core -> listeners, signals, reload, shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gateway import __version__
from gateway.broker.auth import PasswordAuthenticator, PasswordFileError, parse_password_file
from gateway.broker.core import Broker
from gateway.config import BrokerConfig, Config, ConfigError, load_config, reloadable_fields
from gateway.net.server import ListenerSpec, Server

log = logging.getLogger("ledge")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(level.upper())


def build_authenticator(config: Config) -> PasswordAuthenticator:
    users = None
    path = config.auth.password_file
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                str(path), [f"auth.password_file: cannot read: {exc.strerror or exc}"]
            ) from None
        try:
            users = parse_password_file(text)
        except PasswordFileError as exc:
            raise ConfigError(str(path), [f"auth.password_file: {exc}"]) from None
    return PasswordAuthenticator(config.auth.allow_anonymous, users)


class Gateway:
    """The running gateway: one broker, its listeners, and (later) drivers and bridges."""

    def __init__(self, config: Config, config_path: Path | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.broker: Broker | None = None
        self.server: Server | None = None
        self.addresses: list[tuple[str, int]] = []
        self._stop = asyncio.Event()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        if config.data_dir is not None:
            os.makedirs(config.data_dir, exist_ok=True)
        self.broker = Broker(
            config.broker_settings(),
            build_authenticator(config),
            version=f"ledge {__version__}",
            now=loop.time(),
        )
        self.server = Server(self.broker, loop)
        for i, listener in enumerate(config.listeners):
            spec = ListenerSpec(listener.host, listener.port, listener.name or f"listener {i}")
            try:
                self.addresses.extend(await self.server.listen(spec))
            except OSError as exc:
                await self.server.close(0)
                where = f"{listener.host}:{listener.port}"
                raise ConfigError(
                    str(self.config_path or "<command line>"),
                    [f"listeners[{i}]: cannot listen on {where}: {exc.strerror}"],
                ) from None
        log.info(
            "ledge %s started (pid %d, event loop %s)",
            __version__,
            os.getpid(),
            type(loop).__module__.split(".")[0],
        )

    def stop(self) -> None:
        self._stop.set()

    async def wait(self) -> None:
        await self._stop.wait()

    async def close(self) -> None:
        if self.server is not None:
            log.info("shutting down")
            await self.server.close()

    def reload(self) -> None:
        """SIGHUP: re-read the config file and apply what can change while running."""
        if self.config_path is None or self.broker is None:
            log.info("SIGHUP ignored: running on the embedded default config")
            return
        try:
            new = load_config(self.config_path)
            auth = build_authenticator(new)
        except ConfigError as exc:
            log.error("reload failed, keeping the running config:\n%s", exc)
            return
        current = self.broker.settings
        fresh = new.broker_settings()
        changes = {
            name: getattr(fresh, name)
            for name, reload in reloadable_fields(BrokerConfig).items()
            if reload and getattr(fresh, name) != getattr(current, name)
        }
        self.broker.settings = replace(current, **changes)
        self.broker.authenticator = auth
        setup_logging(new.log.level)
        ignored = [
            name
            for name, reload in reloadable_fields(BrokerConfig).items()
            if not reload and getattr(fresh, name) != getattr(current, name)
        ]
        if new.listeners != self.config.listeners:
            ignored.append("listeners")
        log.info(
            "config reloaded from %s: %s%s",
            self.config_path,
            ", ".join(sorted(changes)) or "no broker changes",
            f" (restart needed for: {', '.join(ignored)})" if ignored else "",
        )


async def run(
    config: Config, config_path: Path | None = None, ready: Callable[[Gateway], None] | None = None
) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    gateway = Gateway(config, config_path)
    loop = asyncio.get_running_loop()
    await gateway.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, gateway.stop)
    loop.add_signal_handler(signal.SIGHUP, gateway.reload)
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


def run_forever(config: Config, config_path: Path | None = None) -> int:
    """Start the event loop (uvloop when installed) and run the gateway."""
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is optional
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run(config, config_path))
