"""A lossy file system for power-cut tests: what was not synced is lost at a cut.

``python -m tests.support.lossyfs BACKING MOUNTPOINT --control SOCKET`` mounts, over
``/dev/fuse`` (mfusepy, libfuse 3), a passthrough onto the directory BACKING, which
plays the disk. ``LossyMount`` starts, drives and unmounts it from a test.

The model (the one LazyFS, the FUSE file system Jepsen uses for this, has by default,
and SQLite's own crash tests use):

- **File data is volatile until synced.** ``write`` and ``truncate`` (also ``O_TRUNC``
  at open) do not touch the backing file: they are kept in memory per file, in order,
  keyed by the backing file's inode (so a rename keeps them). They reach the backing
  file only at ``fsync``/``fdatasync`` of that file (any descriptor of it), applied in
  order, and then the backing file is fsynced. A file opened with ``O_SYNC`` or
  ``O_DSYNC`` syncs at every write.
- **Reads see the pending changes**: the backing bytes overlaid with the pending
  writes and truncates, in order; ``getattr`` reports the size they give.
- **The namespace is durable at once**: create, unlink, rename, mkdir, rmdir, chmod,
  chown and utimens go to the backing directory when they happen; ``fsyncdir`` has
  nothing to do. (A real file system may lose a create or a rename that was not
  followed by an fsync of the directory; this one never does.)
- **A cut** (the power fails) ends every operation: from then on each one fails with
  EIO until the file system is unmounted, so nothing the dying gateway still had in
  flight can reach the disk after it. What was pending is then, per cut: ``all``,
  dropped entirely; or ``random``, split into 4 KiB-aligned pieces (a torn write:
  one write may survive in part), and a random subset of the pieces is applied in
  order (each kept with one probability drawn per cut), then synced -- so only what an
  fsync ordered is guaranteed, and any prefix-free mix of the rest may survive, as
  on a disk that writes back pages in any order. Mounting again on the same backing
  directory is the power coming back.
- **Wear is counted**: the bytes and distinct 4 KiB pages each sync writes to the
  backing files, per kind of file (the SQLite database, its ``-wal`` and ``-shm``,
  others). A page written several times between two syncs is counted once, as a page
  cache would write it back once.

What it does not model: the drive's own volatile cache (an fsync here is a flush
that the backing file system makes durable); the file system's metadata journal
(sizes change only with the data ops that change them); sector tearing below
4 KiB (a 4 KiB piece is written whole or not at all); reordering of the namespace
operations; write-back of the kernel's own dirty pages when nothing syncs (in this
model unsynced data never reaches the disk by itself -- ``sync`` in the control
protocol writes it all, for wear figures). SQLite's ``-shm`` (mmap'ed) works: FUSE
supports shared writable mappings without ``direct_io``, and the kernel writes the
mapped pages back through ``write``, so they are pending like the rest.

The FUSE loop is single-threaded; a control thread answers JSON lines on a Unix
socket (``stats``, ``cut``, ``sync``) under the same lock as the file operations.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

PAGE: Final = 4096
KINDS: Final = ("db", "wal", "shm", "other")
MODES: Final = ("all", "random")


def kind_of(name: str) -> str:
    if name.endswith("-wal"):
        return "wal"
    if name.endswith("-shm"):
        return "shm"
    if name.endswith(".db"):
        return "db"
    return "other"


class Write(NamedTuple):
    offset: int
    data: bytes


class Truncate(NamedTuple):
    length: int


Change = Write | Truncate


@dataclass
class Pending:
    """The unsynced changes of one file (one backing inode)."""

    fd: int  # our own read-write descriptor of the backing file
    name: str  # its last known path (for the wear counts by kind)
    size: int  # the size the pending changes give
    #: Backing bytes at or beyond this offset read as zero (a pending truncate cut
    #: them off; later writes are in ``pages``).
    floor: int
    changes: list[Change] = field(default_factory=list)
    #: The content of every page a pending write touched, with every change applied.
    pages: dict[int, bytearray] = field(default_factory=dict)
    written: int = 0  # bytes of the pending writes

    def backing_page(self, index: int) -> bytearray:
        page = bytearray(os.pread(self.fd, PAGE, index * PAGE))
        page.extend(bytes(PAGE - len(page)))
        cut = self.floor - index * PAGE
        if cut < PAGE:
            page[max(0, cut) :] = bytes(PAGE - max(0, cut))
        return page

    def write(self, offset: int, data: bytes) -> None:
        self.changes.append(Write(offset, data))
        self.written += len(data)
        pos, end = offset, offset + len(data)
        while pos < end:
            index, start = divmod(pos, PAGE)
            page = self.pages.get(index)
            if page is None:
                page = self.pages[index] = self.backing_page(index)
            n = min(PAGE - start, end - pos)
            page[start : start + n] = data[pos - offset : pos - offset + n]
            pos += n
        self.size = max(self.size, end)

    def truncate(self, length: int) -> None:
        self.changes.append(Truncate(length))
        self.floor = min(self.floor, length)
        for index in [i for i in self.pages if (i + 1) * PAGE > length]:
            keep = length - index * PAGE
            if keep <= 0:
                del self.pages[index]
            else:
                self.pages[index][keep:] = bytes(PAGE - keep)
        self.size = length

    def read(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self.size)
        out = bytearray()
        pos = offset
        while pos < end:
            index, start = divmod(pos, PAGE)
            page = self.pages.get(index)
            if page is None:
                page = self.backing_page(index)
            n = min(PAGE - start, end - pos)
            out += page[start : start + n]
            pos += n
        return bytes(out)


def pieces(change: Change) -> Iterator[Change]:
    """A change split at 4 KiB boundaries of the file: the units a cut keeps or loses."""
    if isinstance(change, Truncate):
        yield change
        return
    offset, data = change
    pos, end = offset, offset + len(data)
    while pos < end:
        n = min(PAGE - pos % PAGE, end - pos)
        yield Write(pos, data[pos - offset : pos - offset + n])
        pos += n


@dataclass
class Counts:
    syncs: int = 0  # fsync / fdatasync calls
    flushes: int = 0  # of them, those that had pending changes to write
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    pages: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    cuts: int = 0
    cut_dropped: int = 0  # bytes of pending writes lost at cuts
    cut_kept: int = 0  # bytes of pending writes a random cut let through


class LossyFS:
    """The file operations (mfusepy calls them by name; every one holds ``lock``)."""

    use_ns = True

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.lock = threading.Lock()
        self.fds: dict[int, tuple[int, tuple[int, int], int]] = {}  # fh -> fd, key, flags
        self.next_fh = 1
        self.pending: dict[tuple[int, int], Pending] = {}
        self.counts = Counts()
        self.dead = False
        self.ready = threading.Event()

    # ------------------------------------------------------------------ helpers

    def _real(self, path: str) -> str:
        return self.root + path

    def _handle(self, fd: int, flags: int) -> int:
        st = os.fstat(fd)
        fh = self.next_fh
        self.next_fh += 1
        self.fds[fh] = (fd, (st.st_dev, st.st_ino), flags)
        return fh

    def _pending(self, fh: int, path: str) -> Pending:
        fd, key, _ = self.fds[fh]
        p = self.pending.get(key)
        if p is None:
            size = os.fstat(fd).st_size
            own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
            p = self.pending[key] = Pending(own, path, size, size)
        elif path:
            p.name = path
        return p

    def _apply(self, p: Pending, changes: list[Change]) -> None:
        touched: set[int] = set()
        written = 0
        for change in changes:
            if isinstance(change, Truncate):
                os.ftruncate(p.fd, change.length)
            else:
                os.pwrite(p.fd, change.data, change.offset)
                written += len(change.data)
                first = change.offset // PAGE
                last = (change.offset + len(change.data) - 1) // PAGE
                touched.update(range(first, last + 1))
        os.fsync(p.fd)
        kind = kind_of(p.name)
        self.counts.bytes[kind] += written
        self.counts.pages[kind] += len(touched)

    def _flush(self, key: tuple[int, int]) -> None:
        p = self.pending.pop(key, None)
        if p is None:
            return
        try:
            self.counts.flushes += 1
            self._apply(p, p.changes)
        finally:
            os.close(p.fd)

    def _forget(self, key: tuple[int, int]) -> None:
        """The inode is gone (its last name removed, nobody has it open)."""
        if any(k == key for _, k, _ in self.fds.values()):
            return
        p = self.pending.pop(key, None)
        if p is not None:
            os.close(p.fd)

    # ------------------------------------------------------------------ control

    def cut(self, mode: str, seed: int) -> dict[str, int]:
        """The power fails: pending changes are lost (``all``) or partly written
        (``random``), and every later operation fails."""
        rnd = random.Random(seed)
        keep = rnd.random()
        dropped = kept = 0
        self.dead = True
        self.counts.cuts += 1
        for key in list(self.pending):
            p = self.pending.pop(key)
            try:
                chosen: list[Change] = []
                for change in p.changes:
                    for piece in pieces(change):
                        size = len(piece.data) if isinstance(piece, Write) else 0
                        if mode == "random" and rnd.random() < keep:
                            chosen.append(piece)
                            kept += size
                        else:
                            dropped += size
                if chosen:
                    self._apply(p, chosen)
            finally:
                os.close(p.fd)
        self.counts.cut_dropped += dropped
        self.counts.cut_kept += kept
        return {"dropped": dropped, "kept": kept}

    def sync(self) -> None:
        """``sync``: every pending change reaches the disk (counted)."""
        for key in list(self.pending):
            self._flush(key)

    def stats(self) -> dict[str, Any]:
        c = self.counts
        return {
            "ready": self.ready.is_set(),
            "dead": self.dead,
            "syncs": c.syncs,
            "flushes": c.flushes,
            "bytes": dict(c.bytes),
            "pages": dict(c.pages),
            "cuts": c.cuts,
            "cut_dropped": c.cut_dropped,
            "cut_kept": c.cut_kept,
            "pending_files": len(self.pending),
            "pending_bytes": sum(p.written for p in self.pending.values()),
        }

    # ------------------------------------------------------------------ FUSE

    def init(self, path: str) -> None:
        self.ready.set()

    def destroy(self, path: str) -> None:
        # Unmounted: what is still pending never reaches the disk.
        for p in self.pending.values():
            os.close(p.fd)
        self.pending.clear()

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        if fh is not None and fh in self.fds:
            st = os.fstat(self.fds[fh][0])
        else:
            st = os.lstat(self._real(path))
        attrs = {
            key: getattr(st, key)
            for key in (
                "st_mode",
                "st_ino",
                "st_nlink",
                "st_uid",
                "st_gid",
                "st_size",
                "st_atime_ns",
                "st_mtime_ns",
                "st_ctime_ns",
                "st_blocks",
            )
        }
        for key in ("st_atime", "st_mtime", "st_ctime"):
            attrs[key] = attrs.pop(key + "_ns")
        p = self.pending.get((st.st_dev, st.st_ino))
        if p is not None:
            attrs["st_size"] = p.size
            attrs["st_blocks"] = (p.size + 511) // 512
        return attrs

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, "access")
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._real(path))
        return {
            key: getattr(sv, key)
            for key in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            )
        }

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        real = self._real(path)
        st = os.lstat(real)
        os.unlink(real)
        if st.st_nlink <= 1:
            self._forget((st.st_dev, st.st_ino))
        return 0

    def rename(self, old: str, new: str) -> int:
        target = self._real(new)
        try:
            st: os.stat_result | None = os.lstat(target)
        except FileNotFoundError:
            st = None
        os.rename(self._real(old), target)
        if st is not None and st.st_nlink <= 1:
            self._forget((st.st_dev, st.st_ino))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._real(path))
        else:
            os.utime(self._real(path), ns=times)
        return 0

    def _open(self, path: str, flags: int, mode: int = 0o644) -> int:
        truncate = bool(flags & os.O_TRUNC)
        fd = os.open(self._real(path), flags & ~(os.O_TRUNC | os.O_APPEND), mode)
        fh = self._handle(fd, flags)
        if truncate:
            self._pending(fh, path).truncate(0)
        return fh

    def open(self, path: str, flags: int) -> int:
        return self._open(path, flags)

    def create(self, path: str, mode: int, flags: int) -> int:
        return self._open(path, flags | os.O_CREAT, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        fd, key, _ = self.fds[fh]
        p = self.pending.get(key)
        if p is None:
            return os.pread(fd, size, offset)
        return p.read(size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        p = self._pending(fh, path)
        p.write(offset, data)
        if self.fds[fh][2] & (os.O_SYNC | os.O_DSYNC):
            self._flush(self.fds[fh][1])
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is None:
            fd = os.open(self._real(path), os.O_RDONLY)
            fh = self._handle(fd, os.O_RDONLY)
            try:
                self._pending(fh, path).truncate(length)
            finally:
                self.release(path, fh)
        else:
            self._pending(fh, path).truncate(length)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.counts.syncs += 1
        self._flush(self.fds[fh][1])
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # the namespace is durable at once

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        fd, key, _ = self.fds.pop(fh)
        os.close(fd)
        with contextlib.suppress(OSError, KeyError):
            if os.stat(f"/proc/self/fd/{self.pending[key].fd}").st_nlink == 0:
                self._forget(key)  # unlinked while open, now closed: gone
        return 0


_F = TypeVar("_F", bound=Callable[..., Any])

#: The operations given to libfuse (each wrapped: the lock, and EIO after a cut).
OPERATIONS: Final = (
    "getattr",
    "access",
    "readdir",
    "statfs",
    "mkdir",
    "rmdir",
    "unlink",
    "rename",
    "chmod",
    "chown",
    "utimens",
    "open",
    "create",
    "read",
    "write",
    "truncate",
    "fsync",
    "fsyncdir",
    "flush",
    "release",
)


def operations(fs: LossyFS) -> Any:
    """An mfusepy ``Operations`` object calling ``fs`` under its lock."""
    import mfusepy

    def guarded(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            with fs.lock:
                if not fs.dead:
                    return method(*args)
                # After a cut only closing works (the dead gateway's files, unmounting).
                if name == "release":
                    with contextlib.suppress(KeyError, OSError):
                        os.close(fs.fds.pop(args[1])[0])
                    return 0
                if name == "flush":
                    return 0
                raise mfusepy.FuseOSError(errno.EIO)

        call.__name__ = name
        return call

    namespace: dict[str, Any] = {"use_ns": True}
    for name in OPERATIONS:
        namespace[name] = staticmethod(guarded(name, getattr(fs, name)))
    namespace["init"] = staticmethod(fs.init)
    namespace["destroy"] = staticmethod(fs.destroy)
    # mfusepy passes create() the open flags when the method takes three parameters.
    create = guarded("create", fs.create)

    def create3(path: str, mode: int, flags: int) -> int:
        result: int = create(path, mode, flags)
        return result

    namespace["create"] = staticmethod(create3)
    cls = type("LossyOperations", (mfusepy.Operations,), namespace)
    return cls()


def _serve_control(fs: LossyFS, path: str) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def answer(conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                request = json.loads(line)
                with fs.lock:
                    command = request["cmd"]
                    if command == "cut":
                        reply: dict[str, Any] = fs.cut(request["mode"], request["seed"])
                    elif command == "sync":
                        fs.sync()
                        reply = fs.stats()
                    else:
                        reply = fs.stats()
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, name="lossyfs-control", daemon=True).start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--control", required=True, help="Unix socket for stats/cut/sync")
    args = parser.parse_args()
    import mfusepy

    fs = LossyFS(args.backing)
    _serve_control(fs, args.control)
    mfusepy.FUSE(
        operations(fs),
        args.mountpoint,
        foreground=True,
        nothreads=True,
        fsname="lossyfs",
    )
    return 0


# ---------------------------------------------------------------------- the client


def fuse_available() -> str | None:
    """Why a lossy mount cannot be made here (None: it can)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (Debian's fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse 3: {exc}"
    return None


def mounted(mountpoint: Path) -> bool:
    """Whether something is mounted there (from the mount table: a stat of a dead or
    cut mount fails, so ``os.path.ismount`` cannot tell)."""
    where = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as table:
        return any(line.split()[1] == where for line in table)


class LossyMount:
    """One mount of the lossy file system, driven from a test or a bench."""

    def __init__(self, backing: Path, mountpoint: Path, control: Path) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.control = control
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = control.with_suffix(".log")
        self._sock: socket.socket | None = None
        self._stream: Any = None

    def mount(self, timeout: float = 20.0) -> LossyMount:
        problem = fuse_available()
        if problem is not None:
            raise AssertionError(f"no lossy file system here: {problem} (scripts/setup --test)")
        self.backing.mkdir(parents=True, exist_ok=True)
        if mounted(self.mountpoint):  # left by an earlier run that died
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.control.unlink()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.lossyfs",
                    str(self.backing),
                    str(self.mountpoint),
                    "--control",
                    str(self.control),
                ],
                cwd=Path(__file__).resolve().parents[2],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the lossy file system exited:\n{self.log.read_text()}")
            if mounted(self.mountpoint) and self.control.exists():
                with contextlib.suppress(OSError):
                    if self.request({"cmd": "stats"})["ready"]:
                        return self
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the lossy file system to mount")
            time.sleep(0.005)

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._stream is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(60)
            sock.connect(str(self.control))
            self._sock = sock
            self._stream = sock.makefile("rwb")
        self._stream.write(json.dumps(request).encode() + b"\n")
        self._stream.flush()
        line = self._stream.readline()
        if not line:
            raise OSError("the lossy file system closed its control socket")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def stats(self) -> dict[str, Any]:
        return self.request({"cmd": "stats"})

    def sync(self) -> dict[str, Any]:
        return self.request({"cmd": "sync"})

    def cut(self, mode: str, seed: int) -> dict[str, int]:
        assert mode in MODES
        reply = self.request({"cmd": "cut", "mode": mode, "seed": seed})
        return {"dropped": int(reply["dropped"]), "kept": int(reply["kept"])}

    def unmount(self, timeout: float = 20.0) -> None:
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            if self._sock is not None:
                self._sock.close()
            self._stream = self._sock = None
        proc = self.proc
        if proc is None:
            return
        deadline = time.monotonic() + timeout
        while mounted(self.mountpoint):
            done = subprocess.run(
                ["fusermount3", "-u", str(self.mountpoint)], check=False, capture_output=True
            )
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)
                break
            time.sleep(0.01)
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
        self.proc = None

    def __enter__(self) -> LossyMount:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()


if __name__ == "__main__":
    raise SystemExit(main())
