"""The flow of a message towards a device as one transition table (sections 6.10, 6.13).

h11's shape, as the broker core's ``qos.py``: the table is the documentation. A
message for a client waits ``QUEUED`` in its bounded queue until the client can take
it (active, or awake from sleep) and nothing else is in flight: one message at a time
(6.13). A QoS 0 message is sent and done. A QoS 1/2 one on a topic the client has no
id for is ``REGISTERING`` first (it stays at the head of the queue until the REGACK;
``delivery.pump``), then ``AWAIT_PUBACK`` (QoS 1) or ``AWAIT_PUBREC`` (QoS 2, then
``AWAIT_PUBCOMP`` after PUBREL). Each acknowledgement the client sends moves it on;
``DONE`` means it leaves the client. An acknowledgement with no row -- another message
id, another step -- is ignored, as MQTT ignores one for no message it has. A step in
flight is sent again after ``retry_interval`` (DUP on a PUBLISH), ``max_retries``
times, and then the client is lost (``delivery``).

Inbound QoS 2 (a device publishing to us) is the broker's method A, in
``handle_publish``: routed on PUBLISH, its message id kept until PUBREL.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from gateway.mqttsn.state import Step


class Ack(Enum):
    """What a client sends back for a REGISTER or a QoS 1/2 PUBLISH."""

    REGACK = "REGACK accepted"
    REGACK_REFUSED = "REGACK with a rejection"
    PUBACK = "PUBACK accepted"
    #: The client lost the registration (it restarted): register again, resend.
    PUBACK_UNREGISTERED = "PUBACK 'rejected: invalid topic ID' for a normal topic id"
    PUBACK_REFUSED = "PUBACK with another rejection"
    PUBREC = "PUBREC"
    PUBCOMP = "PUBCOMP"


#: (step, acknowledgement) -> next step.
SENDER: Final[dict[tuple[Step, Ack], Step]] = {
    (Step.REGISTERING, Ack.REGACK): Step.QUEUED,  # registered: the PUBLISH follows
    (Step.REGISTERING, Ack.REGACK_REFUSED): Step.DONE,  # cannot be delivered: counted
    (Step.AWAIT_PUBACK, Ack.PUBACK): Step.DONE,
    (Step.AWAIT_PUBACK, Ack.PUBACK_UNREGISTERED): Step.QUEUED,  # back to the head
    (Step.AWAIT_PUBACK, Ack.PUBACK_REFUSED): Step.DONE,  # counted
    # 5.4.13: a PUBACK can answer any PUBLISH in error, also a QoS 2 one.
    (Step.AWAIT_PUBREC, Ack.PUBACK): Step.DONE,
    (Step.AWAIT_PUBREC, Ack.PUBACK_UNREGISTERED): Step.QUEUED,
    (Step.AWAIT_PUBREC, Ack.PUBACK_REFUSED): Step.DONE,
    (Step.AWAIT_PUBREC, Ack.PUBREC): Step.AWAIT_PUBCOMP,  # PUBREL goes out
    (Step.AWAIT_PUBCOMP, Ack.PUBREC): Step.AWAIT_PUBCOMP,  # a repeated PUBREC: PUBREL again
    (Step.AWAIT_PUBCOMP, Ack.PUBCOMP): Step.DONE,
}

#: The step a QoS 1/2 PUBLISH is in once sent (its topic has an id).
SENT: Final[dict[int, Step]] = {1: Step.AWAIT_PUBACK, 2: Step.AWAIT_PUBREC}


def after(step: Step, ack: Ack) -> Step | None:
    """The step ``ack`` moves a message in ``step`` to, or None when it does not apply."""
    return SENDER.get((step, ack))
