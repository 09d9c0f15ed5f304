"""In-process clients: publish and subscribe from Python inside the gateway, no TCP.

Drivers, the cloud bridge and user taps use this. A local client is a session
like any other for routing (wildcards, shared groups, retained messages, No
Local), but what it receives is handed to its ``sink`` at once instead of being
encoded for a socket: no copies, no packet identifiers, no acknowledgements.
Sinks run inside the core's delivery loop and must only enqueue; the app layer
drains its queue elsewhere. Each call is an event of the core: when it is over, the
shell is woken (``Context.wake``) to write what it produced.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.broker import publish_policy, sessions
from gateway.broker.context import Context
from gateway.broker.delivery import deliver
from gateway.broker.message import Message
from gateway.broker.state import Session, Subscription
from gateway.mqtt.properties import EMPTY, Properties
from gateway.mqtt.topics import filter_error, parse_shared, topic_name_error

#: What a local subscriber receives: the message, the QoS it was granted, the retain
#: flag as delivered, and the identifiers of the matching subscriptions.
Sink = Callable[[Message, int, bool, tuple[int, ...]], None]


class LocalClient:
    """One in-process client of ``broker`` under ``client_id``."""

    __slots__ = ("broker", "client_id", "session")

    def __init__(self, broker: Context, client_id: str, sink: Sink | None = None) -> None:
        if client_id in broker.sessions:
            raise ValueError(f"client id {client_id!r} is already in use")
        self.broker = broker
        self.client_id = client_id
        session = Session(client_id)
        session.sink = sink or _discard
        broker.sessions[client_id] = session
        self.session = session

    def subscribe(
        self,
        topic_filter: str,
        qos: int = 0,
        now: float = 0.0,
        *,
        retained: bool = True,
        no_local: bool = False,
        retain_as_published: bool = False,
        identifier: int | None = None,
    ) -> None:
        """Subscribe; with ``retained`` the matching retained messages arrive at once.
        With ``retain_as_published`` live messages keep their retain flag (a bridge)."""
        shared = parse_shared(topic_filter)  # raises ValueError for a bad shared filter
        if shared is None:
            error = filter_error(topic_filter)
            if error:
                raise ValueError(f"topic filter {topic_filter!r}: {error}")
            share_name, inner = None, topic_filter
        else:
            share_name, inner = shared
        sub = Subscription(inner, qos, no_local, retain_as_published, 0, identifier, share_name)
        ctx = self.broker
        with ctx.event:
            old = self.session.subscriptions.get(topic_filter)
            if old is not None:
                ctx.index.remove(self.session, old)
            self.session.subscriptions[topic_filter] = sub
            ctx.index.add(self.session, sub)
            if retained and share_name is None:
                ids = (identifier,) if identifier else ()
                for msg in ctx.retained.matching(inner, now):
                    if no_local and msg.origin == self.client_id:
                        continue
                    deliver(ctx, self.session, msg, min(qos, msg.qos), True, ids, None, now)

    def unsubscribe(self, topic_filter: str) -> bool:
        sub = self.session.subscriptions.pop(topic_filter, None)
        if sub is None:
            return False
        self.broker.index.remove(self.session, sub)
        return True

    def publish(
        self,
        topic: str,
        payload: bytes,
        now: float,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: Properties = EMPTY,
    ) -> int:
        """Route a message as if this client had published it; returns the recipients."""
        error = topic_name_error(topic)
        if error:
            raise ValueError(f"topic {topic!r}: {error}")
        ctx = self.broker
        with ctx.event:
            return publish_policy.publish_local(
                ctx,
                topic,
                payload,
                now,
                qos=qos,
                retain=retain,
                properties=properties,
                origin=self.client_id,
            )

    def close(self, now: float) -> None:
        """Remove the client and its subscriptions."""
        ctx = self.broker
        if ctx.sessions.get(self.client_id) is self.session:
            with ctx.event:
                sessions.end(ctx, self.session, now)


def _discard(msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
    """A publish-only client receives nothing."""


__all__ = ["LocalClient", "Message", "Sink"]
