"""MiBeacon's header at its edges, exactly: the frame control word (version in its top
four bits, the mesh, MAC, capability, objects and encryption flags), a MAC and a
capability (with its I/O byte) before the objects, a frame without objects, each
refusal's reason, text and byte offset, and the MAC in the frame as the nonce of an
encrypted one. Frames written out byte by byte from the format."""

from __future__ import annotations

import struct

import pytest

from drivers.parsers.ble import mibeacon
from drivers.parsers.ble.base import Context, mac_bytes
from drivers.parsers.ble.ccm import Cipher
from tests.support.adverts import refusal

ADDRESS = "A4:C1:38:00:00:01"
KEY = bytes.fromhex("814aac74c4f17b6c1581e1ab87816b99")
PRODUCT = b"\x5b\x05"  # 0x055b, little endian
FRAME = 0x2A
TEMPERATURE = b"\x04\x10\x02" + (-123).to_bytes(2, "little", signed=True)  # -12.3 °C


def ctx(key: bytes | None = None, address: str = ADDRESS) -> Context:
    return Context(address, cipher=Cipher(key) if key else None)


def frame(flags: int, version: int = 5, rest: bytes = b"") -> bytes:
    # frame control, little endian: flags in the low byte, the version in the top nibble
    return bytes([flags, version << 4]) + PRODUCT + bytes([FRAME]) + rest


def values(data: bytes, context: Context) -> list[tuple[str, object, str]]:
    decoded = mibeacon.decode(data, context)
    assert decoded.problem is None
    assert decoded.packet_id == FRAME
    return [(s.field, s.value, s.unit) for s in decoded.samples]


MAC_LSB = bytes([6, 5, 4, 3, 2, 1])


def test_a_frame_with_mac_and_capabilities_reads_its_objects_after_them() -> None:
    assert values(frame(0x40, rest=TEMPERATURE), ctx()) == [("temperature", -12.3, "°C")]
    assert values(frame(0x50, rest=MAC_LSB + TEMPERATURE), ctx()) == [("temperature", -12.3, "°C")]
    # a capability byte; with bit 0x20 set, an I/O capability byte follows it
    assert values(frame(0x60, rest=b"\x08" + TEMPERATURE), ctx()) == [("temperature", -12.3, "°C")]
    assert values(frame(0x60, rest=b"\x09" + TEMPERATURE), ctx()) == [
        ("temperature", -12.3, "°C")
    ]  # (bit 0x01 is no I/O byte)
    assert values(frame(0x60, rest=b"\x28\x01"), ctx()) == []  # the I/O byte, last
    with_io = frame(0x70, rest=MAC_LSB + b"\x28\x01" + TEMPERATURE)
    assert values(with_io, ctx()) == [("temperature", -12.3, "°C")]
    # versions 2 to 15 are read
    for version in (2, 3, 15):
        assert values(frame(0x40, version, TEMPERATURE), ctx()) == [("temperature", -12.3, "°C")]


def test_a_frame_without_objects_is_a_beacon_with_its_frame_counter() -> None:
    for data in (frame(0x00), frame(0x10, rest=MAC_LSB), frame(0x30, rest=MAC_LSB + b"\x00")):
        decoded = mibeacon.decode(data, ctx())
        assert (decoded.samples, decoded.packet_id, decoded.counter) == ([], FRAME, None)
    # (an objects frame with none: nothing either, and nothing wrong)
    assert values(frame(0x40), ctx()) == []


