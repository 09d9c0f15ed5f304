"""One teardown path: a connection the broker closes and one whose transport goes first
end in the same state (``closing.teardown``)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.broker.journal import Journal
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    ConnAck,
    Connect,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    Will,
)

from .support.harness import FakeClient, Harness

ENDINGS = ["closed by the broker", "transport lost"]


def _commit(h: Harness) -> None:
    """As if the store committed the batch so far at once."""
    batch = h.broker.seal_batch()
    if batch is not None:
        h.broker.batch_committed(batch[0])


def _end(client: FakeClient, ending: str) -> None:
    if ending == "closed by the broker":
        client.send(ConnAck(False, 0))  # servers only send CONNACK: a protocol error
        assert client.closed
    client.drop()


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_connected_client_ends_the_same_way_however_it_ends(ending: str, version: int) -> None:
    h = Harness()
    h.broker.journal = Journal()
    watcher = h.client()
    watcher.connect("watcher")
    watcher.subscribe("will/#")
    keeper = h.client()
    keeper.send(
        Connect("keeper", MQTT_5, False, 0, properties=Properties(session_expiry_interval=100))
    )
    _commit(h)
    keeper.expect(ConnAck)
    keeper.send(Subscribe(keeper.pid(), (SubscriptionRequest("t", 1),)))
    _commit(h)
    keeper.expect(SubAck)
    client = h.client(version)
    expiry: dict[str, Any] = {"session_expiry_interval": 60} if version == MQTT_5 else {}
    client.connect("c", keep_alive=30, will=Will("will/c", b"gone", 0, False), **expiry)
    client.send(Publish("t", b"m", 1, packet_id=1))  # for a persistent session: stored
    conn = client.conn
    assert conn.held is not None and conn.timer is not None  # PUBACK waits for the store
    session = h.broker.sessions["c"]
    connected = h.broker.connected
    free = len(h.broker.free)

    _end(client, ending)

    assert conn.held is None  # the held PUBACK goes with the connection
    assert conn.timer is None and conn.stuck_timer is None
    [will] = watcher.publishes()  # the will, once
    assert (will.topic, will.payload) == ("will/c", b"gone")
    assert session.conn is None and conn.session is None
    assert h.broker.connected == connected - 1
    if version == MQTT_5:
        assert session.expires_at == h.now + 60
    else:
        assert "c" not in h.broker.sessions
    assert conn.id not in h.broker.connections
    assert len(h.broker.free) == free + 1 and h.broker.listener_open["test"] == 2
    _commit(h)
    assert not any(isinstance(p, PubAck) for p in client.take())  # nothing held goes later


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_connection_before_connack_leaves_the_connecting_budget(ending: str) -> None:
    h = Harness(max_connections=4, connecting_share=0.5)
    client = h.client()
    assert h.broker.connecting and client.conn.timer is not None
    _end(client, ending)
    assert not h.broker.connecting and not h.broker.connecting_by_address
    assert client.conn.timer is None
    assert len(h.broker.timers) == len([h for h in h.broker.timers._heap if h[2] is not None])
    assert len(h.broker.free) == 4 and h.broker.listener_open["test"] == 0
