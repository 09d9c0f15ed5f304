"""SUBSCRIBE and UNSUBSCRIBE (MQTT 5.0 3.8 - 3.11), with retained delivery on subscribe."""

from __future__ import annotations

import logging
from dataclasses import replace

from gateway.broker.acl import denied_by
from gateway.broker.context import Context
from gateway.broker.delivery import deliver
from gateway.broker.output import send
from gateway.broker.state import Connection, Session, Subscription
from gateway.mqtt.errors import MalformedPacket, MQTTError, ProtocolError
from gateway.mqtt.packets import (
    MQTT_5,
    MQTT_31,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
)
from gateway.mqtt.reason_codes import ReasonCode, describe
from gateway.mqtt.topics import filter_error, has_wildcard, parse_shared

log = logging.getLogger("ledge.broker")


def handle_subscribe(ctx: Context, conn: Connection, packet: Subscribe, now: float) -> None:
    settings = ctx.settings
    session = conn.session
    assert session is not None
    sub_id: int | None = None
    if packet.properties.subscription_identifiers:
        if not settings.subscription_identifiers:
            raise MQTTError(
                "subscription identifiers are disabled",
                ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
            )
        sub_id = packet.properties.subscription_identifiers[0]
    # The whole packet is checked before any of it is applied: one filter that is not
    # a topic filter makes the SUBSCRIBE malformed (MQTT 5.0 4.7.1, 4.7.3, 4.8.2).
    parsed = [(request, _parse_filter(request.topic_filter)) for request in packet.subscriptions]
    codes: list[int] = []
    added: list[tuple[Subscription, bool]] = []
    for request, shared in parsed:
        code, sub, is_new = _subscribe_one(ctx, conn, session, request, shared, sub_id)
        if code >= 0x80 and conn.version != MQTT_5:
            if conn.version == MQTT_31:
                # MQTT 3.1 SUBACKs carry granted QoS only: the refusal cannot be told,
                # so the subscription is not made, the SUBACK grants, and it is logged.
                log.warning(
                    "subscription %r of MQTT 3.1 client %s not made (%s); its SUBACK cannot say so",
                    request.topic_filter,
                    conn.label,
                    describe(code),
                )
                code = request.qos
            else:
                code = ReasonCode.UNSPECIFIED_ERROR  # 3.1.1 knows one failure code: 0x80
        codes.append(code)
        if sub is not None:
            added.append((sub, is_new))
    journal = ctx.journal
    if journal is not None and session.persisted and added:
        for sub, _is_new in added:
            journal.subscribe(session, sub)
        journal.hold(conn)  # SUBACK once the subscriptions are stored
    send(ctx, conn, SubAck(packet.packet_id, tuple(codes)))
    for sub, is_new in added:
        if sub.share_name is not None:
            continue  # no retained messages for shared subscriptions (MQTT 5.0 4.8.2)
        if sub.retain_handling == 2 or (sub.retain_handling == 1 and not is_new):
            continue  # MQTT-3.3.1-10, -11
        _send_retained(ctx, session, sub, now)


def _parse_filter(raw: str) -> tuple[str, str] | None:
    """``(share name, filter)`` of a shared subscription, None for a plain filter; a
    string that is not a topic filter makes the packet malformed."""
    try:
        shared = parse_shared(raw)
    except ValueError as exc:
        raise MalformedPacket(f"topic filter {raw!r}: {exc}") from None
    if shared is None:
        error = filter_error(raw)
        if error:
            raise MalformedPacket(f"topic filter {raw!r}: {error}")
    return shared


def _subscribe_one(
    ctx: Context,
    conn: Connection,
    session: Session,
    request: SubscriptionRequest,
    shared: tuple[str, str] | None,
    sub_id: int | None,
) -> tuple[int, Subscription | None, bool]:
    settings = ctx.settings
    raw = request.topic_filter
    if shared is not None:
        share_name, topic_filter = shared
        if not settings.shared_subscriptions:
            return ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, None, False
        if request.no_local:
            # MQTT-3.8.3-4
            raise ProtocolError("No Local on a shared subscription")
    else:
        share_name, topic_filter = None, raw
        if conn.bridge:
            # A bridge's 3.1.1 subscription cannot say so itself: as Mosquitto does, it
            # gets No Local (its own messages do not come back, no loop) and Retain As
            # Published (a retained message crosses as retained).
            request = replace(request, no_local=True, retain_as_published=True)
    if not settings.wildcard_subscriptions and has_wildcard(topic_filter):
        return ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, None, False
    denied = denied_by(settings.deny_subscriptions, topic_filter)
    if denied is not None:
        log.info("refusing subscription %r of %s: denied by %r", raw, conn.label, denied)
        return settings.deny_subscription_code, None, False
    rules = conn.rules
    if rules is not None and not rules.can_subscribe(topic_filter):
        if settings.acl_denied_subscribe == "refuse":
            log.info("refusing subscription %r of %s: not authorized by the ACL", raw, conn.label)
            return ReasonCode.NOT_AUTHORIZED, None, False
        # "grant" (Mosquitto's way): the subscription is made and the ACL filters what
        # it delivers, so nothing the client may not read reaches it.
        log.info("subscription %r of %s can deliver nothing the ACL allows", raw, conn.label)
    is_new = raw not in session.subscriptions
    if is_new and len(session.subscriptions) >= settings.max_subscriptions_per_client:
        log.warning(
            "refusing subscription %r of %s: limit of %d subscriptions per client",
            raw,
            conn.label,
            settings.max_subscriptions_per_client,
        )
        return ReasonCode.QUOTA_EXCEEDED, None, False
    granted = request.qos
    sub = Subscription(
        topic_filter,
        granted,
        request.no_local,
        request.retain_as_published,
        request.retain_handling,
        sub_id,
        share_name,
    )
    old = session.subscriptions.get(raw)
    if old is not None:
        ctx.index.remove(session, old)  # MQTT-3.8.4-3: replaced, not added
    session.subscriptions[raw] = sub
    ctx.index.add(session, sub)
    return granted, sub, is_new


def _send_retained(ctx: Context, session: Session, sub: Subscription, now: float) -> None:
    ids = (sub.identifier,) if sub.identifier else ()
    rules = session.rules
    for msg in ctx.retained.matching(sub.topic_filter, now):
        if sub.no_local and msg.origin == session.client_id:
            continue
        if rules is not None and not rules.can_read(msg.topic):
            continue  # the ACL: a retained message is delivered like any other
        qos = sub.qos if sub.qos < msg.qos else msg.qos
        # MQTT-3.3.1-9: RETAIN is 1 when sent because of a new subscription.
        deliver(ctx, session, msg, qos, True, ids, None, now)


def handle_unsubscribe(ctx: Context, conn: Connection, packet: Unsubscribe, now: float) -> None:
    session = conn.session
    assert session is not None
    for raw in packet.topic_filters:
        _parse_filter(raw)  # MQTT 5.0 4.7: the packet is malformed, nothing is applied
    codes: list[int] = []
    for raw in packet.topic_filters:
        sub = session.subscriptions.pop(raw, None)
        if sub is not None:
            ctx.index.remove(session, sub)
            if ctx.journal is not None and session.persisted:
                ctx.journal.unsubscribe(session, raw)
                ctx.journal.hold(conn)
            codes.append(ReasonCode.SUCCESS)
        else:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
    send(ctx, conn, UnsubAck(packet.packet_id, tuple(codes) if conn.version == MQTT_5 else ()))
