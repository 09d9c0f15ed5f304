"""A disk with a volatile write cache, served over NBD, whose power can be cut.

QEMU reaches the card image through this server (``-drive file=nbd+unix://...``)
instead of opening the file itself. A write is acknowledged at once and kept in the
server's cache, in 4 KiB pages; only a FLUSH (the guest's fsync, a journal commit's
barrier) or a write with FUA puts pages on the image file. At a cut (``cut``, after
QEMU was killed) the cache is thrown away: every page, or a random subset of them (a
real card writes back in any order it likes between two flushes). What was flushed is
all that is certain to be on the card, as on a real SD card.

The protocol is the NBD fixed-newstyle handshake (``NBD_OPT_GO`` or
``NBD_OPT_EXPORT_NAME``) and simple replies; READ, WRITE (with FUA), FLUSH,
WRITE_ZEROES, TRIM (ignored: the data stays) and DISC
(https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md). One client at a
time: one boot of one QEMU.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 4096

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698

FLAG_FIXED_NEWSTYLE = 1
FLAG_NO_ZEROES = 2
CLIENT_NO_ZEROES = 2

OPT_EXPORT_NAME = 1
OPT_ABORT = 2
OPT_INFO = 6
OPT_GO = 7
REP_ACK = 1
REP_INFO = 3
REP_ERR_UNSUP = (1 << 31) + 1
INFO_EXPORT = 0

# Transmission flags: flags in requests, FLUSH, FUA, TRIM, WRITE_ZEROES.
TRANSMISSION = 1 | 4 | 8 | 32 | 64
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_WRITE_ZEROES = 0, 1, 2, 3, 4, 6
CMD_FLAG_FUA = 1
EINVAL, EIO = 22, 5

REQUEST = struct.Struct(">IHHQQI")
SIMPLE_REPLY = struct.Struct(">IIQ")


def _recv(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


@dataclass
class CutReport:
    """What one cut did to the cache."""

    mode: str
    dirty_pages: int
    kept_pages: int


@dataclass
class CachedDisk:
    """``path`` behind a volatile write cache; ``serve`` on a Unix socket."""

    path: Path
    socket_path: Path
    #: Pages written and acknowledged but not flushed: page number -> its content.
    dirty: dict[int, bytearray] = field(default_factory=dict)
    flushes: int = 0
    writes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _listener: socket.socket | None = None
    _thread: threading.Thread | None = None
    _conn: socket.socket | None = None
    _fd: int = -1
    error: BaseException | None = None

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    # ------------------------------------------------------------------ the cache

    def _page(self, number: int) -> bytearray:
        page = self.dirty.get(number)
        if page is None:
            page = bytearray(os.pread(self._fd, PAGE, number * PAGE).ljust(PAGE, b"\0"))
        return page

    def read(self, offset: int, length: int) -> bytes:
        with self._lock:
            data = bytearray(os.pread(self._fd, length, offset).ljust(length, b"\0"))
            first, last = offset // PAGE, (offset + length - 1) // PAGE
            if len(self.dirty) < last - first + 1:
                numbers = [n for n in self.dirty if first <= n <= last]
            else:
                numbers = [n for n in range(first, last + 1) if n in self.dirty]
            for number in numbers:
                page = self.dirty[number]
                lo, hi = max(offset, number * PAGE), min(offset + length, (number + 1) * PAGE)
                data[lo - offset : hi - offset] = page[lo - number * PAGE : hi - number * PAGE]
            return bytes(data)

    def write(self, offset: int, data: bytes, fua: bool) -> None:
        with self._lock:
            self.writes += 1
            end = offset + len(data)
            touched = []
            for number in range(offset // PAGE, (end - 1) // PAGE + 1):
                page = self._page(number)
                lo, hi = max(offset, number * PAGE), min(end, (number + 1) * PAGE)
                page[lo - number * PAGE : hi - number * PAGE] = data[lo - offset : hi - offset]
                self.dirty[number] = page
                touched.append(number)
            if fua:
                self._write_back(touched)

    def _write_back(self, numbers: list[int]) -> None:
        size = self.size
        for number in sorted(numbers):
            page = self.dirty.pop(number)
            start = number * PAGE
            os.pwrite(self._fd, bytes(page[: max(0, min(PAGE, size - start))]), start)
        os.fsync(self._fd)

    def flush(self) -> None:
        with self._lock:
            self.flushes += 1
            self._write_back(list(self.dirty))

    def cut(self, rng: random.Random, mode: str) -> CutReport:
        """The power goes (QEMU is already gone): ``"all"`` loses every unflushed page,
        ``"subset"`` a random half of them (the rest reached the card)."""
        with self._lock:
            dirty = list(self.dirty)
            kept = [n for n in dirty if mode == "subset" and rng.random() < 0.5]
            for number in set(dirty) - set(kept):
                del self.dirty[number]
            if kept:
                self._write_back(kept)
            return CutReport(mode, len(dirty), len(kept))

    # ------------------------------------------------------------------ the server

    def start(self) -> CachedDisk:
        self._fd = os.open(self.path, os.O_RDWR)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        listener.listen(1)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="nbd", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> CachedDisk:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while self._listener is not None:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conn = conn
            try:
                self._session(conn)
            except (EOFError, ConnectionError, OSError):
                pass  # QEMU killed: its writes up to here are in the cache
            except BaseException as exc:  # a bug here: say so at the next check
                self.error = exc
            finally:
                conn.close()
                self._conn = None

    def _session(self, conn: socket.socket) -> None:
        conn.sendall(struct.pack(">QQH", NBDMAGIC, IHAVEOPT, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES))
        (client_flags,) = struct.unpack(">I", _recv(conn, 4))
        if not self._negotiate(conn, bool(client_flags & CLIENT_NO_ZEROES)):
            return
        self._transmit(conn)

    def _reply(self, conn: socket.socket, option: int, kind: int, data: bytes = b"") -> None:
        conn.sendall(struct.pack(">QIII", REPLY_MAGIC, option, kind, len(data)) + data)

    def _negotiate(self, conn: socket.socket, no_zeroes: bool) -> bool:
        export = struct.pack(">QH", self.size, TRANSMISSION)
        while True:
            magic, option, length = struct.unpack(">QII", _recv(conn, 16))
            if magic != IHAVEOPT:
                raise ConnectionError(f"NBD: bad option magic {magic:#x}")
            _recv(conn, length)
            if option == OPT_EXPORT_NAME:
                conn.sendall(export + (b"" if no_zeroes else bytes(124)))
                return True
            if option in (OPT_GO, OPT_INFO):
                self._reply(conn, option, REP_INFO, struct.pack(">H", INFO_EXPORT) + export)
                self._reply(conn, option, REP_ACK)
                if option == OPT_GO:
                    return True
            elif option == OPT_ABORT:
                self._reply(conn, option, REP_ACK)
                return False
            else:  # structured replies, meta contexts, TLS, lists: not offered
                self._reply(conn, option, REP_ERR_UNSUP)

    def _transmit(self, conn: socket.socket) -> None:
        size = self.size
        while True:
            magic, flags, kind, handle, offset, length = REQUEST.unpack(_recv(conn, REQUEST.size))
            if magic != REQUEST_MAGIC:
                raise ConnectionError(f"NBD: bad request magic {magic:#x}")
            if kind == CMD_DISC:
                return
            data = _recv(conn, length) if kind == CMD_WRITE else b""
            error, payload = 0, b""
            if kind in (CMD_READ, CMD_WRITE, CMD_WRITE_ZEROES, CMD_TRIM) and (
                offset + length > size
            ):
                error = EINVAL
            elif kind == CMD_READ:
                payload = self.read(offset, length)
            elif kind == CMD_WRITE:
                self.write(offset, data, bool(flags & CMD_FLAG_FUA))
            elif kind == CMD_WRITE_ZEROES:
                self.write(offset, bytes(length), bool(flags & CMD_FLAG_FUA))
            elif kind == CMD_FLUSH:
                self.flush()
            elif kind != CMD_TRIM:
                error = EINVAL
            conn.sendall(SIMPLE_REPLY.pack(SIMPLE_REPLY_MAGIC, error, handle) + payload)
