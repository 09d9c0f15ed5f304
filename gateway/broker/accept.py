"""The rest of a CONNECT once the client is authenticated: its will, its session (new,
resumed or taken over), the negotiated limits and the CONNACK (MQTT 5.0 3.1.2 - 3.2).

Reached from ``handle_connect`` at once, or from ``handle_login`` when a password
check has decided. A refusal is raised as ``closing.Refused``.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.broker import sessions
from gateway.broker.closing import Refused, fail, schedule_keepalive
from gateway.broker.context import Context
from gateway.broker.delivery import pump, resend_inflight
from gateway.broker.output import fits, send
from gateway.broker.publish_policy import sys_write_refused
from gateway.broker.state import Connection, Session, State
from gateway.mqtt.codec import encode
from gateway.mqtt.errors import MQTTError
from gateway.mqtt.packets import MQTT_5, MQTT_31, MQTT_311, ConnAck, Connect, Will
from gateway.mqtt.properties import EMPTY, Properties
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.wire import VARINT_MAX

log = logging.getLogger("ledge.broker")


def accept(
    ctx: Context, conn: Connection, packet: Connect, username: str | None, now: float
) -> None:
    """The rest of CONNECT, once the client is authenticated."""
    assigned = not packet.client_id
    settings = ctx.settings
    version = packet.protocol_version
    props = packet.properties
    client_id = conn.client_id
    policy = conn.policy
    acl = policy.acl if policy is not None else ctx.acl
    rules = acl.rules_for(username, client_id) if acl is not None else None

    # -- the will must be publishable
    will = packet.will
    if will is not None:
        problem = _will_problem(ctx, will, client_id)
        if problem is None and rules is not None and not rules.can_write(will.topic):
            problem = ReasonCode.NOT_AUTHORIZED, f"will on {will.topic!r} not authorized"
        if problem is not None:
            raise Refused(problem[1], problem[0])

    if ctx.shutting_down:
        raise Refused("server shutting down", ReasonCode.SERVER_UNAVAILABLE)

    existing = ctx.sessions.get(client_id)
    if existing is not None and existing.sink is not None:
        # In use inside the gateway (a driver, a bridge, the taps): never taken over.
        raise Refused(
            f"client identifier {client_id!r} is used inside the gateway",
            ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
        )
    takeover = existing is not None and existing.conn is not None

    # -- negotiated limits
    if version == MQTT_5:
        conn.peer_receive_max = props.receive_maximum or 65_535
        conn.peer_max_packet = props.maximum_packet_size
        conn.peer_alias_max = props.topic_alias_maximum or 0
    keep_alive = packet.keep_alive
    server_keep_alive: int | None = None
    if version == MQTT_5 and settings.max_keepalive and keep_alive > settings.max_keepalive:
        server_keep_alive = keep_alive = settings.max_keepalive
    conn.keep_alive = keep_alive

    # -- session expiry
    if version == MQTT_5:
        expiry = props.session_expiry_interval or 0
    else:
        expiry = 0 if packet.clean_start else settings.persistent_session_expiry
    granted_expiry = min(expiry, settings.max_session_expiry_interval)

    # -- the CONNACK's properties; one the client could not receive refuses the CONNECT
    # (MQTT-3.1.2-25: nothing larger than its Maximum Packet Size is sent to it)
    ack_props = EMPTY
    if version == MQTT_5:
        ack_props = _connack_properties(
            ctx, packet, client_id, assigned, expiry, granted_expiry, server_keep_alive
        )
        limit = conn.peer_max_packet
        if limit is not None and not fits(conn, len(encode(ConnAck(True, 0, ack_props), MQTT_5))):
            raise Refused(
                f"the CONNACK would exceed the client's maximum packet size of {limit}",
                ReasonCode.PACKET_TOO_LARGE,
            )

    # -- session takeover (MQTT-3.1.4-3): the old connection goes first
    if takeover:
        assert existing is not None and existing.conn is not None
        old = existing.conn
        log.info("client %r reconnected from %s: taking over its session", client_id, conn.peer)
        if old.will is not None and not sessions.will_survives_takeover(
            old.will, existing, packet.clean_start
        ):
            old.will = None
        fail(ctx, old, MQTTError("session taken over", ReasonCode.SESSION_TAKEN_OVER), now)
        existing = ctx.sessions.get(client_id)

    # -- session present or new (MQTT-3.1.2-4 .. -6)
    session_present = False
    if existing is not None:
        # A new connection for the client in time: a will waiting for its Will Delay
        # Interval is not sent (MQTT-3.1.3-9), even if Clean Start ends the session.
        sessions.resume(ctx, existing)
    if existing is not None and packet.clean_start:
        sessions.end(ctx, existing, now)
        existing = None
    if existing is not None:
        session = existing
        session_present = True
    else:
        session = Session(client_id)
        ctx.sessions[client_id] = session
    session.expiry_interval = granted_expiry
    session.connected_expiry_zero = granted_expiry == 0
    session.protocol_version = version
    session.username = username
    session.listener = conn.listener
    if session.rules != rules:
        sessions.apply_rules(ctx, session, rules, now)
    conn.rules = rules
    if ctx.journal is not None:
        ctx.journal.session(session)
    session.conn = conn
    conn.session = session
    conn.will = packet.will
    conn.state = State.CONNECTED
    ctx.connecting_over(conn)
    ctx.connected += 1
    ctx.stats.clients_maximum = max(ctx.stats.clients_maximum, ctx.connected)

    # -- CONNACK (MQTT 3.1 has no session present flag: that byte is reserved)
    flag = session_present and version != MQTT_31
    send(ctx, conn, ConnAck(flag, ReasonCode.SUCCESS, ack_props))
    log.info(
        "client %r connected from %s (MQTT %s, keep alive %d s, session %s)",
        client_id,
        conn.peer,
        _VERSION_NAMES.get(version, str(version)) + (" bridge" if conn.bridge else ""),
        keep_alive,
        "resumed" if session_present else "new",
    )
    schedule_keepalive(ctx, conn, now)
    if session_present:
        resend_inflight(ctx, session, conn, now)
        pump(ctx, session, now)


_VERSION_NAMES = {MQTT_31: "3.1", MQTT_311: "3.1.1", MQTT_5: "5.0"}


def _connack_properties(
    ctx: Context,
    packet: Connect,
    client_id: str,
    assigned: bool,
    expiry: int,
    granted_expiry: int,
    server_keep_alive: int | None,
) -> Properties:
    """What an MQTT 5.0 CONNACK tells the client (MQTT 5.0 section 3.2.2.3)."""
    settings = ctx.settings
    values: dict[str, Any] = {}
    if assigned:
        values["assigned_client_identifier"] = client_id
    if granted_expiry != expiry:
        values["session_expiry_interval"] = granted_expiry
    if settings.receive_maximum < 65_535:
        values["receive_maximum"] = settings.receive_maximum
    if settings.max_packet_size < VARINT_MAX + 5:
        values["maximum_packet_size"] = settings.max_packet_size
    if settings.topic_alias_maximum:
        values["topic_alias_maximum"] = settings.topic_alias_maximum
    if not settings.retain_available:
        values["retain_available"] = 0
    if not settings.wildcard_subscriptions:
        values["wildcard_subscription_available"] = 0
    if not settings.subscription_identifiers:
        values["subscription_identifiers_available"] = 0
    if not settings.shared_subscriptions:
        values["shared_subscription_available"] = 0
    if server_keep_alive is not None:
        values["server_keep_alive"] = server_keep_alive
    if packet.properties.request_response_information and settings.response_information_prefix:
        values["response_information"] = settings.response_information_prefix + client_id
    return Properties(**values) if values else EMPTY


def _will_problem(ctx: Context, will: Will, client_id: str) -> tuple[int, str] | None:
    """Why ``will`` of ``client_id`` can never be published, or None."""
    if will.retain and not ctx.settings.retain_available:
        return ReasonCode.RETAIN_NOT_SUPPORTED, "retained wills need retained messages"
    if sys_write_refused(will.topic, client_id):
        # A bridge's will on its own $SYS/broker/connection/<client id>/state is allowed.
        return ReasonCode.NOT_AUTHORIZED, "a will may not be published under $SYS"
    if will.properties.payload_format_indicator == 1:
        try:
            will.payload.decode("utf-8")
        except UnicodeDecodeError:
            return ReasonCode.PAYLOAD_FORMAT_INVALID, "will payload is not UTF-8"
    return None
