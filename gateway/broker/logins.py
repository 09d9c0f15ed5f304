"""Failed logins slow down per source address, so guessing passwords over the network
is impractical. Pure: time is an argument; the core arms timers for what waits.

The policy:

- A password check that fails sets a delay for its address that doubles with every
  consecutive failure, from ``failed_login_delay`` up to ``failed_login_delay_max``.
  The refusal (CONNACK 0x86 / 4) is sent only when the delay has passed.
- At most one password check per address runs at a time. While one runs, or while the
  address's delay has not passed, further logins from it wait their turn, in order, up
  to ``WAITING_PER_ADDRESS``; beyond that they are refused at once with 0x9F
  (Connection rate exceeded; 3.1.1: 3, server unavailable). A login still waiting when
  its connect deadline passes is refused the same way.
- A successful login clears the address's record; a record whose last failure is older
  than ``FORGET_AFTER`` seconds starts again from the first delay.
- The table holds at most ``TABLE_SIZE`` addresses; beyond it the least recently used
  record is evicted (policy: LRU) and its waiting logins are refused with 0x9F.
- IPv6 addresses count per /64 prefix: one host usually has a whole /64 to pick from.

So an address gets one guess per ``failed_login_delay_max`` seconds once it has failed a
few times (with the defaults, 1 s doubling to 30 s: about 2,900 guesses a day), however
many connections it opens, and a legitimate client behind the same address gets in as
soon as it is its turn with the right password.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Final

from gateway.broker.timers import Handle

if TYPE_CHECKING:
    from gateway.broker.state import LoginAttempt

#: Addresses remembered (policy: least recently used evicted).
TABLE_SIZE: Final = 4096
#: Logins from one address waiting behind a running check or a delay.
WAITING_PER_ADDRESS: Final = 8
#: A record whose last failure is this old (seconds) starts afresh.
FORGET_AFTER: Final = 600.0


class AddressRecord:
    """What the gateway remembers about logins from one address."""

    __slots__ = ("busy", "failures", "last_failure", "until", "waiting", "wake")

    def __init__(self) -> None:
        self.failures = 0
        self.last_failure = 0.0
        #: No password check for this address before this time.
        self.until = 0.0
        #: A check for this address is running.
        self.busy = False
        self.waiting: deque[LoginAttempt] = deque()
        self.wake: Handle | None = None

    @property
    def idle(self) -> bool:
        return not (self.busy or self.waiting or self.failures)


class LoginThrottle:
    """The table of addresses and their delays."""

    __slots__ = ("_records", "size")

    def __init__(self, size: int = TABLE_SIZE) -> None:
        self.size = size
        self._records: OrderedDict[str, AddressRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str) -> AddressRecord | None:
        return self._records.get(key)

    def record(self, key: str, now: float) -> tuple[AddressRecord, AddressRecord | None]:
        """The record for ``key`` (created if new) and the record evicted to make room."""
        records = self._records
        record = records.get(key)
        evicted = None
        if record is None:
            if len(records) >= self.size:
                _key, evicted = records.popitem(last=False)
            record = records[key] = AddressRecord()
        else:
            records.move_to_end(key)
            if record.failures and now - record.last_failure > FORGET_AFTER:
                record.failures = 0
        return record, evicted

    def failed(self, record: AddressRecord, now: float, base: float, maximum: float) -> float:
        """Count a failure; returns the delay before the next check from that address:
        ``base`` doubled per consecutive failure, at most ``maximum``."""
        record.failures += 1
        record.last_failure = now
        delay = 0.0
        if base > 0:
            delay = min(maximum, base * 2.0 ** min(record.failures - 1, 32))
        record.until = now + delay
        return delay

    def succeeded(self, record: AddressRecord) -> None:
        record.failures = 0
        record.until = 0.0

    def forget(self, key: str) -> None:
        self._records.pop(key, None)


def address_key(peer: str) -> str:
    """The throttled unit of a peer ``host:port``: the IPv4 address, or the IPv6 /64."""
    host = peer.rpartition(":")[0] if ":" in peer else peer
    host = host.strip("[]")
    if ":" not in host:
        return host
    import ipaddress  # only for IPv6 peers

    try:
        ip = ipaddress.IPv6Address(host.split("%")[0])
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
