"""Delivery to a device (section 6.10): a message from the broker, sent or queued.

The broker hands every message a client's subscriptions match to the client's sink
(``SnClient.receive`` -> ``deliver``). It is sent at once when the client is active,
nothing is in flight and its topic has an id; otherwise it waits in the client's
queue, bounded by ``max_queued_messages`` (policy ``queue_policy``: drop the oldest,
or the new one; counted in ``publish/dropped/queue full``). ``pump`` sends from the
queue while the client can take one more: REGISTER first for a topic without an id,
then one QoS 1/2 PUBLISH in flight at a time, each step sent again every
``retry_interval`` (``qos.py`` has the flow). A sleeping client's messages wait until
it wakes; then ``pump`` sends them and PINGRESP, and it sleeps again (6.14).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from gateway.mqttsn import keepalive, output, registry, sessions
from gateway.mqttsn.context import Context, SnClient, log, sparse
from gateway.mqttsn.encoding import encode_publish
from gateway.mqttsn.packets import PingResp, PubRel, Register
from gateway.mqttsn.qos import SENT
from gateway.mqttsn.state import Outbound, State, Step

if TYPE_CHECKING:
    from gateway.broker.message import Message

#: Bytes of an MQTT-SN PUBLISH besides its payload (long length form).
_PUBLISH_OVERHEAD: Final = 7

#: States in which a client takes messages (an asleep one has them kept).
_RECEIVING: Final = frozenset({State.ACTIVE, State.AWAKE})


def deliver(ctx: Context, client: SnClient, msg: Message, qos: int, retain: bool) -> None:
    """A message for ``client`` from the broker: sent now or queued (bounded)."""
    state = client.state
    stats = ctx.stats
    if state is State.DISCONNECTED and qos == 0:
        stats.dropped_offline_qos0 += 1
        return
    if len(msg.payload) + _PUBLISH_OVERHEAD > ctx.settings.max_message_size:
        # A PUBLISH longer than the clients may receive: counted, not sent.
        stats.dropped_too_large += 1
        return
    # Deliveries happen inside the broker's routing; a message routed just now
    # was created just now (retained ones arrive inside our own SUBSCRIBE).
    now = msg.created if msg.created > ctx.now else ctx.now
    entry = Outbound(msg, qos, retain)
    if (
        state is State.ACTIVE
        and not client.holding
        and client.inflight is None
        and not client.queue
        and registry.resolve(ctx, client, entry)
    ):
        _transmit(ctx, client, entry, now)
        return
    queue = client.queue
    if queue is None:
        queue = client.queue = deque()
    # A message REGISTERING heads the queue while its REGISTER is on the wire: it is
    # in flight, not waiting, and neither counts against the bound nor is dropped for
    # it (as a PUBLISH in flight, which has left the queue).
    registering = queue[0] is client.inflight if queue else False
    if len(queue) - registering >= ctx.settings.max_queued_messages:
        stats.dropped_queue_full += 1
        if sparse(stats.dropped_queue_full):
            log.warning(
                "queue of %r full (%d messages): %s (%d dropped so far)",
                client.client_id,
                len(queue),
                ctx.settings.queue_policy,
                stats.dropped_queue_full,
            )
        if ctx.settings.queue_policy == "drop-new":
            return
        del queue[1 if registering else 0]
    queue.append(entry)
    if state is State.ACTIVE and not client.holding and client.inflight is None:
        pump(ctx, client, now)


def resume(ctx: Context, client: SnClient, now: float) -> None:
    """The client can take messages again (CONNACK, or awake): the step in flight is
    sent again, then what is queued."""
    if client.inflight is not None:
        resend(ctx, client, now)
    pump(ctx, client, now)


def pump(ctx: Context, client: SnClient, now: float) -> None:
    """Send queued messages while the client can take them; an awake client then
    gets PINGRESP and sleeps again."""
    if client.state not in _RECEIVING or client.holding:
        return
    queue = client.queue
    while queue and client.inflight is None:
        entry = queue[0]
        if not registry.resolve(ctx, client, entry):
            topic_id = registry.assign(ctx, client, entry.message.topic)
            if topic_id is None:
                queue.popleft()  # counted by registry.assign
                continue
            # 6.10: REGISTER first; the PUBLISH follows the REGACK.
            entry.step = Step.REGISTERING
            entry.msg_id = client.allocate_msg_id()
            entry.topic_id = topic_id
            client.inflight = entry
            output.send(ctx, client, Register(topic_id, entry.msg_id, entry.message.topic))
            start_retry(ctx, client, now)
            return
        queue.popleft()
        _transmit(ctx, client, entry, now)
    if not queue:
        client.queue = None
    if client.state is State.AWAKE and client.inflight is None and not client.queue:
        output.send(ctx, client, PingResp())
        keepalive.asleep(ctx, client, now)


def _transmit(ctx: Context, client: SnClient, entry: Outbound, now: float) -> None:
    msg = entry.message
    if entry.qos == 0:
        output.emit(
            ctx,
            client,
            encode_publish(entry.topic_id, 0, msg.payload, 0, entry.retain, False, entry.id_type),
        )
        return
    entry.msg_id = client.allocate_msg_id()
    entry.step = SENT[entry.qos]
    client.inflight = entry
    output.emit(ctx, client, _publish_bytes(entry, dup=False))
    start_retry(ctx, client, now)


def resend(ctx: Context, client: SnClient, now: float) -> None:
    """Send the step in flight again (DUP on a PUBLISH), section 6.13."""
    entry = client.inflight
    if entry is None:
        return
    ctx.stats.retransmissions += 1
    if entry.step == Step.REGISTERING:
        output.send(ctx, client, Register(entry.topic_id, entry.msg_id, entry.message.topic))
    elif entry.step == Step.AWAIT_PUBCOMP:
        output.send(ctx, client, PubRel(entry.msg_id))
    else:
        output.emit(ctx, client, _publish_bytes(entry, dup=True))
    start_retry(ctx, client, now)


def start_retry(ctx: Context, client: SnClient, now: float) -> None:
    ctx.timers.cancel(client.retry_timer)
    client.retry_timer = ctx.timers.at(now + ctx.settings.retry_interval, _retry, client)


def stop_retry(ctx: Context, client: SnClient) -> None:
    ctx.timers.cancel(client.retry_timer)
    client.retry_timer = None
    client.retries = 0


def _retry(client: SnClient, now: float) -> None:
    """The step in flight was not acknowledged within ``retry_interval``."""
    ctx = client.ctx
    client.retry_timer = None
    if client.inflight is None or client.state not in _RECEIVING:
        return
    settings = ctx.settings
    if client.retries >= settings.max_retries:
        sessions.lost(
            ctx,
            client,
            now,
            f"no acknowledgement after {client.retries} resends "
            f"(every {settings.retry_interval:g} s)",
        )
        return
    client.retries += 1
    resend(ctx, client, now)


def _publish_bytes(entry: Outbound, *, dup: bool) -> bytes:
    return encode_publish(
        entry.topic_id,
        entry.msg_id,
        entry.message.payload,
        entry.qos,
        entry.retain,
        dup,
        entry.id_type,
    )
