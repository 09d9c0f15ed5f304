"""The last accepted encryption counter of each device with a bindkey, kept across
restarts in ``<data_dir>/ble-counters.json``.

Replay protection is only as good as its memory: a gateway that forgot the counters
when it restarted would believe recorded adverts again (a restart would be a counter
reset nobody asked for). So the counters are written to the data directory: at most
every ``bluetooth.counter_save_interval`` seconds while they change, and at shutdown.

Each entry also holds a fingerprint of the device's bindkey (8 hex digits of its
SHA-256): a new key is a new device as far as replay goes (adverts recorded under the
old key do not authenticate under the new one), so its counter starts afresh.

The file is replaced whole (written beside, flushed to disk, renamed over), so a power
cut leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Final

FILE_NAME: Final = "ble-counters.json"
VERSION: Final = 1

#: address -> (key fingerprint, last accepted counter)
Counters = dict[str, tuple[str, int]]


class CounterFileError(ValueError):
    """The counters file exists but cannot be read as one."""


def fingerprint(key: bytes) -> str:
    """What the file keeps of a bindkey: enough to notice that it changed."""
    return hashlib.sha256(key).hexdigest()[:8]


def encode(counters: Counters) -> bytes:
    devices = {
        address: {"key": key, "counter": counter}
        for address, (key, counter) in sorted(counters.items())
    }
    return json.dumps({"version": VERSION, "devices": devices}, indent=1).encode() + b"\n"


def decode(data: bytes) -> Counters:
    """The counters in a file's bytes; CounterFileError naming what is wrong."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CounterFileError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise CounterFileError(f"not a version {VERSION} counters file")
    devices = doc.get("devices")
    if not isinstance(devices, dict):
        raise CounterFileError("no 'devices' table")
    out: Counters = {}
    for address, entry in devices.items():
        key = entry.get("key") if isinstance(entry, dict) else None
        counter = entry.get("counter") if isinstance(entry, dict) else None
        if not isinstance(key, str) or type(counter) is not int or not 0 <= counter < 2**32:
            raise CounterFileError(f"device {address!r}: not a key fingerprint and a counter")
        out[str(address).upper()] = (key, counter)
    return out


def load(path: Path) -> Counters:
    """The counters of ``path``; empty when there is no file yet. OSError when it cannot
    be read, CounterFileError when it is not a counters file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    return decode(data)


def save(path: Path, counters: Counters) -> None:
    """Replace ``path`` with ``counters``, durably (OSError when the disk says no)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(encode(counters))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
