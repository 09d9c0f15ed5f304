"""Clients of another protocol as broker sessions (the firmware bridge's MQTT-SN clients).

A ``ProxyClient`` is a ``LocalClient`` that stands for one remote device rather than
code inside the gateway, so the rules of an MQTT client apply to it: the ACL (as an
anonymous client under its client id), ``broker.deny_subscriptions``, the limit of
subscriptions per client, the refusal of QoS 1/2 messages the store or a bridge's
outbox cannot take, ``$SYS`` being the broker's (but for the client's own bridge state,
``publish_policy.sys_write_refused``), its will, and the counters
(``clients/connected``, ``publish/messages/received``, ``.../denied``). What it
receives is handed to its sink, which owns the device's delivery (QoS flows, sleep
buffers). This is the broker API the firmware bridge uses; it uses nothing else.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final, NamedTuple

from gateway.broker import publish_policy, sessions
from gateway.broker.acl import denied_by
from gateway.broker.delivery import deliver
from gateway.broker.local import LocalClient, Sink
from gateway.broker.state import Outgoing
from gateway.mqtt.packets import Will
from gateway.mqtt.properties import EMPTY
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.topics import SHARE_PREFIX, filter_error, has_wildcard

if TYPE_CHECKING:
    from gateway.broker.acl import Acl
    from gateway.broker.context import Context


# What kind of refusal (the other protocol picks its code from it).
NOT_AUTHORIZED: Final = "not authorized"
NO_ROOM: Final = "no room"
INVALID: Final = "invalid"


#: The kind of each of ``publish_policy.authorize``'s verdicts.
_KINDS: Final = {
    ReasonCode.NOT_AUTHORIZED: NOT_AUTHORIZED,
    ReasonCode.TOPIC_NAME_INVALID: INVALID,
    ReasonCode.QUOTA_EXCEEDED: NO_ROOM,
}


class Refusal(NamedTuple):
    """Why the broker refuses what a proxied client asked, and of which kind."""

    reason: str
    kind: str


#: Shared by every proxy session, and always empty (see ``ProxyClient.__init__``).
_NO_QUEUE: deque[Outgoing] = deque()
_NO_INFLIGHT: dict[int, Outgoing] = {}
_NO_QOS2: set[int] = set()


class ProxyClient(LocalClient):
    """One remote device as a connected session of ``broker``."""

    __slots__ = ("closed", "counted")

    def __init__(
        self,
        broker: Context,
        client_id: str,
        sink: Sink,
        *,
        acl: Acl | None,
        now: float,
        counted: bool = True,
    ) -> None:
        """``counted``: a device (counted as a connected client), or the gateway's own
        session for messages that name no client (QoS -1)."""
        super().__init__(broker, client_id, sink)
        # Its sink takes every message, so the session never queues, has nothing in
        # flight and no inbound QoS 2 of its own: it shares empty containers instead of
        # allocating its own (about 1 KiB a device, which a thousand devices feel).
        session = self.session
        session.queue = _NO_QUEUE
        session.inflight = _NO_INFLIGHT
        session.incoming_qos2 = _NO_QOS2
        self.closed = False
        self.counted = counted
        if acl is not None:
            sessions.apply_rules(broker, self.session, acl.rules_for(None, client_id), now)
        if not counted:
            return
        broker.connected += 1
        stats = broker.stats
        stats.connections_total += 1
        stats.clients_maximum = max(stats.clients_maximum, broker.connected)

    # ------------------------------------------------------------------ publishing

    def refusal(self, topic: str, qos: int, retain: bool, size: int) -> Refusal | None:
        """Why a PUBLISH from this device cannot be accepted now, or None: steps 5 and
        6 of the one PUBLISH policy (``publish_policy.authorize``; the device's own
        protocol does steps 1 to 4: its codec, its QoS 2 flow).

        A refused PUBLISH is counted as an MQTT client's is: in
        ``publish/messages/received`` and ``publish/messages/denied`` (one that passes
        is counted by ``publish_counted``)."""
        verdict = publish_policy.authorize(
            self.broker, self.client_id, self.session.rules, topic, qos, retain, size
        )
        if verdict is None:
            return None
        self.broker.stats.publish_received += 1  # and denied, by ``authorize``
        return Refusal(verdict.reason, _KINDS[verdict.code])

    def publish_counted(
        self, topic: str, payload: bytes, now: float, *, qos: int = 0, retain: bool = False
    ) -> int | None:
        """Route a message from the device (checked with ``refusal`` first).

        Returns the store batch that must commit before the message may be
        acknowledged (acknowledged means durable), or None when nothing was stored.
        """
        broker = self.broker
        broker.stats.publish_received += 1
        journal = broker.journal
        mark = len(journal.ops) if journal is not None else 0
        self.publish(topic, payload, now, qos=qos, retain=retain, properties=EMPTY)
        if journal is not None and len(journal.ops) != mark:
            return journal.batch_id
        return None

    # ------------------------------------------------------------------ subscribing

    def subscribe_checked(self, topic_filter: str, qos: int, now: float) -> Refusal | None:
        """Subscribe as the broker would subscribe an MQTT client, or say why not.

        Retained messages the device may read are handed to the sink at once.
        """
        broker = self.broker
        settings = broker.settings
        error = filter_error(topic_filter)
        if error:
            return Refusal(error, INVALID)
        if not settings.wildcard_subscriptions and has_wildcard(topic_filter):
            return Refusal("wildcard subscriptions are disabled", NOT_AUTHORIZED)
        denied = denied_by(settings.deny_subscriptions, topic_filter)
        if denied is not None:
            return Refusal(f"denied by broker.deny_subscriptions ({denied!r})", NOT_AUTHORIZED)
        rules = self.session.rules
        if rules is not None and not rules.can_subscribe(topic_filter):
            return Refusal("not authorized by the ACL", NOT_AUTHORIZED)
        subs = self.session.subscriptions
        if topic_filter not in subs and len(subs) >= settings.max_subscriptions_per_client:
            limit = settings.max_subscriptions_per_client
            return Refusal(f"limit of {limit} subscriptions per client", NO_ROOM)
        self.subscribe(topic_filter, qos, now, retained=False)
        with broker.event:  # an event of the core: the shell is woken when it is over
            for msg in broker.retained.matching(topic_filter, now):
                if rules is None or rules.can_read(msg.topic):
                    deliver(broker, self.session, msg, min(qos, msg.qos), True, (), None, now)
        return None

    # ------------------------------------------------------------------ end

    def publish_will(self, topic: str, payload: bytes, qos: int, retain: bool, now: float) -> None:
        """The device was lost: publish its will as the broker publishes any will
        (the ACL is checked again; ``$SYS`` -- but for the device's own
        ``$SYS/broker/connection/<client id>/state`` -- and ``$share/`` are refused)."""
        refused = publish_policy.sys_write_refused(topic, self.client_id)
        if refused or topic.startswith(SHARE_PREFIX):
            self.broker.stats.publish_denied += 1
            return
        broker = self.broker
        with broker.event:
            sessions.publish_will(
                broker, Will(topic, payload, qos, retain), self.client_id, now, self.session
            )

    def close(self, now: float) -> None:
        """The device's session ends: its subscriptions go, it no longer counts as
        connected."""
        if self.closed:
            return
        self.closed = True
        if self.counted:
            self.broker.connected -= 1
        super().close(now)
