"""Thin wrappers around third-party MQTT clients, recording what they receive."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

from tests.support.wait import wait_for

#: How long a reply from the broker (CONNACK, SUBACK, an acknowledgement) may take: a
#: deadline, not a delay, so only a loaded machine (several test workers, a refused
#: login's delay) ever comes near it.
REPLY_DEADLINE = 15.0


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Any = None
    #: When it arrived (``time.monotonic()``).
    at: float = 0.0


@dataclass
class Paho:
    """A paho-mqtt client (3.1.1 or 5.0) with its loop in a background thread."""

    port: int
    client_id: str
    version: int = 5
    messages: list[Received] = field(default_factory=list)
    disconnects: list[int] = field(default_factory=list)
    subacks: list[list[int]] = field(default_factory=list)
    #: The reason code of each QoS 1/2 publish's acknowledgement, by message id.
    acks: dict[int, int] = field(default_factory=dict)
    connack: Any = None
    session_present: bool | None = None
    #: "tcp" or "websockets", TLS with ``ca`` (and a client certificate), credentials.
    transport: str = "tcp"
    ws_path: str = "/mqtt"
    ca: str | None = None
    cert: tuple[str, str] | None = None
    username: str | None = None
    password: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._make_client(clean=True)

    def _make_client(self, clean: bool) -> None:
        protocol = mqtt.MQTTv5 if self.version == 5 else mqtt.MQTTv311
        kwargs: dict[str, Any] = {}
        if self.version != 5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=protocol,
            transport=self.transport,  # type: ignore[arg-type]
            **kwargs,
        )
        if self.transport == "websockets":
            self.client.ws_set_options(path=self.ws_path)
        if self.ca is not None:
            certfile, keyfile = self.cert or (None, None)
            self.client.tls_set(ca_certs=self.ca, certfile=certfile, keyfile=keyfile)
        if self.username is not None:
            self.client.username_pw_set(self.username, self.password)
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = self._on_publish

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append(
                Received(
                    msg.topic,
                    bytes(msg.payload),
                    msg.qos,
                    bool(msg.retain),
                    getattr(msg, "properties", None),
                    time.monotonic(),
                )
            )

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any = None
    ) -> None:
        self.connack = rc
        self.session_present = bool(flags.session_present)

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any = None
    ) -> None:
        self.disconnects.append(rc.value if isinstance(rc, PahoReasonCode) else int(rc))

    def _on_subscribe(
        self, client: Any, userdata: Any, mid: int, codes: Any, props: Any = None
    ) -> None:
        self.subacks.append([c.value if isinstance(c, PahoReasonCode) else int(c) for c in codes])

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any = None) -> None:
        with self._lock:
            self.acks[mid] = rc.value if isinstance(rc, PahoReasonCode) else int(rc)

    def connect(
        self,
        *,
        clean: bool = True,
        session_expiry: int | None = None,
        will: tuple[str, bytes, int, bool] | None = None,
        keepalive: int = 60,
    ) -> Paho:
        self.connack = None
        self._make_client(clean)
        if will is not None:
            self.client.will_set(will[0], will[1], will[2], will[3])
        if self.version == 5:
            props = Properties(PacketTypes.CONNECT)
            if session_expiry is not None:
                props.SessionExpiryInterval = session_expiry
            self.client.connect(
                "127.0.0.1", self.port, keepalive, clean_start=clean, properties=props
            )
        else:
            self.client.connect("127.0.0.1", self.port, keepalive)
        self.client.loop_start()
        wait_for(lambda: self.connack is not None, REPLY_DEADLINE, f"CONNACK for {self.client_id}")
        return self

    def subscribe(self, topic: str, qos: int = 0, **options: Any) -> list[int]:
        before = len(self.subacks)
        if self.version == 5:
            from paho.mqtt.subscribeoptions import SubscribeOptions

            self.client.subscribe(topic, options=SubscribeOptions(qos=qos, **options))
        else:
            self.client.subscribe(topic, qos)
        wait_for(lambda: len(self.subacks) > before, REPLY_DEADLINE, f"SUBACK for {topic}")
        return self.subacks[before]

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
        *,
        refused: int | None = None,
    ) -> None:
        """Publish; QoS 1/2 wait for the acknowledgement, whose reason code must be a
        success (below 0x80) -- or ``refused``, when the test expects that refusal."""
        code = self.publish_code(topic, payload, qos, retain, properties)
        if refused is None:
            assert code < 0x80, f"{topic}: refused with reason code {code:#04x}"
        else:
            assert code == refused, f"{topic}: reason code {code:#04x}, not {refused:#04x}"

    def publish_code(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> int:
        """Publish; the reason code of the acknowledgement (QoS 0: 0)."""
        info = self.client.publish(topic, payload, qos, retain, properties=properties)
        if not qos:
            return 0
        info.wait_for_publish(5)
        assert info.is_published(), f"no acknowledgement for {topic}"
        return wait_for(lambda: self.acks.get(info.mid, -1) + 1, REPLY_DEADLINE, "ack code") - 1

    def wait_messages(self, count: int, timeout: float = 5.0) -> list[Received]:
        wait_for(
            lambda: len(self.messages) >= count, timeout, f"{count} messages at {self.client_id}"
        )
        return list(self.messages)

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        self._release()

    def _release(self) -> None:
        """Close paho's sockets, its wake-up socket pair included: paho keeps that pair
        until the client object is collected, and in a reference cycle (the callbacks
        point back here) the collector may finalize it before paho closes it (an
        "unclosed socket" warning); the loop thread being over, close them now."""
        self.client._reset_sockets()

    def close(self) -> None:
        """Stop the loop and close the socket, whatever state the connection is in
        (the server may have closed it)."""
        self.client.loop_stop()
        self._release()

    def kill(self) -> None:
        """Break the connection without DISCONNECT (so the will fires)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()
        self._release()
