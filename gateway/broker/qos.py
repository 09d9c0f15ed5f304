"""The QoS 1 and 2 flows towards a subscriber as one transition table (MQTT 5.0 4.3).

h11's ``_state.py`` shape: the table is the documentation. An outbound message is
``Flow.QUEUED`` until it is put in flight (``delivery.send_new``: ``AWAIT_ACK``);
from there each acknowledgement the subscriber sends moves it on, and ``DONE`` means
it leaves the session. An acknowledgement with no row is for no message we have in
that state: a PUBREC is answered with PUBREL 0x92 (Packet Identifier not found),
PUBACK and PUBCOMP are ignored -- except an acknowledgement of the other QoS's flow for
a message in flight (a PUBREC or PUBCOMP for QoS 1, a PUBACK for QoS 2), a protocol
error that closes the connection (``handle_publish``).

Inbound QoS 2 (a client publishing to us) is the spec's method A, in
``publish_policy``: the message is routed on PUBLISH and its packet identifier kept
until PUBREL, so a re-sent PUBLISH is acknowledged again but never routed twice.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from gateway.broker.state import Flow


class Ack(Enum):
    """What a subscriber sends back for a QoS 1/2 PUBLISH."""

    PUBACK = "PUBACK"
    PUBREC = "PUBREC"
    PUBREC_ERROR = "PUBREC with a reason code of 0x80 or more"
    PUBCOMP = "PUBCOMP"


#: (QoS of the delivery, state, acknowledgement) -> next state.
SENDER: Final[dict[tuple[int, Flow, Ack], Flow]] = {
    (1, Flow.AWAIT_ACK, Ack.PUBACK): Flow.DONE,
    (2, Flow.AWAIT_ACK, Ack.PUBREC): Flow.AWAIT_COMP,  # PUBREL goes out
    # MQTT-4.3.3-4 note: an error PUBREC ends the flow; the identifier is free again.
    (2, Flow.AWAIT_ACK, Ack.PUBREC_ERROR): Flow.DONE,
    (2, Flow.AWAIT_COMP, Ack.PUBREC): Flow.AWAIT_COMP,  # a repeated PUBREC: PUBREL again
    (2, Flow.AWAIT_COMP, Ack.PUBREC_ERROR): Flow.DONE,
    (2, Flow.AWAIT_COMP, Ack.PUBCOMP): Flow.DONE,
}


def after(qos: int, state: Flow, ack: Ack) -> Flow | None:
    """The state ``ack`` moves a message to, or None when it does not apply."""
    return SENDER.get((qos, state, ack))
