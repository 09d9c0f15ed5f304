"""The firmware bridge's records: client states, outbound steps, messages, counters.

Plain data that every module of the gateway reads (``state.py`` of the broker core).
The client record itself, ``SnClient``, lives with the ``Context`` it points back to
(``context.py``). Section numbers refer to the MQTT-SN 1.2 specification.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Final

from gateway.broker.proxy import INVALID, NO_ROOM, NOT_AUTHORIZED
from gateway.mqttsn.packets import ReturnCode, TopicIdType

if TYPE_CHECKING:
    from gateway.broker.message import Message

#: Whatever a transport tells its peers apart by: a UDP ``(host, port)``, a serial
#: line's name.
Address = Hashable
#: Where a client is: transport label, address, and its node id behind a forwarder
#: (section 5.5; ``b""`` when it talks to us directly).
Key = tuple[str, Address, bytes]
#: One datagram or frame to send: transport label, address, bytes.
Datagram = tuple[str, Address, bytes]

#: The address of "everyone on this transport" (ADVERTISE).
BROADCAST: Final = "<broadcast>"

#: Inbound QoS 2 messages one client may have between PUBLISH and PUBREL; beyond that
#: its QoS 2 PUBLISH gets PUBACK "rejected: congestion".
MAX_INBOUND_QOS2: Final = 16

#: Longest client id accepted (the specification says 1-23 characters; like MQTT
#: 3.1.1 servers we accept longer ones).
MAX_CLIENT_ID: Final = 64

#: The return code (section 5.3.10) for each kind of broker refusal: MQTT-SN has no
#: "not authorized", so what the ACL forbids is "not supported".
RETURN_CODES: Final = {
    NOT_AUTHORIZED: ReturnCode.NOT_SUPPORTED,
    NO_ROOM: ReturnCode.CONGESTION,
    INVALID: ReturnCode.INVALID_TOPIC_ID,
}


class State(IntEnum):
    """Client states, section 6.14 Figure 4 (``CONNECTING``: in the Will prompts)."""

    CONNECTING = 0
    ACTIVE = 1
    ASLEEP = 2
    AWAKE = 3
    DISCONNECTED = 4  # clean session 0: subscriptions and registrations remembered


#: States in which a client has a connection (PUBLISH, SUBSCRIBE... are taken).
CONNECTED_STATES: Final = frozenset({State.ACTIVE, State.ASLEEP, State.AWAKE})
#: States without a connection: a message that needs one is answered DISCONNECT.
UNCONNECTED_STATES: Final = frozenset({State.CONNECTING, State.DISCONNECTED})
#: A sleeping client (6.14): its messages wait in its queue until it wakes.
SLEEPING_STATES: Final = frozenset({State.ASLEEP, State.AWAKE})


class Step(IntEnum):
    """Where one message on its way to a client is (``qos.SENDER`` moves it on).

    Section 6.13 retransmission applies to each step in flight."""

    #: In the client's queue, not sent yet (a message whose REGISTER failed with
    #: "invalid topic id" returns here, to be registered again).
    QUEUED = 0
    #: REGISTER sent; the message stays at the head of the queue until the REGACK.
    REGISTERING = 1
    AWAIT_PUBACK = 2
    AWAIT_PUBREC = 3
    AWAIT_PUBCOMP = 4
    #: Acknowledged, or refused by the client: it leaves the client.
    DONE = 5


@dataclass(frozen=True, slots=True)
class TransportPolicy:
    """What a transport lets in."""

    label: str
    allow_client_ids: frozenset[str] = frozenset()
    #: ADVERTISE can be sent (broadcast addresses, or a serial line).
    can_broadcast: bool = False


class Outbound:
    """One message on its way to one client."""

    __slots__ = ("id_type", "message", "msg_id", "qos", "retain", "step", "topic_id")

    def __init__(self, message: Message, qos: int, retain: bool) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.msg_id = 0
        self.topic_id = 0
        self.id_type: int = TopicIdType.NORMAL
        self.step = Step.QUEUED


class Will:
    __slots__ = ("message", "qos", "retain", "topic")

    def __init__(self, topic: str, qos: int, retain: bool) -> None:
        self.topic = topic
        self.qos = qos
        self.retain = retain
        self.message = b""


@dataclass(slots=True)
class SnStats:
    """The firmware bridge's counters (``$SYS/broker/mqttsn/...``)."""

    messages_received: int = 0
    messages_sent: int = 0
    malformed: int = 0
    connects: int = 0
    clients_refused: int = 0
    clients_lost: int = 0
    clients_evicted: int = 0
    #: Connected clients without a keep-alive evicted for a newcomer (table full).
    clients_evicted_silent: int = 0
    #: CONNECTs refused because their source IP has ``max_clients_per_address``.
    clients_refused_per_address: int = 0
    #: CONNECTs refused for ``max_connect_rate`` or ``max_connect_rate_per_address``.
    clients_refused_rate: int = 0
    #: Unproven clients (silent since their CONNACK) evicted for a newcomer.
    clients_evicted_unproven: int = 0
    #: PINGREQs and CONNECTs naming a sleeping client, sent from elsewhere than it
    #: connected from (refused).
    wakes_refused: int = 0
    dropped_queue_full: int = 0
    dropped_topic_table: int = 0
    dropped_offline_qos0: int = 0
    dropped_too_large: int = 0
    publish_refused: int = 0
    qos_minus_one: int = 0
    retransmissions: int = 0
    not_connected: int = 0
