"""Taps: user Python code that reacts to messages, inside the gateway, without TCP.

    from gateway.taps import on_message, publish

    @on_message("sensors/{device}/temperature")
    async def too_hot(message, device):
        if message.json()["value"] > 30:
            publish(f"alerts/{device}", b"too hot")

``{name}`` matches one topic level and is passed as a keyword argument; ``#`` may
end a pattern. Handlers (plain or ``async``) run on their own bounded plane: the
broker only puts matched messages in a queue of ``taps.queue_size`` and goes on
delivering to clients; a worker task runs the handlers in order. When the queue is
full the newest message is dropped for the taps (policy: drop new), counted in
``$SYS/broker/taps/dropped`` and logged. A handler that raises is logged with its
traceback and the plane goes on.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import logging
import re
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gateway.broker.core import Broker
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.mqtt.properties import EMPTY, Properties

log = logging.getLogger("ledge.taps")

Handler = Callable[..., Awaitable[None] | None]
_CAPTURE: Final = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")


@dataclass(frozen=True, slots=True)
class TapMessage:
    """What a handler receives."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Properties = EMPTY

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.payload)


@dataclass(frozen=True)
class Tap:
    pattern: str
    handler: Handler
    qos: int
    topic_filter: str
    captures: tuple[tuple[int, str], ...]  # (level index, argument name)

    def arguments(self, topic: str) -> dict[str, str]:
        levels = topic.split("/")
        return {name: levels[i] for i, name in self.captures}


def compile_pattern(pattern: str) -> tuple[str, tuple[tuple[int, str], ...]]:
    """``sensors/{device}/temperature`` -> (``sensors/+/temperature``, ((1, "device"),))."""
    levels = pattern.split("/")
    out: list[str] = []
    captures: list[tuple[int, str]] = []
    for i, level in enumerate(levels):
        m = _CAPTURE.match(level)
        if m:
            out.append("+")
            captures.append((i, m.group(1)))
        elif "{" in level or "}" in level:
            raise ValueError(f"pattern {pattern!r}: '{level}' must be a whole level like {{name}}")
        elif level == "#" and i != len(levels) - 1:
            raise ValueError(f"pattern {pattern!r}: '#' must be the last level")
        else:
            out.append(level)
    names = [n for _, n in captures]
    if len(set(names)) != len(names):
        raise ValueError(f"pattern {pattern!r} names a level twice")
    return "/".join(out), tuple(captures)


#: Taps declared with @on_message, in declaration order.
REGISTRY: list[Tap] = []


def on_message(pattern: str, *, qos: int = 0) -> Callable[[Handler], Handler]:
    """Declare ``handler`` for messages whose topic matches ``pattern``."""
    topic_filter, captures = compile_pattern(pattern)

    def register(handler: Handler) -> Handler:
        REGISTRY.append(Tap(pattern, handler, qos, topic_filter, captures))
        return handler

    return register


#: The running plane, for ``publish`` (one gateway per process).
_RUNNING: list[TapPlane] = []


def publish(topic: str, payload: bytes | str, qos: int = 0, retain: bool = False) -> int:
    """Publish from a tap (or any code in the gateway process)."""
    if not _RUNNING:
        raise RuntimeError("publish() needs a running gateway")
    return _RUNNING[-1].publish(topic, payload, qos, retain)


@dataclass(slots=True)
class TapStats:
    queued: int = 0
    handled: int = 0
    failed: int = 0
    dropped: int = 0


@dataclass
class TapPlane:
    """The bounded queue and the worker that runs the handlers."""

    broker: Broker
    clock: Callable[[], float]
    taps: list[Tap]
    queue_size: int = 1000
    stats: TapStats = field(default_factory=TapStats)

    def __post_init__(self) -> None:
        self.queue: deque[tuple[Tap, TapMessage]] = deque()
        self.ready = asyncio.Event()
        self.client = LocalClient(self.broker, "ledge-taps", self._sink)
        self._task: asyncio.Task[None] | None = None
        self._warned = 0

    def start(self) -> None:
        _RUNNING.append(self)
        self.broker.sys_sources.append(self.sys_values)
        now = self.clock()
        for topic_filter in dict.fromkeys(t.topic_filter for t in self.taps):
            qos = max(t.qos for t in self.taps if t.topic_filter == topic_filter)
            self.client.subscribe(topic_filter, qos, now, retained=False)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="taps")
        if self.taps:
            log.info(
                "%d tap(s) listening: %s", len(self.taps), ", ".join(t.pattern for t in self.taps)
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self in _RUNNING:
            _RUNNING.remove(self)
        if self.sys_values in self.broker.sys_sources:
            self.broker.sys_sources.remove(self.sys_values)

    def sys_values(self) -> dict[str, str]:
        st = self.stats
        return {
            "taps/queued": str(st.queued),
            "taps/handled": str(st.handled),
            "taps/failed": str(st.failed),
            "taps/dropped": str(st.dropped),
            "taps/waiting": str(len(self.queue)),
        }

    def publish(self, topic: str, payload: bytes | str, qos: int, retain: bool) -> int:
        data = payload.encode() if isinstance(payload, str) else payload
        return self.client.publish(topic, data, self.clock(), qos=qos, retain=retain)

    def _sink(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
        from gateway.mqtt.topics import matches

        message = TapMessage(msg.topic, msg.payload, qos, retain, msg.properties)
        for tap in self.taps:
            if not matches(tap.topic_filter, msg.topic):
                continue
            if len(self.queue) >= self.queue_size:
                # The taps' overflow policy: drop the newest, count it, never block delivery.
                self.stats.dropped += 1
                if self.stats.dropped >= 2 * self._warned:
                    self._warned = max(1, self.stats.dropped)
                    log.warning(
                        "tap queue full (%d): message on %r dropped for the taps "
                        "(%d dropped so far)",
                        self.queue_size,
                        msg.topic,
                        self.stats.dropped,
                    )
                continue
            self.queue.append((tap, message))
            self.stats.queued += 1
        if self.queue:
            self.ready.set()

    async def _run(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.queue:
                tap, message = self.queue.popleft()
                try:
                    result = tap.handler(message, **tap.arguments(message.topic))
                    if inspect.isawaitable(result):
                        await result
                    self.stats.handled += 1
                except asyncio.CancelledError:
                    raise
                except Exception:
                    self.stats.failed += 1
                    log.exception("tap %r failed on %r", tap.pattern, message.topic)


def load_module(spec: str) -> None:
    """Import the user's tap module: a dotted module name, or a path to a ``.py`` file."""
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"taps.module: no file {path}")
        module_spec = importlib.util.spec_from_file_location(f"ledge_taps_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"taps.module: cannot load {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec)
