"""Wake-ups by one mechanism: every way into the core is one event (``with
ctx.event:``), and the shell is woken once, when the outermost one is over."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.broker.core import Broker
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.broker.proxy import ProxyClient
from gateway.mqtt import MQTT_5, Connect, Publish, encode

from .support.harness import Harness


class Wakes:
    """The shell's wake-up hook, counting; the core must be at rest when called."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.count = 0
        broker.wake = self

    def __call__(self) -> None:
        assert self.broker.depth == 0
        self.count += 1


def _entries(h: Harness) -> dict[str, Callable[[], object]]:
    broker = h.broker
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t/#")
    fresh = h.client()
    local = LocalClient(broker, "local")
    proxy = ProxyClient(broker, "device", lambda *a: None, acl=None, now=h.now)
    broker.retained.store(Message("t/r", b"r", 0, True, created=h.now))
    publish = encode(Publish("t/x", b"x", 0), MQTT_5)
    return {
        "data_received": lambda: broker.data_received(sub.conn, publish, h.now),
        "dispatch": lambda: broker.dispatch(fresh.conn, Connect("f", MQTT_5), h.now),
        "open_connection": lambda: broker.open_connection("127.0.0.1:7", "test", h.now),
        "set_writable": lambda: broker.set_writable(sub.conn, True, h.now),
        "tick": lambda: broker.tick(h.now),
        "batch_committed": lambda: broker.batch_committed(0),
        "set_policies": lambda: broker.set_policies({}, None, h.now),
        "publish_local": lambda: broker.publish_local("t/y", b"y", h.now),
        "LocalClient.subscribe": lambda: local.subscribe("t/#", 0, h.now),
        "LocalClient.publish": lambda: local.publish("t/z", b"z", h.now),
        "LocalClient.close": lambda: local.close(h.now),
        "ProxyClient.publish_will": lambda: proxy.publish_will("t/w", b"w", 0, False, h.now),
        "connection_lost": lambda: broker.connection_lost(sub.conn, h.now),
        "shutdown": lambda: broker.shutdown(h.now),
    }


ENTRIES = list(_entries(Harness()))


@pytest.mark.parametrize("name", ENTRIES)
def test_every_way_into_the_core_wakes_the_shell_once(name: str) -> None:
    h = Harness()
    entry = _entries(h)[name]
    wakes = Wakes(h.broker)
    entry()
    assert wakes.count == 1
    assert h.broker.depth == 0


def test_an_event_inside_an_event_wakes_once_when_the_outer_one_ends() -> None:
    """A sink that publishes (a tap re-publishing what it got) is nested in the
    publish that reached it: one wake for both."""
    h = Harness()
    broker = h.broker
    echo = LocalClient(broker, "echo")

    def republish(msg: Message, qos: int, retain: bool, ids: tuple[int, ...]) -> None:
        echo.publish("out", msg.payload, h.now)

    echo.session.sink = republish
    echo.subscribe("in", 0, h.now)
    seen: list[bytes] = []
    LocalClient(broker, "seen", lambda msg, *_: seen.append(msg.payload)).subscribe("out")
    wakes = Wakes(broker)
    broker.publish_local("in", b"p", h.now)
    assert seen == [b"p"]
    assert wakes.count == 1


def test_an_event_that_raises_still_wakes_and_leaves_the_core_at_rest() -> None:
    h = Harness()

    def broken(msg: Message, qos: int, retain: bool, ids: tuple[int, ...]) -> None:
        raise RuntimeError("a sink that fails")

    LocalClient(h.broker, "broken", broken).subscribe("t")
    wakes = Wakes(h.broker)
    with pytest.raises(RuntimeError):
        h.broker.publish_local("t", b"x", h.now)
    assert wakes.count == 1 and h.broker.depth == 0
