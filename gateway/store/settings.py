"""Store settings: plain data, importable without loading SQLite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """How the store under ``data_dir`` behaves (see ``gateway.store.sqlite``)."""

    durability: str = "power"  # "power": fsync every commit; "process": no fsync
    on_corrupt: str = "refuse"  # "refuse" | "move-aside"
    max_bytes: int = 0  # 0: only the disk limits it
    retry_interval: float = 1.0  # seconds between attempts when the store is full


#: Bytes an outbox entry costs beyond its topic, payload and properties (the bridge
#: and the store count it the same way).
OUTBOX_ENTRY_OVERHEAD: Final = 64
