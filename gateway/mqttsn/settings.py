"""Firmware bridge settings (``[mqttsn]``, ``[[mqttsn.udp]]``, ``[[mqttsn.serial]]``):
each option declared once, with ``option`` (default, reload, bounds), as every table
of the config file is (see ``gateway.broker.settings``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.broker.settings import DAY, INT31, MAX_SLOTS, option


@dataclass(frozen=True, slots=True)
class UdpSettings:
    """One UDP socket: IPv4 or IPv6 by ``host``."""

    host: str = option("127.0.0.1")
    port: int = option(1884, ge=0, le=65535)
    name: str = option("")
    #: Where ADVERTISE goes: broadcast or multicast addresses, ``"host"`` or
    #: ``"host:port"`` (``[v6]:port``); the port defaults to ``port``. Empty: none.
    broadcast: tuple[str, ...] = option(())
    #: Client ids allowed to connect through this socket (empty: any). With a list,
    #: QoS -1 (which names no client) is refused here.
    allow_client_ids: tuple[str, ...] = option(())

    @property
    def label(self) -> str:
        return self.name or f"udp {self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class MqttSnSerialSettings:
    """One serial line carrying COBS frames (firmware-bridge/UART.md)."""

    name: str = option(min_length=1)
    path: str = option(min_length=1)
    baudrate: int = option(115200, gt=0, le=INT31)
    allow_client_ids: tuple[str, ...] = option(())

    @property
    def label(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class MqttSnSettings:
    """Everything the firmware bridge enforces, with its default. Times are seconds."""

    udp: tuple[UdpSettings, ...] = option(())
    serial: tuple[MqttSnSerialSettings, ...] = option(())
    #: Sent in ADVERTISE and GWINFO.
    gateway_id: int = option(1, ge=0, le=255)
    #: Seconds between ADVERTISE messages (and the Duration they carry); 0: none.
    advertise_interval: float = option(900.0, ge=0, le=65535)
    #: Topic id -> topic name, known to every client in advance.
    predefined_topics: dict[int, str] = option(factory=dict)
    #: Connected, sleeping and remembered clients together. When full, a new CONNECT
    #: takes the slot of the oldest unproven client, else of a remembered
    #: (disconnected) session, else of the longest-silent client without a keep-alive;
    #: proven clients with a keep-alive, and sleeping ones, are never taken.
    max_clients: int = option(1024, ge=1, le=MAX_SLOTS)
    #: Clients from one source IP (a forwarder's nodes included); a newcomer beyond it
    #: takes the slot of the oldest unproven client from that address, or else gets
    #: CONNACK "rejected: congestion". Serial lines are not limited by this.
    max_clients_per_address: int = option(128, ge=1, le=MAX_SLOTS)
    #: Unproven clients (nothing heard from them since their CONNACK: what a CONNECT
    #: from a spoofed or abandoned source looks like) hold at most this share of
    #: ``max_clients``; a newcomer beyond it takes the slot of the oldest unproven
    #: client older than ``unproven_grace``. Any message after the CONNACK (PINGREQ,
    #: PUBLISH, REGISTER, SUBSCRIBE, DISCONNECT...) proves a client.
    unproven_share: float = option(0.25, gt=0, le=1)
    #: Seconds after its CONNACK within which a client is expected to speak; younger
    #: unproven clients are evicted for the share only when every slot is taken.
    unproven_grace: float = option(10.0, ge=0, le=DAY)
    #: CONNECTs accepted per second from all sources together (a burst of two seconds'
    #: worth); more get CONNACK "rejected: congestion" and are counted.
    max_connect_rate: float = option(200.0, gt=0, le=1_000_000)
    #: CONNECTs per second from one source IP (an IPv6 /64), a burst of two seconds'
    #: worth; serial lines are not limited by this.
    max_connect_rate_per_address: float = option(20.0, gt=0, le=1_000_000)
    #: Clients in the middle of their CONNECT (the Will prompts) at once.
    max_connecting: int = option(64, ge=1, le=MAX_SLOTS)
    #: Longest message accepted or sent (octets, Length included).
    max_message_size: int = option(1024, ge=64, le=65535)
    #: Registered topics per client (REGISTER both ways, SUBACK ids).
    max_topics_per_client: int = option(64, ge=1, le=65534)
    #: Messages waiting for one client: while it sleeps, while one is in flight, while
    #: its topic is being registered (the one in flight, a PUBLISH or a REGISTER, is
    #: not waiting: it neither counts nor is dropped). Policy when full: ``queue_policy``.
    max_queued_messages: int = option(100, ge=1, le=INT31)
    queue_policy: Literal["drop-oldest", "drop-new"] = option("drop-oldest")
    #: Tretry and Nretry (section 6.13): resend an unacknowledged REGISTER, PUBLISH or
    #: PUBREL after ``retry_interval``; after ``max_retries`` resends the client is lost.
    retry_interval: float = option(10.0, gt=0, le=DAY)
    max_retries: int = option(5, ge=0, le=65535)
    #: Time a CONNECT may take through its Will prompts.
    connect_timeout: float = option(10.0, gt=0, le=DAY)
    #: Accept QoS -1 PUBLISH (no connection; predefined and short topics only).
    qos_minus_one: bool = option(True)
    #: A client silent for keep-alive x this (or sleep duration x this) is lost.
    keepalive_grace: float = option(1.5, ge=1.0, le=100.0)
    #: A connected client without a keep-alive (Duration 0) silent this long is lost.
    idle_timeout: float = option(3600.0, gt=0, le=DAY)

    @property
    def max_unproven(self) -> int:
        """Slots unproven clients may hold beyond their grace (at least one)."""
        return max(1, int(self.max_clients * self.unproven_share))
