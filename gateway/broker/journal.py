"""The journal: changes to persistent state, as operations for the store. Pure.

When the broker runs with a store, every change to a persistent session (one
with a Session Expiry Interval above zero, or a 3.1.1 clean-session-0 session),
to its subscriptions and QoS 1/2 messages, and to retained messages is appended
here as a typed operation (a named tuple of plain values, in the order of the
store's columns). The shell seals the operations into numbered batches; the
store commits them in order and reports back.

Acknowledged means durable: output that depends on a change -- the PUBACK or
PUBREC to a publisher, a QoS 1/2 PUBLISH or PUBREL to a persistent subscriber,
a SUBACK -- is *held* on its connection, tagged with the batch holding the
change, and released only once that batch is committed. Later output to the same
connection queues behind it, so the order a client sees never changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from gateway.broker.state import Outgoing, Session, Subscription
from gateway.mqtt.packets import Will
from gateway.mqtt.properties import encode_properties

if TYPE_CHECKING:
    from gateway.broker.message import Message
    from gateway.broker.state import Connection


# ----------------------------------------------------------------- the operations


class SaveSession(NamedTuple):
    """A session created, resumed, disconnected, or its delayed will changed."""

    client_id: str
    expiry_interval: int
    expires_at: float | None  # on the core's clock
    protocol_version: int
    will: Will | None
    will_due: float | None  # on the core's clock


class EndSession(NamedTuple):
    """The session and everything it holds are gone."""

    client_id: str


class AddSubscription(NamedTuple):
    client_id: str
    key: str
    topic_filter: str
    qos: int
    no_local: int
    retain_as_published: int
    retain_handling: int
    identifier: int | None
    share_name: str | None


class RemoveSubscription(NamedTuple):
    client_id: str
    key: str


class StoreMessage(NamedTuple):
    """A message some stored queue entry refers to (stored once)."""

    message_id: int
    topic: str
    payload: bytes
    qos: int
    retain: int
    properties: bytes
    origin: str | None
    expiry_interval: int | None
    created: float  # on the core's clock


class ForgetMessage(NamedTuple):
    message_id: int


class AddEntry(NamedTuple):
    """A QoS 1/2 message queued or in flight for a persistent session."""

    client_id: str
    seq: int
    message_id: int
    qos: int
    retain: int
    sub_ids: tuple[int, ...]
    packet_id: int
    state: int
    share: tuple[str, str] | None


class MoveEntry(NamedTuple):
    """An entry moved on in its flow (a packet id given, PUBREC received)."""

    client_id: str
    seq: int
    packet_id: int
    state: int


class RemoveEntry(NamedTuple):
    client_id: str
    seq: int


class AddIncoming(NamedTuple):
    """An inbound QoS 2 packet id awaiting PUBREL."""

    client_id: str
    packet_id: int


class RemoveIncoming(NamedTuple):
    client_id: str
    packet_id: int


class Retain(NamedTuple):
    topic: str
    payload: bytes
    qos: int
    properties: bytes
    origin: str | None
    expiry_interval: int | None
    created: float  # on the core's clock


class Unretain(NamedTuple):
    topic: str


class PutOutbox(NamedTuple):
    """A message entering a bridge's outbox (times are wall-clock already)."""

    bridge: str
    pos: int
    seq: int
    topic: str
    payload: bytes
    qos: int
    retain: int
    properties: bytes
    created: float
    expires: float | None


class RemoveOutbox(NamedTuple):
    bridge: str
    pos: int


class SetMeta(NamedTuple):
    key: str
    value: str


class StepClock(NamedTuple):
    """The system clock was set ``step`` seconds forward (or back): every wall-clock
    time in the store moves with it."""

    step: float


#: One operation for the store (see gateway.store.sqlite for what each one writes).
Op = (
    SaveSession
    | EndSession
    | AddSubscription
    | RemoveSubscription
    | StoreMessage
    | ForgetMessage
    | AddEntry
    | MoveEntry
    | RemoveEntry
    | AddIncoming
    | RemoveIncoming
    | Retain
    | Unretain
    | PutOutbox
    | RemoveOutbox
    | SetMeta
    | StepClock
)


