"""A bridge in the test's own process: the broker harness on its fake clock, a wall
clock the test moves, and bridges made on them whose local side is subscribed as
``start`` would, without a link to a remote."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.bridge.link import Bridge
from gateway.bridge.sequence import Sequence
from gateway.bridge.settings import BridgeSettings, RuleSettings
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.mqtt.properties import Properties
from gateway.store.sqlite import Store
from tests.support.harness import Harness

GATEWAY = "gw1"
#: Readings go up under ``fleet/``.
UP = RuleSettings("t/#", remote_prefix="fleet/")


class Wall:
    """The gateway's wall clock, moved by the test."""

    def __init__(self, now: float = 5000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class HarnessBridge(Bridge):
    """A bridge whose broker clock is the harness's (the gateway's is the event loop's)."""

    def __init__(
        self,
        h: Harness,
        settings: BridgeSettings,
        *,
        sequence: Sequence,
        store: Store | None,
        wall: Wall,
    ) -> None:
        self.harness = h
        super().__init__(
            settings,
            gateway=GATEWAY,
            prefix="ledge",
            broker=h.broker,
            sequence=sequence,
            store=store,
            wall=wall,
        )

    def broker_now(self) -> float:
        return self.harness.now


def listen(bridge: Bridge, now: float) -> None:
    """The local subscriptions ``start`` makes, without starting the link."""
    for rule in bridge.settings.rules:
        if rule.outbound:
            bridge.local.subscribe(
                rule.local_filter, 2, now, retained=False, no_local=True, retain_as_published=True
            )


def bridge_settings(*rules: RuleSettings, name: str = "cloud", **options: Any) -> BridgeSettings:
    return BridgeSettings(name, (("127.0.0.1", 1),), rules or (UP,), **options)


@dataclass
class Got:
    """One message a local subscriber received."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Properties
    created: float
    expires_at: float | None
    origin: str | None


class Watcher:
    """An in-process subscriber that records what it receives (retain as published)."""

    def __init__(self, h: Harness, client_id: str, topic_filter: str, *, retained: bool) -> None:
        self.got: list[Got] = []
        self.client = LocalClient(h.broker, client_id, self._sink)
        self.client.subscribe(topic_filter, 2, h.now, retained=retained, retain_as_published=True)

    def _sink(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
        self.got.append(
            Got(
                msg.topic,
                msg.payload,
                qos,
                retain,
                msg.properties,
                msg.created,
                msg.expires_at,
                msg.origin,
            )
        )

    def topics(self) -> list[str]:
        return [g.topic for g in self.got]


class World:
    """A broker on a fake clock, a wall clock, and the bridges made on them."""

    def __init__(self) -> None:
        self.h = Harness()
        self.wall = Wall()
        self.bridges: list[Bridge] = []
        self._watchers = 0

    def bridge(
        self,
        settings: BridgeSettings | None = None,
        *,
        sequence: Sequence | None = None,
        store: Store | None = None,
    ) -> HarnessBridge:
        made = HarnessBridge(
            self.h,
            settings or bridge_settings(),
            sequence=sequence or Sequence(500),
            store=store,
            wall=self.wall,
        )
        listen(made, self.h.now)
        self.bridges.append(made)
        return made

    def device(self, client_id: str = "sensor-node") -> LocalClient:
        return LocalClient(self.h.broker, client_id)

    def watch(self, topic_filter: str, *, retained: bool = False) -> Watcher:
        self._watchers += 1
        return Watcher(self.h, f"watcher-{self._watchers}", topic_filter, retained=retained)

    def retained(self, topic_filter: str) -> list[tuple[str, bytes]]:
        """The retained messages matching ``topic_filter``, as a late subscriber gets them."""
        late = self.watch(topic_filter, retained=True)
        return sorted((g.topic, g.payload) for g in late.got)

    def close(self) -> None:
        for made in self.bridges:
            made.detach()
