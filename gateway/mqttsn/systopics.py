"""``$SYS/broker/mqttsn/...``: the firmware bridge's values for the broker's ``$SYS``.

The broker publishes them with its own (``Broker.sys_sources``); the metrics page
has a Prometheus metric for each (``gateway/metrics/collect.py``).
"""

from __future__ import annotations

from gateway.mqttsn.context import Context
from gateway.mqttsn.state import State

_PREFIX = "mqttsn/"


def values(ctx: Context) -> dict[str, str]:
    """Values under ``$SYS/broker/``, by topic below it."""
    st = ctx.stats
    states = [c.state for c in ctx.by_id.values()]
    connected = sum(s in (State.ACTIVE, State.AWAKE) for s in states)
    found = {
        "clients/connected": connected,
        "clients/asleep": states.count(State.ASLEEP),
        "clients/disconnected": states.count(State.DISCONNECTED),
        "clients/refused": st.clients_refused,
        "clients/lost": st.clients_lost,
        "clients/evicted": st.clients_evicted,
        "clients/evicted silent": st.clients_evicted_silent,
        "clients/refused per address": st.clients_refused_per_address,
        "clients/refused rate": st.clients_refused_rate,
        "clients/evicted unproven": st.clients_evicted_unproven,
        "clients/unproven": len(ctx.unproven),
        "clients/wake refused": st.wakes_refused,
        "messages/received": st.messages_received,
        "messages/sent": st.messages_sent,
        "messages/malformed": st.malformed,
        "messages/retransmitted": st.retransmissions,
        "messages/without connection": st.not_connected,
        "publish/qos -1": st.qos_minus_one,
        "publish/refused": st.publish_refused,
        "publish/dropped/queue full": st.dropped_queue_full,
        "publish/dropped/topic table full": st.dropped_topic_table,
        "publish/dropped/offline qos 0": st.dropped_offline_qos0,
        "publish/dropped/too large": st.dropped_too_large,
    }
    return {_PREFIX + name: str(value) for name, value in found.items()}
