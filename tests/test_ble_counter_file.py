"""The replay counters' file, exactly: its bytes as written (a person reading it sees a
device per entry), the counter's range at both ends (a 32-bit counter: 0 and 2**32 - 1
are counters, -1 and 2**32 are not), each refusal's text, the key fingerprint's length,
and the file replaced whole with nothing left beside it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from drivers.ble.counters import CounterFileError, decode, encode, fingerprint, load, save


def test_the_file_as_written() -> None:
    data = encode(
        {"B0:00:00:00:00:02": ("bbbbbbbb", 2**32 - 1), "A0:00:00:00:00:01": ("aaaaaaaa", 0)}
    )
    assert data == (
        b'{\n "version": 1,\n "devices": {\n  "A0:00:00:00:00:01": {\n   "key": "aaaaaaaa",\n'
        b'   "counter": 0\n  },\n  "B0:00:00:00:00:02": {\n   "key": "bbbbbbbb",\n'
        b'   "counter": 4294967295\n  }\n }\n}\n'
    )
    assert decode(data) == {
        "A0:00:00:00:00:01": ("aaaaaaaa", 0),
        "B0:00:00:00:00:02": ("bbbbbbbb", 2**32 - 1),
    }


def test_a_key_is_kept_as_eight_hex_digits_of_its_sha256() -> None:
    key = bytes(range(16))
    assert fingerprint(key) == hashlib.sha256(key).hexdigest()[:8] and len(fingerprint(key)) == 8
    assert fingerprint(key) != fingerprint(bytes(16))


def entry(counter: object) -> bytes:
    return (
        b'{"version": 1, "devices": {"a0:00:00:00:00:01": {"key": "k", "counter": %s}}}'
        % str(counter).encode()
    )


def test_the_counter_is_a_32_bit_number_and_addresses_are_upper_case() -> None:
    assert decode(entry(0)) == {"A0:00:00:00:00:01": ("k", 0)}
    assert decode(entry(2**32 - 1)) == {"A0:00:00:00:00:01": ("k", 2**32 - 1)}
    for bad in (-1, 2**32, 2**33, "1", 1.0, "true"):
        with pytest.raises(CounterFileError) as caught:
            decode(entry(bad if bad != "1" else '"1"'))
        assert (
            str(caught.value) == "device 'a0:00:00:00:00:01': not a key fingerprint and a counter"
        )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[1]", "not a version 1 counters file"),
        (b'{"version": 2, "devices": {}}', "not a version 1 counters file"),
        (b'{"version": 1}', "no 'devices' table"),
        (b'{"version": 1, "devices": []}', "no 'devices' table"),
        (b'{"version": 1, "devices": {"x": 5}}', "device 'x': not a key fingerprint and a counter"),
    ],
)
def test_each_refusal_says_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(CounterFileError) as caught:
        decode(data)
    assert str(caught.value) == message
    with pytest.raises(CounterFileError, match=r"^not JSON: "):
        decode(b"{")


def test_saved_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ble-counters.json"
    assert load(path) == {}
    counters = {"A0:00:00:00:00:01": ("aaaaaaaa", 7)}
    save(path, counters)
    save(path, {**counters, "B0:00:00:00:00:02": ("bbbbbbbb", 9)})
    assert load(path) == {**counters, "B0:00:00:00:00:02": ("bbbbbbbb", 9)}
    assert sorted(os.listdir(tmp_path)) == ["ble-counters.json"]  # nothing beside it
    assert path.read_bytes() == encode(load(path))
