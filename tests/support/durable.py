"""A harness broker whose journal a real store commits: the broker core runs packet by
packet on the fake clock, the store's writer thread writes a real SQLite file, and a
restart reads it back into a fresh broker (``restore``)."""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.broker.core import Broker
from gateway.mqtt import MQTT_5, SubAck, Subscribe, SubscriptionRequest
from gateway.store.restore import restore
from gateway.store.settings import StoreSettings
from gateway.store.sqlite import Store
from tests.support.harness import FakeClient, Harness

WALL = 1_700_000_000.0  # the wall clock while the test "runs"


class Durable:
    """A harness broker with a journal, committed by a real Store."""

    def __init__(
        self, directory: Path, store: StoreSettings | None = None, **settings: Any
    ) -> None:
        self.directory = directory
        self.h = Harness(**settings)
        self.store = Store(directory, store or StoreSettings(retry_interval=0.05))
        snapshot = self.store.open()
        restore(self.h.broker, snapshot, self.h.now, WALL)
        self.events: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.Queue()
        self.failures: list[str] = []
        #: What the store said about its room, in order (True: full).
        self.fullness: list[bool] = []
        self.store.start(
            lambda fn, *args: self.events.put((fn, args)),
            self.h.broker.batch_committed,
            self.failures.append,
            self.fullness.append,
        )

    @property
    def broker(self) -> Broker:
        return self.h.broker

    def commit(self) -> None:
        """Seal what the core journaled, wait for the writer, apply its callback."""
        batch = self.broker.seal_batch()
        if batch is None:
            return
        self.store.submit(batch[0], batch[1], WALL - self.h.now)
        while True:
            fn, args = self.events.get(timeout=10)
            fn(*args)
            if fn == self.broker.batch_committed and args[0] >= batch[0]:
                return

    def restart(self, downtime: float = 0.0) -> Durable:
        """Stop (as a kill would: nothing more is written) and start a new broker."""
        self.store.close()
        again = Durable.__new__(Durable)
        again.directory = self.directory
        again.h = Harness()
        again.h.now = self.h.now + downtime
        again.store = Store(self.directory, StoreSettings(retry_interval=0.05))
        snapshot = again.store.open()
        restore(again.h.broker, snapshot, again.h.now, WALL + downtime)
        again.events = queue.Queue()
        again.failures = []
        again.store.start(
            lambda fn, *args: again.events.put((fn, args)),
            again.h.broker.batch_committed,
            again.failures.append,
        )
        return again

    def close(self) -> None:
        self.store.close()


def subscribe_stored(d: Durable, c: FakeClient, topic_filter: str, qos: int = 1) -> None:
    """SUBSCRIBE for a persistent session: the SUBACK comes once the store committed."""
    c.send(Subscribe(c.pid(), (SubscriptionRequest(topic_filter, qos),)))
    assert c.take() == []
    d.commit()
    assert isinstance(c.expect(SubAck), SubAck)


def persistent_sub(
    d: Durable, client_id: str = "sub", qos: int = 2, version: int = MQTT_5
) -> FakeClient:
    c = d.h.client(version)
    c.connect(client_id, clean_start=False, session_expiry_interval=3600)
    subscribe_stored(d, c, "t/#", qos)
    return c
