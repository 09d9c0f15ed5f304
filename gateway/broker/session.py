"""Session state as plain data, so a store can persist it and a restart restore it.

A session outlives its network connection. Outbound QoS 1/2 messages are split,
as in mosquitto, into *inflight* (sent, awaiting acknowledgement, bounded by the
client's Receive Maximum) and *queued* (not yet sent, bounded by count and bytes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gateway.broker.message import Message
from gateway.broker.timers import Handle
from gateway.mqtt.packets import Will

if TYPE_CHECKING:
    from gateway.broker.acl import Rules
    from gateway.broker.connection import Connection

#: Outbound message states (the QoS 1/2 sender table, MQTT 5.0 section 4.3).
QUEUED: Final = 0  # not yet sent; no packet identifier
AWAIT_ACK: Final = 1  # PUBLISH sent; awaiting PUBACK (QoS 1) or PUBREC (QoS 2)
AWAIT_COMP: Final = 2  # PUBREL sent; awaiting PUBCOMP


@dataclass(slots=True)
class Subscription:
    """One subscription of one session, with its options (MQTT 5.0 section 3.8.3.1)."""

    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None
    share_name: str | None = None

    @property
    def key(self) -> str:
        """The filter as the client wrote it (with ``$share/{name}/`` when shared)."""
        if self.share_name is None:
            return self.topic_filter
        return f"$share/{self.share_name}/{self.topic_filter}"


class Outgoing:
    """One message on its way to one session."""

    __slots__ = ("message", "packet_id", "qos", "retain", "seq", "share", "state", "sub_ids")

    def __init__(
        self,
        message: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...] = (),
        share: tuple[str, str] | None = None,
    ) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.packet_id = 0
        self.state = QUEUED
        self.share = share
        #: Position in the store's queue of its session (0: not stored).
        self.seq = 0

    def __repr__(self) -> str:
        return (
            f"Outgoing({self.message.topic!r}, qos={self.qos}, pid={self.packet_id}, "
            f"state={self.state})"
        )


class Session:
    """Everything the broker keeps for one client identifier."""

    __slots__ = (
        "client_id",
        "conn",
        "connected_expiry_zero",
        "expires_at",
        "expiry_interval",
        "expiry_timer",
        "incoming_qos2",
        "inflight",
        "listener",
        "next_packet_id",
        "persisted",
        "protocol_version",
        "queue",
        "queued_bytes",
        "rules",
        "sink",
        "subscriptions",
        "username",
        "will",
        "will_due",
        "will_timer",
    )

    def __init__(self, client_id: str, expiry_interval: int = 0) -> None:
        self.client_id = client_id
        self.subscriptions: dict[str, Subscription] = {}
        self.expiry_interval = expiry_interval
        self.expires_at: float | None = None
        self.inflight: dict[int, Outgoing] = {}
        self.queue: deque[Outgoing] = deque()
        self.queued_bytes = 0
        self.incoming_qos2: set[int] = set()
        self.next_packet_id = 1
        self.conn: Connection | None = None
        #: A will waiting for its Will Delay Interval after the connection closed.
        self.will: Will | None = None
        self.will_due: float | None = None
        self.will_timer: Handle | None = None
        self.expiry_timer: Handle | None = None
        self.protocol_version = 4
        #: The CONNECT asked for Session Expiry 0: a later non-zero value is a protocol error.
        self.connected_expiry_zero = False
        #: The store holds this session (it has an expiry interval above zero).
        self.persisted = False
        #: For an in-process client: where its messages go (see gateway.broker.local).
        self.sink: Callable[[Message, int, bool, tuple[int, ...]], None] | None = None
        #: Who it last connected as, through which listener, and what the ACL lets it
        #: read and write (None: everything). Not stored: set again at every CONNECT.
        self.username: str | None = None
        self.listener: str | None = None
        self.rules: Rules | None = None

    def __repr__(self) -> str:
        return (
            f"Session({self.client_id!r}, subs={len(self.subscriptions)}, "
            f"inflight={len(self.inflight)}, queued={len(self.queue)})"
        )

    def allocate_packet_id(self) -> int:
        """A packet identifier not in use by an outbound flow (MQTT-2.2.1-3)."""
        pid = self.next_packet_id
        inflight = self.inflight
        for _ in range(65_535):
            if pid not in inflight:
                break
            pid = pid + 1 if pid < 65_535 else 1
        else:
            raise RuntimeError("all 65,535 packet identifiers are in use")
        self.next_packet_id = pid + 1 if pid < 65_535 else 1
        return pid