@pytest.mark.parametrize(
    ("data", "key", "expected"),
    [
        (frame(0x40)[:4], None, ("short", "4 bytes, a MiBeacon header has 5", 4)),
        (frame(0xC0, rest=TEMPERATURE), None, ("unsupported", "MiBeacon mesh frame", 0)),
        (frame(0x40, 1, TEMPERATURE), None, ("unsupported", "MiBeacon version 1", 0)),
        (frame(0x40, 0, TEMPERATURE), None, ("unsupported", "MiBeacon version 0", 0)),
        (frame(0x50, rest=MAC_LSB[:5]), None, ("short", "MAC flag set but the MAC is cut off", 10)),
        (
            frame(0x70, rest=MAC_LSB),
            None,
            ("short", "capability flag set but no capability byte", 11),
        ),
        (frame(0x60, rest=b"\x20"), None, ("short", "I/O capability byte is cut off", 6)),
        (
            frame(0x48, 3, TEMPERATURE),
            KEY,
            ("unsupported", "legacy MiBeacon v3 encryption", 0),
        ),
        (
            frame(0x48, 4, bytes(8)),
            None,
            ("no_key", "encrypted MiBeacon advert and no bindkey configured", 0),
        ),
        # counter (3) and MIC (4) and at least one byte: seven bytes are too few
        (
            frame(0x48, 5, bytes(7)),
            KEY,
            ("short", "encrypted MiBeacon advert shorter than counter and MIC", 12),
        ),
        (
            frame(0x58, 5, MAC_LSB + bytes(7)),
            KEY,
            ("short", "encrypted MiBeacon advert shorter than counter and MIC", 18),
        ),
        (
            frame(0x48, 5, bytes(8)),
            KEY,
            ("wrong_key", "MiBeacon advert does not decrypt with the bindkey", 0),
        ),
        (
            frame(0x40, rest=TEMPERATURE),
            KEY,
            ("not_encrypted", "plain MiBeacon advert from a device with a bindkey", 0),
        ),
    ],
)
def test_each_refusal_names_its_reason_text_and_byte(
    data: bytes, key: bytes | None, expected: tuple[str, str, int]
) -> None:
    assert refusal(lambda: mibeacon.decode(data, ctx(key))) == expected


def test_an_encrypted_frame_with_its_mac_is_opened_with_that_mac() -> None:
    """The nonce is the MAC the frame carries (least significant byte first), the product
    id, the frame counter and the counter's three more bytes; the counter the decoder
    reports is all four."""
    sender = mac_bytes("C4:7C:8D:00:00:07")
    plain = mibeacon.encode(0x055B, FRAME, [(0x1004, b"\x85\xff")], mac=sender)
    assert plain == frame(0x50, rest=sender[::-1] + TEMPERATURE)
    sealed = mibeacon.encrypt(plain, sender, 0x010203, KEY)
    assert sealed[:2] == bytes([0x58, 0x50]) and sealed[5:11] == sender[::-1]
    decoded = mibeacon.decode(sealed, ctx(KEY, address="7E:00:00:00:00:01"))
    assert [(s.field, s.value) for s in decoded.samples] == [("temperature", -12.3)]
    assert (decoded.packet_id, decoded.counter, decoded.problem) == (FRAME, 0x0102032A, None)
    # without the MAC in the frame, the sender's address is the nonce
    bare = mibeacon.encrypt(mibeacon.encode(0x055B, FRAME, [(0x1004, b"\x85\xff")]), sender, 1, KEY)
    assert [s.value for s in mibeacon.decode(bare, ctx(KEY, "C4:7C:8D:00:00:07")).samples] == [
        -12.3
    ]
    assert refusal(lambda: mibeacon.decode(bare, ctx(KEY)))[0] == "wrong_key"


def test_an_encrypted_frame_with_a_capability_byte_is_opened() -> None:
    """The capability byte stays in the clear between the header (and MAC) and the sealed
    objects: a frame ``encrypt`` seals with one decrypts to its values, with or without
    the MAC before it (else every test of a sensor sending one is a wrong_key)."""
    sender = mac_bytes(ADDRESS)
    for mac, clear in ((sender, sender[::-1] + b"\x08"), (None, b"\x08")):
        plain = mibeacon.encode(0x055B, FRAME, [(0x1004, b"\x85\xff")], mac=mac, capability=8)
        sealed = mibeacon.encrypt(plain, sender, 0x000102, KEY)
        assert sealed[5 : 5 + len(clear)] == clear
        decoded = mibeacon.decode(sealed, ctx(KEY))
        assert [(s.field, s.value, s.unit) for s in decoded.samples] == [
            ("temperature", -12.3, "°C")
        ]
        assert (decoded.packet_id, decoded.counter, decoded.problem) == (FRAME, 0x01022A, None)


