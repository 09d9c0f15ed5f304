"""A Mosquitto bridge into Ledge, on Mosquitto's default bridge settings.

Debian's real ``mosquitto`` bridges to ``ledge run`` over loopback with a bridge
section that names only the connection, the address and the topics, so
``notifications true`` (the default) applies: the bridge connects with its will set
to ``0`` on ``$SYS/broker/connection/<its client id>/state``, publishes ``1`` there,
retained, once connected, and its will goes out when it is lost. It connects at its
first attempt, as a bridge (protocol level 0x84). Messages flow both ways at QoS 1,
and on a ``both`` topic without coming back. Another client still cannot write that
topic, nor any other under ``$SYS``. Watchers on both brokers are paho clients.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.clients import Paho, Received
from tests.support.procs import LedgeProcess, MosquittoProcess
from tests.support.wait import wait_for

#: How long Mosquitto may take to connect its bridge. Its first CONNECT is taken at
#: once; were it refused, Mosquitto would try again after its restart_timeout (5 s
#: and up, with jitter) -- the test checks that this never happens.
CONNECT_WITHIN = 40.0


@pytest.fixture
def ledge() -> Iterator[LedgeProcess]:
    proc = LedgeProcess().start()
    yield proc
    assert proc.stop() == 0


class BridgedMosquitto:
    """Debian's mosquitto with a bridge section into Ledge, logging to a file."""

    def __init__(self, workdir: Path, ledge_port: int) -> None:
        self.log_file = workdir / "mosquitto.log"
        self.proc = MosquittoProcess(
            workdir,
            f"log_dest file {self.log_file}\nlog_type all\n"
            "connection toledge\n"
            f"address 127.0.0.1:{ledge_port}\n"
            "topic sensors/# out 1\n"
            "topic commands/# in 1\n"
            "topic both/# both 1\n",
        )
        #: Mosquitto's default remote_clientid: <hostname>.<connection name>.
        self.client_id = f"{socket.gethostname()}.toledge"

    @property
    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""


@pytest.fixture
def mosquitto_bridge(tmp_path: Path, ledge: LedgeProcess) -> Iterator[BridgedMosquitto]:
    MosquittoProcess.require()
    bridged = BridgedMosquitto(tmp_path, ledge.port)
    yield bridged
    bridged.proc.stop()


def until(
    bridged: BridgedMosquitto, condition: Callable[[], object], within: float, what: str
) -> None:
    """``wait_for``, failing with Mosquitto's log (why its bridge did not connect)."""
    try:
        wait_for(condition, within, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; mosquitto's log:\n{bridged.log}") from None


def last(messages: list[Received], topic: str) -> Received | None:
    found = [m for m in messages if m.topic == topic]
    return found[-1] if found else None


def retained_state(port: int, topic: str, client_id: str) -> Received:
    """What a client that subscribes now is sent for ``topic`` (its retained message)."""
    late = Paho(port, client_id, version=4).connect()
    try:
        late.subscribe(topic, 1)
        return late.wait_messages(1)[0]
    finally:
        late.disconnect()


def test_a_default_mosquitto_bridge_connects_both_ways_and_its_will_goes_out(
    ledge: LedgeProcess, mosquitto_bridge: BridgedMosquitto
) -> None:
    state = f"$SYS/broker/connection/{mosquitto_bridge.client_id}/state"
    watch = Paho(ledge.port, "ledge-watcher", version=4).connect()
    watch.subscribe("$SYS/broker/connection/#", 1)
    watch.subscribe("sensors/#", 1)
    # Something for the bridge's subscription to bring back retained: when it arrives
    # on Mosquitto's side, the bridge's SUBSCRIBE into Ledge is in place.
    watch.publish("commands/ready", b"yes", qos=1, retain=True)

    bridge = mosquitto_bridge.proc.start()
    until(
        mosquitto_bridge,
        lambda: (m := last(watch.messages, state)) is not None and m.payload == b"1",
        CONNECT_WITHIN,
        "the bridge's state 1 in Ledge",
    )
    # At the first attempt, as a bridge (protocol level 0x84, Mosquitto's try_private).
    ledge.wait_log(rf"client '{mosquitto_bridge.client_id}' connected .*MQTT 3\.1\.1 bridge")
    assert "refusing connection" not in ledge.log
    got = retained_state(ledge.port, state, "late-1")
    assert (got.payload, got.retain) == (b"1", True)

    local = Paho(bridge.port, "mosquitto-local", version=4).connect()
    local.subscribe("commands/#", 1)
    ready = "commands/ready via the bridge"
    until(mosquitto_bridge, lambda: last(local.messages, "commands/ready"), 10, ready)

    # Out: a message published to Mosquitto reaches Ledge, at QoS 1.
    local.publish("sensors/kitchen/t", b"21.5", qos=1)
    wait_for(lambda: last(watch.messages, "sensors/kitchen/t"), 10, "sensors/kitchen/t in Ledge")
    out = last(watch.messages, "sensors/kitchen/t")
    assert out is not None and (out.payload, out.qos) == (b"21.5", 1)

    # In: a message published to Ledge reaches Mosquitto's subscriber, at QoS 1.
    watch.publish("commands/kitchen/led", b"on", qos=1)
    wait_for(lambda: last(local.messages, "commands/kitchen/led"), 10, "commands via the bridge")
    back = last(local.messages, "commands/kitchen/led")
    assert back is not None and (back.payload, back.qos, back.retain) == (b"on", 1, False)

    # Both ways on one topic: a message crosses once and does not come back (a bridge's
    # subscriptions have No Local). Ledge delivers in order, so an echo would come
    # back to Mosquitto before the marker published after it.
    local.subscribe("both/#", 1)
    watch.subscribe("both/#", 1)
    local.publish("both/x", b"once", qos=1)
    wait_for(lambda: last(watch.messages, "both/x"), 10, "both/x in Ledge")
    watch.publish("both/marker", b"m", qos=1)
    wait_for(lambda: last(local.messages, "both/marker"), 10, "both/marker via the bridge")
    assert [m.payload for m in local.messages if m.topic == "both/x"] == [b"once"]
    assert [m.payload for m in watch.messages if m.topic == "both/x"] == [b"once"]

    # Nobody else may speak for the bridge, nor anywhere else under $SYS.
    intruder = Paho(ledge.port, "intruder", version=5).connect()
    intruder.publish(state, b"0", qos=1, retain=True, refused=0x87)
    intruder.publish("$SYS/broker/uptime", b"0", qos=1, retain=True, refused=0x87)
    intruder.disconnect()
    assert retained_state(ledge.port, state, "late-2").payload == b"1"

    # The bridge is killed: Ledge publishes its will, 0, retained.
    local.disconnect()
    assert bridge.proc is not None
    bridge.proc.kill()
    bridge.proc.wait(10)
    wait_for(
        lambda: (m := last(watch.messages, state)) is not None and m.payload == b"0",
        10,
        "the bridge's will",
    )
    ledge.wait_log(rf"publishing will of '{mosquitto_bridge.client_id}'")
    got = retained_state(ledge.port, state, "late-3")
    assert (got.payload, got.retain) == (b"0", True)
    assert [m.payload for m in watch.messages if m.topic == state] == [b"1", b"0"]
    watch.disconnect()
