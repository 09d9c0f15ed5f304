"""The open-file limit against the connection pool, checked once at start-up.

Every connection is a file descriptor. A pool larger than the process's open-file
limit does not fail at start: it fails later, when ``accept()`` gets EMFILE and the
event loop stops accepting anyone for a while. So the gateway raises its soft limit
(``RLIMIT_NOFILE``) to what its pool needs, up to the hard limit, and when even the
hard limit is too low it says so and serves the connections it can hold, refusing
the rest with a reason code like any connection past ``max_connections``.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import replace
from typing import Final

from gateway.broker.pool import OVERFLOW_SLOTS
from gateway.broker.settings import BrokerSettings
from gateway.net.endpoint import MAX_PENDING_HANDSHAKES

log = logging.getLogger("ledge.net")

#: Descriptors besides client connections: the listening sockets' neighbours -- the
#: store (database, WAL, shared memory), bridge links, serial ports, the event loop's
#: own, standard streams, worker threads' pipes.
RESERVE: Final = 64

#: Connections the event loop may accept in one go before the pool sees them (the
#: listen backlog): wanted on top, so a burst does not hit the limit, not required.
ACCEPT_BURST: Final = 1024


def required(settings: BrokerSettings, listeners: int, handshake_listeners: int) -> int:
    """Descriptors the pool can hold at once: every slot, the refusal slots, the
    connections in a TLS handshake or WebSocket upgrade, the listeners, the reserve."""
    return (
        settings.max_connections
        + OVERFLOW_SLOTS
        + handshake_listeners * MAX_PENDING_HANDSHAKES
        + listeners
        + RESERVE
    )


def fit(settings: BrokerSettings, listeners: int, handshake_listeners: int) -> BrokerSettings:
    """Raise the soft open-file limit for the pool (up to the hard limit); when the
    hard limit is below what the pool needs, warn and return settings with a pool
    that fits."""
    need = required(settings, listeners, handshake_listeners)
    want = need + ACCEPT_BURST
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, ceiling, exc)
        else:
            log.info(
                "open-file limit raised from %d to %d for %d connection slots",
                soft,
                ceiling,
                settings.max_connections,
            )
            soft = ceiling
    if soft == resource.RLIM_INFINITY or soft >= need:
        return settings
    fits = max(1, settings.max_connections - (need - soft))
    log.warning(
        "broker.max_connections = %d needs %d open files but the limit is %d (hard %s): "
        "serving at most %d clients, more are refused as past max_connections; raise "
        "the hard limit (LimitNOFILE= in the systemd unit, ulimit -Hn) or lower "
        "broker.max_connections",
        settings.max_connections,
        need,
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
        fits,
    )
    return replace(settings, max_connections=fits)
