"""One device's advert stream through ``DeviceDecoder``, at its edges: manufacturer data
of a company (Ruuvi) and of any company (Inkbird), pinned or recognised; an element
whose bytes did not change is a repeat; a packet id within the window (and not at its
end) is a repeat; the first MIC failure is a retry and keeps its text and byte; a
replayed counter is refused with the words the log shows. Pure: time is an argument."""

from __future__ import annotations

from drivers.ble.tracker import PACKET_WINDOW, DeviceDecoder, format_named, plan
from drivers.parsers.ble import FORMATS, bthome, govee, inkbird, ruuvi
from drivers.parsers.ble.base import Context, mac_bytes
from drivers.parsers.ble.ccm import Cipher

ADDRESS = "CB:B8:33:4C:88:4F"
RUUVI = bytes.fromhex("0512FC5394C37C0004FFFC040CAC364200CDCBB8334C884F")
KEY = bytes.fromhex("231d39c1d7cc1ab1aee224cd096db932")


def test_a_companys_manufacturer_data_pinned_or_recognised() -> None:
    for fmt in (FORMATS["ruuvi"], None):
        device = DeviceDecoder(Context(ADDRESS), fmt)
        assert device.pinned is (fmt is not None)
        # another company's data beside it is not Ruuvi's
        out = device.feed({}, {0x0001: b"\x01\x02", ruuvi.COMPANY_ID: RUUVI}, "Ruuvi 884F", 0.0)
        assert out is not None and out.problems == [] and out.repeats == 0
        assert [s.field for s in out.samples][:2] == ["temperature", "humidity"]
        assert out.identity == "CB:B8:33:4C:88:4F" and not out.authenticated
        assert device.format is FORMATS["ruuvi"]
        # the same bytes again (BlueZ merges properties: an RSSI change repeats them)
        again = device.feed({}, {ruuvi.COMPANY_ID: RUUVI}, "Ruuvi 884F", 1.0)
        assert again is not None and (again.samples, again.repeats) == ([], 1)
        # nothing of its format: None
        assert device.feed({}, {0x0001: b"\x01"}, "Ruuvi 884F", 2.0) is None
    assert plan(FORMATS["ruuvi"])[0][:2] == (1, ruuvi.COMPANY_ID)
    assert plan(FORMATS["inkbird"])[0][:2] == (2, -1)
    assert format_named("auto") is None and format_named("ruuvi") is FORMATS["ruuvi"]


def test_any_companys_manufacturer_data_is_read_with_that_company_id() -> None:
    """Inkbird's temperature stands where the company id does: each company id of the
    advert is handed to the decoder as the context's."""
    device = DeviceDecoder(Context(ADDRESS), FORMATS["inkbird"])
    data = (4567).to_bytes(2, "little") + b"\x00\x00\x00\x57\x08"
    out = device.feed({}, {2500: data}, "sps", 0.0)
    assert out is not None and out.problems == []
    assert [(s.field, s.value) for s in out.samples] == [
        ("temperature", 25.0), ("humidity", 45.67), ("battery", 87)
    ]  # fmt: skip
    assert inkbird.accepts(data, Context(ADDRESS, name="sps"))


def test_each_company_of_a_format_is_looked_at_and_each_repeat_counted() -> None:
    """Govee speaks under two company ids: data under the second alone is read (the
    first missing does not end the look), and both elements unchanged are two repeats."""
    device = DeviceDecoder(Context(ADDRESS), FORMATS["govee"])
    h5179 = bytes(4) + (2150).to_bytes(2, "little") + (4500).to_bytes(2, "little") + b"\x5a"
    out = device.feed({}, {0x8801: h5179}, "GVH5179", 0.0)
    assert out is not None and [(s.field, s.value) for s in out.samples] == [
        ("temperature", 21.5), ("humidity", 45.0), ("battery", 90)
    ]  # fmt: skip
    both = {0xEC88: govee.encode_h5075(20.0, 50.0, 80), 0x8801: h5179}
    device.feed({}, both, "GVH5179", 1.0)
    again = device.feed({}, both, "GVH5179", 2.0)
    assert again is not None and (again.samples, again.repeats) == ([], 2)


def bthome_packet(packet_id: int, battery: int) -> dict[str, bytes]:
    return {bthome.UUID: bthome.encode([(0x01, bytes([battery]))], packet_id=packet_id)}


def test_a_packet_id_repeats_within_its_window_only() -> None:
    device = DeviceDecoder(Context(ADDRESS), FORMATS["bthome"])
    first = device.feed(bthome_packet(5, 80), {}, "", 100.0)
    assert first is not None and len(first.samples) == 1
    # the same packet id with other bytes (another copy of the packet) within the window
    inside = device.feed(bthome_packet(5, 81), {}, "", 100.0 + PACKET_WINDOW - 0.01)
    assert inside is not None and (inside.samples, inside.repeats) == ([], 1)
    at_end = device.feed(bthome_packet(5, 82), {}, "", 100.0 + PACKET_WINDOW)
    assert at_end is not None and [s.value for s in at_end.samples] == [82]
    assert PACKET_WINDOW == 4.0


def sealed(counter: int, key: bytes = KEY) -> dict[str, bytes]:
    plain = bthome.encode([(0x01, b"\x50")], packet_id=counter % 256)
    return {bthome.UUID: bthome.encrypt(plain, mac_bytes(ADDRESS), counter, key)}


def test_the_first_mic_failure_is_a_retry_and_a_replay_is_refused_in_words() -> None:
    device = DeviceDecoder(Context(ADDRESS, cipher=Cipher(KEY)), FORMATS["bthome"])
    assert device.keyed
    other = bytes(16)
    first = device.feed(sealed(10, other), {}, "", 0.0)
    assert first is not None
    [retry] = first.problems
    assert (retry.reason, retry.offset) == ("decrypt_retry", 0)
    assert retry.detail == "BTHome advert does not decrypt with the bindkey"
    second = device.feed(sealed(11, other), {}, "", 1.0)
    assert second is not None and [p.reason for p in second.problems] == ["wrong_key"]
    good = device.feed(sealed(12), {}, "", 2.0)
    assert good is not None and good.authenticated and device.counter == 12
    # after a good one, one failure is a retry again
    third = device.feed(sealed(13, other), {}, "", 3.0)
    assert third is not None and [p.reason for p in third.problems] == ["decrypt_retry"]
    replay = device.feed(sealed(12), {}, "", 10.0)
    assert replay is not None and not replay.authenticated and replay.samples == []
    [refused] = replay.problems
    assert (refused.reason, refused.offset) == ("replay", 0)
    assert refused.detail == (
        "encryption counter 12 is not above 12 (a replayed advert, or the device "
        "restarted its counter: ledge ble reset-counter)"
    )
    assert device.reset_counter() == 12 and device.counter is None
