"""CONNECT, PINGREQ, DISCONNECT and AUTH: the connection's life (MQTT 5.0 3.1, 3.12, 3.14, 3.15)."""

from __future__ import annotations

import logging

from gateway.broker.accept import accept
from gateway.broker.auth import PasswordCheck
from gateway.broker.closing import Refused, close
from gateway.broker.context import Context
from gateway.broker.output import send
from gateway.broker.state import Connection, LoginAttempt, State
from gateway.mqtt.codec import PING_RESP
from gateway.mqtt.errors import ProtocolError
from gateway.mqtt.packets import MQTT_5, MQTT_31, Auth, Connect, Disconnect, PingReq
from gateway.mqtt.reason_codes import ReasonCode

log = logging.getLogger("ledge.broker")


def handle_connect(ctx: Context, conn: Connection, packet: Connect, now: float) -> None:
    if conn.state is not State.NEW or conn.pending is not None:
        # MQTT-3.1.0-2: a second CONNECT is a protocol violation.
        raise ProtocolError("second CONNECT on a connection")
    settings = ctx.settings
    version = packet.protocol_version
    conn.version = version
    conn.bridge = packet.bridge
    conn.reader.version = version
    if conn.overflow:
        # Beyond the pool: told in the client's own version (v5 0x97, 3.1.1 3).
        raise Refused(
            f"connection limit of {settings.max_connections} reached", ReasonCode.QUOTA_EXCEEDED
        )
    props = packet.properties
    client_id = packet.client_id
    conn.client_id = client_id
    conn.username = packet.username
    # MQTT-3.1.2-29: reason strings only to a client that did not decline them.
    conn.problem_info = props.request_problem_information != 0

    if version == MQTT_31 and not 1 <= len(client_id) <= settings.mqtt31_max_client_id:
        # MQTT 3.1 section 3.1: a Client Identifier is 1 to 23 characters, else
        # CONNACK 2 (identifier rejected); 3.1 has no assigned identifiers.
        raise Refused(
            f"MQTT 3.1 client identifier of {len(client_id)} characters "
            f"(1 to {settings.mqtt31_max_client_id} allowed)",
            ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
        )

    # -- client identifier (MQTT-3.1.3-6 .. -8)
    if not client_id:
        if not settings.allow_zero_length_client_id:
            raise Refused(
                "zero-length client id not allowed", ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
            )
        if version != MQTT_5 and not packet.clean_start:
            # MQTT-3.1.3-8: 3.1.1 needs CleanSession 1 with a zero-length client id.
            raise Refused(
                "zero-length client id requires clean session",
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
            )
        client_id = settings.assigned_client_id_prefix + ctx.client_id_factory()
        while client_id in ctx.sessions:
            client_id = settings.assigned_client_id_prefix + ctx.client_id_factory()
        conn.client_id = client_id

    # -- enhanced authentication: no methods are offered (MQTT-4.12.0-1)
    if props.authentication_method is not None:
        raise Refused(
            f"authentication method {props.authentication_method!r} not supported",
            ReasonCode.BAD_AUTHENTICATION_METHOD,
        )

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
        authenticator = policy.authenticator if policy is not None else ctx.authenticator
        verdict = authenticator.check(client_id, username, packet.password)
    if isinstance(verdict, PasswordCheck):
        # Only with a password file: a broker without one does not carry this code.
        from gateway.broker import handle_login

        attempt = LoginAttempt(conn, packet, username, verdict, "")
        handle_login.check_password(ctx, conn, attempt, now)
        return
    if verdict != ReasonCode.SUCCESS:
        reason = (
            "bad user name or password"
            if verdict == ReasonCode.BAD_USER_NAME_OR_PASSWORD
            else "not authorized"
        )
        raise Refused(reason, verdict)
    accept(ctx, conn, packet, username, now)


# ---------------------------------------------------------------------------- the rest


def handle_pingreq(ctx: Context, conn: Connection, packet: PingReq, now: float) -> None:
    send(ctx, conn, PING_RESP)


def handle_disconnect(ctx: Context, conn: Connection, packet: Disconnect, now: float) -> None:
    session = conn.session
    new_expiry = packet.properties.session_expiry_interval
    if new_expiry is not None and session is not None:
        if session.connected_expiry_zero and new_expiry != 0:
            # MQTT-3.14.2-2: zero at CONNECT cannot become non-zero at DISCONNECT.
            raise ProtocolError("session expiry interval was 0 at CONNECT and cannot be changed")
        session.expiry_interval = min(new_expiry, ctx.settings.max_session_expiry_interval)
    # MQTT-3.14.4-3: DISCONNECT 0x00 discards the will; 0x04 (or any other) keeps it.
    conn.graceful = packet.reason_code == ReasonCode.SUCCESS
    if packet.reason_code >= 0x80:
        log.info(
            "client %s disconnected with reason 0x%02x %s",
            conn.label,
            packet.reason_code,
            packet.properties.reason_string or "",
        )
    close(ctx, conn, now, "client disconnected")


def handle_auth(ctx: Context, conn: Connection, packet: Auth, now: float) -> None:
    # No authentication method was agreed at CONNECT, so any AUTH is out of place.
    raise ProtocolError("AUTH without an authentication method")
