"""BTHome v2 at its edges, exactly: every refusal's reason, text and byte offset (what the
log line and the per-device counter show), the MAC carried in the advert (plain and
encrypted, where it, not the sender's address, is the nonce), the length boundaries,
and every kind of object as the sample it becomes (value and unit), events included.

Fixed bytes, written out from the format (bthome.io/format), so a wrong slice, offset,
unit or message fails every run, not one in a few property runs."""

from __future__ import annotations

import pytest

from drivers.parsers import Sample
from drivers.parsers.ble import bthome
from drivers.parsers.ble.base import Context, company_pattern, mac_bytes, precision
from drivers.parsers.ble.ccm import Cipher
from tests.support.adverts import refusal

ADDRESS = "A4:C1:38:00:00:01"
KEY = bytes.fromhex("231d39c1d7cc1ab1aee224cd096db932")
PLAIN = 0x40  # version 2, no flag
WITH_MAC = 0x42


def ctx(key: bytes | None = None, address: str = ADDRESS) -> Context:
    return Context(address, cipher=Cipher(key) if key else None)


@pytest.mark.parametrize(
    ("data", "key", "expected"),
    [
        (b"", None, ("short", "empty BTHome service data", 0)),
        (bytes([0x20, 0x01, 0x50]), None, ("unsupported", "BTHome version 1, only 2 is read", 0)),
        (bytes([0x60]), None, ("unsupported", "BTHome version 3, only 2 is read", 0)),
        # the MAC flag with five of its six bytes: where reading stopped is the end
        (
            bytes([WITH_MAC, 1, 2, 3, 4, 5]),
            None,
            ("short", "MAC flag set but fewer than 6 MAC bytes", 6),
        ),
        (
            bytes([0x41, 0x01, 0x50]) + bytes(8),
            None,
            ("no_key", "encrypted BTHome advert and no bindkey configured", 0),
        ),
        # counter (4) and MIC (4) need one byte of ciphertext before them
        (
            bytes([0x41]) + bytes(8),
            KEY,
            ("short", "encrypted BTHome advert shorter than its counter and MIC", 0),
        ),
        (
            bytes([0x43]) + bytes(6) + bytes(8),
            KEY,
            ("short", "encrypted BTHome advert shorter than its counter and MIC", 0),
        ),
        (
            bytes([0x41]) + bytes(9),
            KEY,
            ("wrong_key", "BTHome advert does not decrypt with the bindkey", 0),
        ),
        (
            bytes([PLAIN, 0x01, 0x50]),
            KEY,
            ("not_encrypted", "plain BTHome advert from a device with a bindkey", 0),
        ),
    ],
)
def test_each_refusal_names_its_reason_text_and_byte(
    data: bytes, key: bytes | None, expected: tuple[str, str, int]
) -> None:
    reason, detail, offset = expected
    assert refusal(lambda: bthome.decode(data, ctx(key))) == (reason, detail, offset)


BATTERY = [Sample("battery", 80, "%")]


@pytest.mark.parametrize(
    ("data", "expected", "before"),
    [
        # battery 80 %, then an id the table does not have: its offset in the advert
        (
            bytes([PLAIN, 0x01, 0x50, 0x30, 0x00]),
            ("unknown_object", "unknown BTHome object id 0x30", 3),
            BATTERY,
        ),
        (
            bytes([PLAIN, 0x01, 0x50, 0x53]),
            ("short", "object 0x53 lacks its length byte", 3),
            BATTERY,
        ),
        (bytes([PLAIN, 0x02, 0x01]), ("short", "object 0x02 needs 2 bytes, 1 left", 1), []),
        (
            bytes([PLAIN, 0x01, 0x50, 0x54, 0x03, 0xAA]),
            ("short", "object 0x54 needs 3 bytes, 1 left", 3),
            BATTERY,
        ),
        # a MAC first: offsets still count from the advert's first byte
        (
            bytes([WITH_MAC, 1, 2, 3, 4, 5, 6, 0x01, 0x50, 0x99]),
            ("unknown_object", "unknown BTHome object id 0x99", 9),
            BATTERY,
        ),
        # text that is not UTF-8: the offset of its first byte, and the objects after it read
        (
            bytes([PLAIN, 0x53, 0x02, 0xC3, 0x28, 0x01, 0x50]),
            ("invalid_value", "text object is not UTF-8", 3),
            BATTERY,
        ),
    ],
)
def test_an_object_that_cannot_be_read_keeps_what_came_before_and_says_where(
    data: bytes, expected: tuple[str, str, int], before: list[Sample]
) -> None:
    decoded = bthome.decode(data, ctx())
    assert decoded.problem is not None
    _, detail, offset = expected
    assert (decoded.problem.reason, decoded.problem.detail, decoded.problem.offset) == expected
    assert str(decoded.problem) == f"{detail} (byte {offset})"
    assert decoded.samples == before


