"""RuuviTag data format 5, by the vectors of its specification
(ruuvi-sensor-protocols, dataformat_05.md: valid, maximum, minimum, and every field
"not available"), with each value's unit, the sequence and the MAC identity; and each
refusal's reason, text and byte offset."""

from __future__ import annotations

import pytest

from drivers.parsers.ble import ruuvi
from drivers.parsers.ble.base import Context
from tests.support.adverts import refusal

ADDRESS = "CB:B8:33:4C:88:4F"
G = 9.80665 / 1000  # m/s² per mG


def decoded(hex_data: str) -> tuple[list[tuple[str, object, str]], int | None, str | None]:
    d = ruuvi.decode(bytes.fromhex(hex_data), Context(ADDRESS, company_id=ruuvi.COMPANY_ID))
    assert d.problem is None
    return [(s.field, s.value, s.unit) for s in d.samples], d.packet_id, d.identity


def test_the_specifications_valid_vector() -> None:
    samples, seq, identity = decoded("0512FC5394C37C0004FFFC040CAC364200CDCBB8334C884F")
    assert samples == [
        ("temperature", 24.3, "°C"),
        ("humidity", 53.49, "%"),
        ("pressure", 1000.44, "hPa"),
        ("acceleration_x", round(4 * G, 3), "m/s²"),
        ("acceleration_y", round(-4 * G, 3), "m/s²"),
        ("acceleration_z", round(1036 * G, 3), "m/s²"),
        ("voltage", 2.977, "V"),
        ("tx_power", 4, "dBm"),
        ("movement_counter", 66, ""),
    ]
    assert (seq, identity) == (205, "CB:B8:33:4C:88:4F")


def test_encode_writes_the_specifications_valid_vector() -> None:
    """``encode`` (the fake RuuviTags of the gateway tests) packs battery and tx power
    into the power field as the specification does (11 bits of mV above 1600, then 5
    bits of 2 dBm steps above -40): the valid vector's values give its bytes, and
    other values come back from ``decode`` as they went in."""
    mac = bytes.fromhex("CBB8334C884F")
    sent = ruuvi.encode(mac, 24.3, 53.49, 100044, (4, -4, 1036), 2977, 4, 66, 205)
    assert sent == bytes.fromhex("0512FC5394C37C0004FFFC040CAC364200CDCBB8334C884F")
    for mv, power in ((1600, -40), (2500, -8), (3646, 20)):
        data = ruuvi.encode(mac, 20.0, 50.0, 101325, (0, 0, 1000), mv, power, 1, 2)
        got = {field: (value, unit) for field, value, unit in decoded(data.hex())[0]}
        assert (got["voltage"], got["tx_power"]) == ((mv / 1000, "V"), (power, "dBm"))


def test_the_specifications_maximum_and_minimum_vectors() -> None:
    samples, seq, _ = decoded("057FFFFFFEFFFE7FFF7FFF7FFFFFDEFEFFFECBB8334C884F")
    assert samples == [
        ("temperature", 163.835, "°C"),
        ("humidity", 163.835, "%"),
        ("pressure", 1155.34, "hPa"),
        ("acceleration_x", round(32767 * G, 3), "m/s²"),
        ("acceleration_y", round(32767 * G, 3), "m/s²"),
        ("acceleration_z", round(32767 * G, 3), "m/s²"),
        ("voltage", 3.646, "V"),
        ("tx_power", 20, "dBm"),
        ("movement_counter", 254, ""),
    ]
    assert seq == 65534
    samples, seq, _ = decoded("058001000000008001800180010000000000CBB8334C884F")
    assert samples == [
        ("temperature", -163.835, "°C"),
        ("humidity", 0.0, "%"),
        ("pressure", 500.0, "hPa"),
        ("acceleration_x", round(-32767 * G, 3), "m/s²"),
        ("acceleration_y", round(-32767 * G, 3), "m/s²"),
        ("acceleration_z", round(-32767 * G, 3), "m/s²"),
        ("voltage", 1.6, "V"),
        ("tx_power", -40, "dBm"),
        ("movement_counter", 0, ""),
    ]
    assert seq == 0


def test_every_field_not_available_leaves_it_out() -> None:
    samples, seq, identity = decoded("058000FFFFFFFF800080008000FFFFFFFFFFFFFFFFFFFFFF")
    assert (samples, seq, identity) == ([], None, None)
    # the last axis not available: no acceleration at all (the three go together)
    samples, _, _ = decoded("0512FC5394C37C0004FFFC8000AC364200CDCBB8334C884F")
    assert not [s for s in samples if s[0].startswith("acceleration")]
    assert len(samples) == 6


def test_longer_data_is_read_up_to_its_24_bytes() -> None:
    samples, seq, identity = decoded("0512FC5394C37C0004FFFC040CAC364200CDCBB8334C884F" + "00")
    assert (len(samples), seq, identity) == (9, 205, "CB:B8:33:4C:88:4F")


@pytest.mark.parametrize(
    ("hex_data", "expected"),
    [
        ("", ("short", "empty Ruuvi manufacturer data", 0)),
        ("0312FC5394C37C", ("unsupported", "Ruuvi data format 3, only 5 is read", 0)),
        (
            "0512FC5394C37C0004FFFC040CAC364200CDCBB8334C88",
            ("short", "23 bytes, data format 5 has 24", 23),
        ),
    ],
)
def test_each_refusal_names_its_reason_text_and_byte(
    hex_data: str, expected: tuple[str, str, int]
) -> None:
    assert refusal(lambda: ruuvi.decode(bytes.fromhex(hex_data), Context(ADDRESS))) == expected
    data = bytes.fromhex(hex_data)
    assert not ruuvi.accepts(data, Context(ADDRESS))
