"""Inkbird at its edges, exactly: each refusal's reason, text and byte offset, the
humidity and battery bounds, the IBS-P01B without humidity, the iBBQ probe counts and
unplugged probes, and which adverts the decoder claims. Fixed bytes from the format
(the reference decoder's, Bluetooth-Devices/inkbird-ble)."""

from __future__ import annotations

import pytest

from drivers.parsers.ble import inkbird
from drivers.parsers.ble.base import Context
from tests.support.adverts import refusal

ADDRESS = "49:42:07:00:00:01"


def ctx(name: str, company_id: int = 0) -> Context:
    return Context(ADDRESS, name=name, company_id=company_id)


def ibs(humidity: int, battery: int) -> bytes:
    return humidity.to_bytes(2, "little") + b"\x00\x00\x00" + bytes([battery]) + b"\x08"


def samples(data: bytes, context: Context) -> list[tuple[str, object, str]]:
    decoded = inkbird.decode(data, context)
    assert decoded.problem is None
    return [(s.field, s.value, s.unit) for s in decoded.samples]


def test_an_ibs_th_reading_its_temperature_in_the_company_id() -> None:
    # -5.12 °C (int16 LE where the company id belongs), 45.67 %, battery 87 %
    company = (-512).to_bytes(2, "little", signed=True)
    context = ctx("sps", int.from_bytes(company, "little"))
    assert samples(ibs(4567, 87), context) == [
        ("temperature", -5.12, "°C"),
        ("humidity", 45.67, "%"),
        ("battery", 87, "%"),
    ]
    # bounds: 100.00 % and 100 % are readings; one more is a refusal that says so
    assert samples(ibs(10000, 100), ctx("SPS", 2500))[1:] == [
        ("humidity", 100.0, "%"),
        ("battery", 100, "%"),
    ]


def test_an_ibs_p01b_sends_no_humidity_and_an_ibs_th_sends_zero() -> None:
    for none in (0, 0xFFFF):
        assert samples(ibs(none, 50), ctx("tps", 2000)) == [
            ("temperature", 20.0, "°C"),
            ("battery", 50, "%"),
        ]
    assert ("humidity", 0.0, "%") in samples(ibs(0, 50), ctx("sps", 2000))
    assert ("humidity", 12.34, "%") in samples(ibs(1234, 50), ctx("tps", 2000))


@pytest.mark.parametrize(
    ("data", "name", "expected"),
    [
        (ibs(4567, 87)[:6], "sps", ("malformed", "6 bytes, IBS-TH sends 7", 6)),
        (ibs(4567, 87) + b"\x00", "tps", ("malformed", "8 bytes, IBS-TH sends 7", 8)),
        (ibs(10001, 87), "sps", ("invalid_value", "humidity 100.01 %", 0)),
        (ibs(4567, 101), "sps", ("invalid_value", "battery 101 %", 5)),
        (bytes(11), "iBBQ", ("malformed", "11 bytes from an iBBQ", 11)),
        (bytes(7), "ThermoX", ("unsupported", "name 'ThermoX' is no Inkbird model Ledge reads", 0)),
    ],
)
def test_each_refusal_names_its_reason_text_and_byte(
    data: bytes, name: str, expected: tuple[str, str, int]
) -> None:
    assert refusal(lambda: inkbird.decode(data, ctx(name, 2000))) == expected


def probes(*values: int) -> bytes:
    return bytes(8) + b"".join(v.to_bytes(2, "little", signed=True) for v in values)


@pytest.mark.parametrize("count", [1, 2, 4, 6])
def test_an_ibbq_reads_each_probe_and_leaves_out_the_unplugged(count: int) -> None:
    values = [215, -35, -1, 1000, 0, -1][:count]
    data = probes(*values)
    assert len(data) in inkbird.BBQ_PROBES and inkbird.BBQ_PROBES[len(data)] == count
    want = [(f"temperature_probe_{i + 1}", v / 10, "°C") for i, v in enumerate(values) if v != -1]
    assert samples(data, ctx("xBBQ")) == want
    assert samples(data, ctx("iBBQ")) == want
    assert inkbird.accepts(data, ctx("xbbq")) and inkbird.accepts(data, ctx("iBBQ"))


def test_what_the_decoder_claims() -> None:
    assert inkbird.accepts(ibs(1, 1), ctx("sps")) and inkbird.accepts(ibs(1, 1), ctx("TPS"))
    assert not inkbird.accepts(ibs(1, 1) + b"\x00", ctx("sps"))  # a hygrometer sends 7
    assert not inkbird.accepts(ibs(1, 1), ctx("other"))  # 7 bytes from anyone else
    assert not inkbird.accepts(probes(1), ctx("sps"))
    assert not inkbird.accepts(probes(1), ctx("other"))  # a probe length, not an iBBQ
    assert not inkbird.accepts(probes(1)[:-1], ctx("iBBQ"))
    assert not inkbird.accepts(probes(1), ctx("bbq"))  # neither iBBQ nor xBBQ
