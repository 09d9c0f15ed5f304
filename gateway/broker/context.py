"""What the broker's small modules share: one plain object, mosquitto's ``db``.

Handlers and the modules they call (``output``, ``delivery``, ``sessions``,
``closing``, ``systopics``, ``publish_policy``) take a ``Context`` as their first
argument and never import the dispatcher (``gateway.broker.core.Broker``, which is a
``Context`` with the dispatch and the shell API on top). No locks: the asyncio loop
is single-threaded and this object has one owner.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.broker.auth import Authenticator, ListenerPolicy, PasswordAuthenticator
from gateway.broker.ratelog import RateLimitedLog
from gateway.broker.retained import RetainedStore
from gateway.broker.router import SubscriptionIndex
from gateway.broker.settings import BrokerSettings
from gateway.broker.state import Connection, Session
from gateway.broker.stats import LoadAverage, Stats
from gateway.broker.timers import Timers

if TYPE_CHECKING:
    # Imported when an ACL or a password file is configured, not before: a broker
    # without them does not carry their code.
    from gateway.broker.acl import Acl
    from gateway.broker.journal import Journal
    from gateway.broker.logins import LoginThrottle
    from gateway.broker.state import LoginAttempt

#: ``$SYS/broker/load/...`` averages, by counter.
LOAD_COUNTERS: tuple[str, ...] = (
    "messages/received",
    "messages/sent",
    "bytes/received",
    "bytes/sent",
    "publish/received",
    "publish/sent",
    "connections",
)


def _nothing() -> None:
    """The wake-up hook of a core nobody drives (tests, tools)."""


def _random_client_id() -> str:
    return os.urandom(8).hex()


class Context:
    """All broker state, with time as an argument everywhere."""

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
        self.listener_open: dict[str, int] = {}
        #: Failed logins per source address (the slowdown), made at the first check.
        self.login_throttle: LoginThrottle | None = None
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
        #: Connections with output to write (``gateway.broker.output``).
        self.dirty: list[Connection] = []
        #: Some connection has more than ``output.FLUSH_AT`` bytes waiting: write now.
        self.urgent = False
        #: The one wake-up hook the shell subscribes to: called once an outermost event
        #: (bytes, a timer, an in-process publish...) is over, so the shell writes what is
        #: dirty, seals the journal and arms its timer.
        self.wake: Callable[[], None] = _nothing
        #: Events in progress (an in-process publish from a timer is nested in ``tick``).
        self.depth = 0
        #: ``with ctx.event:`` around whatever enters the core from outside (see ``Event``).
        self.event = Event(self)
        #: Feeds a connection what arrived while its login was being decided (the
        #: dispatcher's ``data_received``; set by ``Broker``).
        self.resume: Callable[[Connection, float], None] = _resume_nothing
        self.stats = Stats()
        #: Changes to persistent state for the store; None when running in memory only.
        self.journal: Journal | None = None
        #: The store cannot write (disk or store.max_bytes full): QoS 1/2 messages that
        #: would have to be stored are refused until it can again.
        self.store_full = False
        self.shutting_down = False
        #: Run once before the next input is read (set by the app from a signal
        #: handler, so that e.g. a new ACL applies before any packet that follows it).
        self.before_input: Callable[[], None] | None = None
        self.next_conn_id = 1
        # The connection pool: every slot allocated now, reused for the process's life.
        self.free = [
            Connection(self.settings.max_packet_size) for _ in range(self.settings.max_connections)
        ]
        self.overflow = 0
        #: Connections in the pool still before their CONNACK, oldest first (by id),
        #: and the same by source address: their budget (``core.open_connection``).
        self.connecting: dict[int, Connection] = {}
        self.connecting_by_address: dict[str, dict[int, Connection]] = {}
        self.client_id_factory = client_id_factory or _random_client_id
        self.loads = {name: LoadAverage() for name in LOAD_COUNTERS}
        self.sys_last: dict[str, bytes] = {}
        #: Other parts of the gateway (taps, sensors, bridges) adding ``$SYS`` values:
        #: each returns topic -> value below ``$SYS/broker/``.
        self.sys_sources: list[Callable[[], dict[str, str]]] = []
        #: Checks every QoS 1/2 PUBLISH from a client must pass (``publish_policy``):
        #: each gets the topic and payload size and returns why not, or None.
        self.publish_gates: list[Callable[[str, int], str | None]] = []
        #: Log lines of refused PUBLISHes (``$SYS``, ``$share/``, the ACL, a payload
        #: that is not what it says), at most one per source address per minute: a
        #: client repeating one costs no log.
        self.publish_refusals = RateLimitedLog(
            logging.getLogger("ledge.broker"), level=logging.INFO
        )
        #: Log lines of refused connections and protocol errors, the same way: a host
        #: that reconnects to send garbage writes a line a minute, not one a packet.
        self.refusals = RateLimitedLog(logging.getLogger("ledge.broker"))

    @property
    def logins(self) -> LoginThrottle:
        """Failed logins per source address (the slowdown), made at the first check."""
        if self.login_throttle is None:
            from gateway.broker.logins import LoginThrottle

            self.login_throttle = LoginThrottle()
        return self.login_throttle

    def connecting_over(self, conn: Connection) -> None:
        """``conn`` got its CONNACK, or is closing: it leaves the connecting budget."""
        if self.connecting.pop(conn.id, None) is not None:
            same = self.connecting_by_address[conn.source]
            del same[conn.id]
            if not same:
                del self.connecting_by_address[conn.source]


class Event:
    """One event of the core, the one way anything enters it: ``with ctx.event:``.

    Bytes, a timer, a closed transport, an in-process publish or subscribe, a device
    of the firmware bridge: each is wrapped in it where it enters (the shell API of
    ``Broker``, ``LocalClient``, ``ProxyClient``, the MQTT-SN shell). Events nest (an
    in-process publish from a timer is inside ``tick``); when the outermost one is
    over, the shell is woken (``Context.wake``) once, to write what is dirty, seal
    the journal and re-arm its timer. The handlers and the modules below them never
    open one.
    """

    __slots__ = ("_ctx",)

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    def __enter__(self) -> None:
        self._ctx.depth += 1

    def __exit__(self, *exc: object) -> None:
        ctx = self._ctx
        ctx.depth -= 1
        if not ctx.depth:
            ctx.wake()


def _resume_nothing(conn: Connection, now: float) -> None:
    """A context without a dispatcher has no input to resume."""