def test_a_mac_in_the_advert_is_read_and_the_objects_start_after_it() -> None:
    advert_mac = mac_bytes("11:22:33:44:55:66")
    data = bthome.encode([(0x02, (-1234).to_bytes(2, "little", signed=True))], mac=advert_mac)
    # least significant byte first on the air
    assert data == bytes([WITH_MAC, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x02, 0x2E, 0xFB])
    decoded = bthome.decode(data, ctx())
    assert decoded.samples == [Sample("temperature", -12.34, "°C")] and decoded.problem is None
    # the flag and its six bytes, no object: nothing, and nothing wrong
    empty = bthome.decode(data[:7], ctx())
    assert empty.samples == [] and empty.problem is None


def test_an_encrypted_advert_with_its_mac_is_opened_with_that_mac_not_the_senders_address() -> None:
    """A device sending from a random address puts its own MAC in the advert: the nonce
    is that MAC. Opened with the address instead, it would not decrypt."""
    advert_mac = mac_bytes("11:22:33:44:55:66")
    plain = bthome.encode([(0x01, b"\x5a")], packet_id=7, mac=advert_mac)
    sealed = bthome.encrypt(plain, advert_mac, counter=0x01020304, key=KEY)
    assert sealed[0] == 0x43 and sealed[1:7] == advert_mac[::-1]
    assert sealed[-8:-4] == bytes([4, 3, 2, 1])  # the counter, little endian
    random_address = ctx(KEY, address="7E:00:00:00:00:01")
    decoded = bthome.decode(sealed, random_address)
    assert decoded.samples == [Sample("battery", 90, "%")]
    assert (decoded.packet_id, decoded.counter, decoded.problem) == (7, 0x01020304, None)
    # the same advert without the MAC flag is sealed with, and needs, the sender's address
    bare = bthome.encrypt(bthome.encode([(0x01, b"\x5a")]), mac_bytes(ADDRESS), 5, KEY)
    assert bthome.decode(bare, ctx(KEY)).samples == [Sample("battery", 90, "%")]
    assert refusal(lambda: bthome.decode(bare, random_address))[0] == "wrong_key"
    # one byte of ciphertext is enough to be read (counter and MIC after it)
    one = bthome.encrypt(bytes([PLAIN, 0x00]), mac_bytes(ADDRESS), 1, KEY)
    assert len(one) == 1 + 1 + 8
    # (offsets in what was decrypted: a packet id without its byte)
    problem = bthome.decode(one, ctx(KEY)).problem
    assert problem is not None
    assert (problem.reason, problem.detail, problem.offset) == (
        "short", "object 0x00 needs 1 bytes, 0 left", 0
    )  # fmt: skip


