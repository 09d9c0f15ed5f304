"""A reload of authentication and ACLs applied to the running broker.

Every session's rules are compiled again; connected clients their listener would no
longer let in are disconnected (MQTT 5.0: DISCONNECT 0x98, administrative action).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.broker import closing, sessions
from gateway.broker.auth import ListenerPolicy, PasswordAuthenticator
from gateway.broker.context import Context
from gateway.broker.state import Connection, State
from gateway.mqtt.errors import MQTTError
from gateway.mqtt.reason_codes import ReasonCode

if TYPE_CHECKING:
    from gateway.broker.acl import Acl


def apply(ctx: Context, policies: dict[str, ListenerPolicy], acl: Acl | None, now: float) -> None:
    """New per-listener policies and default ACL, from now on."""
    ctx.policies = policies
    ctx.acl = acl
    for session in list(ctx.sessions.values()):
        if session.sink is not None or session.listener is None:
            continue
        policy = policies.get(session.listener)
        session_acl = policy.acl if policy is not None else acl
        rules = (
            session_acl.rules_for(session.username, session.client_id)
            if session_acl is not None
            else None
        )
        if rules != session.rules:
            sessions.apply_rules(ctx, session, rules, now)
    for conn in list(ctx.connections.values()):
        if conn.overflow:
            continue
        conn.policy = policies.get(conn.listener)
        if conn.state is State.CONNECTED:
            reason = _no_longer_allowed(ctx, conn)
            if reason is not None:
                error = MQTTError(reason, ReasonCode.ADMINISTRATIVE_ACTION)
                closing.fail(ctx, conn, error, now)


def _no_longer_allowed(ctx: Context, conn: Connection) -> str | None:
    policy = conn.policy
    if policy is not None and policy.use_identity_as_username:
        return None
    auth = policy.authenticator if policy is not None else ctx.authenticator
    if not isinstance(auth, PasswordAuthenticator):
        return None
    if auth.users is None or conn.username is None:
        return None if auth.allow_anonymous else "anonymous clients are no longer allowed"
    if conn.username not in auth.users:
        return f"user {conn.username!r} is no longer in the password file"
    return None
