"""CONNECT, PINGREQ, DISCONNECT and AUTH: the connection's life (MQTT 5.0 3.1, 3.12, 3.14, 3.15)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gateway.broker.auth import PasswordCheck
from gateway.broker.connection import Connection, State
from gateway.broker.session import Session
from gateway.mqtt.codec import PING_RESP
from gateway.mqtt.packets import MQTT_5, Auth, ConnAck, Connect, Disconnect, PingReq, Will
from gateway.mqtt.properties import EMPTY, Properties
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.wire import VARINT_MAX

if TYPE_CHECKING:
    from gateway.broker.core import Broker

log = logging.getLogger("ledge.broker")


def handle_connect(broker: Broker, conn: Connection, packet: Connect, now: float) -> None:
    if conn.state is not State.NEW or conn.pending is not None:
        # MQTT-3.1.0-2: a second CONNECT is a protocol violation.
        broker.fail(conn, ReasonCode.PROTOCOL_ERROR, "second CONNECT on a connection", now)
        return
    settings = broker.settings
    version = packet.protocol_version
    conn.version = version
    conn.reader.version = version
    if conn.overflow:
        # Beyond the pool: told in the client's own version (v5 0x97, 3.1.1 3).
        broker.refuse_connect(
            conn,
            ReasonCode.QUOTA_EXCEEDED,
            f"connection limit of {settings.max_connections} reached",
            now,
        )
        return
    props = packet.properties
    client_id = packet.client_id
    conn.client_id = client_id
    conn.username = packet.username

    # -- client identifier (MQTT-3.1.3-6 .. -8)
    if not client_id:
        if not settings.allow_zero_length_client_id:
            broker.refuse_connect(
                conn,
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                "zero-length client id not allowed",
                now,
            )
            return
        if version != MQTT_5 and not packet.clean_start:
            # MQTT-3.1.3-8: 3.1.1 needs CleanSession 1 with a zero-length client id.
            broker.refuse_connect(
                conn,
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                "zero-length client id requires clean session",
                now,
            )
            return
        client_id = settings.assigned_client_id_prefix + broker._client_id_factory()
        while client_id in broker.sessions:
            client_id = settings.assigned_client_id_prefix + broker._client_id_factory()
        conn.client_id = client_id

    # -- enhanced authentication: no methods are offered (MQTT-4.12.0-1)
    if props.authentication_method is not None:
        broker.refuse_connect(
            conn,
            ReasonCode.BAD_AUTHENTICATION_METHOD,
            f"authentication method {props.authentication_method!r} not supported",
            now,
        )
        return

    # -- credentials
    policy = conn.policy
    username = packet.username
    verdict: int | PasswordCheck
    if policy is not None and policy.use_identity_as_username:
        # The verified certificate's CN is the user name; no password is checked.
        username = conn.identity
        conn.username = username
        verdict = ReasonCode.NOT_AUTHORIZED if username is None else ReasonCode.SUCCESS
    else:
        authenticator = policy.authenticator if policy is not None else broker.authenticator
        verdict = authenticator.check(client_id, username, packet.password)
    if isinstance(verdict, PasswordCheck):
        # Only with a password file: a broker without one does not carry this code.
        from gateway.broker import handle_login
        from gateway.broker.logins import LoginAttempt

        attempt = LoginAttempt(conn, packet, username, verdict, "")
        handle_login.check_password(broker, conn, attempt, now)
        return
    if verdict != ReasonCode.SUCCESS:
        reason = (
            "bad user name or password"
            if verdict == ReasonCode.BAD_USER_NAME_OR_PASSWORD
            else "not authorized"
        )
        broker.refuse_connect(conn, verdict, reason, now)
        return
    accept(broker, conn, packet, username, now)


def accept(
    broker: Broker, conn: Connection, packet: Connect, username: str | None, now: float
) -> None:
    """The rest of CONNECT, once the client is authenticated."""
    assigned = not packet.client_id
    settings = broker.settings
    version = packet.protocol_version
    props = packet.properties
    client_id = conn.client_id
    policy = conn.policy
    acl = policy.acl if policy is not None else broker.acl
    rules = acl.rules_for(username, client_id) if acl is not None else None

    # -- the will must be publishable
    will = packet.will
    if will is not None:
        problem = _will_problem(broker, will)
        if problem is None and rules is not None and not rules.can_write(will.topic):
            problem = ReasonCode.NOT_AUTHORIZED, f"will on {will.topic!r} not authorized"
        if problem is not None:
            broker.refuse_connect(conn, problem[0], problem[1], now)
            return

    if broker.shutting_down:
        broker.refuse_connect(conn, ReasonCode.SERVER_UNAVAILABLE, "server shutting down", now)
        return

    existing = broker.sessions.get(client_id)
    if existing is not None and existing.sink is not None:
        # In use inside the gateway (a driver, a bridge, the taps): never taken over.
        broker.refuse_connect(
            conn,
            ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
            f"client identifier {client_id!r} is used inside the gateway",
            now,
        )
        return
    takeover = existing is not None and existing.conn is not None

    # -- negotiated limits
    if version == MQTT_5:
        conn.peer_receive_max = props.receive_maximum or 65_535
        conn.peer_max_packet = props.maximum_packet_size
        conn.peer_alias_max = props.topic_alias_maximum or 0
        conn.problem_info = props.request_problem_information != 0
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

    # -- session takeover (MQTT-3.1.4-3): the old connection goes first
    if takeover:
        assert existing is not None and existing.conn is not None
        old = existing.conn
        log.info("client %r reconnected from %s: taking over its session", client_id, conn.peer)
        broker.fail(old, ReasonCode.SESSION_TAKEN_OVER, "session taken over", now)
        existing = broker.sessions.get(client_id)

    # -- session present or new (MQTT-3.1.2-4 .. -6)
    session_present = False
    if existing is not None and packet.clean_start:
        broker.end_session(existing, now)
        existing = None
    if existing is not None:
        session = existing
        session_present = True
        # MQTT-3.1.3-9: a delayed will is not sent if the session resumes in time.
        session.will = None
        session.will_due = None
        session.expires_at = None
        broker.cancel_session_timers(session)
    else:
        session = Session(client_id)
        broker.sessions[client_id] = session
    session.expiry_interval = granted_expiry
    session.connected_expiry_zero = granted_expiry == 0
    session.protocol_version = version
    session.username = username
    session.listener = conn.listener
    if session.rules != rules:
        broker.apply_rules(session, rules, now)
    conn.rules = rules
    if broker.journal is not None:
        broker.journal.session(session)
    session.conn = conn
    conn.session = session
    conn.will = packet.will
    conn.state = State.CONNECTED
    broker.connected += 1
    broker.stats.clients_maximum = max(broker.stats.clients_maximum, broker.connected)

    # -- CONNACK
    ack_props: Properties = EMPTY
    if version == MQTT_5:
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
        if props.request_response_information and settings.response_information_prefix:
            values["response_information"] = settings.response_information_prefix + client_id
        if values:
            ack_props = Properties(**values)
    broker.send(conn, ConnAck(session_present, ReasonCode.SUCCESS, ack_props))
    log.info(
        "client %r connected from %s (MQTT %s, keep alive %d s, session %s)",
        client_id,
        conn.peer,
        "5.0" if version == MQTT_5 else "3.1.1",
        keep_alive,
        "resumed" if session_present else "new",
    )
    broker.schedule_keepalive(conn, now)
    if session_present:
        broker.resend_inflight(session, conn, now)
        broker.pump(session, now)


# ---------------------------------------------------------------------------- the rest


def handle_pingreq(broker: Broker, conn: Connection, packet: PingReq, now: float) -> None:
    broker.send(conn, PING_RESP)


def handle_disconnect(broker: Broker, conn: Connection, packet: Disconnect, now: float) -> None:
    session = conn.session
    new_expiry = packet.properties.session_expiry_interval
    if new_expiry is not None and session is not None:
        if session.connected_expiry_zero and new_expiry != 0:
            # MQTT-3.14.2-2: zero at CONNECT cannot become non-zero at DISCONNECT.
            broker.fail(
                conn,
                ReasonCode.PROTOCOL_ERROR,
                "session expiry interval was 0 at CONNECT and cannot be changed",
                now,
            )
            return
        session.expiry_interval = min(new_expiry, broker.settings.max_session_expiry_interval)
    # MQTT-3.14.4-3: DISCONNECT 0x00 discards the will; 0x04 (or any other) keeps it.
    conn.graceful = packet.reason_code == ReasonCode.SUCCESS
    if packet.reason_code >= 0x80:
        log.info(
            "client %s disconnected with reason 0x%02x %s",
            conn.label,
            packet.reason_code,
            packet.properties.reason_string or "",
        )
    broker.close(conn, now, "client disconnected")


def handle_auth(broker: Broker, conn: Connection, packet: Auth, now: float) -> None:
    # No authentication method was agreed at CONNECT, so any AUTH is out of place.
    broker.fail(conn, ReasonCode.PROTOCOL_ERROR, "AUTH without an authentication method", now)


def _will_problem(broker: Broker, will: Will) -> tuple[int, str] | None:
    """Why ``will`` can never be published, or None."""
    if will.retain and not broker.settings.retain_available:
        return ReasonCode.RETAIN_NOT_SUPPORTED, "retained wills need retained messages"
    if will.topic.startswith("$SYS"):
        return ReasonCode.NOT_AUTHORIZED, "a will may not be published under $SYS"
    if will.properties.payload_format_indicator == 1:
        try:
            will.payload.decode("utf-8")
        except UnicodeDecodeError:
            return ReasonCode.PAYLOAD_FORMAT_INVALID, "will payload is not UTF-8"
    return None
