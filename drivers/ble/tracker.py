"""One advertising device's decoding state: duplicates, replayed counters, decryption
failures. Pure: time is an argument.

BlueZ reports a device's advertisement data as properties that it merges: every
advert (even one that only changed the RSSI) arrives with the last service and
manufacturer data. So an element whose bytes equal the last ones is a repeat and is
not decoded again; a packet id seen within ``PACKET_WINDOW`` seconds is a repeat too
(BTHome devices send each packet several times).

An encrypted element is accepted only with an encryption counter strictly above the
last accepted one. Nothing an advert says lowers that counter: a device that restarted
its counter (a battery change) is refused until someone resets it explicitly
(``reset_counter``), because a run of recorded adverts looks exactly like a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from drivers.parsers import Sample
from drivers.parsers.ble import FORMATS, Format, recognise
from drivers.parsers.ble.base import AdvertError, Context, Decode

#: A packet id repeated within this many seconds is the same packet (bthome-ble's rule).
PACKET_WINDOW: Final = 4.0


class Outcome:
    """What one advert gave: samples (events among them), problems to count and log,
    how many elements were repeats, and whether an element was authenticated (decrypted
    with the bindkey, its counter above the last: the device itself sent it)."""

    __slots__ = ("authenticated", "events", "identity", "problems", "repeats", "samples")

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.events: frozenset[str] = frozenset()
        self.problems: list[AdvertError] = []
        self.repeats = 0
        self.identity: str | None = None
        self.authenticated = False


#: How a format's elements are found in an advert: (kind, key, decode), kind 0 service
#: data, 1 manufacturer data of a company, 2 manufacturer data of any company.
Plan = list[tuple[int, Any, Decode]]


def plan(fmt: Format) -> Plan:
    kinds = {"service": 0, "company": 1, "any_company": 2}
    return [(kinds[s.kind], s.key, s.decode) for s in fmt.sources]


class DeviceDecoder:
    """Decodes one device's adverts in the format it speaks (found on first sight when
    not configured)."""

    __slots__ = (
        "_failures",
        "_last",
        "_packet",
        "_packet_at",
        "_plan",
        "counter",
        "ctx",
        "format",
        "pinned",
    )

    def __init__(self, ctx: Context, fmt: Format | None = None) -> None:
        self.ctx = ctx
        self.format = fmt
        self.pinned = fmt is not None
        self._plan: Plan = plan(fmt) if fmt is not None else []
        self._last: dict[str | int, bytes] = {}
        self._packet: int | None = None
        self._packet_at = 0.0
        #: The last accepted encryption counter (None: none accepted yet).
        self.counter: int | None = None
        self._failures = 0

    @property
    def keyed(self) -> bool:
        """The device has a bindkey: only authenticated adverts are its own."""
        return self.ctx.cipher is not None

    def reset_counter(self) -> int | None:
        """Forget the last accepted counter (the explicit reset after a device restarted
        its counter): the next authenticated advert sets it again. Returns the old one."""
        old, self.counter = self.counter, None
        return old

    def feed(
        self,
        service_data: Mapping[str, bytes],
        manufacturer_data: Mapping[int, bytes],
        name: str,
        now: float,
    ) -> Outcome | None:
        """The samples of one advert; None when it carries nothing of the device's format."""
        ctx = self.ctx
        ctx.name = name
        if self.format is None:
            fmt = recognise(service_data, manufacturer_data, ctx)
            if fmt is None:
                return None
            self.format = fmt
            self._plan = plan(fmt)
        out: Outcome | None = None
        for kind, key, decode in self._plan:
            if kind == 0:
                data = service_data.get(key)
                if data is None:
                    continue
                self._one(out := out or Outcome(), key, 0, data, decode, now)
            elif kind == 1:
                data = manufacturer_data.get(key)
                if data is None:
                    continue
                self._one(out := out or Outcome(), key, key, data, decode, now)
            else:
                for company, data in manufacturer_data.items():
                    self._one(out := out or Outcome(), company, company, data, decode, now)
        return out

    def _one(
        self, out: Outcome, key: Any, company: int, data: bytes, decode: Decode, now: float
    ) -> None:
        if self._last.get(key) == data:
            out.repeats += 1
            return
        self._last[key] = data
        ctx = self.ctx
        ctx.company_id = company
        try:
            decoded = decode(data, ctx)
        except AdvertError as exc:
            if exc.reason == "wrong_key":
                self._failures += 1
                if self._failures == 1:
                    # One failure is tolerated before it is reported: a corrupted
                    # advert fails the MIC like a wrong key does (bthome-ble #107).
                    exc = AdvertError("decrypt_retry", exc.detail, exc.offset)
            out.problems.append(exc)
            return
        if decoded.counter is not None:
            if not self._counter_ok(decoded.counter, out):
                return
            out.authenticated = True
        self._failures = 0
        packet = decoded.packet_id
        if packet is not None:
            if packet == self._packet and now - self._packet_at < PACKET_WINDOW:
                out.repeats += 1
                return
            self._packet = packet
            self._packet_at = now
        if out.samples:
            out.samples.extend(decoded.samples)
        else:
            out.samples = decoded.samples
        if decoded.events:
            out.events = out.events | decoded.events
        if decoded.identity is not None:
            out.identity = decoded.identity
        if decoded.problem is not None:
            out.problems.append(decoded.problem)

    def _counter_ok(self, counter: int, out: Outcome) -> bool:
        """Replay protection: an encryption counter must be strictly above the last
        accepted one; equal or smaller is a replay, whatever came before."""
        last = self.counter
        if last is None or counter > last:
            self.counter = counter
            return True
        out.problems.append(
            AdvertError(
                "replay",
                f"encryption counter {counter} is not above {last} (a replayed advert, or "
                "the device restarted its counter: ledge ble reset-counter)",
                0,
            )
        )
        return False


def format_named(name: str) -> Format | None:
    """The format of a configured name; None for ``auto``."""
    return None if name == "auto" else FORMATS[name]
