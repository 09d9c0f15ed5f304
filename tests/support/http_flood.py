"""Slow HTTP requests from one address, reopened as the server closes them: the attack
that once locked Prometheus out of the HTTP listener."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from types import TracebackType

#: The start of a request head that never ends (one more header byte now and then).
SLOW_HEAD = b"GET /metrics HTTP/1.1\r\nHost: gw1\r\nX-Slow: "


class SlowRequests:
    """``count`` sockets from ``source``, each sending ``SLOW_HEAD`` and then one more
    byte every ``trickle`` seconds; one the server closes (an answer, a reset) is
    reopened at once. Runs in a thread until the ``with`` block ends."""

    def __init__(
        self, port: int, source: str = "127.0.0.2", count: int = 20, trickle: float = 0.2
    ) -> None:
        self.port = port
        self.source = source
        self.count = count
        self.trickle = trickle
        #: Sockets the server closed (each reopened), and what it said before, if anything.
        self.closed = 0
        self.answers: dict[bytes, int] = {}
        #: Connections that could not be opened (the listener's backlog was full).
        self.failed = 0
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow requests", daemon=True)

    def __enter__(self) -> SlowRequests:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the attack did not stop"

    def _open(self, selector: selectors.BaseSelector) -> None:
        sock = socket.socket()
        try:
            sock.settimeout(2)
            sock.bind((self.source, 0))
            sock.connect(("127.0.0.1", self.port))
            sock.sendall(SLOW_HEAD)
            sock.setblocking(False)
        except OSError:
            self.failed += 1
            sock.close()
            return
        selector.register(sock, selectors.EVENT_READ)

    def _run(self) -> None:
        try:
            with selectors.DefaultSelector() as selector:
                self._loop(selector)
        except Exception as exc:  # reported to the test by the attribute
            self.error = repr(exc)

    def _loop(self, selector: selectors.BaseSelector) -> None:
        for _ in range(self.count):
            self._open(selector)
        next_byte = time.monotonic() + self.trickle
        while not self._stop.is_set():
            for key, _ in selector.select(0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    status = data[:12]
                    self.answers[status] = self.answers.get(status, 0) + 1
                selector.unregister(sock)
                sock.close()
                self.closed += 1
                self._open(selector)
            missing = self.count - len(selector.get_map())
            for _ in range(missing):
                self._open(selector)
            if time.monotonic() >= next_byte:
                next_byte += self.trickle
                for key in list(selector.get_map().values()):
                    with contextlib.suppress(OSError):
                        key.fileobj.send(b"s")  # type: ignore[union-attr]
        for key in list(selector.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
