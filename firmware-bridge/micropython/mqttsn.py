# An MQTT-SN 1.2 client for MicroPython (asyncio), built for links that drop packets.
#
#   transport = UDPTransport("192.168.1.10")          # or UARTTransport(machine.UART(...))
#   client = Client(transport, "pico-kitchen", on_message=handler)
#   await client.connect()
#   await client.subscribe("ledge/gw1/firmware/pico-kitchen/cmd/#", qos=1)
#   await client.publish("ledge/gw1/firmware/pico-kitchen/temperature", b"21.5", qos=1)
#
# What it does for you:
# - every request (CONNECT, REGISTER, SUBSCRIBE, QoS 1 PUBLISH, PINGREQ, sleep) is
#   resent when its answer does not come, with exponential backoff (DUP on PUBLISH);
# - when the gateway is gone (no answer after the retries, an unexpected DISCONNECT,
#   "invalid topic id" after a gateway restart) it connects again with backoff, then
#   registers its topics and subscribes again by itself, and resends the message;
# - memory is bounded: fixed-size topic and subscription tables, one request in
#   flight, no queues. See firmware-bridge/README.md for the RAM it needs.
#
# Section numbers refer to the MQTT-SN 1.2 specification.

try:
    import asyncio
except ImportError:  # older MicroPython
    import uasyncio as asyncio

import time

try:
    from time import ticks_add, ticks_diff, ticks_ms
except ImportError:  # CPython, for host-side tools

    def ticks_ms():
        return int(time.monotonic() * 1000)

    def ticks_diff(a, b):
        return a - b

    def ticks_add(a, b):
        return a + b


ADVERTISE = 0x00
SEARCHGW = 0x01
GWINFO = 0x02
CONNECT = 0x04
CONNACK = 0x05
WILLTOPICREQ = 0x06
WILLTOPIC = 0x07
WILLMSGREQ = 0x08
WILLMSG = 0x09
REGISTER = 0x0A
REGACK = 0x0B
PUBLISH = 0x0C
PUBACK = 0x0D
SUBSCRIBE = 0x12
SUBACK = 0x13
UNSUBSCRIBE = 0x14
UNSUBACK = 0x15
PINGREQ = 0x16
PINGRESP = 0x17
DISCONNECT = 0x18

ACCEPTED = 0
CONGESTION = 1
INVALID_TOPIC_ID = 2
NOT_SUPPORTED = 3

NORMAL = 0
PREDEFINED = 1
SHORT = 2

_DUP = 0x80
_RETAIN = 0x10
_WILL = 0x08
_CLEAN = 0x04


class MQTTSNError(Exception):
    pass


class Refused(MQTTSNError):
    """The gateway answered with a return code other than "accepted"."""

    def __init__(self, what, code):
        super().__init__("%s refused with return code %d" % (what, code))
        self.code = code


class LinkLost(MQTTSNError):
    """No answer after every retry: the gateway (or the link to it) is gone."""


# ---------------------------------------------------------------------- codec


def _u16(value):
    return bytes((value >> 8, value & 0xFF))


def message(msg_type, body=b""):
    """Length + MsgType + body (section 5.2), 3-octet Length from 256 octets on."""
    n = len(body) + 2
    if n < 256:
        return bytes((n, msg_type)) + body
    n += 2
    return bytes((1, n >> 8, n & 0xFF, msg_type)) + body


def parse(data):
    """(MsgType, body) of one whole message, or None when it is not one."""
    n = len(data)
    if n < 2:
        return None
    if data[0] == 1:
        if n < 4 or (data[1] << 8 | data[2]) != n:
            return None
        return data[3], data[4:]
    if data[0] != n:
        return None
    return data[1], data[2:]


def _qos_bits(qos):
    return (qos & 3) << 5


def _qos_of(flags):
    q = (flags >> 5) & 3
    return -1 if q == 3 else q


def short_topic_id(name):
    raw = name.encode()
    return raw[0] << 8 | raw[1]


# ---------------------------------------------------------------------- transports


