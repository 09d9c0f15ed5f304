"""The records the broker core keeps, which point at each other: connections, sessions,
their subscriptions and outbound messages, and logins waiting for a password check.

Plain data: no sockets, no clock. A connection belongs to the shell's transport (its
``handle``) and, once connected, to a session; a session outlives its connection, so
a store can persist it and a restart restore it. Outbound QoS 1/2 messages are split,
as in mosquitto, into *inflight* (sent, awaiting acknowledgement, bounded by the
client's Receive Maximum) and *queued* (not yet sent, bounded by count and bytes);
their states are ``Flow`` and their transitions the table in ``gateway.broker.qos``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from gateway.broker.message import Message
from gateway.broker.timers import Handle
from gateway.mqtt.framer import PacketReader
from gateway.mqtt.packets import Connect, Will

if TYPE_CHECKING:
    from gateway.broker.acl import Rules
    from gateway.broker.auth import ListenerPolicy, PasswordCheck


class State(IntEnum):
    """Where a connection is in its life."""

    NEW = 0  # TCP open, CONNECT not yet processed
    CONNECTED = 1  # CONNACK 0x00 sent
    CLOSING = 2  # the broker decided to close; flushing output
    CLOSED = 3  # the shell reported the transport gone


class Flow(IntEnum):
    """Where an outbound QoS 1/2 message is in its flow (MQTT 5.0 section 4.3); the
    values are stored, so they never change."""

    QUEUED = 0  # not yet sent; no packet identifier
    AWAIT_ACK = 1  # PUBLISH sent; awaiting PUBACK (QoS 1) or PUBREC (QoS 2)
    AWAIT_COMP = 2  # PUBREL sent; awaiting PUBCOMP
    DONE = 3  # acknowledged: the message leaves the session


#: The topic alias maps of a connection that has none (never written to).
_NO_ALIASES_OUT: dict[str, int] = {}
_NO_ALIASES_IN: dict[int, str] = {}


class Connection:
    """Per-connection protocol state (one writer: the broker core)."""

    __slots__ = (
        "abort",
        "aliases_in",
        "aliases_out",
        "bridge",
        "client_id",
        "dropped",
        "evicted",
        "generation",
        "graceful",
        "handle",
        "held",
        "id",
        "identity",
        "in_dirty",
        "keep_alive",
        "last_rx",
        "listener",
        "opened_at",
        "out",
        "out_bytes",
        "overflow",
        "paused_at",
        "peer",
        "peer_alias_max",
        "peer_max_packet",
        "peer_receive_max",
        "pending",
        "policy",
        "problem_info",
        "reader",
        "rules",
        "session",
        "source",
        "state",
        "stuck_timer",
        "timer",
        "username",
        "version",
        "will",
        "writable",
    )

    def __init__(self, max_packet_size: int) -> None:
        """An unused slot; ``reset`` makes it a connection."""
        self.reader = PacketReader(max_packet_size)
        self.out: list[bytes] = []
        self.aliases_out: dict[str, int] = _NO_ALIASES_OUT
        self.aliases_in: dict[int, str] = _NO_ALIASES_IN
        #: Counts reuses of this slot; timers compare it to know they are still current.
        self.generation = 0
        #: A connection beyond the pool, kept only to refuse its CONNECT properly.
        self.overflow = False
        #: Closed before its CONNACK to make room: its slot went to a newcomer at once,
        #: so this object does not go back to the pool.
        self.evicted = False
        self.reset(0, "", "", 0.0)

    def reset(
        self,
        conn_id: int,
        peer: str,
        listener: str,
        now: float,
        policy: ListenerPolicy | None = None,
        identity: str | None = None,
    ) -> None:
        """Make this slot a fresh connection (nothing of the previous one survives)."""
        self.generation += 1
        self.id = conn_id
        self.peer = peer
        #: The address the per-address limits count (an IPv6 /64 counts as one).
        self.source = ""
        self.listener = listener
        #: The listener's authentication and ACL (None: the broker's defaults).
        self.policy = policy
        #: The CN of a verified TLS client certificate.
        self.identity = identity
        #: The CONNECT whose password is being checked (or waits for its turn).
        self.pending: LoginAttempt | None = None
        #: What the ACL lets this client do (None: no ACL, everything).
        self.rules: Rules | None = None
        self.handle: Any = None
        self.reader.reset()
        self.version = 0
        #: A bridge (CONNECT's protocol level with the top bit, Mosquitto's try_private).
        self.bridge = False
        self.state = State.NEW
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        self.keep_alive = 0
        self.last_rx = now
        self.opened_at = now
        self.out.clear()
        self.out_bytes = 0
        self.in_dirty = False
        self.writable = True
        #: When the transport last paused writing (the client stopped reading).
        self.paused_at = 0.0
        #: Close without flushing (a slow consumer's output will never drain).
        self.abort = False
        #: The pending connect or keep-alive deadline, and the slow-consumer deadline.
        self.timer: Handle | None = None
        self.stuck_timer: Handle | None = None
        #: Output waiting for store batches to commit: [(batch id, chunks)], or None.
        self.held: list[tuple[int, list[bytes]]] | None = None
        #: The client's Maximum Packet Size (None: no limit beyond the protocol's).
        self.peer_max_packet: int | None = None
        #: The client's Receive Maximum: QoS 1/2 PUBLISHes we may have unacknowledged.
        self.peer_receive_max = 65_535
        #: The client's Topic Alias Maximum: how many aliases we may use towards it.
        self.peer_alias_max = 0
        # Shared empty maps until a client uses topic aliases (writers replace them
        # first): a thousand idle slots do not each hold two dicts.
        self.aliases_out = _NO_ALIASES_OUT
        self.aliases_in = _NO_ALIASES_IN
        self.problem_info = True
        self.will: Will | None = None
        #: True once a DISCONNECT 0x00 (or 3.1.1 DISCONNECT) arrived: no will.
        self.graceful = False
        #: QoS 0 messages dropped for this connection by the slow-consumer policy.
        self.dropped = 0

    def __repr__(self) -> str:
        return f"Connection(#{self.id} {self.client_id!r} from {self.peer} {self.state.name})"

    @property
    def label(self) -> str:
        """How logs name this connection."""
        if self.client_id:
            return f"{self.client_id!r} ({self.peer})"
        return f"#{self.id} ({self.peer})"

    def take_output(self) -> list[bytes]:
        out = self.out
        self.out = []
        self.out_bytes = 0
        self.in_dirty = False
        return out


class LoginAttempt:
    """A CONNECT whose password is being checked, or waits for its turn."""

    __slots__ = ("check", "conn", "generation", "key", "packet", "username")

    def __init__(
        self,
        conn: Connection,
        packet: Connect,
        username: str | None,
        check: PasswordCheck,
        key: str,
    ) -> None:
        self.conn = conn
        self.generation = conn.generation
        self.packet = packet
        self.username = username
        self.check = check
        self.key = key

    def __repr__(self) -> str:
        return f"LoginAttempt({self.username!r} from {self.key})"

    @property
    def live(self) -> bool:
        """Is the connection still there, waiting for this very attempt?"""
        conn = self.conn
        return conn.generation == self.generation and conn.pending is self


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
        self.state = Flow.QUEUED
        self.share = share
        #: Position in the store's queue of its session (0: not stored).
        self.seq = 0

    def __repr__(self) -> str:
        return (
            f"Outgoing({self.message.topic!r}, qos={self.qos}, pid={self.packet_id}, "
            f"state={self.state.name})"
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