@pytest.mark.parametrize(
    ("objects", "samples", "events"),
    [
        (
            [(0x0F, b"\x01"), (0x10, b"\x00")],
            [Sample("generic", True), Sample("power_on", False)],
            set(),
        ),
        ([(0x3A, b"\x04")], [Sample("button", "long_press")], {"button"}),
        ([(0x3A, b"\x00")], [], set()),  # "no press": nothing to report
        (
            [(0x3A, b"\x01"), (0x3A, b"\x80")],
            [Sample("button_1", "press"), Sample("button_2", "hold_press")],
            {"button_1", "button_2"},
        ),
        (
            [(0x3C, b"\x02\x05")],
            [Sample("dimmer", "rotate_right"), Sample("dimmer_steps", 5)],
            {"dimmer", "dimmer_steps"},
        ),
        ([(0x3B, b"\x00\x02")], [Sample("remote_command", "toggle")], {"remote_command"}),
        # a name of two words, twice: each still an event
        (
            [(0x3B, b"\x00\x01"), (0x3B, b"\x00\x00")],
            [Sample("remote_command_1", "on"), Sample("remote_command_2", "off")],
            {"remote_command_1", "remote_command_2"},
        ),
        (
            [(0x3B, b"\x02\x01\xab\xcd")],
            [Sample("remote_command", "on"), Sample("remote_command_args", "abcd")],
            {"remote_command", "remote_command_args"},
        ),
        ([(0x53, b"\x02hi"), (0x53, b"\x00")], [Sample("text", "hi")], set()),
        ([(0x54, b"\x02\xbe\xef"), (0x54, b"\x00")], [Sample("raw", "beef")], set()),
        (
            [(0x50, (1_700_000_000).to_bytes(4, "little"))],
            [Sample("timestamp", "2023-11-14T22:13:20+00:00")],
            set(),
        ),
        ([(0xF0, b"\x01\x00")], [Sample("device_type_id", 1)], set()),
        ([(0xF1, b"\x04\x03\x02\x01")], [Sample("firmware_version", "1.2.3.4")], set()),
        ([(0xF2, b"\x03\x02\x01")], [Sample("firmware_version", "1.2.3")], set()),
        # a factor of one gives the integer; another, the value to its decimal places
        (
            [(0x09, b"\x07"), (0x0C, b"\xb8\x0b"), (0x3E, b"\x01\x00\x00\x80")],
            [Sample("count_1", 7), Sample("voltage", 3.0, "V"), Sample("count_2", 2**31 + 1)],
            set(),
        ),
        (
            [(0x2E, b"\x37"), (0x03, b"\x88\x13")],
            [Sample("humidity_1", 55, "%"), Sample("humidity_2", 50.0, "%")],
            set(),
        ),
    ],
)
def test_each_kind_of_object_becomes_its_sample(
    objects: list[tuple[int, bytes]], samples: list[Sample], events: set[str]
) -> None:
    decoded = bthome.decode(bthome.encode(objects), ctx())
    assert decoded.problem is None
    assert [(s.field, s.value, s.unit) for s in decoded.samples] == [
        (s.field, s.value, s.unit) for s in samples
    ]
    assert [type(s.value) for s in decoded.samples] == [type(s.value) for s in samples]
    assert decoded.events == frozenset(events)


def test_encode_writes_the_flags_it_is_given() -> None:
    assert bthome.encode([]) == bytes([PLAIN])
    assert bthome.encode([], trigger=True) == bytes([0x44])
    assert bthome.encode([(0x01, b"\x50")], packet_id=9) == bytes([PLAIN, 0x00, 9, 0x01, 0x50])
    with_mac = bthome.encode([], mac=bytes([1, 2, 3, 4, 5, 6]), trigger=True)
    assert with_mac == bytes([0x46, 6, 5, 4, 3, 2, 1])


def test_values_keep_the_decimal_places_of_their_factor_and_adverts_are_found_by_uuid() -> None:
    """The places come from each factor as the format writes it (0.35: one place, so
    float noise never shows); BTHome is claimed by its 16-bit service UUID 0xFCD2,
    little endian in the advert, at any position."""
    assert [precision(f) for f in (1, 0.1, 0.35, 0.01, 0.001, 0.000001)] == [0, 1, 1, 2, 3, 6]
    assert bthome.PLACES[0x58] == 1 and bthome.PLACES[0x62] == 6
    assert bthome.decode(bthome.encode([(0x58, b"\x03")]), ctx()).samples == [
        Sample("temperature", 1.0, "°C")  # 3 x 0.35 = 1.0499999999999998, at one place
    ]
    assert bthome.PATTERNS == ((0, 0x16, b"\xd2\xfc"),)
    assert company_pattern(0x0499) == (0, 0xFF, b"\x99\x04")
