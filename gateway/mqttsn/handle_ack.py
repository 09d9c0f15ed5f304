"""REGACK, PUBACK, PUBREC and PUBCOMP from a client: its answers to what we sent.

Each answer is named (``qos.Ack``) and looked up with the step of the message in
flight in ``qos.SENDER``; no row (another message id, another step) and it is
ignored. What a move does besides: PUBREL goes out on the way to ``AWAIT_PUBCOMP``;
leaving flight, the retry timer stops and the queue is pumped; a refusal by the
client is counted (``publish/refused``) and logged.
"""

from __future__ import annotations

from collections import deque

from gateway.mqttsn import delivery, output, registry, sessions
from gateway.mqttsn.context import Context, SnClient, log
from gateway.mqttsn.packets import PubAck, PubComp, PubRec, PubRel, RegAck, ReturnCode, TopicIdType
from gateway.mqttsn.qos import Ack, after
from gateway.mqttsn.state import Key, Step


def handle_regack(ctx: Context, key: Key, packet: RegAck, now: float) -> None:
    client = sessions.connected(ctx, key, packet, now)
    code = packet.return_code
    accepted = code == ReturnCode.ACCEPTED
    _move(ctx, client, packet.msg_id, Ack.REGACK if accepted else Ack.REGACK_REFUSED, code, now)


def handle_puback(ctx: Context, key: Key, packet: PubAck, now: float) -> None:
    client = sessions.connected(ctx, key, packet, now)
    code = packet.return_code
    entry = client.inflight
    if code == ReturnCode.ACCEPTED:
        ack = Ack.PUBACK
    elif (
        code == ReturnCode.INVALID_TOPIC_ID
        and entry is not None
        and entry.id_type == TopicIdType.NORMAL
    ):
        ack = Ack.PUBACK_UNREGISTERED
    else:
        ack = Ack.PUBACK_REFUSED
    _move(ctx, client, packet.msg_id, ack, code, now)


def handle_pubrec(ctx: Context, key: Key, packet: PubRec, now: float) -> None:
    client = sessions.connected(ctx, key, packet, now)
    _move(ctx, client, packet.msg_id, Ack.PUBREC, ReturnCode.ACCEPTED, now)


def handle_pubcomp(ctx: Context, key: Key, packet: PubComp, now: float) -> None:
    client = sessions.connected(ctx, key, packet, now)
    _move(ctx, client, packet.msg_id, Ack.PUBCOMP, ReturnCode.ACCEPTED, now)


def _move(
    ctx: Context,
    client: SnClient,
    msg_id: int,
    ack: Ack,
    return_code: int,
    now: float,
) -> None:
    """Move the message in flight on by ``ack``, as ``qos.SENDER`` says
    (``return_code``: the client's, for the log line of a refusal)."""
    entry = client.inflight
    if entry is None or entry.msg_id != msg_id:
        return
    step = after(entry.step, ack)
    if step is None:
        return
    entry.step = step
    if step is Step.AWAIT_PUBCOMP:
        client.retries = 0
        output.send(ctx, client, PubRel(msg_id))
        delivery.start_retry(ctx, client, now)
        return
    delivery.stop_retry(ctx, client)
    client.inflight = None
    topic = entry.message.topic
    if ack is Ack.REGACK_REFUSED:
        # The client will not take the topic: the message cannot be delivered.
        ctx.stats.publish_refused += 1
        log.info(
            "client %r refused REGISTER of %r (return code %d): message dropped",
            client.client_id,
            topic,
            return_code,
        )
        registry.forget(client, topic)
        if client.queue and client.queue[0] is entry:
            client.queue.popleft()  # a message REGISTERING heads the queue
    elif ack is Ack.PUBACK_UNREGISTERED:
        registry.forget(client, topic)
        if client.queue is None:
            client.queue = deque()
        client.queue.appendleft(entry)
    elif ack is Ack.PUBACK_REFUSED:
        ctx.stats.publish_refused += 1
        log.info(
            "client %r refused a message on %r (return code %d)",
            client.client_id,
            topic,
            return_code,
        )
    delivery.pump(ctx, client, now)
