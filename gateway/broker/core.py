"""The broker core: one plain object that owns all broker state. Pure, time passed in.

The shell hands it bytes (``data_received(conn, data, now)``) and events
(``connection_lost``, ``set_writable``, ``tick``); the core answers by appending
encoded bytes to ``conn.out`` and listing the connection in ``dirty``. The shell
writes what is dirty once per loop iteration, and closes connections whose
state is ``CLOSING`` after writing. Packet families are handled in
``handle_connect``, ``handle_publish`` and ``handle_subscribe`` (mosquitto's
one-file-per-family layout); this module holds dispatch, delivery, sessions,
wills and timers.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from gateway.broker import handle_connect, handle_publish, handle_subscribe
from gateway.broker.auth import Authenticator, ListenerPolicy, PasswordAuthenticator
from gateway.broker.connection import Connection, State
from gateway.broker.journal import Journal, Op
from gateway.broker.message import Message
from gateway.broker.publish_policy import receive
from gateway.broker.retained import RetainedStore
from gateway.broker.router import SubscriptionIndex
from gateway.broker.session import AWAIT_ACK, AWAIT_COMP, Outgoing, Session
from gateway.broker.settings import NEVER_EXPIRES, BrokerSettings
from gateway.broker.stats import LoadAverage, Stats
from gateway.broker.timers import Timers
from gateway.mqtt.codec import decode, encode
from gateway.mqtt.errors import (
    BadProtocolName,
    MQTTError,
    ProtocolError,
    UnsupportedProtocolVersion,
)
from gateway.mqtt.fastpath import PUBLISH_TYPE, encode_packet_id, peek_publish, template_size
from gateway.mqtt.framer import NeedData
from gateway.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
    Will,
)
from gateway.mqtt.properties import EMPTY, Properties
from gateway.mqtt.reason_codes import ConnackCode311, ReasonCode, connack_311, describe

if TYPE_CHECKING:
    # Imported when an ACL or a password file is configured, not before: a broker
    # without them does not carry their code.
    from gateway.broker.acl import Acl, Rules
    from gateway.broker.logins import LoginAttempt, LoginThrottle

log = logging.getLogger("ledge.broker")

Handler = Callable[["Broker", Connection, Any, float], None]

#: Output waiting on one connection beyond which the shell writes at once instead of
#: at the end of the loop iteration (coalescing stays; memory and latency stay bounded).
FLUSH_AT: Final = 65_536

#: Connections beyond ``max_connections`` that may wait at once for their refusal.
OVERFLOW_SLOTS: Final = 64

#: Input a connection may pile up while its login is being decided, beyond one packet of
#: ``max_packet_size``; more closes the connection.
PENDING_INPUT_SLACK: Final = 65_536

#: Packets a server must never receive (they flow server -> client only).
_SERVER_BOUND_ONLY: Final = "CONNACK, SUBACK, UNSUBACK and PINGRESP are sent by servers only"


class Broker:
    """All broker state, driven by the shell with time as an argument."""

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        authenticator: Authenticator | None = None,
        *,
        version: str = "ledge",
        now: float = 0.0,
        client_id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.settings = settings or BrokerSettings()
        self.authenticator: Authenticator = authenticator or PasswordAuthenticator()
        #: The ACL of connections whose listener has no policy of its own (None: no ACL).
        self.acl: Acl | None = None
        #: Per-listener authentication, ACL and connection limit, by listener label.
        self.policies: dict[str, ListenerPolicy] = {}
        self._listener_open: dict[str, int] = {}
        #: Failed logins per source address (the slowdown).
        self._logins: LoginThrottle | None = None
        #: Runs a password check off the event loop and later calls ``password_checked``
        #: (set by the shell). None: checks run inline, blocking (tests, tools).
        self.verifier: Callable[[LoginAttempt], None] | None = None
        self.version = version
        self.started = now
        self.sessions: dict[str, Session] = {}
        self.connections: dict[int, Connection] = {}
        self.connected = 0
        self.index = SubscriptionIndex(self.settings.route_cache_size)
        self.retained = RetainedStore(
            self.settings.max_retained_messages, self.settings.max_retained_bytes
        )
        self.timers = Timers()
        self.dirty: list[Connection] = []
        #: Some connection has more than FLUSH_AT bytes waiting: write now, not later.
        self.urgent = False
        self.stats = Stats()
        #: Changes to persistent state for the store; None when running in memory only.
        self.journal: Journal | None = None
        #: The store cannot write (disk or store.max_bytes full): QoS 1/2 messages that
        #: would have to be stored are refused until it can again.
        self.store_full = False
        self.shutting_down = False
        self._next_conn_id = 1
        # The connection pool: every slot allocated now, reused for the process's life.
        self._free = [
            Connection(self.settings.max_packet_size) for _ in range(self.settings.max_connections)
        ]
        self._overflow = 0
        self._client_id_factory = client_id_factory or _random_client_id
        self._loads = {name: LoadAverage() for name in _LOAD_COUNTERS}
        self._sys_last: dict[str, bytes] = {}
        #: Other parts of the gateway (taps, sensors, bridges) adding ``$SYS`` values:
        #: each returns topic -> value below ``$SYS/broker/``.
        self.sys_sources: list[Callable[[], dict[str, str]]] = []
        #: Checks every QoS 1/2 PUBLISH from a client must pass (``publish_refusal``):
        #: each gets the topic and payload size and returns why not, or None.
        self.publish_gates: list[Callable[[str, int], str | None]] = []
        if self.settings.sys_interval > 0:
            self.timers.at(now, self._sys_timer, None)
        self._handlers: dict[type, Handler] = {
            Connect: handle_connect.handle_connect,
            Publish: handle_publish.handle_publish,
            PubAck: handle_publish.handle_puback,
            PubRec: handle_publish.handle_pubrec,
            PubRel: handle_publish.handle_pubrel,
            PubComp: handle_publish.handle_pubcomp,
            Subscribe: handle_subscribe.handle_subscribe,
            Unsubscribe: handle_subscribe.handle_unsubscribe,
            PingReq: handle_connect.handle_pingreq,
            Disconnect: handle_connect.handle_disconnect,
            Auth: handle_connect.handle_auth,
        }

    # ================================================================== shell API

    def open_connection(
        self, peer: str, listener: str, now: float, identity: str | None = None
    ) -> Connection | None:
        """A new network connection, in a slot of the pool; it must send CONNECT within
        ``connect_timeout``. ``identity`` is the CN of a verified TLS client certificate.

        When every slot is taken, or the listener has its own connection limit and is at
        it, up to ``OVERFLOW_SLOTS`` more connections get a temporary slot that only
        answers their CONNECT with a refusal in their own protocol version; beyond
        that, None: the shell closes the socket at once. Both are counted as refused.
        """
        policy = self.policies.get(listener)
        at_limit = False
        if policy is not None and policy.max_connections:
            at_limit = self._listener_open.get(listener, 0) >= policy.max_connections
        if self._free and not at_limit:
            conn = self._free.pop()
            self._listener_open[listener] = self._listener_open.get(listener, 0) + 1
        elif self._overflow < OVERFLOW_SLOTS:
            conn = Connection(self.settings.max_packet_size)
            conn.overflow = True
            self._overflow += 1
        else:
            self.stats.connections_refused += 1
            if self.stats.connections_refused & (self.stats.connections_refused - 1) == 0:
                log.warning(
                    "connection from %s closed at once: all %d slots and %d refusal slots "
                    "in use (%d refused so far)",
                    peer,
                    self.settings.max_connections,
                    OVERFLOW_SLOTS,
                    self.stats.connections_refused,
                )
            return None
        conn.reset(self._next_conn_id, peer, listener, now, policy, identity)
        self._next_conn_id += 1
        self.connections[conn.id] = conn
        self.stats.connections_total += 1
        conn.timer = self.timers.at(
            now + self.settings.connect_timeout, self._connect_timer, (conn, conn.generation)
        )
        return conn

    def data_received(self, conn: Connection, data: bytes, now: float) -> None:
        self.stats.bytes_received += len(data)
        connected = State.CONNECTED
        state = conn.state
        if state is not connected:
            if state >= State.CLOSING:
                return
            if conn.pending is not None:
                # The login is being decided: keep the input (bounded) for afterwards.
                framer = conn.reader.framer
                framer.feed(data)
                if framer.buffered > self.settings.max_packet_size + PENDING_INPUT_SLACK:
                    conn.pending = None
                    self.close(conn, now, "too much input before CONNACK")
                return
        reader = conn.reader
        framer = reader.framer
        framer.feed(data)
        stats = self.stats
        try:
            while True:
                span = framer.next_span()
                if isinstance(span, NeedData):
                    return
                first, frame_start, start, end = span
                conn.last_rx = now
                stats.messages_received += 1
                buf = framer.buffer
                if first & 0xF0 == PUBLISH_TYPE and conn.state is connected:
                    # The fast path: a plain PUBLISH's fields straight from the buffer,
                    # then the same policy as every other PUBLISH.
                    plain = peek_publish(first, buf, start, end, reader.version)
                    if plain is not None:
                        topic, qos, pid, pos = plain
                        payload = bytes(buf[pos:end])
                        raw = None if qos else bytes(buf[frame_start:end])
                        receive(self, conn, topic, payload, qos, False, pid, EMPTY, now, raw)
                        if conn.state >= State.CLOSING:
                            return
                        continue
                packet = decode(first, buf[start:end], reader.version)
                self._dispatch(conn, packet, now)
                if conn.state is not connected:
                    return  # closing, or a CONNECT whose login is still being decided
        except MQTTError as exc:
            self._codec_failure(conn, exc, now)

    def dispatch(self, conn: Connection, packet: Packet, now: float) -> None:
        """The general path for one decoded packet: its handler, and a violation it
        raises ends the connection."""
        try:
            self._dispatch(conn, packet, now)
        except MQTTError as exc:
            self._codec_failure(conn, exc, now)

    def _dispatch(self, conn: Connection, packet: Packet, now: float) -> None:
        if conn.state is State.NEW and type(packet) is not Connect:
            # MQTT-3.1.0-1: the first packet must be CONNECT.
            self.close(conn, now, "first packet was not CONNECT")
            return
        handler = self._handlers.get(type(packet))
        if handler is None:
            raise ProtocolError(_SERVER_BOUND_ONLY)
        handler(self, conn, packet, now)

    def password_checked(self, attempt: LoginAttempt, ok: bool | None, now: float) -> None:
        """The outcome of a password check handed to ``verifier`` (None: it could not
        be run, the checker is overloaded)."""
        from gateway.broker import handle_login

        handle_login.login_decided(self, attempt, ok, now)

    def connection_lost(self, conn: Connection, now: float) -> None:
        """The transport is gone (peer closed, reset, or our close completed)."""
        if conn.state is State.CLOSED:
            return
        if conn.state is State.CONNECTED:
            log.info("client %s disconnected: connection lost", conn.label)
        if conn.dropped:
            log.warning(
                "client %s was a slow consumer: %d QoS 0 messages dropped",
                conn.label,
                conn.dropped,
            )
        self._cancel_connection_timers(conn)
        conn.held = None
        self._detach(conn, now)
        conn.state = State.CLOSED
        conn.handle = None
        self.connections.pop(conn.id, None)
        if conn.overflow:
            self._overflow -= 1
        else:
            self._listener_open[conn.listener] -= 1
            self._free.append(conn)  # the slot goes back to the pool

    def set_writable(self, conn: Connection, writable: bool, now: float) -> None:
        """Flow control from the transport: pause (False) or resume (True) writing."""
        conn.writable = writable
        self.timers.cancel(conn.stuck_timer)
        conn.stuck_timer = None
        if not writable:
            conn.paused_at = now
            timeout = self.settings.slow_consumer_timeout
            if timeout > 0:
                conn.stuck_timer = self.timers.at(
                    now + timeout, self._stuck_timer, (conn, conn.generation, now)
                )
        elif conn.session is not None and conn.state is State.CONNECTED:
            self.pump(conn.session, now)

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()

    def tick(self, now: float) -> None:
        self.timers.run_due(now)

    def take_dirty(self) -> list[Connection]:
        dirty = self.dirty
        self.dirty = []
        self.urgent = False
        return dirty

    def would_store(self, topic: str, retain: bool) -> bool:
        """Would a QoS 1/2 message on ``topic`` be written to the store?"""
        if retain:
            return True
        route = self.index.route(topic)
        if any(session.persisted for session, _subs in route.direct):
            return True
        return any(
            session.persisted for group in route.shared for session, _s in group.members.values()
        )

    def publish_refusal(self, topic: str, retain: bool, size: int) -> str | None:
        """Why a QoS 1/2 PUBLISH on ``topic`` cannot be accepted now, or None: the store
        is full and the message would be stored, or a gate (a bridge's full outbox with
        the policy "refuse") says no."""
        if self.store_full and self.would_store(topic, retain):
            return f"store full: message on {topic!r} for persistent sessions refused"
        for gate in self.publish_gates:
            why = gate(topic, size)
            if why is not None:
                return why
        return None

    def refuse_publish(self, conn: Connection, reason: str, now: float) -> int | None:
        """Refuse a QoS 1/2 PUBLISH: the reason code to acknowledge with (v5), or None
        after closing a 3.1.1 connection (which has no negative acknowledgement)."""
        self.stats.publish_denied += 1
        if conn.version == MQTT_5:
            log.warning("refusing PUBLISH from %s: %s", conn.label, reason)
            return ReasonCode.QUOTA_EXCEEDED
        self.fail(conn, ReasonCode.QUOTA_EXCEEDED, reason, now)
        return None

    def seal_batch(self) -> tuple[int, list[Op]] | None:
        """The journal's operations so far, as a numbered batch for the store."""
        return self.journal.seal() if self.journal is not None else None

    def batch_committed(self, upto: int) -> None:
        """The store committed every batch up to ``upto``: release the output held
        for them, in order."""
        if self.journal is None:
            return
        for conn, chunks in self.journal.release(upto):
            if conn.state is not State.CONNECTED:
                continue
            for data in chunks:
                self._emit(conn, data)

    def shutdown(self, now: float) -> None:
        """Close every connection; MQTT 5 clients get DISCONNECT 0x8B (server shutting down)."""
        self.shutting_down = True
        for conn in list(self.connections.values()):
            if conn.state is State.CONNECTED:
                # The clients did nothing wrong: their wills are not published.
                conn.graceful = True
                self.fail(conn, ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down", now)
            elif conn.state is State.NEW:
                self.close(conn, now, "server shutting down")

    # ================================================================== output

    def send_bytes(self, conn: Connection, data: bytes) -> None:
        self.stats.messages_sent += 1
        if conn.held is not None:
            assert self.journal is not None
            self.journal.held_append(conn, data)
            return
        self._emit(conn, data)

    def _emit(self, conn: Connection, data: bytes) -> None:
        conn.out.append(data)
        conn.out_bytes += len(data)
        if conn.out_bytes > FLUSH_AT:
            self.urgent = True
        if not conn.in_dirty:
            conn.in_dirty = True
            self.dirty.append(conn)

    def send(self, conn: Connection, packet: Packet) -> None:
        """Encode ``packet`` for ``conn``; drops problem details the client declined or
        cannot receive (MQTT-3.1.2-25, -29)."""
        data = encode(packet, conn.version or MQTT_311)
        limit = conn.peer_max_packet
        if limit is not None and len(data) > limit:
            props = getattr(packet, "properties", EMPTY)
            if props is EMPTY or not (props.reason_string or props.user_properties):
                log.debug(
                    "not sending %s to %s: exceeds its maximum packet size", packet, conn.label
                )
                return
            packet = _strip_problem_details(packet)
            data = encode(packet, conn.version or MQTT_311)
        self.send_bytes(conn, data)

    # ================================================================== closing

    def close(self, conn: Connection, now: float, reason: str) -> None:
        """Close after flushing output. The session detaches now (will, expiry)."""
        if conn.state >= State.CLOSING:
            return
        conn.close_reason = reason
        conn.held = None  # output waiting for the store goes with the connection
        self._cancel_connection_timers(conn)
        self._detach(conn, now)
        conn.state = State.CLOSING
        if not conn.in_dirty:
            conn.in_dirty = True
            self.dirty.append(conn)

    def fail(self, conn: Connection, code: int, reason: str, now: float) -> None:
        """End a connection for ``code``: DISCONNECT on MQTT 5, a plain close on 3.1.1."""
        if conn.state >= State.CLOSING:
            return
        if code >= 0x80:
            self.stats.protocol_errors += 1
            log.warning("closing %s: %s (%s)", conn.label, reason, describe(code))
        else:
            log.info("closing %s: %s", conn.label, reason)
        if conn.version == MQTT_5 and conn.state is State.CONNECTED:
            props = Properties(reason_string=reason) if reason else EMPTY
            conn.held = None  # the DISCONNECT goes out now; held acknowledgements do not
            self.send(conn, Disconnect(code, props))
        self.close(conn, now, reason)

    def _codec_failure(self, conn: Connection, exc: MQTTError, now: float) -> None:
        if conn.state is not State.NEW:
            self.fail(conn, exc.reason_code, exc.message, now)
            return
        # The CONNECT itself was bad.
        self.stats.protocol_errors += 1
        log.warning("refusing connection %s: %s", conn.label, exc.message)
        if isinstance(exc, BadProtocolName):
            pass  # MQTT-3.1.2-1: close without CONNACK
        elif isinstance(exc, UnsupportedProtocolVersion):
            # MQTT-3.1.2-2: CONNACK 0x01 in the 3.1.1 format, which every version reads.
            self.send_bytes(
                conn, encode(ConnAck(False, ConnackCode311.UNACCEPTABLE_PROTOCOL_VERSION), MQTT_311)
            )
        elif exc.protocol_version == MQTT_5:
            conn.version = MQTT_5
            self.send(conn, ConnAck(False, exc.reason_code, Properties(reason_string=exc.message)))
        self.close(conn, now, exc.message)

    def refuse_connect(self, conn: Connection, code: int, reason: str, now: float) -> None:
        """CONNACK with a refusal in the client's protocol version, then close."""
        self.stats.connections_refused += 1
        log.warning("refusing connection %s: %s (%s)", conn.label, reason, describe(code))
        if conn.version == MQTT_5:
            self.send(conn, ConnAck(False, code, Properties(reason_string=reason)))
        else:
            self.send(conn, ConnAck(False, connack_311(code)))
        self.close(conn, now, reason)

    # ================================================================== authorization

    def apply_rules(self, session: Session, rules: Rules | None, now: float) -> None:
        """Give ``session`` new ACL rules: routes are worked out again, and queued
        messages it may no longer read are dropped (counted as denied)."""
        session.rules = rules
        if session.conn is not None:
            session.conn.rules = rules
        if rules is not None:
            self.index.acl = True
        if session.subscriptions:
            self.index.clear_cache()
        if rules is None or not session.queue:
            return
        kept: deque[Outgoing] = deque()
        for entry in session.queue:
            if rules.can_read(entry.message.topic):
                kept.append(entry)
                continue
            session.queued_bytes -= entry.message.size
            self.stats.publish_denied += 1
            if self.journal is not None:
                self.journal.entry_done(session, entry)
        session.queue = kept

    @property
    def logins(self) -> LoginThrottle:
        """Failed logins per source address (the slowdown), made at the first check."""
        if self._logins is None:
            from gateway.broker.logins import LoginThrottle

            self._logins = LoginThrottle()
        return self._logins

    def set_policies(
        self, policies: dict[str, ListenerPolicy], acl: Acl | None, now: float
    ) -> None:
        """New authentication and ACLs (a reload). Every session's rules are compiled
        again; connected clients their listener would no longer let in are disconnected
        (MQTT 5.0: DISCONNECT 0x98, administrative action)."""
        self.policies = policies
        self.acl = acl
        for session in list(self.sessions.values()):
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
                self.apply_rules(session, rules, now)
        for conn in list(self.connections.values()):
            if conn.overflow:
                continue
            conn.policy = policies.get(conn.listener)
            if conn.state is State.CONNECTED:
                reason = self._no_longer_allowed(conn)
                if reason is not None:
                    self.fail(conn, ReasonCode.ADMINISTRATIVE_ACTION, reason, now)

    def _no_longer_allowed(self, conn: Connection) -> str | None:
        policy = conn.policy
        if policy is not None and policy.use_identity_as_username:
            return None
        auth = policy.authenticator if policy is not None else self.authenticator
        if not isinstance(auth, PasswordAuthenticator):
            return None
        if auth.users is None or conn.username is None:
            return None if auth.allow_anonymous else "anonymous clients are no longer allowed"
        if conn.username not in auth.users:
            return f"user {conn.username!r} is no longer in the password file"
        return None

    # ================================================================== sessions

    def _cancel_connection_timers(self, conn: Connection) -> None:
        self.timers.cancel(conn.timer)
        self.timers.cancel(conn.stuck_timer)
        conn.timer = conn.stuck_timer = None

    def _detach(self, conn: Connection, now: float) -> None:
        """The connection ends: publish or schedule its will; start session expiry."""
        session = conn.session
        if session is None:
            return
        conn.session = None
        if session.conn is not conn:
            return
        session.conn = None
        self.connected -= 1
        will = conn.will
        conn.will = None
        if will is not None and not conn.graceful:
            delay = will.properties.will_delay_interval or 0
            if delay <= 0:
                self.publish_will(will, session.client_id, now, session)
            else:
                session.will = will
                session.will_due = now + delay
                session.will_timer = self.timers.at(session.will_due, self._will_timer, session)
        if session.expiry_interval == 0:
            self.end_session(session, now)
            return
        if session.expiry_interval != NEVER_EXPIRES:
            session.expires_at = now + session.expiry_interval
            session.expiry_timer = self.timers.at(session.expires_at, self._expiry_timer, session)
        if self.journal is not None:
            self.journal.session(session)

    def adopt_session(self, session: Session, now: float) -> None:
        """Take in a session restored from the store (not connected). Its pending will and
        its expiry run from their deadlines; one already past fires now."""
        self.sessions[session.client_id] = session
        for sub in session.subscriptions.values():
            self.index.add(session, sub)
        if session.will is not None and session.will_due is not None:
            if session.will_due <= now:
                self._will_timer(session, now)
            else:
                session.will_timer = self.timers.at(session.will_due, self._will_timer, session)
        if session.expires_at is not None:
            if session.expires_at <= now:
                self._expiry_timer(session, now)
            else:
                session.expiry_timer = self.timers.at(
                    session.expires_at, self._expiry_timer, session
                )

    def cancel_session_timers(self, session: Session) -> None:
        self.timers.cancel(session.will_timer)
        self.timers.cancel(session.expiry_timer)
        session.will_timer = session.expiry_timer = None

    def end_session(self, session: Session, now: float) -> None:
        """Discard a session: a pending will is published now (MQTT-3.1.3-9's flip side)."""
        self.cancel_session_timers(session)
        if self.journal is not None:
            self.journal.session_end(session)
        if session.will is not None:
            will = session.will
            session.will = None
            session.will_due = None
            self.publish_will(will, session.client_id, now, session)
        for sub in list(session.subscriptions.values()):
            self.index.remove(session, sub)
        session.subscriptions.clear()
        orphans = [
            e for e in session.inflight.values() if e.share is not None and e.state == AWAIT_ACK
        ]
        orphans.extend(e for e in session.queue if e.share is not None)
        session.inflight.clear()
        session.queue.clear()
        session.queued_bytes = 0
        session.incoming_qos2.clear()
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        for entry in orphans:
            self._redispatch_shared(entry, now)

    def _redispatch_shared(self, entry: Outgoing, now: float) -> None:
        """A shared-subscription message whose member went away goes to the next member."""
        assert entry.share is not None
        name, topic_filter = entry.share
        groups = self.index.shared.get(topic_filter)
        group = groups.get(name) if groups else None
        picked = group.pick(entry.message.topic) if group is not None else None
        if picked is None:
            self.stats.dropped_queue_full += 1
            log.warning(
                "shared subscription $share/%s/%s has no members left: message on %r dropped",
                name,
                topic_filter,
                entry.message.topic,
            )
            return
        session, sub = picked
        qos = min(entry.qos, sub.qos)
        self.deliver(session, entry.message, qos, False, entry.sub_ids, entry.share, now)

    def publish_will(
        self, will: Will, client_id: str, now: float, session: Session | None = None
    ) -> None:
        rules = session.rules if session is not None else None
        if rules is not None and not rules.can_write(will.topic):
            # The ACL changed since CONNECT (a reload): the will is not published.
            self.stats.publish_denied += 1
            log.info("not publishing will of %r on %r: not authorized", client_id, will.topic)
            return
        props = will.properties
        expiry = props.message_expiry_interval
        if props.will_delay_interval is not None:
            props = props.with_(will_delay_interval=None)
        msg = Message(
            will.topic,
            will.payload,
            will.qos,
            will.retain,
            props if props else EMPTY,
            expiry_interval=expiry,
            origin=client_id,
            created=now,
        )
        log.info("publishing will of %r on %r", client_id, will.topic)
        self.publish(msg, now)

    # ================================================================== timers

    def _connect_timer(self, arg: tuple[Connection, int], now: float) -> None:
        conn, generation = arg
        if conn.generation == generation and conn.state is State.NEW:
            if conn.pending is not None:
                conn.pending = None
                self.refuse_connect(
                    conn,
                    ReasonCode.CONNECTION_RATE_EXCEEDED,
                    "login not decided in time: too many logins from this address",
                    now,
                )
                return
            log.info(
                "closing %s: no CONNECT within %g s", conn.label, self.settings.connect_timeout
            )
            self.close(conn, now, "no CONNECT in time")

    def schedule_keepalive(self, conn: Connection, now: float) -> None:
        """Replace the connect deadline by the keep-alive deadline (if any)."""
        self.timers.cancel(conn.timer)
        conn.timer = None
        if conn.keep_alive:
            conn.timer = self.timers.at(
                now + conn.keep_alive * 1.5, self._keepalive_timer, (conn, conn.generation)
            )

    def _keepalive_timer(self, arg: tuple[Connection, int], now: float) -> None:
        conn, generation = arg
        if conn.generation != generation or conn.state is not State.CONNECTED:
            return
        if not conn.keep_alive:
            return
        due = conn.last_rx + conn.keep_alive * 1.5
        if now >= due:
            # MQTT-3.1.2-22 (3.1.1: MQTT-3.1.2-24): nothing heard for 1.5 x keep alive.
            self.fail(
                conn,
                ReasonCode.KEEP_ALIVE_TIMEOUT,
                f"keep alive timeout: nothing received for {conn.keep_alive * 1.5:g} s",
                now,
            )
        else:
            conn.timer = self.timers.at(due, self._keepalive_timer, arg)

    def _stuck_timer(self, arg: tuple[Connection, int, float], now: float) -> None:
        """Slow-consumer deadline: a client that has not read for this long is cut off."""
        conn, generation, paused_at = arg
        if conn.generation != generation or conn.writable or conn.paused_at != paused_at:
            return
        if conn.state >= State.CLOSING:
            return
        log.warning(
            "closing %s: slow consumer, not reading for %g s (%d QoS 0 messages dropped)",
            conn.label,
            now - paused_at,
            conn.dropped,
        )
        conn.abort = True  # its buffers are full: do not wait to flush them
        self.close(conn, now, "slow consumer")

    def _will_timer(self, session: Session, now: float) -> None:
        due = session.will_due
        if session.will is None or due is None or now < due or session.conn is not None:
            return
        will = session.will
        session.will = None
        session.will_due = None
        self.publish_will(will, session.client_id, now, session)
        if self.journal is not None:
            self.journal.session(session)

    def _expiry_timer(self, session: Session, now: float) -> None:
        expires_at = session.expires_at
        if session.conn is not None or expires_at is None or now < expires_at:
            return
        if self.sessions.get(session.client_id) is not session:
            return
        log.info("session %r expired", session.client_id)
        self.end_session(session, now)

    def _sys_timer(self, _arg: object, now: float) -> None:
        self.publish_sys(now)
        self.timers.at(now + self.settings.sys_interval, self._sys_timer, None)

    def sys_values(self, now: float) -> dict[str, str]:
        """``$SYS`` topic -> value, with mosquitto's names for the common ones."""
        st = self.stats
        counters = {
            "messages/received": st.messages_received,
            "messages/sent": st.messages_sent,
            "bytes/received": st.bytes_received,
            "bytes/sent": st.bytes_sent,
            "publish/received": st.publish_received,
            "publish/sent": st.publish_sent,
            "connections": st.connections_total,
        }
        base = "$SYS/broker/"
        values = {
            base + "version": self.version,
            base + "uptime": f"{int(now - self.started)} seconds",
            base + "clients/connected": str(self.connected),
            base + "clients/disconnected": str(len(self.sessions) - self.connected),
            base + "clients/total": str(len(self.sessions)),
            base + "clients/maximum": str(st.clients_maximum),
            base + "messages/received": str(st.messages_received),
            base + "messages/sent": str(st.messages_sent),
            base + "publish/messages/received": str(st.publish_received),
            base + "publish/messages/sent": str(st.publish_sent),
            base + "publish/messages/dropped": str(st.drops()),
            base + "bytes/received": str(st.bytes_received),
            base + "bytes/sent": str(st.bytes_sent),
            base + "subscriptions/count": str(self.index.count),
            base + "retained messages/count": str(len(self.retained)),
            # Ledge's own: every drop and refusal, by reason.
            base + "publish/messages/dropped/slow consumer": str(st.dropped_slow_consumer),
            base + "publish/messages/dropped/queue full": str(st.dropped_queue_full),
            base + "publish/messages/dropped/expired": str(st.dropped_expired),
            base + "publish/messages/dropped/too large": str(st.dropped_too_large),
            base + "publish/messages/dropped/offline qos 0": str(st.dropped_offline_qos0),
            base + "publish/messages/denied": str(st.publish_denied),
            base + "retained messages/refused": str(self.retained.refused),
            base + "clients/refused": str(st.connections_refused),
            base + "clients/protocol errors": str(st.protocol_errors),
        }
        for name, load in self._loads.items():
            load.update(counters[name], now)
            for minutes, rate in load.rates.items():
                values[f"{base}load/{name}/{minutes}min"] = f"{rate:.2f}"
        for source in self.sys_sources:
            values.update({base + k: v for k, v in source().items()})
        return values

    def publish_sys(self, now: float) -> None:
        """Publish the ``$SYS`` values that changed, retained, QoS 0."""
        self.retained.purge_expired(now)
        last = self._sys_last
        for topic, value in self.sys_values(now).items():
            payload = value.encode()
            if last.get(topic) != payload:
                last[topic] = payload
                self.publish_local(topic, payload, now, retain=True)

    # ================================================================== delivery

    def publish(self, msg: Message, now: float) -> int:
        """Route ``msg`` to every matching session; returns how many it went to.

        Retained messages are stored (or deleted) here first.
        """
        if msg.retain and self.retained.store(msg) and self.journal is not None:
            self.journal.retain(msg)
        route = self.index.route(msg.topic)
        count = 0
        origin = msg.origin
        msg_qos = msg.qos
        for session, subs in route.direct:
            if len(subs) == 1:
                sub = subs[0]
                if sub.no_local and session.client_id == origin:
                    continue
                qos = sub.qos if sub.qos < msg_qos else msg_qos
                ident = sub.identifier
                sub_ids: tuple[int, ...] = (ident,) if ident else ()
                retain = msg.retain and sub.retain_as_published
            else:
                qos = -1
                ids: list[int] = []
                retain = False
                for sub in subs:
                    if sub.no_local and session.client_id == origin:
                        continue
                    granted = sub.qos if sub.qos < msg_qos else msg_qos
                    qos = max(qos, granted)
                    if sub.identifier:
                        ids.append(sub.identifier)
                    if sub.retain_as_published and msg.retain:
                        retain = True
                if qos < 0:
                    continue
                sub_ids = tuple(sorted(ids))
            self.deliver(session, msg, qos, retain, sub_ids, None, now)
            count += 1
        for group in route.shared:
            picked = group.pick(msg.topic)
            if picked is None:
                continue
            session, sub = picked
            qos = sub.qos if sub.qos < msg_qos else msg_qos
            ident = sub.identifier
            self.deliver(
                session,
                msg,
                qos,
                False,
                (ident,) if ident else (),
                (group.name, group.topic_filter),
                now,
            )
            count += 1
        return count

    def deliver(
        self,
        session: Session,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        share: tuple[str, str] | None,
        now: float,
    ) -> None:
        """Hand one message to one session: send now, or queue under its bounds."""
        sink = session.sink
        if sink is not None:  # an in-process client
            self.stats.publish_sent += 1
            sink(msg, qos, retain, sub_ids)
            return
        conn = session.conn
        if qos == 0:
            if conn is None:
                if self.settings.queue_qos0_offline and session.expiry_interval:
                    self._enqueue(session, Outgoing(msg, 0, retain, sub_ids, share))
                else:
                    self.stats.dropped_offline_qos0 += 1
                return
            if not conn.writable or conn.out_bytes > self.settings.max_outbound_bytes:
                # Slow-consumer policy for QoS 0: drop, count, never grow past the bound.
                conn.dropped += 1
                self.stats.dropped_slow_consumer += 1
                return
            data = msg.raw
            if (
                data is None
                or retain
                or sub_ids
                or conn.version != msg.raw_version
                or conn.peer_alias_max
            ):
                parts = self._encode_for(conn, msg, 0, retain, sub_ids, False, now)
                if parts is None:
                    return
                data = parts[0]
            self.send_bytes(conn, data)
            self.stats.publish_sent += 1
            return
        entry = Outgoing(msg, qos, retain, sub_ids, share)
        if (
            conn is not None
            and conn.writable
            and not session.queue
            and len(session.inflight) < self._window(conn)
        ):
            self._send_new(session, conn, entry, now)
        else:
            self._enqueue(session, entry)

    def _window(self, conn: Connection) -> int:
        limit = conn.peer_receive_max
        cap = self.settings.max_inflight
        return limit if limit < cap else cap

    def _enqueue(self, session: Session, entry: Outgoing) -> bool:
        settings = self.settings
        size = entry.message.size
        if (
            len(session.queue) >= settings.max_queued_messages
            or session.queued_bytes + size > settings.max_queued_bytes
        ):
            # Queue-full policy: the new message is dropped for this session and counted.
            self.stats.dropped_queue_full += 1
            if self.stats.dropped_queue_full & (self.stats.dropped_queue_full - 1) == 0:
                log.warning(
                    "queue of %r full (%d messages, %d bytes): dropping new messages "
                    "(%d dropped so far)",
                    session.client_id,
                    len(session.queue),
                    session.queued_bytes,
                    self.stats.dropped_queue_full,
                )
            return False
        session.queue.append(entry)
        session.queued_bytes += size
        if self.journal is not None:
            self.journal.entry(session, entry)
        return True

    def _send_new(self, session: Session, conn: Connection, entry: Outgoing, now: float) -> None:
        parts = self._encode_for(
            conn, entry.message, entry.qos, entry.retain, entry.sub_ids, False, now
        )
        journal = self.journal
        if parts is None:
            # Too large or expired: counted; treated as delivered (MQTT-3.1.2-25).
            if journal is not None:
                journal.entry_done(session, entry)
            return
        pid = session.allocate_packet_id()
        entry.packet_id = pid
        entry.state = AWAIT_ACK
        session.inflight[pid] = entry
        if journal is not None and session.persisted:
            # Write-ahead: the PUBLISH leaves only once its packet id is stored, so a
            # restart can never re-send it under another id (QoS 2 stays exactly once).
            journal.entry(session, entry)
            journal.hold(conn)
        self._write_publish(conn, parts, pid)

    def _write_publish(self, conn: Connection, parts: tuple[bytes, bytes], pid: int) -> None:
        head, tail = parts
        if conn.held is not None:
            assert self.journal is not None
            self.stats.publish_sent += 1
            self.stats.messages_sent += 1
            self.journal.held_append(conn, head + encode_packet_id(pid) + tail)
            return
        out = conn.out
        out.append(head)
        out.append(encode_packet_id(pid))
        out.append(tail)
        conn.out_bytes += len(head) + len(tail) + 2
        if conn.out_bytes > FLUSH_AT:
            self.urgent = True
        self.stats.publish_sent += 1
        self.stats.messages_sent += 1
        if not conn.in_dirty:
            conn.in_dirty = True
            self.dirty.append(conn)

    def _encode_for(
        self,
        conn: Connection,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        dup: bool,
        now: float,
    ) -> tuple[bytes, bytes] | None:
        """The packet parts for ``conn``, or None when it must not be sent (counted)."""
        expiry: int | None = None
        if msg.expires_at is not None:
            if msg.expired(now):
                self.stats.dropped_expired += 1
                return None
            expiry = msg.expiry_remaining(now)
        if conn.version != MQTT_5:
            return msg.encode(MQTT_311, qos, retain, dup=dup)
        alias = 0
        new_alias = False
        if conn.peer_alias_max:
            alias = conn.aliases_out.get(msg.topic, 0)
            if not alias and len(conn.aliases_out) < conn.peer_alias_max:
                alias = len(conn.aliases_out) + 1
                new_alias = True
        parts = msg.encode(
            MQTT_5,
            qos,
            retain,
            dup=dup,
            sub_ids=sub_ids,
            expiry=expiry,
            alias=alias,
            send_topic=new_alias or not alias,
        )
        limit = conn.peer_max_packet
        if limit is not None and template_size(parts, qos) > limit:
            self.stats.dropped_too_large += 1
            log.debug("message on %r exceeds maximum packet size of %s", msg.topic, conn.label)
            return None
        if new_alias:
            if not conn.aliases_out:  # the shared empty map: this connection's own now
                conn.aliases_out = {}
            conn.aliases_out[msg.topic] = alias
        return parts

    def pump(self, session: Session, now: float) -> None:
        """Move queued messages into flight while the window and the transport allow."""
        conn = session.conn
        if conn is None:
            return
        queue = session.queue
        window = self._window(conn)
        inflight = session.inflight
        while queue and conn.writable and len(inflight) < window:
            entry = queue.popleft()
            session.queued_bytes -= entry.message.size
            if entry.message.expired(now):
                self.stats.dropped_expired += 1
                if self.journal is not None:
                    self.journal.entry_done(session, entry)
                continue
            if entry.qos == 0:
                parts = self._encode_for(
                    conn, entry.message, 0, entry.retain, entry.sub_ids, False, now
                )
                if parts is not None:
                    self.send_bytes(conn, parts[0])
                    self.stats.publish_sent += 1
                continue
            self._send_new(session, conn, entry, now)

    def resend_inflight(self, session: Session, conn: Connection, now: float) -> None:
        """On session resumption, re-send unacknowledged PUBLISH (DUP) and PUBREL packets
        with their original packet identifiers (MQTT-4.4.0-1); nothing else is retried."""
        for pid, entry in list(session.inflight.items()):
            if entry.state == AWAIT_COMP:
                self.send(conn, PubRel(pid))
                continue
            msg = entry.message
            parts = self._encode_for(conn, msg, entry.qos, entry.retain, entry.sub_ids, True, now)
            if parts is None and not msg.expired(now):
                del session.inflight[pid]
                if self.journal is not None:
                    self.journal.entry_done(session, entry)
                continue
            if parts is None:
                # Expired while in flight: onward delivery had started, so send it anyway
                # with a zero expiry rather than break the QoS flow.
                parts = msg.encode(
                    conn.version, entry.qos, entry.retain, dup=True, sub_ids=entry.sub_ids, expiry=0
                )
            self._write_publish(conn, parts, pid)

    # ================================================================== in-process API

    def publish_local(
        self,
        topic: str,
        payload: bytes,
        now: float,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: Properties = EMPTY,
        origin: str | None = None,
    ) -> int:
        """Publish from inside the gateway (drivers, $SYS, the bridge). No TCP, no copies."""
        expiry = properties.message_expiry_interval
        msg = Message(
            topic,
            payload,
            qos,
            retain,
            properties,
            expiry_interval=expiry,
            origin=origin,
            created=now,
        )
        return self.publish(msg, now)


def _random_client_id() -> str:
    return os.urandom(8).hex()


def _strip_problem_details(packet: Packet) -> Packet:
    props: Properties = getattr(packet, "properties", EMPTY)
    changes: dict[str, Any] = {"properties": props.with_(reason_string=None, user_properties=())}
    stripped: Packet = replace(packet, **changes)
    return stripped


_LOAD_COUNTERS: Final = (
    "messages/received",
    "messages/sent",
    "bytes/received",
    "bytes/sent",
    "publish/received",
    "publish/sent",
    "connections",
)
