"""The lander: a persistent QoS 1 subscription written to JSON Lines files.

``ledge-pipeline land --broker mqtt://host:1883 --topic 'ledge/#' --root /data/ledge``

- **Nothing acknowledged is lost.** Messages are acknowledged by hand (paho's manual
  ack) only after the line holding them is written and fsynced: a crash before that
  leaves them unacknowledged, and the broker sends them again to the persistent session
  (MQTT 5 clean start 0 with a session expiry, or 3.1.1 clean session 0). A crash may
  therefore land a message twice; silver deduplicates exactly by (gateway, sequence).
- **Group commit.** After a message arrives, everything already waiting is written too,
  then one fsync covers the batch and the batch is acknowledged.
- **Files.** The open file lives in ``landing/_incoming/`` (Spark skips ``_`` folders). A
  file is finished when it reaches ``--max-file-bytes``, is ``--max-file-age`` seconds
  old, or the UTC hour of the receive time changes; it is then renamed atomically into
  ``landing/date=YYYY-MM-DD/hour=HH/``, so readers only ever see whole files. At start,
  files left in ``_incoming`` by a crash are cut after their last whole line (a torn line
  was never acknowledged, so it comes again) and moved to their partition.
- **Bounded.** At most ``--receive-maximum`` unacknowledged QoS 1 messages are in memory
  (MQTT 5 Receive Maximum; the broker keeps the rest); QoS 0 messages beyond
  ``QOS0_BACKLOG`` waiting are dropped by the client library and logged. A batch is at
  most ``--receive-maximum`` messages, a file at most ``--max-file-bytes`` (plus a line).
- The lander records what arrived and judges nothing: every message becomes a line
  (``pipeline.records``); envelopes are opened, and bad input quarantined, by silver.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Final
from urllib.parse import unquote, urlsplit

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from drivers.model import GATEWAY_PROPERTY, SEQUENCE_PROPERTY
from pipeline.records import landing_line

log = logging.getLogger(__name__)

INCOMING: Final = "_incoming"
QOS0_BACKLOG: Final = 10_000
_HOUR_NAME = re.compile(r"^(\d{8})T(\d{2})-")


@dataclass(frozen=True)
class Broker:
    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None


def parse_broker(url: str) -> Broker:
    """``mqtt://[user[:password]@]host[:port]`` or ``mqtts://...`` (TLS, default port 8883)."""
    parts = urlsplit(url if "://" in url else f"mqtt://{url}")
    if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
        raise ValueError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://")
    if not parts.hostname:
        raise ValueError(f"broker URL {url!r} has no host")
    tls = parts.scheme in ("mqtts", "ssl")
    return Broker(
        parts.hostname,
        parts.port or (8883 if tls else 1883),
        tls,
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password else None,
    )


