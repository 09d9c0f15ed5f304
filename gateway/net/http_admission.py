"""The HTTP listener's connection slots and their budgets: who gets a slot, who is
closed to make room. Pure: time is an argument, connections are opaque keys.

The shape of the MQTT pool (``Broker.open_connection``), for HTTP's phases. A
connection is in one of three:

- *unfinished*: no complete request head yet (just accepted, or a head arriving);
- *idle*: a keep-alive connection between requests (nothing of the next head yet);
- *answering*: its request head is complete and its answer is being made (a
  password check runs).

Unfinished and idle connections are *waiting*; answering ones are never closed to
make room. A newcomer is admitted in three steps, each with its reason:

1. ``address_full``: its address (an IPv6 /64) has ``max_connections_per_address``
   connections: that address's oldest waiting connection is closed; with none waiting
   (all being answered) the newcomer is refused.
2. ``unfinished_full``: unfinished connections hold ``unfinished_share`` of the slots
   (others are free): the oldest of them is closed.
3. ``listener_full``: every slot is taken: the oldest unfinished connection is
   closed, else the oldest idle one (a server may close an idle keep-alive
   connection at any time, RFC 9112 9.3); with every connection being answered, the
   newcomer is refused.

An unfinished connection younger than ``unfinished_grace`` is not closed for the
share while a slot is free (a burst of connections is accepted before any of their
requests is read); the share applies again to the next newcomer. The address budget
has no grace, unlike the MQTT pool's: one address reopening more sockets than there
are slots would keep the listener full of its own young connections. It only ever
costs that address its own oldest connection. So one address never holds more than
``max_connections_per_address`` slots, and whoever arrives finds a slot unless every
connection is being answered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: Why a connection was closed to make room, or a newcomer refused.
ADDRESS_FULL: Final = "address_full"
UNFINISHED_FULL: Final = "unfinished_full"
LISTENER_FULL: Final = "listener_full"
REASONS: Final = (ADDRESS_FULL, UNFINISHED_FULL, LISTENER_FULL)


class Phase(Enum):
    UNFINISHED = "unfinished"
    IDLE = "idle"
    ANSWERING = "answering"


@dataclass(slots=True)
class Slot:
    address: str
    phase: Phase
    #: When the current phase began (the order of eviction: oldest first).
    since: float
    opened: float


@dataclass(frozen=True, slots=True)
class Budgets:
    max_connections: int
    unfinished_share: float
    max_connections_per_address: int
    unfinished_grace: float

    @property
    def max_unfinished(self) -> int:
        """Slots unfinished connections may hold (at least one)."""
        return max(1, int(self.max_connections * self.unfinished_share))


@dataclass(frozen=True, slots=True)
class Eviction(Generic[K]):
    key: K
    slot: Slot
    reason: str


@dataclass(frozen=True, slots=True)
class Verdict(Generic[K]):
    """The newcomer's fate: admitted or refused (``refused`` is the reason), and the
    connections closed to make room for it (the caller closes them)."""

    refused: str | None
    evicted: tuple[Eviction[K], ...] = ()


class Admission(Generic[K]):
    """Every open connection's slot, its phase, and the budgets over them."""

    def __init__(self, budgets: Budgets) -> None:
        self.budgets = budgets
        self.slots: dict[K, Slot] = {}
        #: Open connections per address (all phases).
        self.per_address: dict[str, int] = {}
        #: Waiting connections (unfinished and idle), oldest phase first; and the
        #: unfinished ones alone, and the waiting ones per address.
        self._waiting: OrderedDict[K, None] = OrderedDict()
        self._unfinished: OrderedDict[K, None] = OrderedDict()
        self._by_address: dict[str, OrderedDict[K, None]] = {}

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def full(self) -> bool:
        return len(self.slots) >= self.budgets.max_connections

    @property
    def unfinished(self) -> int:
        return len(self._unfinished)

    def admit(self, key: K, address: str, now: float) -> Verdict[K]:
        """A slot for ``key`` (an unfinished connection from ``address``), closing
        others to make room as the budgets say; or a refusal."""
        b = self.budgets
        judged = now - b.unfinished_grace
        evicted: list[Eviction[K]] = []
        if self.per_address.get(address, 0) >= b.max_connections_per_address:
            own = self._by_address.get(address)
            victim = next(iter(own), None) if own else None
            if victim is None:
                return Verdict(ADDRESS_FULL)
            evicted.append(self._evict(victim, ADDRESS_FULL))
        if not self.full and len(self._unfinished) >= b.max_unfinished:
            victim = next(iter(self._unfinished))
            if self.slots[victim].since <= judged:
                evicted.append(self._evict(victim, UNFINISHED_FULL))
        if self.full:
            victim = next(iter(self._unfinished), None)
            if victim is None:
                victim = next(iter(self._waiting), None)
            if victim is not None:
                evicted.append(self._evict(victim, LISTENER_FULL))
        if self.full:
            return Verdict(LISTENER_FULL, tuple(evicted))
        self.slots[key] = Slot(address, Phase.UNFINISHED, now, now)
        self.per_address[address] = self.per_address.get(address, 0) + 1
        self._wait(key, address, unfinished=True)
        return Verdict(None, tuple(evicted))

    # ------------------------------------------------------------------ phases

    def request_started(self, key: K, now: float) -> None:
        """The first bytes of a request head arrived on an idle connection."""
        slot = self.slots.get(key)
        if slot is not None and slot.phase is not Phase.UNFINISHED:
            self._unwait(key, slot)
            slot.phase, slot.since = Phase.UNFINISHED, now
            self._wait(key, slot.address, unfinished=True)

    def answering(self, key: K) -> None:
        """A complete request head: its answer is being made."""
        slot = self.slots.get(key)
        if slot is not None and slot.phase is not Phase.ANSWERING:
            self._unwait(key, slot)
            slot.phase = Phase.ANSWERING

    def idle(self, key: K, now: float) -> None:
        """Answered; the keep-alive connection waits for its next request."""
        slot = self.slots.get(key)
        if slot is not None:
            self._unwait(key, slot)
            slot.phase, slot.since = Phase.IDLE, now
            self._wait(key, slot.address, unfinished=False)

    def leave(self, key: K) -> Slot | None:
        """The connection is closing: its slot is free (None: it had none)."""
        slot = self.slots.pop(key, None)
        if slot is None:
            return None
        self._unwait(key, slot)
        left = self.per_address[slot.address] - 1
        if left:
            self.per_address[slot.address] = left
        else:
            del self.per_address[slot.address]
        return slot

    # ------------------------------------------------------------------ tables

    def _evict(self, key: K, reason: str) -> Eviction[K]:
        slot = self.leave(key)
        assert slot is not None
        return Eviction(key, slot, reason)

    def _wait(self, key: K, address: str, *, unfinished: bool) -> None:
        self._waiting[key] = None
        self._by_address.setdefault(address, OrderedDict())[key] = None
        if unfinished:
            self._unfinished[key] = None

    def _unwait(self, key: K, slot: Slot) -> None:
        if slot.phase is Phase.ANSWERING:
            return
        self._waiting.pop(key, None)
        self._unfinished.pop(key, None)
        own = self._by_address.get(slot.address)
        if own is not None:
            own.pop(key, None)
            if not own:
                del self._by_address[slot.address]