class Journal:
    __slots__ = ("batch_id", "holding", "next_message_id", "next_seq", "ops")

    def __init__(self, next_seq: int = 1, next_message_id: int = 1) -> None:
        self.ops: list[Op] = []
        #: The batch now being filled (sealed batches have smaller ids).
        self.batch_id = 1
        #: Connections with held output.
        self.holding: list[Connection] = []
        self.next_seq = next_seq
        self.next_message_id = next_message_id

    # ------------------------------------------------------------------ holding

    def hold(self, conn: Connection) -> None:
        """From now on output to ``conn`` waits for the current batch to commit."""
        held = conn.held
        if held is None:
            conn.held = [(self.batch_id, [])]
            self.holding.append(conn)
        elif held[-1][0] != self.batch_id:
            held.append((self.batch_id, []))

    def held_append(self, conn: Connection, data: bytes) -> None:
        held = conn.held
        assert held is not None
        if held[-1][0] != self.batch_id:
            held.append((self.batch_id, []))
        held[-1][1].append(data)

    def seal(self) -> tuple[int, list[Op]] | None:
        """Close the current batch (None when it is empty and nothing waits on it)."""
        if not self.ops and not any(
            c.held and c.held[-1][0] == self.batch_id for c in self.holding
        ):
            return None
        batch = (self.batch_id, self.ops)
        self.ops = []
        self.batch_id += 1
        return batch

    def release(self, upto: int) -> list[tuple[Connection, list[bytes]]]:
        """Output of every batch up to ``upto`` (committed), per connection, in order."""
        out: list[tuple[Connection, list[bytes]]] = []
        keep: list[Connection] = []
        for conn in self.holding:
            held = conn.held
            if held is None:
                continue  # the connection closed: its held output was dropped
            chunks: list[bytes] = []
            while held and held[0][0] <= upto:
                chunks.extend(held.pop(0)[1])
            if chunks:
                out.append((conn, chunks))
            if held:
                keep.append(conn)
            else:
                conn.held = None
        self.holding = keep
        return out

    # ------------------------------------------------------------------ sessions

    def session(self, s: Session) -> None:
        """Write ``s`` (creation, resumption, disconnect, a delayed will)."""
        if s.expiry_interval > 0:
            s.persisted = True
            self.ops.append(
                SaveSession(
                    s.client_id,
                    s.expiry_interval,
                    s.expires_at,
                    s.protocol_version,
                    s.will,
                    s.will_due,
                )
            )
        elif s.persisted:
            self.session_end(s)

    def session_end(self, s: Session) -> None:
        if not s.persisted:
            return
        s.persisted = False
        self.ops.append(EndSession(s.client_id))
        for entry in [*s.inflight.values(), *s.queue]:
            if entry.seq:
                entry.seq = 0
                self._unref(entry.message)

    def subscribe(self, s: Session, sub: Subscription) -> None:
        if s.persisted:
            self.ops.append(
                AddSubscription(
                    s.client_id,
                    sub.key,
                    sub.topic_filter,
                    sub.qos,
                    int(sub.no_local),
                    int(sub.retain_as_published),
                    sub.retain_handling,
                    sub.identifier,
                    sub.share_name,
                )
            )

    def unsubscribe(self, s: Session, key: str) -> None:
        if s.persisted:
            self.ops.append(RemoveSubscription(s.client_id, key))

    # ------------------------------------------------------------------ messages

    def entry(self, s: Session, entry: Outgoing) -> None:
        """A QoS 1/2 message for ``s``: new (queued or in flight) or moving on."""
        if not s.persisted or entry.qos == 0:
            return
        if not entry.seq:
            entry.seq = self.next_seq
            self.next_seq += 1
            msg = entry.message
            if not msg.store_id:
                msg.store_id = self.next_message_id
                self.next_message_id += 1
                self.ops.append(
                    StoreMessage(
                        msg.store_id,
                        msg.topic,
                        msg.payload,
                        msg.qos,
                        int(msg.retain),
                        encode_properties(msg.properties),
                        msg.origin,
                        msg.expiry_interval,
                        msg.created,
                    )
                )
            msg.refs += 1
            self.ops.append(
                AddEntry(
                    s.client_id,
                    entry.seq,
                    msg.store_id,
                    entry.qos,
                    int(entry.retain),
                    entry.sub_ids,
                    entry.packet_id,
                    entry.state,
                    entry.share,
                )
            )
        else:
            self.ops.append(MoveEntry(s.client_id, entry.seq, entry.packet_id, entry.state))

    def entry_done(self, s: Session, entry: Outgoing) -> None:
        """Acknowledged, expired or dropped: the message is gone from ``s``."""
        if not entry.seq:
            return
        if s.persisted:
            self.ops.append(RemoveEntry(s.client_id, entry.seq))
        entry.seq = 0
        self._unref(entry.message)

    def _unref(self, msg: Message) -> None:
        msg.refs -= 1
        if msg.refs <= 0 and msg.store_id:
            self.ops.append(ForgetMessage(msg.store_id))
            msg.store_id = 0
            msg.refs = 0

    def incoming(self, s: Session, pid: int) -> None:
        if s.persisted:
            self.ops.append(AddIncoming(s.client_id, pid))

    def incoming_done(self, s: Session, pid: int) -> None:
        if s.persisted:
            self.ops.append(RemoveIncoming(s.client_id, pid))

    def retain(self, msg: Message) -> None:
        if msg.topic.startswith("$SYS"):
            return  # regenerated every interval: never worth a write to the SD card
        if msg.payload:
            self.ops.append(
                Retain(
                    msg.topic,
                    msg.payload,
                    msg.qos,
                    encode_properties(msg.properties),
                    msg.origin,
                    msg.expiry_interval,
                    msg.created,
                )
            )
        else:
            self.ops.append(Unretain(msg.topic))
