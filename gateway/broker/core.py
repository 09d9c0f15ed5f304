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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from gateway.broker import closing, delivery, output, pool, publish_policy, sessions, systopics
from gateway.broker import policies as policies_
from gateway.broker.auth import Authenticator, ListenerPolicy
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


Handler = Callable[[Context, Connection, Any, float], None]

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
        with self.event:
            self._received(conn, data, now)

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
        with self.event:
            try:
                self._dispatch(conn, packet, now)
            except MQTTError as error:
                closing.fail(self, conn, error, now)

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
        """A new network connection in a slot of the pool, or None: close the socket at
        once (``pool.open_connection``: the admission and eviction policy)."""
        with self.event:
            return pool.open_connection(self, peer, listener, now, identity)

    def password_checked(self, attempt: LoginAttempt, ok: bool | None, now: float) -> None:
        """The outcome of a password check handed to ``verifier`` (None: it could not
        be run, the checker is overloaded)."""
        from gateway.broker import handle_login

        with self.event:
            handle_login.login_decided(self, attempt, ok, now)

    def connection_lost(self, conn: Connection, now: float) -> None:
        """The transport is gone (peer closed, reset, or our close completed): the
        slot goes back to the pool (``pool.connection_closed``)."""
        if conn.state is State.CLOSED:
            return
        with self.event:
            pool.connection_closed(self, conn, now)

    def set_writable(self, conn: Connection, writable: bool, now: float) -> None:
        """Flow control from the transport: pause (False) or resume (True) writing."""
        with self.event:
            closing.set_writable(self, conn, writable, now)
            if writable and conn.session is not None and conn.state is State.CONNECTED:
                delivery.pump(self, conn.session, now)

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()

    def tick(self, now: float) -> None:
        with self.event:
            self.timers.run_due(now)

    def take_dirty(self) -> list[Connection]:
        return output.take_dirty(self)

    def seal_batch(self) -> tuple[int, list[Op]] | None:
        """The journal's operations so far, as a numbered batch for the store."""
        return self.journal.seal() if self.journal is not None else None

    def batch_committed(self, upto: int) -> None:
        """The store committed every batch up to ``upto``: release the output held
        for them, in order."""
        with self.event:
            output.release(self, upto)

    def shutdown(self, now: float) -> None:
        """Close every connection; MQTT 5 clients get DISCONNECT 0x8B (server shutting down)."""
        self.shutting_down = True
        with self.event:
            for conn in list(self.connections.values()):
                if conn.state is State.CONNECTED:
                    # The clients did nothing wrong: their wills are not published.
                    conn.graceful = True
                    going = MQTTError("server shutting down", ReasonCode.SERVER_SHUTTING_DOWN)
                    closing.fail(self, conn, going, now)
                elif conn.state is State.NEW:
                    closing.close(self, conn, now, "server shutting down")

    def set_policies(
        self, policies: dict[str, ListenerPolicy], acl: Acl | None, now: float
    ) -> None:
        """New authentication and ACLs (a reload, ``policies.apply``)."""
        with self.event:
            policies_.apply(self, policies, acl, now)

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
        with self.event:
            return publish_policy.publish_local(
                self,
                topic,
                payload,
                now,
                qos=qos,
                retain=retain,
                properties=properties,
                origin=origin,
            )