def test_encode_writes_its_flags_and_version() -> None:
    assert mibeacon.encode(0x055B, FRAME, []) == frame(0x40)
    assert mibeacon.encode(0x055B, FRAME, [], version=3) == frame(0x40, 3)
    assert mibeacon.encode(0x055B, FRAME, [], capability=0x08) == frame(0x60, rest=b"\x08")


def obj(kind: int, value: bytes) -> bytes:
    return kind.to_bytes(2, "little") + bytes([len(value)]) + value


def test_each_object_with_its_unit_and_what_cannot_be_read_said_where() -> None:
    def decoded(
        objects: bytes, product: bytes = PRODUCT
    ) -> tuple[list[tuple[str, object, str]], object]:
        data = bytes([0x40, 0x50]) + product + bytes([FRAME]) + objects
        d = mibeacon.decode(data, ctx())
        p = d.problem
        return [(s.field, s.value, s.unit) for s in d.samples], (
            None if p is None else (p.reason, p.detail, p.offset)
        )

    both = obj(0x100D, (215).to_bytes(2, "little", signed=True) + (455).to_bytes(2, "little"))
    assert decoded(both + obj(0x100A, b"\x5a")) == (
        [("temperature", 21.5, "°C"), ("humidity", 45.5, "%"), ("battery", 90, "%")],
        None,
    )
    # humidity in tenths, or whole percent for the two products that send it so
    assert decoded(obj(0x1006, (455).to_bytes(2, "little")), b"\x00\x01")[0] == [
        ("humidity", 45.5, "%")
    ]
    assert decoded(obj(0x1006, (455).to_bytes(2, "little")), PRODUCT)[0] == [("humidity", 45, "%")]
    # an unknown object is said, and the objects after it are still read
    assert decoded(obj(0x7777, b"\x01") + obj(0x100A, b"\x5a")) == (
        [("battery", 90, "%")],
        ("unknown_object", "unknown MiBeacon object 0x7777", 5),
    )
    assert decoded(obj(0x1004, b"\x01")) == (
        [],
        ("malformed", "object 0x1004 has 1 bytes, not 2", 5),
    )
    assert decoded(obj(0x100A, b"\x5a") + b"\x04\x10\x05\x01") == (
        [("battery", 90, "%")],
        ("short", "object 0x1004 needs 5 bytes, 1 left", 9),
    )
    # an object of any length with none: said, not read from the next object's bytes
    assert decoded(obj(0x100A, b"") + obj(0x1004, b"\x01\x00")) == (
        [("temperature", 0.1, "°C")],
        ("malformed", "object 0x100a has no value", 5),
    )
    assert decoded(obj(0x4803, b""))[1] == ("malformed", "object 0x4803 has no value", 5)
    assert decoded(obj(0x100A, b"\x5a") + b"\x04\x10") == (
        [("battery", 90, "%")],
        ("short", "2 stray bytes after the objects", 9),
    )


def test_light_formaldehyde_and_float_humidity_each_in_its_unit() -> None:
    """Illuminance is 24 bits of lux (a plant sensor reads up to 100,000 lx in the sun),
    formaldehyde hundredths of mg/m³, and 0x4C08 humidity a float32 % (as xiaomi-ble
    reads them); each read from its own object, after the others."""
    objects = (
        obj(0x1007, (100_000).to_bytes(3, "little"))
        + obj(0x1010, (123).to_bytes(2, "little"))
        + obj(0x4C08, struct.pack("<f", 45.5))
    )
    assert values(frame(0x40, rest=objects), ctx()) == [
        ("illuminance", 100_000, "lx"),
        ("formaldehyde", 1.23, "mg/m³"),
        ("humidity", 45.5, "%"),
    ]
