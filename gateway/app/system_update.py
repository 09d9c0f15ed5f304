"""The outcome of the last system update, as the SD-card image records it.

``ledge-update-commit`` (on the image) settles each system update at the boot after it:
the new system kept (``committed``) or given up (``rolled-back``), and why. It writes
``key=value`` lines (outcome, slot, from, at, reason) to ``gateway.system_update_file``.
The gateway reads that file once at start and reports it where the cloud side and a
person look: retained on ``<topic_prefix>/<id>/system-update``, in the log, on the status
page and in ``/metrics``. Where the file does not exist (anywhere but the image, or an
image never updated) nothing is reported.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

log = logging.getLogger("ledge.update")

#: More than a record ever holds (the reason is cut at 400 characters): a bigger file
#: is not one.
MAX_BYTES = 4096
OUTCOMES = ("committed", "rolled-back")


@dataclass(frozen=True, slots=True)
class UpdateRecord:
    outcome: str  # "committed" or "rolled-back"
    slot: str  # the system slot the update went to
    previous: str  # the slot it came from
    at: str  # when it was settled (UTC, ISO 8601)
    reason: str

    @property
    def timestamp(self) -> float | None:
        """``at`` in seconds since the epoch (None when it is not a time)."""
        try:
            return datetime.fromisoformat(self.at.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None

    def payload(self) -> bytes:
        """The retained message's JSON."""
        body = asdict(self)
        body["from"] = body.pop("previous")
        return json.dumps(body, separators=(",", ":")).encode()

    def summary(self) -> str:
        if self.outcome == "committed":
            return f"system update to slot {self.slot} kept ({self.at}): {self.reason}"
        return (
            f"system update to slot {self.slot} rolled back to slot {self.previous} "
            f"({self.at}): {self.reason}"
        )


def read_record(path: str | None) -> UpdateRecord | None:
    """The record in ``path``; None when there is none. A file that is not a record is
    said in the log (with why) and treated as none."""
    if not path:
        return None
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("system update record %s cannot be read: %s", path, exc.strerror or exc)
        return None
    if len(data) > MAX_BYTES:
        log.warning("system update record %s is over %d bytes: not a record", path, MAX_BYTES)
        return None
    fields: dict[str, str] = {}
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            log.warning("system update record %s line %d: no key=value: %r", path, number, line)
            return None
        fields[key.strip()] = value.strip()
    missing = [k for k in ("outcome", "slot", "from") if not fields.get(k)]
    if missing:
        log.warning("system update record %s has no %s", path, ", ".join(missing))
        return None
    if fields["outcome"] not in OUTCOMES:
        log.warning(
            "system update record %s: outcome %r is not %s",
            path,
            fields["outcome"],
            " or ".join(OUTCOMES),
        )
        return None
    return UpdateRecord(
        fields["outcome"],
        fields["slot"],
        fields["from"],
        fields.get("at", ""),
        fields.get("reason", ""),
    )