class UDPTransport:
    """MQTT-SN over UDP. ``sock`` may be given (anything with ``sendto``/``recvfrom``
    that raises OSError when nothing is waiting); by default a non-blocking socket,
    bound to ``port`` when no gateway is given (to hear its ADVERTISE broadcasts), else
    to ``bind_port`` (0: any)."""

    def __init__(
        self, host=None, port=1884, sock=None, bind_port=None, poll_ms=20, max_message=256
    ):
        if sock is None:
            import socket

            if bind_port is None:
                bind_port = port if host is None else 0
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("0.0.0.0", bind_port))
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            except (OSError, AttributeError):
                pass
        self.sock = sock
        self.port = port
        self.gateway = None if host is None else (host, port)
        self.poll_ms = poll_ms
        self.max_message = max_message

    def send(self, data):
        if self.gateway is None:
            raise MQTTSNError("no gateway address: call Client.discover() first")
        self.sock.sendto(data, self.gateway)

    def broadcast(self, data):
        self.sock.sendto(data, ("255.255.255.255", self.port))

    def learn(self, address):
        """A gateway answered (GWINFO) or advertised from ``address``."""
        if self.gateway is None:
            self.gateway = (address[0], self.port)

    async def recv(self):
        """(message, source address)."""
        while True:
            try:
                data, address = self.sock.recvfrom(self.max_message + 3)
            except OSError:
                await asyncio.sleep_ms(self.poll_ms)
                continue
            if data:
                return data, address


class UARTTransport:
    """MQTT-SN over a serial line in COBS frames (firmware-bridge/UART.md). ``uart`` is a
    ``machine.UART`` or anything with ``write``, ``any`` and ``read``."""

    def __init__(self, uart, poll_ms=10, max_message=256):
        import uframe

        self.uart = uart
        self.poll_ms = poll_ms
        self._encode = uframe.encode_frame
        self.deframer = uframe.Deframer(max_message)
        self._ready = []
        self.gateway = "uart"
        uart.write(b"\x00")  # end whatever a reset left half-sent

    def send(self, data):
        self.uart.write(self._encode(data))

    broadcast = send

    def learn(self, address):
        pass

    async def recv(self):
        while not self._ready:
            n = self.uart.any()
            if n:
                self.deframer.feed(self.uart.read(n), self._ready)
            else:
                await asyncio.sleep_ms(self.poll_ms)
        return self._ready.pop(0), "uart"


# ---------------------------------------------------------------------- the client


