"""What an advert decoder's refusal says, for the decoder tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from drivers.parsers.ble.base import AdvertError


def refusal(decode: Callable[[], object]) -> tuple[str, str, int]:
    """The ``AdvertError`` that ``decode()`` raises, as (reason, detail, byte offset).

    Its text, what the log line shows, is checked on the way: the detail, then the
    offset in bytes."""
    with pytest.raises(AdvertError) as caught:
        decode()
    e = caught.value
    assert str(e) == f"{e.detail} (byte {e.offset})"
    return e.reason, e.detail, e.offset
