"""What the firmware bridge's small modules share: the tables, the output, the clients.

Every module takes a ``Context`` as its first argument and never imports the
dispatcher (``gateway.mqttsn.gateway.Gateway``, a ``Context`` with the dispatch table
and the shell's API on top), as in the broker core. ``SnClient``, one client's
record, lives here because it points back at its context: timer callbacks are plain
functions that get the client (a bound method or a tuple per deadline would cost
every idle client more bytes), and the broker's sink ``SnClient.receive`` hands
messages to ``Context.deliver``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.broker.buckets import SourceBuckets, TokenBucket
from gateway.broker.ratelog import RateLimitedLog
from gateway.broker.timers import Handle, Timers
from gateway.mqttsn.addresses import origin, source, where
from gateway.mqttsn.settings import MqttSnSettings
from gateway.mqttsn.state import Datagram, Key, Outbound, SnStats, State, TransportPolicy, Will

if TYPE_CHECKING:
    from gateway.broker.acl import Acl, Rules
    from gateway.broker.core import Broker
    from gateway.broker.message import Message
    from gateway.broker.proxy import ProxyClient

log = logging.getLogger("ledge.mqttsn")


def sparse(count: int) -> bool:
    """Log the 1st, 2nd, 4th, 8th ... of a counted event: a flood stays readable."""
    return count & (count - 1) == 0


def _nothing() -> None:
    """The output hook of a gateway nobody drives (tests, tools)."""


class Context:
    """All MQTT-SN client state, with time as an argument everywhere."""

    def __init__(
        self,
        broker: Broker,
        settings: MqttSnSettings,
        transports: list[TransportPolicy],
        *,
        acl: Acl | None = None,
        now: float = 0.0,
        kick: Callable[[], None] | None = None,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.transports = {t.label: t for t in transports}
        self.acl = acl
        #: Called whenever datagrams were added to ``out`` (the shell sends them).
        self.kick = kick or _nothing
        self.timers = Timers()
        self.out: list[Datagram] = []
        #: Output waiting for a store batch: (batch, client, datagram), in order.
        self.held: deque[tuple[int, SnClient, Datagram]] = deque()
        self.by_key: dict[Key, SnClient] = {}
        self.by_id: dict[str, SnClient] = {}
        #: Clients not heard from since their CONNACK, oldest first.
        self.unproven: dict[str, SnClient] = {}
        #: Clients in the Will prompts of their CONNECT (``max_connecting``).
        self.connecting = 0
        self.connect_rate = TokenBucket(settings.max_connect_rate, now)
        self.connect_rate_by_source = SourceBuckets(settings.max_connect_rate_per_address)
        #: Refusals and unreadable input: one line per source and kind a minute.
        self.refusals = RateLimitedLog(log)
        #: Refused PUBLISH, SUBSCRIBE and REGISTER, the same way, at level INFO: QoS -1
        #: needs no connection, so any source could otherwise fill the log.
        self.message_refusals = RateLimitedLog(log, level=logging.INFO)
        self.stats = SnStats()
        self.predefined = dict(settings.predefined_topics)
        self.predefined_ids = {name: tid for tid, name in self.predefined.items()}
        #: The broker session QoS -1 messages come from, made at the first one.
        self.anonymous: ProxyClient | None = None
        #: The time of the event being handled.
        self.now = now

    def deliver(self, client: SnClient, msg: Message, qos: int, retain: bool) -> None:
        """A message for ``client`` from the broker (the dispatcher hands it to
        ``delivery.deliver``; a module below it cannot import that one)."""
        raise NotImplementedError

    def rules(self, client: SnClient) -> Rules | None:
        """The ACL rules ``client`` publishes under (None: no ACL)."""
        return self.acl.rules_for(None, client.client_id) if self.acl is not None else None


class SnClient:
    """One MQTT-SN client. Collections are made on first use: an idle client is small."""

    __slots__ = (
        "address",
        "clean",
        "client_id",
        "ctx",
        "duration",
        "held_batch",
        "holding",
        "inbound_qos2",
        "inflight",
        "key",
        "last_rx",
        "next_msg_id",
        "next_topic_id",
        "node_id",
        "origin",
        "proven",
        "proxy",
        "queue",
        "retries",
        "retry_timer",
        "sleep_duration",
        "source",
        "state",
        "timer",
        "topic_ids",
        "transport",
        "will",
    )

    def __init__(self, ctx: Context, key: Key, client_id: str, now: float) -> None:
        self.ctx = ctx
        self.move(key)
        self.client_id = client_id
        self.state = State.DISCONNECTED
        self.clean = True
        self.duration = 0
        self.sleep_duration = 0
        self.last_rx = now
        #: Heard from since its CONNACK (see ``MqttSnSettings.unproven_share``).
        self.proven = False
        #: Keep alive, sleep or CONNECT deadline; ``retry_timer``: the step in flight.
        self.timer: Handle | None = None
        self.retry_timer: Handle | None = None
        self.retries = 0
        self.proxy: ProxyClient | None = None
        self.will: Will | None = None
        #: Topic name -> id, for ids this gateway assigned (section 6.5). Looked up
        #: backwards by a scan: the table is small (``max_topics_per_client``) and one
        #: dict per client instead of two saves memory on idle clients.
        self.topic_ids: dict[str, int] | None = None
        self.next_topic_id = 1
        self.next_msg_id = 1
        self.queue: deque[Outbound] | None = None
        self.inflight: Outbound | None = None
        self.inbound_qos2: set[int] | None = None
        #: Deliveries wait while a SUBACK is being written (retained messages follow it).
        self.holding = False
        #: Output to this client waits for this store batch (acknowledged means durable).
        self.held_batch = 0

    def move(self, key: Key) -> None:
        """The client is at ``key`` now (a new source port, a new forwarder)."""
        self.key = key
        self.transport, self.address, self.node_id = key
        self.source = source(self.address)
        self.origin = origin(key)

    def __repr__(self) -> str:
        return f"SnClient({self.client_id!r}, {self.state.name}, {self.where})"

    @property
    def where(self) -> str:
        return where(self.key)

    def receive(self, msg: Message, qos: int, retain: bool, _sub_ids: tuple[int, ...]) -> None:
        """The broker's sink: a message for this client's subscriptions."""
        self.ctx.deliver(self, msg, qos, retain)

    def allocate_msg_id(self) -> int:
        msg_id = self.next_msg_id
        self.next_msg_id = msg_id + 1 if msg_id < 0xFFFF else 1
        return msg_id
