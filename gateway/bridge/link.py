"""One cloud bridge at work: local messages into the outbox, the outbox upstream over
aiomqtt, remote messages back in.

Up: the bridge subscribes in process (``LocalClient``) to each outbound rule's local
filter, with No Local so what it brought in never goes back out, and with Retain As
Published so retained messages stay retained. Each message gets the gateway's
sequence number and enters the outbox (durably, before its publisher is
acknowledged, when there is a store). A sender drains the outbox in order, keeping
at most ``min(remote Receive Maximum, max_inflight)`` QoS 1/2 messages unacknowledged
and honouring ``rate_limit``; an entry leaves the outbox only when the remote has
acknowledged it. After a reconnect everything unacknowledged is sent again, in order.

Down: inbound rules become subscriptions on the remote; what arrives is published
locally under the mapped topic.

Loops: with MQTT 5 the remote subscriptions use No Local. Every message that
crosses a bridge carries the id of the gateway where it entered the bridged world
and its sequence number there: sent up, it gets this gateway's marks (user
properties or the envelope) unless it already has some; brought in unmarked, it is
stamped with this gateway's marks too. A message that reaches this gateway from
outside (a remote, or a network client) already marked with this gateway's own id
has been around a loop and is dropped and counted -- so even two gateways bridging
the same branch to each other in both directions cannot ping-pong a message (they
do deliver duplicates, each carrying the same marks). MQTT 3.1.1 remotes without
the envelope also get echo suppression: an inbound message equal to one sent up in
the last minute is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from drivers.envelope import (
    ENVELOPE_START,
    GATEWAY_PROPERTY,
    SEQUENCE_PROPERTY,
    envelope,
    open_envelope,
)
from gateway.bridge.aiomqtt_client import HookedClient
from gateway.bridge.outbox import Entry, Outbox
from gateway.bridge.rules import map_in, map_out
from gateway.bridge.sequence import Sequence
from gateway.bridge.settings import REFUSE, BridgeSettings
from gateway.broker.core import Broker
from gateway.broker.journal import Op, RemoveOutbox
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.mqtt.properties import (
    EMPTY,
    Properties,
    Where,
    decode_properties,
    encode_properties,
    property_block,
    user_property,
)
from gateway.store.settings import OUTBOX_ENTRY_OVERHEAD

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.store.sqlite import Store

log = logging.getLogger("ledge.bridge")


def backoff(first: float, most: float, failures: int) -> float:
    """The wait after ``failures`` failures in a row: ``first``, doubling with each
    further failure, at most ``most`` (before jitter) -- for any number of failures (an
    uplink down for a day fails thousands of times; 2.0 ** 1024 is not a float)."""
    return min(most, first * 2.0 ** min(max(0, failures - 1), 64))


#: Echo suppression (MQTT 3.1.1 without the envelope): how long and how many.
ECHO_SECONDS: Final = 60.0
ECHO_ENTRIES: Final = 10_000
#: QoS 0 messages waiting to go when ``qos0 = "bypass"`` (drop new beyond).
BYPASS_QUEUE: Final = 1000
#: A connection that lasted this long resets the backoff.
STABLE_SECONDS: Final = 10.0
#: Seconds ``stop`` waits for the link to end before it cancels it again.
STOP_RETRY: Final = 0.5
#: Inbound messages aiomqtt may hold before it drops (it logs each drop).
INBOUND_QUEUE: Final = 10_000
#: Removals from the outbox reach the store at most this late (grouped): after a
#: crash, what the remote acknowledged in that time is sent again (same marks).
DONE_DELAY: Final = 0.25
#: A page of the outbox the store could not read is asked for again after this many
#: seconds, doubling with each failure in a row up to ``REFILL_RETRY_MAX``.
REFILL_RETRY: Final = 1.0
REFILL_RETRY_MAX: Final = 60.0


@dataclass(slots=True)
class BridgeStats:
    received: int = 0  # from the remote, published locally
    unmapped: int = 0  # matched a local subscription but no rule maps it
    loops: int = 0  # dropped: marked with this gateway's id (went around a loop)
    echoes: int = 0  # dropped: an echo of what we sent (3.1.1 without envelope)
    rejected: int = 0  # the remote answered with a failure reason code
    dropped_qos0_offline: int = 0  # bypass QoS 0 while not connected
    connects: int = 0
    refused_publishes: int = 0


class _Repeats(logging.Filter):
    """For the MQTT library's log: the first of identical problems is a warning, the
    repeats (every reconnect attempt) debug; the last one explains a failed attempt."""

    def __init__(self) -> None:
        super().__init__()
        self.last = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            text = record.getMessage()
            if text == self.last:
                record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            self.last = text
        return True


class EchoFilter:
    """Fingerprints of messages sent up recently (bounded, oldest forgotten first)."""

    def __init__(self) -> None:
        self._seen: OrderedDict[tuple[str, int], float] = OrderedDict()

    def sent(self, topic: str, payload: bytes, now: float) -> None:
        key = (topic, hash(payload))
        self._seen[key] = now + ECHO_SECONDS
        self._seen.move_to_end(key)
        while len(self._seen) > ECHO_ENTRIES:
            self._seen.popitem(last=False)

    def is_echo(self, topic: str, payload: bytes, now: float) -> bool:
        deadline = self._seen.pop((topic, hash(payload)), None)
        return deadline is not None and now < deadline


class Bridge:
    """One ``[[bridges]]`` entry, from local subscription to remote acknowledgement."""

    #: Client ids of the in-process clients of every bridge of this gateway: what
    #: they publish was stamped here, so this gateway's own marks on it are no loop.
    local_ids: set[str] = set()

    def __init__(
        self,
        settings: BridgeSettings,
        *,
        gateway: str,
        prefix: str,
        broker: Broker,
        sequence: Sequence,
        store: Store | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        #: The wall clock of outbox times: the gateway's, which follows a step of the
        #: system clock together with the outbox (``Outbox.shift_wall``).
        self.wall = wall
        self.name = settings.name
        self.gateway = gateway
        self.prefix = prefix
        self.broker = broker
        self.sequence = sequence
        self.store = store
        self.client_id = settings.client_id or f"ledge-{gateway}-{settings.name}"
        self.local = LocalClient(broker, f"ledge-bridge-{settings.name}", self._sink)
        Bridge.local_ids.add(self.local.client_id)
        self.outbox = Outbox(
            settings.name, settings.outbox, self._emit if store is not None else None
        )
        self.stats = BridgeStats()
        self.state = "disconnected"
        self.address = ""
        #: Why the last connection attempt failed or the link was lost ("" : never),
        #: and when (wall clock).
        self.last_error = ""
        self.last_error_at: float | None = None
        #: When (wall clock) the link last came up or went down (at first: created).
        self.since = wall()
        self.remote_receive_maximum = 65_535
        self.window = settings.max_inflight
        self.inflight = 0
        self.echo = EchoFilter() if settings.version == 4 and not settings.envelope else None
        self._bypass: list[Entry] = []
        self._wake = asyncio.Event()
        self._slot = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Reads of the outbox from the store in progress (kept: the loop holds only
        #: weak references to tasks).
        self._loads: set[asyncio.Task[None]] = set()
        #: Reads of the outbox that failed in a row, and when to read again (monotonic).
        self._load_failures = 0
        self._load_after = 0.0
        self._stopping = False
        self._pending: dict[int, Entry | None] = {}
        self._client: HookedClient | None = None
        self._status_topic: str | None = None
        self._next_send = 0.0
        self._connected_at: float | None = None
        self._wake_scheduled = False
        self._done_ops: list[Op] = []
        self._done_timer: asyncio.TimerHandle | None = None
        #: The first mark (this gateway's id), encoded.
        self._mark_prefix = user_property(GATEWAY_PROPERTY, gateway)
        self._mqtt_log = logging.getLogger(f"ledge.bridge.{settings.name}")
        self._repeats = _Repeats()
        self._mqtt_log.addFilter(self._repeats)
        mapped = map_out(settings.rules, f"{prefix}/{gateway}/status", 1, True)
        if mapped is not None:
            self._status_topic = mapped.topic

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        now = self.broker_now()
        for rule in self.settings.rules:
            if rule.outbound:
                self.local.subscribe(
                    rule.local_filter,
                    2,
                    now,
                    retained=False,
                    no_local=True,
                    retain_as_published=True,
                )
        if self.settings.outbox.when_full == REFUSE:
            self.broker.publish_gates.append(self._gate)
        self.broker.sys_sources.append(self.sys_values)
        self._set_state("disconnected")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"bridge {self.name}")

    async def stop(self) -> None:
        self._stopping = True
        client = self._client
        if client is not None and self._status_topic is not None:
            with contextlib.suppress(Exception):
                client.paho.publish(self._status_topic, b"offline", 1, True)
        if self._task is not None:
            # Cancelled again until it ends: on Python 3.11, a cancel that comes in the
            # same turn as the reply it waits for is lost inside ``asyncio.wait_for``
            # (aiomqtt's subscribe and publish), and the link would run on for ever.
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=STOP_RETRY)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._loads):
            task.cancel()
        await asyncio.gather(*self._loads, return_exceptions=True)
        # A page cancelled halfway is asked for again by whoever sends this outbox next.
        self.outbox.refilling = False
        if self._done_timer is not None:
            self._done_timer.cancel()
        self._flush_done()
        if self._gate in self.broker.publish_gates:
            self.broker.publish_gates.remove(self._gate)
        if self.sys_values in self.broker.sys_sources:
            self.broker.sys_sources.remove(self.sys_values)
        self._set_state("stopped")

    def detach(self) -> None:
        """After ``stop``, for good (a reload removed or changed the bridge): its local
        subscriptions and client id go, so nothing more enters its outbox."""
        self.local.close(self.broker_now())
        Bridge.local_ids.discard(self.local.client_id)
        self._mqtt_log.removeFilter(self._repeats)

    def successor(self, settings: BridgeSettings) -> Bridge:
        """The bridge that carries on from this stopped one with new ``settings`` (same
        name; a reload changed them): it takes over the outbox -- what is queued goes
        up first, in order, as it was mapped when it was queued -- and the counters.
        Nothing is lost between the two: call ``start`` on it before yielding to the
        event loop."""
        self.detach()
        new = Bridge(
            settings,
            gateway=self.gateway,
            prefix=self.prefix,
            broker=self.broker,
            sequence=self.sequence,
            store=self.store,
            wall=self.wall,
        )
        outbox = self.outbox
        outbox.settings = settings.outbox  # a lower bound applies from the next message on
        outbox.emit = new._emit if self.store is not None else None
        new.outbox = outbox
        new.stats = self.stats
        return new

    def forget_sys(self) -> None:
        """A reload removed the bridge: its retained ``$SYS/broker/bridge/<name>/...``
        values are cleared, so nothing shows a bridge that is no longer there."""
        broker, now = self.broker, self.broker_now()
        for key in (*self.sys_values(), f"bridge/{self.name}/state"):
            topic = "$SYS/broker/" + key
            broker.sys_last.pop(topic, None)
            broker.publish_local(topic, b"", now, retain=True)

    def broker_now(self) -> float:
        return asyncio.get_running_loop().time()

    def committed(self, upto: int) -> None:
        """The store committed batches up to ``upto``: those entries may go up."""
        self.outbox.commit(upto)
        self._wake.set()

    # ------------------------------------------------------------------ local side

    def _emit(self, op: Op) -> None:
        journal = self.broker.journal
        assert journal is not None
        if not isinstance(op, RemoveOutbox):
            journal.ops.append(op)
            return
        # Removals wait a little and go in groups: far fewer commits (and fsyncs)
        # while a backlog drains; losing one only means sending a message again.
        self._done_ops.append(op)
        if self._done_timer is None:
            self._done_timer = asyncio.get_running_loop().call_later(DONE_DELAY, self._flush_done)

    def _flush_done(self) -> None:
        self._done_timer = None
        journal = self.broker.journal
        if self._done_ops and journal is not None:
            journal.ops.extend(self._done_ops)
            self._done_ops.clear()
            self.broker.wake()  # the shell seals them into a store batch

    def _gate(self, topic: str, size: int) -> str | None:
        """Policy ``refuse``: a QoS 1/2 publisher is told no while the outbox is full.
        ``size``: the message's payload and properties; the entry it would make holds
        them under the remote topic (``Entry.size``), so a message accepted here fits."""
        mapped = map_out(self.settings.rules, topic, 1, False)
        if mapped is None:
            return None
        outbox = self.outbox
        if not outbox.would_overflow(len(mapped.topic) + size + OUTBOX_ENTRY_OVERHEAD):
            return None
        self.stats.refused_publishes += 1
        outbox.stats.refused += 1
        return f"bridge {self.name}: outbox full ({outbox.count} messages, {outbox.bytes} bytes)"

    def _sink(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
        """A local message for upstream (called inside the broker's delivery)."""
        settings = self.settings
        mapped = map_out(settings.rules, msg.topic, qos, retain)
        if mapped is None:
            self.stats.unmapped += 1
            return
        props = msg.properties
        origin = _mark(props)
        if origin is not None and origin[0] == self.gateway and msg.origin not in Bridge.local_ids:
            # Marked here, gone out and come back through someone else: a loop.
            self.stats.loops += 1
            if self.stats.loops & (self.stats.loops - 1) == 0:  # the 1st, 2nd, 4th, 8th...
                log.warning(
                    "bridge %s: dropped %r, marked with this gateway's id (a loop; %d so far)",
                    self.name,
                    msg.topic,
                    self.stats.loops,
                )
            return
        wall = self.wall()
        journal = self.broker.journal
        bypass = mapped.qos == 0 and settings.qos0 == "bypass"
        if bypass and (self.state != "connected" or len(self._bypass) >= BYPASS_QUEUE):
            self.stats.dropped_qos0_offline += 1
            return
        if origin is not None:
            seq = origin[1]  # passing through: keep the first gateway's marks
        else:
            seq = self.sequence.for_message(
                msg, journal.batch_id if journal else 0, journal.ops if journal else None
            )
        expires = None
        if msg.expires_at is not None:
            expires = wall + max(0.0, msg.expires_at - self.broker_now())
        entry = Entry(
            0,
            seq,
            mapped.topic,
            msg.payload,
            mapped.qos,
            mapped.retain,
            encode_properties(props) if props is not EMPTY else b"",
            wall,
            expires,
            journal.batch_id if journal is not None and self.store is not None else 0,
        )
        if bypass:
            if origin is None and seq >= self.sequence.limit:
                # Its number is not yet durably reserved (a burst beyond half a block
                # within one commit); sending it could reuse the number after a crash.
                self.stats.dropped_qos0_offline += 1
                return
            self._bypass.append(entry)
            self._wake.set()
            return
        if not self.outbox.put(entry):
            dropped = self.outbox.stats.dropped_full
            if dropped & (dropped - 1) == 0:
                log.warning(
                    "bridge %s: outbox full (%d messages, %d bytes): policy %s, %d dropped so far",
                    self.name,
                    self.outbox.count,
                    self.outbox.bytes,
                    settings.outbox.when_full,
                    dropped,
                )
        self._wake.set()

    # ------------------------------------------------------------------ connection

    async def _run(self) -> None:
        settings = self.settings
        failures = 0
        index = 0
        last_problem: tuple[str, str] | None = None
        while not self._stopping:
            host, port = settings.addresses[index % len(settings.addresses)]
            self.address = f"{host}:{port}"
            self._set_state("connecting")
            reason = ""
            try:
                await self._connection(host, port)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure means: reconnect
                reason = _describe(exc)
                self.last_error = reason
                self.last_error_at = self.wall()
            finally:
                self._disconnected()
            if self._stopping:
                return
            connected_at, self._connected_at = self._connected_at, None
            if connected_at is not None:
                last_problem = None  # it worked for a while: the next problem is news
            if connected_at is not None and time.monotonic() - connected_at >= STABLE_SECONDS:
                failures = 0
            else:
                failures += 1
                index += 1  # try the next address
            delay = backoff(settings.reconnect_min, settings.reconnect_max, failures)
            delay = random.uniform(delay / 2, delay)  # jitter
            # One warning per change of state or reason; repeats of the same go to debug.
            what = "lost" if self.state == "connected" else "cannot connect to"
            repeat = (what, reason) == last_problem
            last_problem = (what, reason)
            log.log(
                logging.DEBUG if repeat else logging.WARNING,
                "bridge %s: %s %s%s; retrying in %.1f s%s",
                self.name,
                what,
                self.address,
                f" ({reason})" if reason else "",
                delay,
                "" if repeat else " (further identical failures are logged at debug level)",
            )
            self._set_state("disconnected")
            await asyncio.sleep(delay)

    async def _connection(self, host: str, port: int) -> None:
        settings = self.settings
        client = HookedClient(
            on_ack=self.on_publish,
            last_error=lambda: self._repeats.last,
            hostname=host,
            port=port,
            identifier=self.client_id,
            username=settings.username,
            password=settings.password,
            protocol=aiomqtt.ProtocolVersion.V5
            if settings.version == 5
            else aiomqtt.ProtocolVersion.V311,
            clean_session=settings.clean_start if settings.version == 4 else None,
            clean_start=settings.clean_start if settings.version == 5 else 3,
            keepalive=settings.keepalive,
            tls_context=_tls_context(settings) if settings.tls.enabled else None,
            tls_insecure=settings.tls.insecure if settings.tls.enabled else None,
            will=aiomqtt.Will(self._status_topic, b"offline", 1, True)
            if self._status_topic
            else None,
            properties=_connect_properties(settings),
            timeout=settings.connect_timeout,
            max_inflight_messages=settings.max_inflight,
            max_queued_incoming_messages=INBOUND_QUEUE,
            logger=self._mqtt_log,
        )
        async with client:
            self._client = client
            self._connected_at = time.monotonic()
            self.stats.connects += 1
            self.remote_receive_maximum = client.receive_maximum
            self.window = max(1, min(settings.max_inflight, client.receive_maximum))
            for rule in settings.rules:
                if not rule.inbound:
                    continue
                if settings.version == 5:
                    await client.subscribe(
                        rule.remote_filter,
                        options=SubscribeOptions(
                            qos=rule.qos, noLocal=True, retainAsPublished=True
                        ),
                    )
                else:
                    await client.subscribe(rule.remote_filter, rule.qos)
            if self._stopping:
                return  # stopped meanwhile: "offline" is said; "online" must not follow
            if self._status_topic is not None:
                client.paho.publish(self._status_topic, b"online", 1, True)
            replay = self.outbox.count
            self._set_state("connected")
            log.info(
                "bridge %s: connected to %s as %s (receive maximum %d, window %d%s)",
                self.name,
                self.address,
                self.client_id,
                client.receive_maximum,
                self.window,
                f", {replay} message(s) waiting" if replay else "",
            )
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive(client))
                group.create_task(self._send(client))

    def _disconnected(self) -> None:
        self._client = None
        self._pending.clear()
        self.inflight = 0
        self._bypass.clear()
        self.outbox.rewind()

    # ------------------------------------------------------------------ up

    async def _send(self, client: HookedClient) -> None:
        outbox = self.outbox
        paho = client.paho
        rate = self.settings.rate_limit
        while True:
            self._refill()
            if self._bypass:
                for bypassed in self._bypass:
                    self._send_entry(paho, bypassed)
                self._bypass.clear()
            if self.inflight >= self.window:
                self._slot.clear()
                await self._slot.wait()
                continue
            entry = outbox.next_ready(self.wall())
            if entry is None:
                self._wake.clear()
                self.broker.wake()  # store what the outbox changed (expired entries)
                await self._wake.wait()
                continue
            if rate > 0:
                now = time.monotonic()
                if self._next_send > now:
                    await asyncio.sleep(self._next_send - now)
                self._next_send = max(now, self._next_send) + 1.0 / rate
            self._send_entry(paho, entry)

    def _send_entry(self, paho: Any, entry: Entry) -> None:
        """Hand one entry to paho; outbox entries (``pos`` > 0) count against the window
        until the remote acknowledges them."""
        payload = entry.payload
        mark = _mark_bytes(entry.properties)
        if self.settings.envelope:
            payload = envelope(mark[0] if mark else self.gateway, entry.seq, payload)
        properties = None
        if self.settings.version == 5:
            properties = self._properties(entry, mark is None)
        if self.echo is not None:
            self.echo.sent(entry.topic, payload, time.monotonic())
        info = paho.publish(entry.topic, payload, entry.qos, entry.retain, properties)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise ConnectionError(f"publish failed: {mqtt.error_string(info.rc)}")
        if not entry.pos:
            return  # QoS 0 bypassing the outbox: nothing to wait for
        self.inflight += 1
        if info.is_published():
            self._published(entry, 0)
        else:
            self._pending[info.mid] = entry

    def _properties(self, entry: Entry, add_mark: bool) -> _Packed:
        """The MQTT 5 properties to send ``entry`` with: what its publisher gave (user
        properties, content type...), the remaining expiry, and the upstream marks."""
        if not entry.properties and entry.expires is None:  # the common case, by hand
            if not add_mark:
                return _Packed(property_block(b""))
            seq = user_property(SEQUENCE_PROPERTY, str(entry.seq))
            return _Packed(property_block(self._mark_prefix + seq))
        props = EMPTY
        if entry.properties:
            props, _ = decode_properties(entry.properties, 0, len(entry.properties), Where.PUBLISH)
        if entry.expires is not None:
            remaining = min(0xFFFF_FFFF, max(1, math.ceil(entry.expires - self.wall())))
            props = props.with_(message_expiry_interval=remaining)
        if add_mark:
            props = props.with_(
                user_properties=(
                    *props.user_properties,
                    (GATEWAY_PROPERTY, self.gateway),
                    (SEQUENCE_PROPERTY, str(entry.seq)),
                )
            )
        return _Packed(encode_properties(props))

    def on_publish(self, mid: int, reason_code: int) -> None:
        """paho: the remote acknowledged ``mid`` (or QoS 0 was written)."""
        entry = self._pending.pop(mid, None)
        if entry is not None:
            self._published(entry, reason_code)

    def _published(self, entry: Entry, reason_code: int) -> None:
        self.inflight -= 1
        self._slot.set()
        if reason_code >= 0x80:
            self.stats.rejected += 1
            log.warning(
                "bridge %s: the remote refused the message on %r (reason code 0x%02X); dropped",
                self.name,
                entry.topic,
                reason_code,
            )
        self.outbox.acknowledged(entry)
        self._wake_soon()

    def _wake_soon(self) -> None:
        """Let the shell seal what the outbox changed, once per loop iteration."""
        if not self._wake_scheduled:
            self._wake_scheduled = True
            asyncio.get_running_loop().call_soon(self._woken)

    def _woken(self) -> None:
        self._wake_scheduled = False
        self.broker.wake()

    def _refill(self) -> None:
        if self._load_failures and time.monotonic() < self._load_after:
            return  # the last read failed: its retry wakes the sender
        request = self.outbox.refill_request()
        if request is None or self.store is None:
            return
        store = self.store
        first, count = request
        steps = self.outbox.wall_steps

        def read() -> list[Entry]:
            rows = store.read_outbox(self.name, first, count)
            return [
                Entry(pos, seq, topic, bytes(data), qos, bool(retain), bytes(props), made, ends)
                for pos, seq, topic, data, qos, retain, props, made, ends in rows
            ]

        async def load() -> None:
            try:
                rows = await asyncio.get_running_loop().run_in_executor(None, read)
            except Exception:
                self.outbox.refilling = False
                self._load_failures += 1
                delay = backoff(REFILL_RETRY, REFILL_RETRY_MAX, self._load_failures)
                self._load_after = time.monotonic() + delay
                log.exception(
                    "bridge %s: cannot read the outbox from the store (trying again in %g s)",
                    self.name,
                    delay,
                )
                # Nothing else may wake the sender (the backlog is all on disk).
                asyncio.get_running_loop().call_later(delay, self._wake.set)
                return
            self._load_failures = 0
            if self.outbox.wall_steps != steps:
                # The clock was set while the page was read: its times may be in the
                # old frame. Read it again (after the store has moved them).
                self.outbox.refilling = False
            else:
                self.outbox.refilled(rows)
            self._wake.set()

        task = asyncio.get_running_loop().create_task(load(), name=f"bridge {self.name} outbox")
        self._loads.add(task)
        task.add_done_callback(self._loads.discard)

    # ------------------------------------------------------------------ down

    async def _receive(self, client: HookedClient) -> None:
        async for message in client.messages:
            self._inbound(message)

    def _inbound(self, message: aiomqtt.Message) -> None:
        topic = message.topic.value
        payload = message.payload
        if isinstance(payload, str):
            payload = payload.encode()
        elif isinstance(payload, int | float):
            payload = str(payload).encode()
        elif payload is None:
            payload = b""
        assert isinstance(payload, bytes | bytearray)
        payload = bytes(payload)
        mapped = map_in(self.settings.rules, topic, message.qos, message.retain)
        if mapped is None:
            self.stats.unmapped += 1
            return
        props = _our_properties(message.properties)
        mark = _mark(props)
        if mark is None and self.settings.envelope and payload.startswith(ENVELOPE_START):
            with contextlib.suppress(ValueError):
                gateway, seq, _ = open_envelope(payload)
                mark = (gateway, seq)
        if mark is not None and mark[0] == self.gateway:
            self.stats.loops += 1
            return
        if self.echo is not None and self.echo.is_echo(topic, payload, time.monotonic()):
            self.stats.echoes += 1
            return
        if mark is None and not (self.settings.envelope and payload.startswith(ENVELOPE_START)):
            # Entering the bridged world here: stamp it, so it can never come back as new.
            journal = self.broker.journal
            seq = self.sequence.take(
                journal.batch_id if journal else 0, journal.ops if journal else None
            )
            props = props.with_(
                user_properties=(
                    *props.user_properties,
                    (GATEWAY_PROPERTY, self.gateway),
                    (SEQUENCE_PROPERTY, str(seq)),
                )
            )
        self.stats.received += 1
        self.local.publish(
            mapped.topic,
            payload,
            self.broker_now(),
            qos=mapped.qos,
            retain=mapped.retain,
            properties=props,
        )

    # ------------------------------------------------------------------ reporting

    def _set_state(self, state: str) -> None:
        if (state == "connected") != (self.state == "connected"):
            self.since = self.wall()
        self.state = state
        self.broker.publish_local(
            f"$SYS/broker/bridge/{self.name}/state",
            state.encode(),
            self.broker_now(),
            retain=True,
        )

    def sys_values(self) -> dict[str, str]:
        o = self.outbox
        st, bs = o.stats, self.stats
        base = f"bridge/{self.name}/"
        return {
            base + "address": self.address,
            base + "queued": str(o.count),
            base + "bytes": str(o.bytes),
            base + "sent": str(st.sent),
            base + "acknowledged": str(st.acknowledged),
            base + "inflight": str(self.inflight),
            base + "window": str(self.window),
            base + "dropped": str(st.dropped + bs.dropped_qos0_offline + bs.rejected),
            base + "dropped/full": str(st.dropped_full),
            base + "dropped/expired": str(st.dropped_expired),
            base + "dropped/qos 0 offline": str(bs.dropped_qos0_offline),
            base + "dropped/rejected": str(bs.rejected),
            base + "dropped/loops": str(bs.loops),
            base + "refused": str(st.refused),
            base + "received": str(bs.received),
            base + "oldest message age": f"{o.oldest_age(self.wall()):.1f}",
            base + "connects": str(bs.connects),
        }

    @property
    def drops(self) -> int:
        """Messages this bridge lost by policy (for the gateway's health reports)."""
        return self.outbox.stats.dropped + self.stats.dropped_qos0_offline + self.stats.rejected


