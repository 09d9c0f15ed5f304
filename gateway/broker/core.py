"""The broker: the dispatcher and the shell's API over the broker's shared state.

The shell hands the core bytes (``data_received(conn, data, now)``) and events
(``open_connection``, ``connection_lost``, ``set_writable``, ``tick``,
``password_checked``, ``batch_committed``); when an event is over the core calls the
one wake-up hook the shell subscribes to (``wake``), and the shell writes the output
collected on the dirty connections, seals the journal and arms its timer for
``next_deadline()``.

``data_received`` frames the bytes and dispatches each packet to its handler (one
module per packet family: ``handle_connect``, ``handle_publish``,
``handle_subscribe``), except a plain PUBLISH, whose fields the codec peeks straight
from the buffer for ``publish_policy`` -- the same policy the PUBLISH handler runs.
Handlers call small modules (``output``, ``delivery``, ``sessions``, ``closing``,
``systopics``), never this one; a violation they raise is turned into the client's
answer in one place (``closing.fail``). See ``gateway/broker/README.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from gateway.broker import closing, delivery, output, sessions, systopics
from gateway.broker.auth import Authenticator, ListenerPolicy, PasswordAuthenticator
from gateway.broker.context import Context
from gateway.broker.handle_connect import (
    handle_auth,
    handle_connect,
    handle_disconnect,
    handle_pingreq,
)
from gateway.broker.handle_publish import (
    handle_puback,
    handle_pubcomp,
    handle_publish,
    handle_pubrec,
    handle_pubrel,
)
from gateway.broker.handle_subscribe import handle_subscribe, handle_unsubscribe
from gateway.broker.logins import address_key
from gateway.broker.publish_policy import receive
from gateway.broker.settings import BrokerSettings
from gateway.broker.state import Connection, Session, State
from gateway.mqtt.codec import decode
from gateway.mqtt.errors import MQTTError, ProtocolError
from gateway.mqtt.fastpath import PUBLISH_TYPE, peek_publish
from gateway.mqtt.framer import NeedData
from gateway.mqtt.packets import (
    Auth,
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
)
from gateway.mqtt.properties import EMPTY, Properties
from gateway.mqtt.reason_codes import ReasonCode

if TYPE_CHECKING:
    from gateway.broker.acl import Acl
    from gateway.broker.journal import Op
    from gateway.broker.state import LoginAttempt

log = logging.getLogger("ledge.broker")

Handler = Callable[[Context, Connection, Any, float], None]

#: Connections beyond ``max_connections`` that may wait at once for their refusal.
OVERFLOW_SLOTS: Final = 64

#: Input a connection may pile up while its login is being decided, beyond one packet of
#: ``max_packet_size``; more closes the connection.
PENDING_INPUT_SLACK: Final = 65_536

#: Packets a server must never receive (they flow server -> client only).
_SERVER_BOUND_ONLY: Final = "CONNACK, SUBACK, UNSUBACK and PINGRESP are sent by servers only"

#: The dispatch table: one handler per packet a client may send (mosquitto's read_handle.c).
HANDLERS: Final[dict[type, Handler]] = {
    Connect: handle_connect,
    Publish: handle_publish,
    PubAck: handle_puback,
    PubRec: handle_pubrec,
    PubRel: handle_pubrel,
    PubComp: handle_pubcomp,
    Subscribe: handle_subscribe,
    Unsubscribe: handle_unsubscribe,
    PingReq: handle_pingreq,
    Disconnect: handle_disconnect,
    Auth: handle_auth,
}


class Broker(Context):
    """The broker's state (``Context``) with the dispatcher and the shell's API."""

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        authenticator: Authenticator | None = None,
        *,
        version: str = "ledge",
        now: float = 0.0,
        client_id_factory: Callable[[], str] | None = None,
    ) -> None:
        super().__init__(
            settings, authenticator, version=version, now=now, client_id_factory=client_id_factory
        )
        self.resume = self._resume
        systopics.start(self, now)

    # ================================================================== dispatch

    def data_received(self, conn: Connection, data: bytes, now: float) -> None:
        if self.before_input is not None:
            hook, self.before_input = self.before_input, None
            hook()
        self.begin()
        try:
            self._received(conn, data, now)
        finally:
            self.end()

    def _received(self, conn: Connection, data: bytes, now: float) -> None:
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
                    closing.close(self, conn, now, "too much input before CONNACK")
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
                self._dispatch(conn, decode(first, buf[start:end], reader.version), now)
                if conn.state is not connected:
                    return  # closing, or a CONNECT whose login is still being decided
        except MQTTError as error:
            closing.fail(self, conn, error, now)

    def dispatch(self, conn: Connection, packet: Packet, now: float) -> None:
        """The general path for one decoded packet: its handler; a violation it raises
        ends the connection."""
        self.begin()
        try:
            self._dispatch(conn, packet, now)
        except MQTTError as error:
            closing.fail(self, conn, error, now)
        finally:
            self.end()

    def _dispatch(self, conn: Connection, packet: Packet, now: float) -> None:
        if conn.state is State.NEW and type(packet) is not Connect:
            # MQTT-3.1.0-1: the first packet must be CONNECT.
            closing.close(self, conn, now, "first packet was not CONNECT")
            return
        handler = HANDLERS.get(type(packet))
        if handler is None:
            raise ProtocolError(_SERVER_BOUND_ONLY)
        handler(self, conn, packet, now)

    def _resume(self, conn: Connection, now: float) -> None:
        """What arrived while ``conn``'s login was being decided."""
        self._received(conn, b"", now)

    # ================================================================== shell API

    def open_connection(
        self, peer: str, listener: str, now: float, identity: str | None = None
    ) -> Connection | None:
        """A new network connection, in a slot of the pool; it must send CONNECT within
        ``connect_timeout``. ``identity`` is the CN of a verified TLS client certificate.

        Connections before their CONNACK have a budget of their own: ``max_connecting``
        slots, ``max_connecting_per_address`` of them from one address. A newcomer
        beyond either, or finding every slot taken, gets the slot of the oldest
        connection still connecting (from its address, or from anywhere), which is
        closed at once (policy: evict oldest; counted, logged). Connected clients are
        never evicted. When every slot is held by connected clients, or the listener
        has its own connection limit and is at it, up to ``OVERFLOW_SLOTS`` more
        connections get a temporary slot that only answers their CONNECT with a
        refusal in their own protocol version; beyond that, None: the shell closes the
        socket at once. Both are counted as refused.
        """
        policy = self.policies.get(listener)
        source = address_key(peer)
        self.begin()
        try:
            conn = self._take_slot(peer, source, listener, policy, now)
            if conn is None:
                return None
            conn.reset(self.next_conn_id, peer, listener, now, policy, identity)
            conn.source = source
            self.next_conn_id += 1
            self.connections[conn.id] = conn
            if not conn.overflow:
                self.connecting[conn.id] = conn
                self.connecting_by_address.setdefault(source, {})[conn.id] = conn
            self.stats.connections_total += 1
            grace = self.settings.connecting_grace
            if conn.overflow or grace >= self.settings.connect_timeout:
                closing.arm_connect_deadline(self, conn, now)
            else:
                conn.timer = self.timers.at(now + grace, _grace_over, (self, conn, conn.generation))
            return conn
        finally:
            self.end()

    def _take_slot(
        self, peer: str, source: str, listener: str, policy: ListenerPolicy | None, now: float
    ) -> Connection | None:
        """A pool slot for a new connection (evicting to make one), or an overflow
        slot, or None."""
        settings = self.settings
        limit = policy.max_connections if policy is not None else 0
        # Only connections that had their grace can be judged silent (a burst of
        # clients is accepted before any of their CONNECTs is read).
        judged = now - settings.connecting_grace
        same = self.connecting_by_address.get(source)
        if same is not None and len(same) >= settings.max_connecting_per_address:
            oldest = next(iter(same.values()))
            if oldest.opened_at <= judged or not self.free:
                self._evict(oldest, peer, now, by_address=True)
        at_limit = bool(limit) and self.listener_open.get(listener, 0) >= limit
        if at_limit:
            # Only a connection of the same listener can make room under its limit.
            victim = next((c for c in self.connecting.values() if c.listener == listener), None)
            if victim is not None:
                self._evict(victim, peer, now, by_address=False)
                at_limit = False
        elif self.connecting:
            oldest = next(iter(self.connecting.values()))
            if not self.free or (
                len(self.connecting) >= settings.max_connecting and oldest.opened_at <= judged
            ):
                self._evict(oldest, peer, now, by_address=False)
        if self.free and not at_limit:
            conn = self.free.pop()
            self.listener_open[listener] = self.listener_open.get(listener, 0) + 1
            return conn
        if self.overflow < OVERFLOW_SLOTS:
            conn = Connection(settings.max_packet_size)
            conn.overflow = True
            self.overflow += 1
            return conn
        self.stats.connections_refused += 1
        self.refusals(
            now,
            source,
            "connection from %s closed at once: all %d slots and %d refusal slots in use"
            " (%d refused so far)",
            peer,
            settings.max_connections,
            OVERFLOW_SLOTS,
            self.stats.connections_refused,
        )
        return None

    def trim_connecting(self, conn: Connection, now: float) -> None:
        """``conn``'s grace is over, still before its CONNACK: the budgets it was let
        past are enforced again, oldest first (those are at least as old as it)."""
        settings = self.settings
        same = self.connecting_by_address.get(conn.source)
        while same and len(same) > settings.max_connecting_per_address:
            self._evict(next(iter(same.values())), None, now, by_address=True)
            same = self.connecting_by_address.get(conn.source)
        while len(self.connecting) > settings.max_connecting:
            self._evict(next(iter(self.connecting.values())), None, now, by_address=False)

    def _evict(self, victim: Connection, peer: str | None, now: float, *, by_address: bool) -> None:
        """Close ``victim``, still before its CONNACK, and hand its slot to ``peer``."""
        stats = self.stats
        if by_address:
            stats.evicted_address_full += 1
            why = (
                f"{victim.source} has {self.settings.max_connecting_per_address} "
                "connections in CONNECT (max_connecting_per_address)"
            )
        else:
            stats.evicted_connecting_full += 1
            why = (
                f"{len(self.connecting)} connections in CONNECT hold "
                f"{self.settings.max_connecting} of {self.settings.max_connections} slots"
            )
        evicted = stats.evicted_address_full + stats.evicted_connecting_full
        if evicted & (evicted - 1) == 0:
            log.warning(
                "closing %s, without CONNACK after %.1f s, to admit %s: %s (%d evicted so far)",
                victim.label,
                now - victim.opened_at,
                peer or "no one (its grace is over)",
                why,
                evicted,
            )
        victim.evicted = True
        victim.abort = True  # nothing to say to it: free the socket at once
        victim.pending = None  # a login it waited for is decided for nobody
        self.listener_open[victim.listener] -= 1
        closing.close(self, victim, now, "evicted to admit a newer connection")
        # Its slot, for the newcomer: the evicted object stays with its transport until
        # the shell reports it closed, and is then dropped instead of pooled.
        self.free.append(Connection(self.settings.max_packet_size))

    def password_checked(self, attempt: LoginAttempt, ok: bool | None, now: float) -> None:
        """The outcome of a password check handed to ``verifier`` (None: it could not
        be run, the checker is overloaded)."""
        from gateway.broker import handle_login

        self.begin()
        try:
            handle_login.login_decided(self, attempt, ok, now)
        finally:
            self.end()

    def connection_lost(self, conn: Connection, now: float) -> None:
        """The transport is gone (peer closed, reset, or our close completed)."""
        if conn.state is State.CLOSED:
            return
        self.begin()
        try:
            if conn.state is State.CONNECTED:
                log.info("client %s disconnected: connection lost", conn.label)
            if conn.dropped:
                log.warning(
                    "client %s was a slow consumer: %d QoS 0 messages dropped",
                    conn.label,
                    conn.dropped,
                )
            closing.cancel_timers(self, conn)
            conn.held = None
            sessions.detach(self, conn, now)
            conn.state = State.CLOSED
            conn.handle = None
            self.connections.pop(conn.id, None)
            self.connecting_over(conn)
            if conn.overflow:
                self.overflow -= 1
            elif not conn.evicted:
                self.listener_open[conn.listener] -= 1
                self.free.append(conn)  # the slot goes back to the pool
        finally:
            self.end()

    def set_writable(self, conn: Connection, writable: bool, now: float) -> None:
        """Flow control from the transport: pause (False) or resume (True) writing."""
        self.begin()
        try:
            closing.set_writable(self, conn, writable, now)
            if writable and conn.session is not None and conn.state is State.CONNECTED:
                delivery.pump(self, conn.session, now)
        finally:
            self.end()

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()

    def tick(self, now: float) -> None:
        self.begin()
        try:
            self.timers.run_due(now)
        finally:
            self.end()

    def take_dirty(self) -> list[Connection]:
        return output.take_dirty(self)

    def seal_batch(self) -> tuple[int, list[Op]] | None:
        """The journal's operations so far, as a numbered batch for the store."""
        return self.journal.seal() if self.journal is not None else None

    def batch_committed(self, upto: int) -> None:
        """The store committed every batch up to ``upto``: release the output held
        for them, in order."""
        self.begin()
        try:
            output.release(self, upto)
        finally:
            self.end()

    def shutdown(self, now: float) -> None:
        """Close every connection; MQTT 5 clients get DISCONNECT 0x8B (server shutting down)."""
        self.shutting_down = True
        self.begin()
        try:
            for conn in list(self.connections.values()):
                if conn.state is State.CONNECTED:
                    # The clients did nothing wrong: their wills are not published.
                    conn.graceful = True
                    going = MQTTError("server shutting down", ReasonCode.SERVER_SHUTTING_DOWN)
                    closing.fail(self, conn, going, now)
                elif conn.state is State.NEW:
                    closing.close(self, conn, now, "server shutting down")
        finally:
            self.end()

    def set_policies(
        self, policies: dict[str, ListenerPolicy], acl: Acl | None, now: float
    ) -> None:
        """New authentication and ACLs (a reload). Every session's rules are compiled
        again; connected clients their listener would no longer let in are disconnected
        (MQTT 5.0: DISCONNECT 0x98, administrative action)."""
        self.policies = policies
        self.acl = acl
        self.begin()
        try:
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
                    sessions.apply_rules(self, session, rules, now)
            for conn in list(self.connections.values()):
                if conn.overflow:
                    continue
                conn.policy = policies.get(conn.listener)
                if conn.state is State.CONNECTED:
                    reason = self._no_longer_allowed(conn)
                    if reason is not None:
                        error = MQTTError(reason, ReasonCode.ADMINISTRATIVE_ACTION)
                        closing.fail(self, conn, error, now)
        finally:
            self.end()

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

    def adopt_session(self, session: Session, now: float) -> None:
        """Take in a session restored from the store (``sessions.adopt``)."""
        sessions.adopt(self, session, now)

    def sys_values(self, now: float) -> dict[str, str]:
        """``$SYS`` topic -> value (``systopics.sys_values``)."""
        return systopics.sys_values(self, now)

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
        self.begin()
        try:
            return delivery.publish_local(
                self,
                topic,
                payload,
                now,
                qos=qos,
                retain=retain,
                properties=properties,
                origin=origin,
            )
        finally:
            self.end()


def _grace_over(arg: tuple[Broker, Connection, int], now: float) -> None:
    """A connection's ``connecting_grace`` is over before its CONNACK: trim the budgets,
    then it has the rest of ``connect_timeout`` to finish."""
    broker, conn, generation = arg
    if conn.generation != generation or conn.state is not State.NEW:
        return
    conn.timer = None
    broker.begin()
    try:
        broker.trim_connecting(conn, now)
        if not conn.evicted and conn.state is State.NEW:
            closing.arm_connect_deadline(broker, conn, conn.opened_at)
    finally:
        broker.end()
