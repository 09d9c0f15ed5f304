"""Firmware bridge settings: plain data handed to the gateway logic by the app layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

#: What happens to a message for a client whose queue (its sleep buffer) is full.
QUEUE_POLICIES: Final = ("drop-oldest", "drop-new")


@dataclass(frozen=True, slots=True)
class UdpSettings:
    """One UDP socket: IPv4 or IPv6 by ``host``."""

    host: str = "127.0.0.1"
    port: int = 1884
    name: str = ""
    #: Where ADVERTISE goes: broadcast or multicast addresses, ``"host"`` or
    #: ``"host:port"`` (``[v6]:port``); the port defaults to ``port``. Empty: none.
    broadcast: tuple[str, ...] = ()
    #: Client ids allowed to connect through this socket (empty: any). With a list,
    #: QoS -1 (which names no client) is refused here.
    allow_client_ids: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.name or f"udp {self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class SerialSettings:
    """One serial line carrying COBS frames (firmware-bridge/UART.md)."""

    name: str
    path: str
    baudrate: int = 115200
    allow_client_ids: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class MqttSnSettings:
    """Everything the firmware bridge enforces, with the defaults the example config
    documents. Times are seconds."""

    udp: tuple[UdpSettings, ...] = ()
    serial: tuple[SerialSettings, ...] = ()
    gateway_id: int = 1
    #: Seconds between ADVERTISE messages (and the Duration they carry); 0: none.
    advertise_interval: float = 900.0
    #: Topic id -> topic name, known to every client in advance.
    predefined_topics: dict[int, str] = field(default_factory=dict)
    #: Connected, sleeping and remembered clients together.
    max_clients: int = 1024
    #: Clients in the middle of their CONNECT (the Will prompts) at once.
    max_connecting: int = 64
    #: Longest message accepted or sent (octets, Length included).
    max_message_size: int = 1024
    #: Registered topics per client (REGISTER both ways, SUBACK ids).
    max_topics_per_client: int = 64
    #: Messages waiting for one client: while it sleeps, while one is in flight, while
    #: its topic is being registered. Policy when full: ``queue_policy``.
    max_queued_messages: int = 100
    queue_policy: str = "drop-oldest"
    #: Tretry and Nretry (section 6.13): resend an unacknowledged REGISTER, PUBLISH or
    #: PUBREL after ``retry_interval``; after ``max_retries`` resends the client is lost.
    retry_interval: float = 10.0
    max_retries: int = 5
    #: Time a CONNECT may take through its Will prompts.
    connect_timeout: float = 10.0
    #: Accept QoS -1 PUBLISH (no connection; predefined and short topics only).
    qos_minus_one: bool = True
    #: A client silent for keep-alive x this (or sleep duration x this) is lost.
    keepalive_grace: float = 1.5

    def __post_init__(self) -> None:
        if self.queue_policy not in QUEUE_POLICIES:
            raise ValueError(f"queue_policy must be one of {QUEUE_POLICIES}")
