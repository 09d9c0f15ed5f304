"""Store settings: plain data, importable without loading SQLite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from gateway.broker.settings import option

#: SQLite's page count limit at 4 KiB pages, with room to spare: one TiB.
MAX_STORE_BYTES: Final = 2**40


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """How the store under ``data_dir`` behaves (see ``gateway.store.sqlite``)."""

    #: "power": fsync every commit; "process": no fsync.
    durability: Literal["power", "process"] = option("power")
    on_corrupt: Literal["refuse", "move-aside"] = option("refuse")
    #: 0: only the disk limits it.
    max_bytes: int = option(0, ge=0, le=MAX_STORE_BYTES)
    #: Seconds between the starts of two commits at most once (group commit): what
    #: arrives meanwhile waits and goes in the next one. 0: commit as soon as possible.
    commit_interval: float = option(0.1, ge=0, le=10.0)
    #: Seconds between attempts when the store is full.
    retry_interval: float = option(1.0, internal=True)


#: Bytes an outbox entry costs beyond its topic, payload and properties (the bridge
#: and the store count it the same way).
OUTBOX_ENTRY_OVERHEAD: Final = 64
