"""The pvvx and ATC1441 custom formats, byte by byte from their description
(github.com/pvvx/ATC_MiThermometer, "Custom format"): each value with its unit, the
counter, the MAC identity in each format's byte order, and each refusal (the encrypted
lengths said apart from a wrong one) with its reason, text and byte offset."""

from __future__ import annotations

import pytest

from drivers.parsers.ble import pvvx
from drivers.parsers.ble.base import Context, mac_bytes
from tests.support.adverts import refusal

ADDRESS = "A4:C1:38:12:34:56"
CTX = Context(ADDRESS)


def read(decoded: object) -> list[tuple[str, object, str]]:
    return [(s.field, s.value, s.unit) for s in decoded.samples]  # type: ignore[attr-defined]


def test_a_pvvx_advert() -> None:
    # MAC least significant first; -5.43 °C, 45.67 %, 2,987 mV, 76 %, counter 201, flags 5
    data = bytes.fromhex("56341238c1a4e1fdd711ab0b4cc905")
    assert len(data) == pvvx.PVVX_LENGTH and pvvx.accepts_pvvx(data, CTX)
    d = pvvx.decode_pvvx(data, CTX)
    assert read(d) == [
        ("temperature", -5.43, "°C"),
        ("humidity", 45.67, "%"),
        ("battery", 76, "%"),
        ("voltage", 2.987, "V"),
    ]
    assert (d.packet_id, d.identity, d.problem) == (201, ADDRESS, None)
    assert pvvx.encode_pvvx(mac_bytes(ADDRESS), -5.43, 45.67, 2987, 76, 201) == data[:-1] + b"\0"


def test_an_atc1441_advert() -> None:
    # MAC most significant first; -12.3 °C, 56 %, 91 %, 3,012 mV, frame 17
    data = bytes.fromhex("a4c138123456ff85385b0bc411")
    assert len(data) == pvvx.ATC_LENGTH and pvvx.accepts_atc(data, CTX)
    d = pvvx.decode_atc(data, CTX)
    assert read(d) == [
        ("temperature", -12.3, "°C"),
        ("humidity", 56, "%"),
        ("battery", 91, "%"),
        ("voltage", 3.012, "V"),
    ]
    assert (d.packet_id, d.identity, d.problem) == (17, ADDRESS, None)
    assert pvvx.encode_atc(mac_bytes(ADDRESS), -12.3, 56, 91, 3012, 17) == data


def test_an_atc1441_frame_counter_uses_its_whole_byte() -> None:
    """The ATC1441 frame counter is a uint8 (as are humidity and battery, and the mV a
    uint16): ``encode_atc`` (the fake thermometers of the gateway tests) writes counters
    above 127 too, as the firmware sends them, and they come back; the README's frame
    below zero with counter 200, byte for byte."""
    mac = mac_bytes("A4:C1:38:2B:3C:4D")
    sent = pvvx.encode_atc(mac, -5.5, 91, 60, 2800, 200)
    assert sent == bytes.fromhex("a4c1382b3c4dffc95b3c0af0c8")
    for count in (127, 128, 200, 255):
        d = pvvx.decode_atc(pvvx.encode_atc(mac, 21.5, 99, 100, 3300, count), CTX)
        assert read(d) == [
            ("temperature", 21.5, "°C"),
            ("humidity", 99, "%"),
            ("battery", 100, "%"),
            ("voltage", 3.3, "V"),
        ]
        assert d.packet_id == count


@pytest.mark.parametrize(
    ("decode", "length", "expected"),
    [
        (
            pvvx.decode_pvvx,
            8,
            ("unsupported", "encrypted pvvx/ATC custom format (send BTHome instead)", 0),
        ),
        (
            pvvx.decode_atc,
            11,
            ("unsupported", "encrypted pvvx/ATC custom format (send BTHome instead)", 0),
        ),
        (pvvx.decode_pvvx, 14, ("malformed", "14 bytes, the format has 15", 14)),
        (pvvx.decode_pvvx, 16, ("malformed", "16 bytes, the format has 15", 16)),
        (pvvx.decode_atc, 12, ("malformed", "12 bytes, the format has 13", 12)),
        (pvvx.decode_atc, 15, ("malformed", "15 bytes, the format has 13", 15)),
    ],
)
def test_each_refusal_names_its_reason_text_and_byte(
    decode: object, length: int, expected: tuple[str, str, int]
) -> None:
    assert refusal(lambda: decode(bytes(length), CTX)) == expected  # type: ignore[operator]


def test_each_format_claims_its_own_length_only() -> None:
    for n in range(0, 20):
        assert pvvx.accepts_pvvx(bytes(n), CTX) == (n == 15)
        assert pvvx.accepts_atc(bytes(n), CTX) == (n == 13)
    assert pvvx.PATTERNS == ((0, 0x16, b"\x1a\x18"),)
