"""``$SYS/broker/...``: the broker's counters as retained QoS 0 messages, with
mosquitto's names for the common ones and Ledge's own for every drop and refusal.

Published every ``sys_interval`` seconds, only the values that changed.
"""

from __future__ import annotations

from gateway.broker import publish_policy
from gateway.broker.context import Context

BASE = "$SYS/broker/"


def start(ctx: Context, now: float) -> None:
    """Publish now and then every ``sys_interval`` seconds (0: never)."""
    if ctx.settings.sys_interval > 0:
        ctx.timers.at(now, _timer, ctx)


def _timer(ctx: Context, now: float) -> None:
    publish_sys(ctx, now)
    ctx.timers.at(now + ctx.settings.sys_interval, _timer, ctx)


def publish_sys(ctx: Context, now: float) -> None:
    """Publish the ``$SYS`` values that changed, retained, QoS 0."""
    ctx.retained.purge_expired(now)
    last = ctx.sys_last
    for topic, value in sys_values(ctx, now).items():
        payload = value.encode()
        if last.get(topic) != payload:
            last[topic] = payload
            publish_policy.publish_local(ctx, topic, payload, now, retain=True)


def sys_values(ctx: Context, now: float) -> dict[str, str]:
    """``$SYS`` topic -> value, with mosquitto's names for the common ones."""
    st = ctx.stats
    counters = {
        "messages/received": st.messages_received,
        "messages/sent": st.messages_sent,
        "bytes/received": st.bytes_received,
        "bytes/sent": st.bytes_sent,
        "publish/received": st.publish_received,
        "publish/sent": st.publish_sent,
        "connections": st.connections_total,
    }
    base = BASE
    values = {
        base + "version": ctx.version,
        base + "uptime": f"{int(now - ctx.started)} seconds",
        base + "clients/connected": str(ctx.connected),
        base + "clients/disconnected": str(len(ctx.sessions) - ctx.connected),
        base + "clients/total": str(len(ctx.sessions)),
        base + "clients/maximum": str(st.clients_maximum),
        base + "messages/received": str(st.messages_received),
        base + "messages/sent": str(st.messages_sent),
        base + "publish/messages/received": str(st.publish_received),
        base + "publish/messages/sent": str(st.publish_sent),
        base + "publish/messages/dropped": str(st.drops()),
        base + "bytes/received": str(st.bytes_received),
        base + "bytes/sent": str(st.bytes_sent),
        base + "subscriptions/count": str(ctx.index.count),
        base + "retained messages/count": str(len(ctx.retained)),
        # Ledge's own: every drop and refusal, by reason.
        base + "publish/messages/dropped/slow consumer": str(st.dropped_slow_consumer),
        base + "publish/messages/dropped/queue full": str(st.dropped_queue_full),
        base + "publish/messages/dropped/expired": str(st.dropped_expired),
        base + "publish/messages/dropped/too large": str(st.dropped_too_large),
        base + "publish/messages/dropped/offline qos 0": str(st.dropped_offline_qos0),
        base + "publish/messages/denied": str(st.publish_denied),
        base + "retained messages/refused": str(ctx.retained.refused),
        base + "clients/refused": str(st.connections_refused),
        base + "clients/connecting": str(len(ctx.connecting)),
        base + "clients/evicted/connecting full": str(st.evicted_connecting_full),
        base + "clients/evicted/address full": str(st.evicted_address_full),
        base + "clients/protocol errors": str(st.protocol_errors),
    }
    for name, load in ctx.loads.items():
        load.update(counters[name], now)
        for minutes, rate in load.rates.items():
            values[f"{base}load/{name}/{minutes}min"] = f"{rate:.2f}"
    for source in ctx.sys_sources:
        values.update({base + k: v for k, v in source().items()})
    return values