class Client:
    """One MQTT-SN client. ``on_message(topic, payload, retained)`` is called for every
    message its subscriptions match (topic is None for an id it was never told)."""

    def __init__(
        self,
        transport,
        client_id,
        keepalive=60,
        clean=True,
        will=None,
        on_message=None,
        predefined=None,
        retry_ms=1000,
        max_retry_ms=16000,
        retries=4,
        max_topics=16,
        max_subscriptions=8,
    ):
        self.transport = transport
        self.client_id = client_id
        self.keepalive = keepalive
        self.clean = clean
        self.will = will  # (topic, payload, qos, retain)
        self.on_message = on_message
        self.predefined = predefined or {}  # topic name -> id
        self.retry_ms = retry_ms
        self.max_retry_ms = max_retry_ms
        self.retries = retries
        self.max_topics = max_topics
        self.max_subscriptions = max_subscriptions
        self.connected = False
        self.asleep = False
        self.gw_id = None
        self.topics = {}  # name -> id (REGISTER, SUBACK)
        self.names = {}  # id -> name (the gateway's REGISTER)
        self.subscriptions = []  # [topic, qos], re-subscribed after a reconnect
        self._msg_id = 0
        self._lock = asyncio.Lock()
        self._reply_event = asyncio.Event()
        self._expect = None
        self._reply = None
        self._subscribing = None  # the name a SUBACK's topic id stands for
        self._last_tx = ticks_ms()
        self._reader = None
        self._recovering = False
        # Counters: what a flaky link cost (printed by the example firmware).
        self.resends = 0
        self.reconnects = 0
        self.dropped = 0

    # ------------------------------------------------------------------ plumbing

    def _next_id(self):
        self._msg_id = self._msg_id % 0xFFFF + 1
        return self._msg_id

    def _send(self, data):
        self._last_tx = ticks_ms()
        self.transport.send(data)

    def start(self):
        """Start the receiver task (``connect`` does it)."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._receive_loop())

    async def _receive_loop(self):
        while True:
            data, address = await self.transport.recv()
            got = parse(data)
            if got is None:
                self.dropped += 1
                continue
            msg_type, body = got
            try:
                self._dispatch(msg_type, body, address)
            except Exception as exc:
                self.dropped += 1
                print("mqttsn: dropped a message:", exc)

    def _dispatch(self, msg_type, body, address):
        expect = self._expect
        if expect is not None and msg_type in expect[0]:
            match = expect[1]
            if match is None or (
                len(body) >= match[0] + 2 and body[match[0]] << 8 | body[match[0] + 1] == match[1]
            ):
                self._reply = (msg_type, body)
                self._expect = None
                if msg_type == SUBACK:
                    self._learn_suback(body)
                self._reply_event.set()
                return
        if msg_type == PUBLISH:
            self._incoming(body)
        elif msg_type == REGISTER:
            # 6.10: the gateway tells us a topic id before its first PUBLISH on it.
            topic_id = body[0] << 8 | body[1]
            if len(self.names) < self.max_topics or topic_id in self.names:
                self.names[topic_id] = bytes(body[4:]).decode()
                rc = ACCEPTED
            else:
                rc = CONGESTION
            self._send(message(0x0B, bytes(body[0:4]) + bytes((rc,))))
        elif msg_type in (ADVERTISE, GWINFO):
            self.gw_id = body[0]
            self.transport.learn(address)
        elif msg_type == DISCONNECT and self.connected and not self.asleep:
            # The gateway ended our connection (it restarted, or forgot us).
            self.connected = False
            print("mqttsn: gateway disconnected us")

    def _learn_suback(self, body):
        # 6.9: the retained messages follow the SUBACK at once, on the topic id it
        # gives; they may be read before the subscribing task runs again, so the id is
        # known from here on, before the next message is handled.
        topic = self._subscribing
        self._subscribing = None
        if topic is None or len(body) < 6 or body[5] != ACCEPTED:
            return
        topic_id = body[1] << 8 | body[2]
        if topic_id and (len(self.names) < self.max_topics or topic_id in self.names):
            self.names[topic_id] = topic

    def _incoming(self, body):
        flags = body[0]
        topic_id = body[1] << 8 | body[2]
        msg_id = body[3] << 8 | body[4]
        kind = flags & 3
        if kind == SHORT:
            topic = bytes(body[1:3]).decode()
        elif kind == PREDEFINED:
            topic = None
            for name, tid in self.predefined.items():
                if tid == topic_id:
                    topic = name
        else:
            topic = self.names.get(topic_id)
        qos = _qos_of(flags)
        if qos == 1:
            self._send(message(PUBACK, bytes(body[1:5]) + bytes((ACCEPTED,))))
        if self.on_message is not None:
            self.on_message(topic, bytes(body[5:]), bool(flags & _RETAIN))
        return msg_id

    async def _request(self, data, expect, match=None, dup_at=-1):
        """Send ``data`` and wait for a message of a type in ``expect`` (with the msg id
        ``match[1]`` at body offset ``match[0]``); resend with backoff; LinkLost after
        ``retries`` resends. ``dup_at``: the octet whose DUP bit marks a resend."""
        delay = self.retry_ms
        for attempt in range(self.retries + 1):
            self._reply = None
            self._expect = (expect, match)
            self._reply_event.clear()
            if attempt:
                self.resends += 1
                if dup_at >= 0:
                    data = bytearray(data)
                    data[dup_at] |= _DUP
                    data = bytes(data)
            self._send(data)
            try:
                await asyncio.wait_for(self._reply_event.wait(), delay / 1000)
            except asyncio.TimeoutError:
                delay = min(delay * 2, self.max_retry_ms)
                continue
            return self._reply
        self._expect = None
        raise LinkLost("no answer to message type 0x%02x" % data[1 if data[0] != 1 else 3])

    # ------------------------------------------------------------------ discovery (6.1)

    async def discover(self, timeout_ms=5000, radius=1):
        """Find a gateway: SEARCHGW (broadcast), answered by GWINFO; an ADVERTISE heard
        meanwhile does as well. Returns its gateway id."""
        self.start()
        deadline = ticks_add(ticks_ms(), timeout_ms)
        delay = self.retry_ms
        while self.gw_id is None:
            self.transport.broadcast(message(SEARCHGW, bytes((radius,))))
            wait = min(delay, max(0, ticks_diff(deadline, ticks_ms())))
            slept = 0
            while self.gw_id is None and slept < wait:
                await asyncio.sleep_ms(20)
                slept += 20
            if ticks_diff(deadline, ticks_ms()) <= 0 and self.gw_id is None:
                raise LinkLost("no gateway answered SEARCHGW")
            delay = min(delay * 2, self.max_retry_ms)
        return self.gw_id

    # ------------------------------------------------------------------ connection (6.2)

    async def connect(self):
        """Connect, retrying with backoff until the gateway accepts (forever, as a
        device must); then subscribe again to everything subscribed before."""
        self.start()
        async with self._lock:
            await self._connect_locked()

    async def _connect_locked(self):
        registered = [name for name in self.topics if name not in self.predefined]
        delay = self.retry_ms
        while True:
            try:
                await self._connect_once()
                break
            except (LinkLost, Refused) as exc:
                print("mqttsn: connect failed (%s); again in %d ms" % (exc, delay))
                await asyncio.sleep_ms(delay)
                delay = min(delay * 2, self.max_retry_ms)
        for entry in self.subscriptions:
            await self._subscribe_locked(entry[0], entry[1])
        for name in registered:  # ids from before do not outlive the connection
            await self._register_locked(name)

    async def _connect_once(self):
        flags = (_CLEAN if self.clean else 0) | (_WILL if self.will else 0)
        body = bytes((flags, 1)) + _u16(self.keepalive) + self.client_id.encode()
        self.connected = False
        self.asleep = False
        self.topics = {}  # registrations do not outlive a connection
        self.names = {}
        if self.will:
            kind, body = await self._request(message(CONNECT, body), (WILLTOPICREQ, CONNACK))
            if kind == WILLTOPICREQ:
                topic, payload, qos, retain = self.will
                will_flags = _qos_bits(qos) | (_RETAIN if retain else 0)
                await self._request(
                    message(WILLTOPIC, bytes((will_flags,)) + topic.encode()), (WILLMSGREQ,)
                )
                kind, body = await self._request(message(WILLMSG, payload), (CONNACK,))
        else:
            kind, body = await self._request(message(CONNECT, body), (CONNACK,))
        if body[0] != ACCEPTED:
            raise Refused("CONNECT", body[0])
        self.connected = True

    async def _recover(self):
        """The gateway is gone or forgot us: connect again and restore everything."""
        self.connected = False
        self.reconnects += 1
        print("mqttsn: reconnecting")
        await self._connect_locked()

    async def _ensure(self):
        if not self.connected:
            await self._recover()

    # ------------------------------------------------------------------ topics (6.5)

    async def register(self, topic):
        async with self._lock:
            await self._ensure()
            return await self._register_locked(topic)

    async def _register_locked(self, topic):
        if topic in self.predefined:
            return self.predefined[topic]
        known = self.topics.get(topic)
        if known is not None:
            return known
        if len(self.topics) >= self.max_topics:
            raise MQTTSNError("topic table full (%d topics)" % self.max_topics)
        msg_id = self._next_id()
        _, body = await self._request(
            message(REGISTER, b"\x00\x00" + _u16(msg_id) + topic.encode()), (REGACK,), (2, msg_id)
        )
        if body[4] != ACCEPTED:
            raise Refused("REGISTER " + topic, body[4])
        topic_id = body[0] << 8 | body[1]
        self.topics[topic] = topic_id
        return topic_id

    def _topic_ref(self, topic):
        """(topic id, id type) for a name already known, else None."""
        if topic in self.predefined:
            return self.predefined[topic], PREDEFINED
        if len(topic) == 2:
            return short_topic_id(topic), SHORT
        topic_id = self.topics.get(topic)
        return None if topic_id is None else (topic_id, NORMAL)

    # ------------------------------------------------------------------ publish (6.6, 6.8)

    async def publish(self, topic, payload, qos=0, retain=False):
        """Publish. QoS 1 returns once the gateway acknowledged it, however many resends
        and reconnects that takes; QoS -1 needs no connection (predefined or two-character
        topics only)."""
        if isinstance(payload, str):
            payload = payload.encode()
        if qos == -1:
            ref = self._topic_ref(topic)
            if ref is None or ref[1] == NORMAL:
                raise MQTTSNError("QoS -1 needs a predefined or short topic")
            flags = _qos_bits(-1) | ref[1] | (_RETAIN if retain else 0)
            self._send(message(PUBLISH, bytes((flags,)) + _u16(ref[0]) + b"\x00\x00" + payload))
            return
        async with self._lock:
            while True:
                try:
                    await self._ensure()
                    await self._publish_locked(topic, payload, qos, retain)
                    return
                except LinkLost:
                    self.connected = False  # resent too often: reconnect, send again

    async def _publish_locked(self, topic, payload, qos, retain):
        for _ in range(3):
            ref = self._topic_ref(topic)
            if ref is None:
                ref = (await self._register_locked(topic), NORMAL)
            flags = _qos_bits(qos) | ref[1] | (_RETAIN if retain else 0)
            msg_id = self._next_id() if qos else 0
            data = message(PUBLISH, bytes((flags,)) + _u16(ref[0]) + _u16(msg_id) + payload)
            if qos == 0:
                self._send(data)
                return
            header = 1 if data[0] != 1 else 3
            _, body = await self._request(data, (PUBACK,), (2, msg_id), dup_at=header + 1)
            code = body[4]
            if code == ACCEPTED:
                return
            if code == INVALID_TOPIC_ID and ref[1] == NORMAL:
                # The gateway lost our registration (it restarted): register again.
                self.topics.pop(topic, None)
                continue
            if code == CONGESTION:
                await asyncio.sleep_ms(self.retry_ms)
                continue
            raise Refused("PUBLISH " + topic, code)
        raise LinkLost("PUBLISH on %s kept failing" % topic)

    # ------------------------------------------------------------------ subscribe (6.9)

    async def subscribe(self, topic, qos=0):
        """Subscribe (QoS 0 or 1); kept and subscribed again after every reconnect."""
        async with self._lock:
            known = False
            for entry in self.subscriptions:
                if entry[0] == topic:
                    entry[1] = qos
                    known = True
            if not known:
                if len(self.subscriptions) >= self.max_subscriptions:
                    raise MQTTSNError("subscription table full")
                self.subscriptions.append([topic, qos])
            while True:
                try:
                    await self._ensure()
                    return await self._subscribe_locked(topic, qos)
                except LinkLost:
                    self.connected = False

    async def _subscribe_locked(self, topic, qos):
        msg_id = self._next_id()
        if topic in self.predefined:
            flags, field = PREDEFINED, _u16(self.predefined[topic])
        elif len(topic) == 2:
            flags, field = SHORT, topic.encode()
        else:
            flags, field = NORMAL, topic.encode()
        # A wildcard-free name gets its topic id in the SUBACK (learnt by _dispatch).
        self._subscribing = topic if flags == NORMAL else None
        try:
            _, body = await self._request(
                message(SUBSCRIBE, bytes((flags | _qos_bits(qos),)) + _u16(msg_id) + field),
                (SUBACK,),
                (3, msg_id),
                dup_at=2,
            )
        finally:
            self._subscribing = None
        if body[5] != ACCEPTED:
            raise Refused("SUBSCRIBE " + topic, body[5])
        return body[1] << 8 | body[2]

    async def unsubscribe(self, topic):
        async with self._lock:
            self.subscriptions = [e for e in self.subscriptions if e[0] != topic]
            if not self.connected:
                return
            msg_id = self._next_id()
            kind = PREDEFINED if topic in self.predefined else SHORT if len(topic) == 2 else NORMAL
            field = _u16(self.predefined[topic]) if kind == PREDEFINED else topic.encode()
            await self._request(
                message(UNSUBSCRIBE, bytes((kind,)) + _u16(msg_id) + field),
                (UNSUBACK,),
                (0, msg_id),
            )

    # ------------------------------------------------------------------ keep alive (6.11)

    async def ping(self):
        """PINGREQ -> PINGRESP; reconnects when the gateway does not answer."""
        async with self._lock:
            try:
                await self._ensure()
                await self._request(message(PINGREQ), (PINGRESP,))
            except LinkLost:
                await self._recover()

    async def keep_alive(self):
        """Run forever: ping when nothing was sent for most of the keep-alive period."""
        while True:
            await asyncio.sleep_ms(1000)
            if self.asleep or not self.keepalive:
                continue
            if ticks_diff(ticks_ms(), self._last_tx) >= self.keepalive * 750:
                await self.ping()

    # ------------------------------------------------------------------ sleep (6.14)

    async def sleep(self, duration):
        """Tell the gateway we sleep for ``duration`` seconds (it keeps our messages)."""
        async with self._lock:
            await self._ensure()
            await self._request(message(DISCONNECT, _u16(duration)), (DISCONNECT,))
            self.asleep = True

    async def wake(self):
        """Wake up: the gateway sends what it kept (``on_message`` gets each, once),
        then PINGRESP; we are asleep again afterwards. If it forgot us (it restarted),
        we connect again."""
        async with self._lock:
            try:
                await self._request(
                    message(PINGREQ, self.client_id.encode()), (PINGRESP, DISCONNECT)
                )
            except LinkLost:
                self.asleep = False
                await self._recover()
                return
            if self._reply is not None and self._reply[0] == DISCONNECT:
                self.asleep = False
                await self._recover()

    async def disconnect(self):
        async with self._lock:
            if self.connected:
                try:
                    await self._request(message(DISCONNECT), (DISCONNECT,))
                except LinkLost:
                    pass
            self.connected = False
            self.asleep = False
