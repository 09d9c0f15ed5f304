"""Fuzz targets of the firmware bridge (registered in ``fuzz.targets.TARGETS``).

``mqttsn_codec``: the bytes as one datagram, as a stream cut into chunks, and as a
serial line. Decoding yields a message or ``MalformedMessage`` (with an offset inside
the input) and nothing else; what was read encodes again to something that reads the
same; the UART deframer gives the same messages and errors whatever the chunking.

``mqttsn_gateway``: the bytes are a program for the pure gateway on a real broker core:
four devices (one pair behind a forwarder) send raw datagrams or well-formed messages
(CONNECT with Wills, REGISTER, PUBLISH at every QoS and topic id type, SUBSCRIBE with
wildcards, acknowledgements for any id, sleeping, waking), an MQTT-side client
publishes, the clock moves. Invariants: nothing raises; everything the gateway sends
decodes, and is encapsulated only for nodes behind the forwarder; its bounds hold; when
it shuts down no session of it is left in the broker.
"""

from __future__ import annotations

from typing import Final

# fuzz.targets registers these targets when it is imported; its Reader is defined by then.
from fuzz.targets import Reader
from gateway.broker.core import Broker
from gateway.broker.local import LocalClient
from gateway.broker.settings import BrokerSettings
from gateway.mqttsn import packets as p
from gateway.mqttsn.codec import MalformedMessage, decode, read_message
from gateway.mqttsn.encoding import encode
from gateway.mqttsn.gateway import Gateway
from gateway.mqttsn.settings import MqttSnSettings
from gateway.mqttsn.state import TransportPolicy
from gateway.mqttsn.uart import Deframer, FrameError

TOPICS: Final = ("a/b", "a/c", "cmd/x", "tt", "$SYS/x", "a/#", "+/b", "", "a//b")
CLIENT_IDS: Final = ("d1", "d2", "d3", "", "x" * 70)
#: (transport, address, node id): two devices on UDP, two behind one forwarder.
DEVICES: Final = (
    ("udp", ("10.0.0.1", 1), b""),
    ("udp", ("10.0.0.2", 2), b""),
    ("uart", "/dev/ttyRADIO", b"\x00\x01"),
    ("uart", "/dev/ttyRADIO", b"\x00\x02"),
)
MAX_CLIENTS: Final = 3


def fuzz_mqttsn_codec(data: bytes) -> int:
    count = 0
    try:
        packet = decode(data, 512)
    except MalformedMessage as exc:
        if not 0 <= exc.offset <= len(data):
            raise AssertionError(f"offset {exc.offset} outside the input") from None
    else:
        count += 1
        if decode(encode(packet)) != packet:
            raise AssertionError(f"{packet!r} does not survive encode/decode")
    pos = 0
    while pos < len(data):
        try:
            got = read_message(data, pos, 512)
        except MalformedMessage:
            break
        if isinstance(got, tuple):
            count += 1
            if got[1] <= pos:
                raise AssertionError("the stream reader did not move")
            pos = got[1]
        else:
            break
    whole = Deframer(64).feed(data)
    step = 1 + (data[0] % 9 if data else 0)
    chunked = Deframer(64)
    pieces: list[bytes | FrameError] = []
    for i in range(0, len(data), step):
        pieces.extend(chunked.feed(data[i : i + step]))
    if pieces != whole:
        raise AssertionError("chunking changed what the deframer gives")
    return count + len(whole)


