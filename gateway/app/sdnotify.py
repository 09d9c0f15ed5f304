"""The systemd notify protocol, spoken directly (no dependency): a few datagrams on the
socket named by ``$NOTIFY_SOCKET``.

sd_notify(3): "a notification message is sent as a datagram over an AF_UNIX socket to the
socket named in $NOTIFY_SOCKET. [...] If the first character of $NOTIFY_SOCKET is '@', the
string is understood as a Linux abstract namespace socket." The message is newline-separated
``VARIABLE=value`` assignments: ``READY=1`` (start-up finished), ``RELOADING=1``,
``STOPPING=1``, ``STATUS=...`` and ``WATCHDOG=1``, which a service with ``WatchdogSec=`` must
send "regularly"; systemd passes the interval in ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``,
the process meant) and recommends a keep-alive every half of it.

The gateway imports this module only when ``$NOTIFY_SOCKET`` is set, i.e. when it runs as
a ``Type=notify`` service.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping

log = logging.getLogger("ledge")

ENV_SOCKET = "NOTIFY_SOCKET"
ENV_WATCHDOG_USEC = "WATCHDOG_USEC"
ENV_WATCHDOG_PID = "WATCHDOG_PID"


class Notifier:
    """Sends notifications to the service manager; never raises (a lost notification
    must not stop the gateway: systemd then times it out and says so)."""

    def __init__(self, address: str, watchdog_usec: int = 0) -> None:
        # sd_notify(3): a leading '@' names an abstract socket (a leading NUL byte).
        self.address = "\0" + address[1:] if address.startswith("@") else address
        #: Seconds between keep-alives: half the watchdog timeout; 0 without a watchdog.
        self.watchdog_interval = watchdog_usec / 2_000_000
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)
        self._failed = False

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str]) -> Notifier | None:
        """The notifier ``environ`` asks for, or None. The variables are removed, as
        sd_notify's ``unset_environment`` does, so child processes (the reload's
        validator) do not take the messages for their own."""
        address = environ.pop(ENV_SOCKET, "")
        usec_text = environ.pop(ENV_WATCHDOG_USEC, "")
        pid_text = environ.pop(ENV_WATCHDOG_PID, "")
        if not address or not (address.startswith(("/", "@"))):
            if address:
                log.warning("ignoring %s=%r: not a socket path", ENV_SOCKET, address)
            return None
        usec = int(usec_text) if usec_text.isdigit() else 0
        # sd_watchdog_enabled(3): WATCHDOG_PID, when set, names the process meant.
        if pid_text and pid_text != str(os.getpid()):
            usec = 0
        return cls(address, usec)

    def send(self, *assignments: str) -> bool:
        """Send ``VARIABLE=value`` lines as one datagram; False when it could not go."""
        try:
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:
            if not self._failed:  # once: the manager went away, or its queue is full
                log.warning("cannot notify the service manager at %s: %s", self.address, exc)
                self._failed = True
            return False
        self._failed = False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def reloading(self) -> bool:
        return self.send("RELOADING=1", "STATUS=reloading the configuration")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", "STATUS=shutting down")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        self._sock.close()