# ---------------------------------------------------------------------- helpers


def _mark(props: Properties) -> tuple[str, int] | None:
    """``(gateway, seq)`` from a message's user properties, if a Ledge bridge marked it."""
    gateway = seq = None
    for key, value in props.user_properties:
        if key == GATEWAY_PROPERTY:
            gateway = value
        elif key == SEQUENCE_PROPERTY:
            seq = value
    if gateway is None or seq is None or not seq.isdigit():
        return None
    return gateway, int(seq)


def _mark_bytes(encoded: bytes) -> tuple[str, int] | None:
    if not encoded:
        return None
    props, _ = decode_properties(encoded, 0, len(encoded), Where.PUBLISH)
    return _mark(props)


class _Packed:
    """MQTT 5 PUBLISH properties already encoded, handed to paho as they are (paho only
    calls ``pack()``): building paho's Properties object per message costs more than
    the rest of the send."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def pack(self) -> bytes:
        return self.data

    def __repr__(self) -> str:
        props, _ = decode_properties(self.data, 0, len(self.data), Where.PUBLISH)
        return repr(props)


def _our_properties(paho_props: Any) -> Properties:
    """paho's PUBLISH properties as ours (what is worth passing on locally)."""
    if paho_props is None:
        return EMPTY
    changes: dict[str, Any] = {}
    user = getattr(paho_props, "UserProperty", None)
    if user:
        changes["user_properties"] = tuple((str(k), str(v)) for k, v in user)
    for ours, theirs in (
        ("payload_format_indicator", "PayloadFormatIndicator"),
        ("content_type", "ContentType"),
        ("response_topic", "ResponseTopic"),
        ("correlation_data", "CorrelationData"),
        ("message_expiry_interval", "MessageExpiryInterval"),
    ):
        value = getattr(paho_props, theirs, None)
        if value is not None:
            changes[ours] = value
    return Properties(**changes) if changes else EMPTY


def _connect_properties(settings: BridgeSettings) -> PahoProperties | None:
    if settings.version != 5:
        return None
    props = PahoProperties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = settings.session_expiry
    props.ReceiveMaximum = 65_535
    return props


def _tls_context(settings: BridgeSettings) -> ssl.SSLContext:
    tls = settings.tls
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.cert_file is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.insecure:
        context.check_hostname = False
    return context


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc) or type(exc).__name__
    return text