@dataclass(frozen=True)
class LanderConfig:
    broker: Broker
    topics: tuple[str, ...]
    root: Path
    client_id: str = "ledge-lander"
    mqtt5: bool = True
    session_expiry: int = 7 * 24 * 3600
    receive_maximum: int = 1000
    max_file_bytes: int = 64 * 1024 * 1024
    max_file_age: float = 60.0
    keepalive: int = 60


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class LandingFiles:
    """The open landing file and its rotation into ``landing/date=/hour=/``."""

    root: Path
    name: str = "lander"
    max_bytes: int = 64 * 1024 * 1024
    max_age: float = 60.0
    finished: int = 0
    lines: int = 0
    _file: BinaryIO | None = field(default=None, repr=False)
    _path: Path | None = None
    _hour: datetime | None = None
    _size: int = 0
    _opened: float = 0.0

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def incoming(self) -> Path:
        return self.landing / INCOMING

    def partition(self, hour: datetime) -> Path:
        return self.landing / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}"

    def recover(self) -> list[Path]:
        """Finish the files a crash left in ``_incoming``: cut the torn tail, move them."""
        moved: list[Path] = []
        if not self.incoming.is_dir():
            return moved
        for path in sorted(self.incoming.glob("*.jsonl")):
            match = _HOUR_NAME.match(path.name)
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) != len(data):
                log.warning(
                    "%s: cut %d bytes of a torn last line (never acknowledged: it comes again)",
                    path.name,
                    len(data) - len(whole),
                )
                with path.open("r+b") as f:
                    f.truncate(len(whole))
                    os.fsync(f.fileno())
            if not whole or match is None:
                path.unlink()
                continue
            hour = datetime.strptime(match.group(1) + match.group(2), "%Y%m%d%H")
            moved.append(self._finish(path, hour))
        if moved:
            log.info("recovered %d landing files left by an earlier run", len(moved))
        return moved

    def append(self, line: bytes, received: datetime) -> None:
        hour = received.astimezone(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None)
        if self._file is not None and (
            hour != self._hour or self._size + len(line) > self.max_bytes
        ):
            self.rotate()
        if self._file is None:
            self._open(hour)
        assert self._file is not None
        self._file.write(line)
        self._size += len(line)
        self.lines += 1

    def _open(self, hour: datetime) -> None:
        self.incoming.mkdir(parents=True, exist_ok=True)
        name = f"{hour:%Y%m%dT%H}-{self.name}-{uuid.uuid4().hex[:12]}.jsonl"
        self._path = self.incoming / name
        self._file = self._path.open("ab")
        self._hour, self._size, self._opened = hour, 0, time.monotonic()

    def sync(self) -> None:
        """Everything appended so far is on disk when this returns."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def age(self) -> float:
        return time.monotonic() - self._opened if self._file is not None else 0.0

    def rotate(self) -> Path | None:
        """Finish the open file (fsync, close, rename into its partition)."""
        if self._file is None or self._path is None or self._hour is None:
            return None
        self.sync()
        self._file.close()
        self._file = None
        return self._finish(self._path, self._hour)

    def _finish(self, path: Path, hour: datetime) -> Path:
        folder = self.partition(hour)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / path.name
        os.rename(path, target)  # atomic: readers see the whole file or none of it
        _fsync_dir(folder)
        _fsync_dir(path.parent)
        self.finished += 1
        log.info("finished %s", target.relative_to(self.root))
        return target


def _marks(message: aiomqtt.Message) -> tuple[str | None, str | None]:
    gateway = seq = None
    props = message.properties
    for key, value in getattr(props, "UserProperty", None) or ():
        if key == GATEWAY_PROPERTY:
            gateway = value
        elif key == SEQUENCE_PROPERTY:
            seq = value
    return gateway, seq


class Lander:
    """Subscribes and lands until cancelled; reconnects with backoff."""

    def __init__(self, cfg: LanderConfig) -> None:
        self.cfg = cfg
        self.files = LandingFiles(
            cfg.root,
            re.sub(r"[^A-Za-z0-9_.-]", "_", cfg.client_id),
            cfg.max_file_bytes,
            cfg.max_file_age,
        )
        self.subscribed = asyncio.Event()
        self.received = 0

    def _client(self) -> aiomqtt.Client:
        cfg = self.cfg
        b = cfg.broker
        kwargs: dict[str, object] = {}
        if cfg.mqtt5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = cfg.session_expiry
            props.ReceiveMaximum = cfg.receive_maximum
            kwargs.update(protocol=aiomqtt.ProtocolVersion.V5, clean_start=False, properties=props)
        else:
            kwargs.update(protocol=aiomqtt.ProtocolVersion.V311, clean_session=False)
        if b.tls:
            kwargs["tls_params"] = aiomqtt.TLSParameters()
        client = aiomqtt.Client(
            b.host,
            b.port,
            username=b.username,
            password=b.password,
            identifier=cfg.client_id,
            keepalive=cfg.keepalive,
            max_queued_incoming_messages=cfg.receive_maximum + QOS0_BACKLOG,
            **kwargs,  # type: ignore[arg-type]
        )
        # Acknowledge only what is on disk (see the module docstring). Set before
        # connecting: a resumed session's queued messages follow the CONNACK at once.
        client._client.manual_ack_set(True)
        return client

    async def run(self) -> None:
        self.files.recover()
        delay = 0.5
        try:
            while True:
                try:
                    await self._session()
                except aiomqtt.MqttError as exc:
                    self.subscribed.clear()
                    log.warning(
                        "broker %s:%d: %s; retrying in %.1f s",
                        self.cfg.broker.host,
                        self.cfg.broker.port,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
                else:
                    delay = 0.5
        finally:
            self.files.rotate()
            log.info(
                "stopped: %d messages landed, %d files finished",
                self.received,
                self.files.finished,
            )

    async def _session(self) -> None:
        cfg = self.cfg
        async with self._client() as client:
            if cfg.mqtt5:
                options = SubscribeOptions(
                    qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB
                )
                await client.subscribe([(t, options) for t in cfg.topics])
            else:
                await client.subscribe([(t, 1) for t in cfg.topics])
            log.info(
                "subscribed to %s on %s:%d as %s (persistent session)",
                ", ".join(cfg.topics),
                cfg.broker.host,
                cfg.broker.port,
                cfg.client_id,
            )
            self.subscribed.set()
            await self._land(client)

    async def _land(self, client: aiomqtt.Client) -> None:
        messages = client.messages
        pending: list[aiomqtt.Message] = []
        try:
            while True:
                wait = max(0.05, self.cfg.max_file_age - self.files.age())
                try:
                    first = await asyncio.wait_for(anext(messages), wait)
                except TimeoutError:
                    if self.files.age() >= self.cfg.max_file_age:
                        self.files.rotate()
                    continue
                pending.append(first)
                self._write(first)
                while len(messages) and len(pending) < self.cfg.receive_maximum:
                    message = await anext(messages)
                    pending.append(message)
                    self._write(message)
                self._commit(client, pending)
                if self.files.age() >= self.cfg.max_file_age:
                    self.files.rotate()
        finally:
            # Stopping (or the connection dropped): what is written is made durable and,
            # if the connection still stands, acknowledged, so it is not sent again.
            self._commit(client, pending)

    def _write(self, message: aiomqtt.Message) -> None:
        received = datetime.now(UTC)
        gateway, seq = _marks(message)
        payload = message.payload
        if not isinstance(payload, bytes):
            payload = str(payload).encode()
        line = landing_line(
            message.topic.value, payload, message.qos, bool(message.retain), gateway, seq, received
        )
        self.files.append(line.encode(), received)

    def _commit(self, client: aiomqtt.Client, pending: list[aiomqtt.Message]) -> None:
        if not pending:
            return
        self.files.sync()
        for message in pending:
            if message.qos > 0:  # on a dropped link this does nothing: it comes again
                client._client.ack(message.mid, message.qos)
        self.received += len(pending)
        pending.clear()


async def land(cfg: LanderConfig) -> None:
    """Run the lander until cancelled (SIGINT/SIGTERM in the CLI)."""
    await Lander(cfg).run()