def fuzz_mqttsn_gateway(data: bytes) -> int:
    r = Reader(data)
    now = 1000.0
    broker = Broker(BrokerSettings(sys_interval=0, max_connections=4), now=now)
    settings = MqttSnSettings(
        max_clients=MAX_CLIENTS,
        max_connecting=2,
        max_topics_per_client=3,
        max_queued_messages=3,
        retry_interval=2,
        max_retries=2,
        connect_timeout=5,
        advertise_interval=30 if r.byte() & 1 else 0,
        predefined_topics={1: "a/b", 2: "p/q"},
        max_message_size=128,
        queue_policy="drop-new" if r.byte() & 1 else "drop-oldest",
    )
    gateway = Gateway(
        broker,
        settings,
        [TransportPolicy("udp", can_broadcast=True), TransportPolicy("uart", can_broadcast=True)],
        now=now,
    )
    mqtt = LocalClient(broker, "mqtt-side")
    sent = 0
    while r.left:
        op = r.byte() % 8
        transport, address, node = DEVICES[r.byte() % len(DEVICES)]
        if op == 0:
            raw = r.take(r.byte() % 40)
            gateway.received(transport, address, raw, now)
        elif op in (1, 2, 3, 4):
            message = _message(r)
            if node:
                message = p.Encapsulated(node, message)
            try:
                raw = encode(message)
            except ValueError:
                continue
            gateway.received(transport, address, raw, now)
        elif op == 5:
            topic = TOPICS[r.byte() % 5]
            payload, qos, retain = r.take(r.byte() % 200), r.byte() % 3, bool(r.byte() & 1)
            if topic and "#" not in topic and "+" not in topic:
                mqtt.publish(topic, payload, now, qos=qos, retain=retain)
        elif op == 6:
            now += r.byte() / 4
            broker.tick(now)
            gateway.tick(now)
        else:
            gateway.committed(r.byte())
        sent += _check_output(gateway)
        if len(gateway.by_id) > MAX_CLIENTS:
            raise AssertionError(f"{len(gateway.by_id)} clients in a pool of {MAX_CLIENTS}")
        for client in gateway.by_id.values():
            if client.queue is not None and len(client.queue) > settings.max_queued_messages:
                raise AssertionError("a client queue grew past its bound")
            if client.topic_ids is not None and len(client.topic_ids) > 3:
                raise AssertionError("a topic table grew past its bound")
    gateway.shutdown(now)
    sent += _check_output(gateway)
    left = [cid for cid in broker.sessions if cid != "mqtt-side"]
    if left or broker.connected:
        raise AssertionError(f"sessions left after shutdown: {left}, connected {broker.connected}")
    return sent


def _check_output(gateway: Gateway) -> int:
    """Everything sent decodes; an encapsulated answer goes only to a forwarder, for one
    of its nodes (the forwarder itself, sending unencapsulated, is answered plainly)."""
    out = gateway.take_output()
    for transport, address, raw in out:
        message = decode(raw)  # raises (a bug) when the gateway wrote garbage
        if not isinstance(message, p.Encapsulated):
            continue
        nodes = {n for t, a, n in DEVICES if t == transport and a == address and n}
        if message.node_id not in nodes:
            raise AssertionError(f"encapsulated for {message.node_id!r}, not a node at {address}")
    return len(out)


def _message(r: Reader) -> p.Packet:
    kind = r.byte() % 14
    msg_id = r.byte() % 4
    topic_id = r.byte() % 5
    qos = (-1, 0, 1, 2)[r.byte() % 4]
    id_type = r.byte() % 4
    if kind == 0:
        return p.Connect(
            CLIENT_IDS[r.byte() % len(CLIENT_IDS)],
            r.byte() % 4 * 5,
            bool(r.byte() & 1),
            bool(r.byte() & 1),
        )
    if kind == 1:
        return p.WillTopic(TOPICS[r.byte() % len(TOPICS)], max(qos, 0), bool(r.byte() & 1))
    if kind == 2:
        return p.WillMsg(r.take(r.byte() % 10))
    if kind == 3:
        return p.Register(0, msg_id, TOPICS[r.byte() % len(TOPICS)])
    if kind == 4:
        return p.Publish(
            topic_id, msg_id, r.take(r.byte() % 20), qos, bool(r.byte() & 1), False, min(id_type, 2)
        )
    if kind == 5:
        return p.PubAck(topic_id, msg_id, r.byte() % 4)
    if kind == 6:
        return (p.PubRec, p.PubRel, p.PubComp)[r.byte() % 3](msg_id)
    if kind == 7:
        return p.RegAck(topic_id, msg_id, r.byte() % 4)
    if kind == 8:
        if id_type == p.TopicIdType.PREDEFINED:
            return p.Subscribe(msg_id, topic_id, qos, id_type)
        topic = TOPICS[r.byte() % len(TOPICS)] if id_type != p.TopicIdType.SHORT else "tt"
        return p.Subscribe(msg_id, topic, qos, min(id_type, 2))
    if kind == 9:
        return p.Unsubscribe(msg_id, TOPICS[r.byte() % len(TOPICS)])
    if kind == 10:
        return p.PingReq(CLIENT_IDS[r.byte() % len(CLIENT_IDS)] if r.byte() & 1 else "")
    if kind == 11:
        return p.Disconnect(r.byte() % 3 * 20 or None)
    if kind == 12:
        return p.WillTopicUpd(TOPICS[r.byte() % len(TOPICS)], max(qos, 0))
    return p.SearchGw(r.byte())
