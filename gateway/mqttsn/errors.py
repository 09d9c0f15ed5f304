"""The gateway's two errors, raised anywhere in a handler and answered in one place.

The dispatcher (``Gateway.received``) turns them into the device's answer; a handler
raises and is done. Answers that carry a return code in the acknowledgement of a
request (REGACK, PUBACK, SUBACK, WILLTOPICRESP, WILLMSGRESP) are not errors: the
handler of that request writes them, as the broker's SUBACK reason codes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.mqttsn.context import SnClient


class NotConnected(Exception):
    """A message that needs a connection, from someone without one. Answered with
    DISCONNECT, which tells a device to connect (again: e.g. after this gateway
    restarted); counted in ``SnStats.not_connected``."""


class Refused(Exception):
    """A CONNECT refused, with its return code (section 5.3.10).

    Answered with CONNACK ``return_code``, counted in ``clients/refused`` and logged
    (``why``) at a bounded rate per source. ``ending`` is the client whose connection
    attempt the refusal ends (in its Will prompts, or its Will refused at the
    CONNACK): it is forgotten. Without it nobody's session is touched -- whoever
    holds the address keeps its own.
    """

    def __init__(
        self, return_code: int, client_id: str, why: str, ending: SnClient | None = None
    ) -> None:
        super().__init__(why)
        self.return_code = return_code
        self.client_id = client_id
        self.why = why
        self.ending = ending
