"""Synthetic landing data: a fleet's messages as the lander writes them, with the faults of
the field injected, and what silver must make of them (the tests' and benchmark's input).

Messages are made by the gateway's own contract (``reading_topic``, ``reading_payload``,
``health_payload``, ``envelope``), so they are exactly what a Ledge bridge sends. Injected:
redelivered copies, a gateway whose uplink was down so its backlog arrives a day late,
messages later than the horizon, implausible clocks, sequence numbers that skip, bridges
speaking MQTT 3.1.1 (envelopes), and one of every kind of bad input.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from drivers.model import (
    Health,
    Reading,
    envelope,
    health_payload,
    health_topic,
    reading_payload,
    reading_topic,
)
from pipeline.records import landing_line, received_text

#: (driver, device, quantity, unit, kind) cycled over each gateway's sensors.
SENSORS = (
    ("serial", "env", "temperature", "°C", "float"),
    ("serial", "env", "humidity", "%", "float"),
    ("ble", "door", "open", "", "bool"),
    ("serial", "hvac", "mode", "", "text"),
)
MODES = ("auto", "heat", "cool", "off")
#: The receive time of one faulty line: no lander writes it, a hand-edited file may.
BAD_RECEIVED = "17/07/2026 25:61"


@dataclass(frozen=True)
class Spec:
    """What to generate. The defaults make a few thousand lines with every fault."""

    gateways: int = 3
    sensors: int = 4
    #: Distinct readings to make (rounded down to whole rounds of every sensor).
    readings: int = 3000
    start: datetime = datetime(2026, 11, 20, 23, 40, tzinfo=UTC)
    interval: timedelta = timedelta(seconds=10)
    #: A health report from each gateway every this many rounds.
    health_every: int = 30
    #: Share of readings and health reports delivered twice.
    duplicates: float = 0.03
    #: The last this many gateways' bridges use envelopes (an MQTT 3.1.1 cloud broker).
    envelope_gateways: int = 1
    #: Gateway 0's uplink is down for the middle third: that backlog arrives a day late.
    backlog: bool = True
    #: Readings arriving later than the late-data horizon.
    beyond_horizon: int = 3
    #: One of every kind of bad input.
    faults: bool = True
    horizon_days: int = 3
    prefix: str = "ledge"
    seed: int = 1


@dataclass(frozen=True)
class Message:
    """One landing line and when it was received."""

    received: datetime
    line: str


@dataclass(frozen=True)
class Sent:
    """A reading silver must keep, as the oracle sees it."""

    gateway: str
    driver: str
    device: str
    quantity: str
    unit: str
    value: float | None
    text: str | None
    timestamp: datetime
    received: datetime
    seq: int
    implausible: bool = False


@dataclass(frozen=True)
class SentHealth:
    gateway: str
    timestamp: datetime
    received: datetime
    dropped: int
    queued: int
    seq: int


@dataclass
class Truth:
    """What silver must make of the generated lines."""

    readings: list[Sent] = field(default_factory=list)
    health: list[SentHealth] = field(default_factory=list)
    #: Quarantined messages by the start of their reason.
    quarantined: Counter[str] = field(default_factory=Counter)
    ignored: int = 0
    #: Redelivered copies of accepted messages (folded into ``copies``).
    duplicates: Counter[str] = field(default_factory=Counter)


class _Fleet:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.seq = {f"gw{g}": 1000 * (g + 1) for g in range(spec.gateways)}
        self.messages: list[Message] = []
        self.truth = Truth()

    def enveloped(self, gateway: str) -> bool:
        return int(gateway[2:]) >= self.spec.gateways - self.spec.envelope_gateways

    def next_seq(self, gateway: str) -> int:
        # Per gateway, only grows, not contiguous (a restarted bridge skips ahead).
        self.seq[gateway] += self.rng.choice((1, 1, 1, 2, 7))
        return self.seq[gateway]

    def send(
        self,
        gateway: str,
        topic: str,
        payload: bytes,
        received: datetime,
        seq: int | None = None,
        marks: bool = True,
        copies: int = 1,
    ) -> int:
        seq = self.next_seq(gateway) if seq is None else seq
        for copy in range(copies):
            at = received + timedelta(seconds=self.rng.uniform(1, 900)) * copy
            if not marks:
                line = landing_line(topic, payload, 1, False, None, None, at)
            elif self.enveloped(gateway):
                line = landing_line(
                    topic, envelope(gateway, seq, payload), 1, False, None, None, at
                )
            else:
                line = landing_line(topic, payload, 1, False, gateway, str(seq), at)
            self.messages.append(Message(at, line))
        return seq

    def too_late(self, stamp: datetime, received: datetime) -> bool:
        """Beyond the late-data horizon: silver quarantines it."""
        return (received.date() - stamp.date()).days > self.spec.horizon_days

    def copies(self) -> int:
        return 2 if self.rng.random() < self.spec.duplicates else 1

    def reading(
        self, gateway: str, sensor: int, at: datetime, received: datetime, implausible: bool = False
    ) -> None:
        driver, device, quantity, unit, kind = SENSORS[sensor % len(SENSORS)]
        device = f"{device}{sensor // len(SENSORS)}"
        phase = at.timestamp() / 3600 + sensor
        value: float | bool | str
        if kind == "float":
            value = round(20 + 5 * math.sin(phase) + self.rng.uniform(-0.5, 0.5), 2)
        elif kind == "bool":
            value = self.rng.random() < 0.3
        else:
            value = MODES[int(phase) % len(MODES)]
        r = Reading(
            device=device, quantity=quantity, value=value, unit=unit, timestamp=at, driver=driver
        )
        copies = self.copies()
        seq = self.send(
            gateway,
            reading_topic(r, gateway, self.spec.prefix),
            reading_payload(r),
            received,
            copies=copies,
        )
        if not implausible and self.too_late(r.timestamp, received):
            self.truth.quarantined["arrived"] += 1  # a long outage's oldest backlog
            return
        number = float(value) if not isinstance(value, str) else None
        text = (
            ("true" if value else "false")
            if isinstance(value, bool)
            else (value if isinstance(value, str) else None)
        )
        self.truth.readings.append(
            Sent(
                gateway,
                driver,
                device,
                quantity,
                unit,
                number,
                text,
                r.timestamp,
                received,
                seq,
                implausible,
            )
        )
        self.truth.duplicates["reading"] += copies - 1

    def health(self, gateway: str, at: datetime, received: datetime) -> None:
        h = Health(
            timestamp=at,
            dropped=self.rng.choice((0, 0, 0, 1, 4)),
            queued=self.rng.randint(0, 50),
            uptime=3600.0,
        )
        copies = self.copies()
        seq = self.send(
            gateway,
            health_topic(gateway, self.spec.prefix),
            health_payload(h),
            received,
            copies=copies,
        )
        if self.too_late(h.timestamp, received):
            self.truth.quarantined["arrived"] += 1
            return
        self.truth.health.append(
            SentHealth(gateway, h.timestamp, received, h.dropped, h.queued, seq)
        )
        self.truth.duplicates["health"] += copies - 1


def _lag(rng: random.Random) -> timedelta:
    return timedelta(seconds=rng.uniform(0.05, 1.5))


def generate(spec: Spec) -> tuple[list[Message], Truth]:
    """The landing lines for ``spec`` (unordered) and what silver must make of them."""
    fleet = _Fleet(spec)
    rng = fleet.rng
    rounds = max(1, spec.readings // (spec.gateways * spec.sensors))
    outage = range(rounds // 3, 2 * rounds // 3) if spec.backlog else range(0)
    back_online = spec.start + spec.interval * outage.stop + timedelta(days=1)
    p = spec.prefix
    for g in range(spec.gateways):
        gateway = f"gw{g}"
        fleet.send(gateway, f"{p}/{gateway}/status", b"online", spec.start)
        fleet.send(gateway, f"{p}/{gateway}/serial/env0/status", b"online", spec.start)
        fleet.truth.ignored += 2
    for r in range(rounds):
        at = spec.start + spec.interval * r
        for g in range(spec.gateways):
            gateway = f"gw{g}"
            late = g == 0 and r in outage
            # The backlog drains in the order it was made, a few milliseconds apart.
            drained = back_online + timedelta(milliseconds=20 * (r - outage.start))
            for s in range(spec.sensors):
                stamp = at + timedelta(milliseconds=37 * s)
                fleet.reading(gateway, s, stamp, (drained if late else stamp) + _lag(rng))
            if r % spec.health_every == 0:
                fleet.health(gateway, at, (drained if late else at) + _lag(rng))
    end = spec.start + spec.interval * rounds
    for i in range(spec.beyond_horizon):
        at = spec.start + timedelta(minutes=i)
        received = at + timedelta(days=spec.horizon_days + 1, hours=1)
        driver, device, quantity, unit, _ = SENSORS[0]
        r_ = Reading(
            device=f"{device}0",
            quantity=quantity,
            value=1.0,
            unit=unit,
            timestamp=at,
            driver=driver,
        )
        fleet.send("gw1", reading_topic(r_, "gw1", p), reading_payload(r_), received)
        fleet.truth.quarantined["arrived"] += 1
    if spec.faults:
        _faults(fleet, end)
    return fleet.messages, fleet.truth


def _faults(fleet: _Fleet, at: datetime) -> None:
    """One of every kind of bad input, plus an implausible clock, all received at ``at``."""
    p, q = fleet.spec.prefix, fleet.truth.quarantined
    gw = "gw1"
    good = f'{{"value":1.5,"unit":"V","timestamp":"{at.isoformat()}"}}'.encode()
    topic = f"{p}/{gw}/serial/env0/voltage"
    received = at + timedelta(seconds=1)
    fleet.messages.append(Message(received, "this is not a landing record\n"))
    fleet.messages.append(Message(received, '{"topic":"ledge/gw1/serial/env0/voltage","pay\n'))
    q["unreadable"] += 2
    fleet.send(gw, topic, good, received, marks=False)
    q["no ledge-gateway"] += 1
    line = landing_line(topic, good, 1, False, gw, "12a", received)
    fleet.messages.append(Message(received, line))
    q["ledge-seq"] += 1
    bad = {
        "payload is not JSON (not UTF-8": b"\xff\xfe\x00",
        "payload is not JSON": b"21.5 V",
        "payload lacks value": f'{{"timestamp":"{at.isoformat()}"}}'.encode(),
        "value must be a number": f'{{"value":null,"timestamp":"{at.isoformat()}"}}'.encode(),
        "value must be finite": f'{{"value":1e400,"timestamp":"{at.isoformat()}"}}'.encode(),
        "unit must be text": f'{{"value":1,"unit":5,"timestamp":"{at.isoformat()}"}}'.encode(),
        "timestamp must carry": b'{"value":1,"timestamp":"2026-11-21T10:00:00"}',
        "timestamp 'yesterday'": b'{"value":1,"timestamp":"yesterday"}',
        "metadata must be": f'{{"value":1,"timestamp":"{at.isoformat()}","metadata":[1]}}'.encode(),
    }
    for reason, payload in bad.items():
        # Envelopes can only carry JSON or base64; the non-UTF-8 payload goes in the latter.
        fleet.send(gw, topic, payload, received)
        q[reason] += 1
    fleet.send(gw, f"{p}/{gw}/serial/bad+name/voltage", good, received)
    q["device 'bad+name'"] += 1
    fleet.send(gw, f"other/{gw}/thing", good, received)
    q["topic 'other"] += 1
    fleet.send(gw, f"{p}/{gw}/health", b'{"timestamp":"2026-11-21T10:00:00Z"}', received)
    q["health payload lacks dropped"] += 1
    # A sequence number used again by a different message: the first to arrive is kept,
    # the other quarantined, never merged.
    used = fleet.send(gw, topic, good, received)
    fleet.truth.readings.append(
        Sent(gw, "serial", "env0", "voltage", "V", 1.5, None, at, received, used)
    )
    fleet.send(gw, topic, good.replace(b"1.5", b"2.5"), received + timedelta(seconds=5), seq=used)
    q[f"ledge-seq {used}"] += 1
    # A clock running an hour ahead: kept, flagged, filed under its receive time.
    fleet.reading(gw, 0, received + timedelta(hours=1), received, implausible=True)
    # A receive time no lander writes (a line edited by hand, or copied in from another
    # tool): the line is quarantined, and every reader of the landing files must survive it.
    line = landing_line(topic, good, 1, False, gw, str(fleet.next_seq(gw)), received)
    fleet.messages.append(Message(received, line.replace(received_text(received), BAD_RECEIVED)))
    q[f"unreadable receive time '{BAD_RECEIVED}'"] += 1


def write_landing(
    root: Path, messages: list[Message], name: str = "gen", per_file: int = 50_000
) -> int:
    """Write ``messages`` as the lander would: ``landing/date=/hour=/`` by receive hour.

    Returns the number of files written. ``name`` keeps the files of separate calls apart."""
    by_hour: dict[tuple[str, str], list[str]] = {}
    for m in sorted(messages, key=lambda m: m.received):
        key = (m.received.strftime("%Y-%m-%d"), m.received.strftime("%H"))
        by_hour.setdefault(key, []).append(m.line)
    files = 0
    for (day, hour), lines in by_hour.items():
        folder = root / "landing" / f"date={day}" / f"hour={hour}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(0, len(lines), per_file):
            (folder / f"{name}-{i // per_file:04d}.jsonl").write_text(
                "".join(lines[i : i + per_file])
            )
            files += 1
    return files
