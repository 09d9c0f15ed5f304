"""The core's view of one network connection: protocol state and pending output.

No sockets here. The shell feeds received bytes to the broker and writes out
what collects in ``out``; ``handle`` is the shell's opaque reference back to its
transport.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any

from gateway.broker.timers import Handle
from gateway.mqtt.framer import PacketReader
from gateway.mqtt.packets import Will

if TYPE_CHECKING:
    from gateway.broker.acl import Rules
    from gateway.broker.auth import ListenerPolicy
    from gateway.broker.logins import LoginAttempt
    from gateway.broker.session import Session


#: The topic alias maps of a connection that has none (never written to).
_NO_ALIASES_OUT: dict[str, int] = {}
_NO_ALIASES_IN: dict[int, str] = {}


class State(IntEnum):
    NEW = 0  # TCP open, CONNECT not yet processed
    CONNECTED = 1  # CONNACK 0x00 sent
    CLOSING = 2  # the broker decided to close; flushing output
    CLOSED = 3  # the shell reported the transport gone


class Connection:
    """Per-connection protocol state (one writer: the broker core)."""

    __slots__ = (
        "abort",
        "aliases_in",
        "aliases_out",
        "client_id",
        "close_reason",
        "dropped",
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
        self.close_reason: str | None = None
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
