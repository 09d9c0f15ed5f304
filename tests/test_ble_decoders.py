"""BLE advertisement decoders on byte vectors (tests/vectors/ble_adverts.json, each with
its source), beside the reference decoders from PyPI on the same vectors and on
generated frames, and fuzzed: bytes in, samples or AdvertError out, nothing else."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drivers.parsers.ble import (
    FORMATS,
    beacons,
    bthome,
    govee,
    mibeacon,
    pvvx,
    recognise,
    ruuvi,
    switchbot,
)
from drivers.parsers.ble.base import AdvertError, Context, Decoded, mac_bytes, uuid16
from drivers.parsers.ble.ccm import Cipher, encrypt_block, expand_key, parse_key
from drivers.parsers.ble.gatt import parse_value
from tests.support.adverts import refusal
from tests.support.reference import REFERENCES

VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "vectors" / "ble_adverts.json").read_text(encoding="utf-8")
)


def advert(v: dict[str, Any]) -> tuple[dict[str, bytes], dict[int, bytes]]:
    kind, key = v["element"].split(":")
    data = bytes.fromhex(v["hex"])
    if kind == "service":
        return {uuid16(int(key, 16)): data}, {}
    return {}, {int(key, 16): data}


def context(v: dict[str, Any]) -> Context:
    key = v.get("bindkey")
    return Context(
        v["address"], name=v.get("name", ""), cipher=Cipher(bytes.fromhex(key)) if key else None
    )


def decode(v: dict[str, Any]) -> Decoded:
    """The vector through its format's decoder (the one element it names)."""
    fmt = FORMATS[v["format"]]
    service, company = advert(v)
    ctx = context(v)
    for source in fmt.sources:
        if source.kind == "service" and source.key in service:
            return source.decode(service[str(source.key)], ctx)
        if source.kind != "service" and company:
            ((cid, data),) = company.items()
            if source.kind == "any_company" or source.key == cid:
                ctx.company_id = cid
                return source.decode(data, ctx)
    raise AssertionError(f"no source of {fmt.name} reads {v['element']}")


def values(decoded: Decoded) -> dict[str, Any]:
    return {s.field: s.value for s in decoded.samples}


def vector_id(v: dict[str, Any]) -> str:
    """ASCII only (a test id with an escaped character, as a degree sign becomes, is not
    found again when given back on the command line in some runners, mutmut's among them)."""
    source = v["source"][:60].encode("ascii", "replace").decode()
    return f"{v['format']}:{source}:{v['hex'][:24]}"


@pytest.mark.parametrize("v", VECTORS, ids=[vector_id(v) for v in VECTORS])
def test_vector(v: dict[str, Any]) -> None:
    """Each vector decodes to exactly its expected values, or fails with its reason."""
    if "expect" not in v:
        with pytest.raises(AdvertError) as info:
            decode(v)
        assert info.value.reason == v["error"], str(info.value)
        return
    decoded = decode(v)
    assert values(decoded) == v["expect"]
    for sample in decoded.samples:
        assert type(sample.value) is type(v["expect"][sample.field])
    if "error" in v:  # a partial decode: the good objects, and why it stopped
        assert decoded.problem is not None and decoded.problem.reason == v["error"]
    else:
        assert decoded.problem is None
    if "packet_id" in v:
        assert decoded.packet_id == v["packet_id"]
    if "identity" in v:
        assert decoded.identity == v["identity"]


def test_vectors_are_recognised_by_their_format() -> None:
    """``recognise`` (what `auto` devices and `ledge ble scan` use) names each vector's
    format from the advert alone (but an element that does not identify its format,
    ``"recognised": false``: SwitchBot's manufacturer data comes with its service data)."""
    for v in VECTORS:
        if "error" in v or not v.get("recognised", True):
            continue
        service, company = advert(v)
        fmt = recognise(service, company, context(v))
        assert fmt is not None and fmt.name == v["format"], v["source"]


#: The signed objects of the bthome.io/format table (sint8/16/32), written out here
#: rather than taken from Ledge's table, which is what these vectors check.
BTHOME_SIGNED = {0x02, 0x08, 0x3F, 0x45, 0x57, 0x58, 0x59, 0x5A, 0x5B, 0x5C, 0x5D, 0x62, 0x63}


def test_every_bthome_object_id_has_fixed_vectors() -> None:
    """Each object id the decoder claims has a vector of its own with the value written
    out: an unsigned one with its top bit set (read signed, it would come out
    negative), a signed one both positive and negative. So a sign or size error fails
    on every run, not when a generated value happens to hit it."""
    by_id: dict[int, list[Any]] = {}
    for v in VECTORS:
        if "object" in v:
            numbers = [] if v["object"] == "0x00" else list(v["expect"].values())
            by_id.setdefault(int(v["object"], 16), []).extend(numbers)
    assert set(by_id) == set(bthome.OBJECTS)
    for oid in BTHOME_SIGNED:
        numbers = by_id[oid]
        assert any(x < 0 for x in numbers) and any(x > 0 for x in numbers), hex(oid)
    for oid, values_ in by_id.items():
        if oid not in BTHOME_SIGNED and bthome.OBJECTS[oid][1] == bthome.NUM:
            assert all(x > 0 for x in values_), hex(oid)


#: The signed fields of the other formats (from their specs and reference decoders),
#: each of which needs a vector with a value below zero.
SIGNED_FIELDS = {
    "mibeacon": {"temperature"},
    "ruuvi": {"temperature", "acceleration_x", "acceleration_y", "acceleration_z", "tx_power"},
    "govee": {"temperature"},
    "inkbird": {"temperature", "temperature_probe_1"},
    "switchbot": {"temperature"},
    "pvvx": {"temperature"},
    "atc1441": {"temperature"},
    "ibeacon": {"measured_power"},
    "eddystone": {"temperature", "tx_power"},
}
#: Each layout of a format with a signed field, and how its vectors are told.
SIGNED_LAYOUTS: list[tuple[str, str, Callable[[dict[str, Any]], bool]]] = [
    ("mibeacon", "object 0x1004", lambda v: "041002" in v["hex"]),
    ("mibeacon", "object 0x100d", lambda v: "0d1004" in v["hex"]),
    ("mibeacon", "object 0x4c01", lambda v: "014c04" in v["hex"]),
    ("govee", "H5075", lambda v: v.get("name", "").startswith("GVH5075")),
    ("govee", "H5074", lambda v: v.get("name", "").startswith("Govee_H5074")),
    ("govee", "H5051", lambda v: v.get("name", "").startswith("Govee_H5051")),
    ("govee", "H5179", lambda v: v["element"] == "company:0x8801"),
    ("inkbird", "IBS-TH", lambda v: v.get("name") == "sps"),
    ("inkbird", "IBS-TH2/P01B", lambda v: v.get("name") == "tps"),
    ("inkbird", "iBBQ", lambda v: v.get("name") == "iBBQ"),
    ("switchbot", "service data", lambda v: v["element"] == "service:fd3d"),
    ("switchbot", "manufacturer data", lambda v: v["element"] == "company:0x0969"),
]


def _negative(v: dict[str, Any], fields: set[str]) -> bool:
    return any(
        isinstance(value, int | float) and not isinstance(value, bool) and value < 0
        for field, value in v.get("expect", {}).items()
        if field in fields
    )


def test_every_signed_field_of_the_other_formats_has_a_vector_below_zero() -> None:
    """As for BTHome: a sign error in any layout of any format fails on every run."""
    for fmt, fields in SIGNED_FIELDS.items():
        for field in fields:
            assert any(v["format"] == fmt and _negative(v, {field}) for v in VECTORS), field
    for fmt, layout, told in SIGNED_LAYOUTS:
        assert any(
            v["format"] == fmt and told(v) and _negative(v, SIGNED_FIELDS[fmt]) for v in VECTORS
        ), (fmt, layout)


@dataclass(frozen=True)
class Field:
    """A ``[[ble.characteristics.fields]]`` entry."""

    type: str
    start: int = 0
    quantity: str = "x"
    scale: float = 1.0
    offset: float = 0.0
    unit: str = ""


@pytest.mark.parametrize(
    ("type_", "data", "value"),
    [
        ("int8", "f6", -10),
        ("uint8", "f6", 246),
        ("int16", "f6ff", -10),
        ("uint16", "f6ff", 65526),
        ("int16be", "fff6", -10),
        ("uint16be", "fff6", 65526),
        ("int24", "f6ffff", -10),
        ("uint24", "f6ffff", 16777206),
        ("int32", "f6ffffff", -10),
        ("uint32", "f6ffffff", 4294967286),
        ("int32be", "fffffff6", -10),
        ("uint32be", "fffffff6", 4294967286),
        ("float16", "00c9", -10.0),
        ("float32", "000020c1", -10.0),
    ],
)
def test_gatt_value_types_signed_and_unsigned(type_: str, data: str, value: float) -> None:
    """GATT field types on bytes with the top bit set: written out by hand, so a type
    read with the wrong sign (or byte order) fails."""
    [sample] = parse_value(bytes.fromhex(data), [Field(type_)])
    assert sample.value == value and type(sample.value) is type(value)


def close(a: Any, b: Any) -> bool:
    """Equal, or floats equal at the coarser rounding of the two decoders."""
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and math.isclose(a, b, abs_tol=0.011)
        )
    return bool(a == b)


def agree(
    fmt: str,
    address: str,
    service: dict[str, bytes],
    company: dict[int, bytes],
    name: str,
    key: bytes | None,
) -> None:
    ctx = Context(address, name=name, cipher=Cipher(key) if key else None)
    ours: dict[str, Any] = {}
    for result in __import__("drivers.parsers.ble", fromlist=["decode_advert"]).decode_advert(
        FORMATS[fmt], service, company, ctx
    ):
        if isinstance(result, Decoded):
            ours.update(values(result))
    theirs = REFERENCES[fmt](address, service, company, name, key)
    # Compare per quantity (temperature_1, temperature_2 -> temperature): bthome-ble
    # names two objects of one quantity in different units (distance in mm and m) alike,
    # so one overwrites the other there; every value it keeps must be one of Ledge's.
    mine = by_base(ours)
    for base, values_ in by_base(theirs).items():
        left = list(mine.get(base, []))
        for value in values_:
            match = next((i for i, v in enumerate(left) if close(v, value)), None)
            assert match is not None, f"{fmt} {base}: reference {value!r}, Ledge {mine.get(base)}"
            left.pop(match)


def by_base(values_: dict[str, Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for key, value in values_.items():
        head, _, tail = key.rpartition("_")
        out.setdefault(head if tail.isdigit() and head else key, []).append(value)
    return out


WITH_REFERENCE = [
    v for v in VECTORS if v["format"] in REFERENCES and "expect" in v and "error" not in v
]


@pytest.mark.parametrize(
    "v", WITH_REFERENCE, ids=[f"{v['format']}:{v['hex'][:24]}" for v in WITH_REFERENCE]
)
def test_vector_agrees_with_the_reference_decoder(v: dict[str, Any]) -> None:
    service, company = advert(v)
    key = bytes.fromhex(v["bindkey"]) if "bindkey" in v else None
    agree(v["format"], v["address"], service, company, v.get("name", ""), key)


# ---------------------------------------------------------------- generated frames

ADDRESS = "A4:C1:38:0F:1E:2D"
NUMERIC = sorted(k for k, v in bthome.OBJECTS.items() if v[1] == bthome.NUM)
BINARY = sorted(k for k, v in bthome.OBJECTS.items() if v[1] == bthome.BIN)


@st.composite
def bthome_objects(draw: st.DrawFn) -> list[tuple[int, bytes]]:
    """Objects in ascending id order (as the spec asks), random values."""
    ids = sorted(
        draw(st.lists(st.sampled_from(NUMERIC + BINARY + [0x3A, 0x3C]), min_size=1, max_size=6))
    )
    out = []
    for oid in ids:
        size = bthome.OBJECTS[oid][2]
        if oid in BINARY:
            out.append((oid, bytes([draw(st.integers(0, 1))])))
        elif oid == 0x3A:
            out.append((oid, bytes([draw(st.sampled_from(sorted(bthome.BUTTON_EVENTS)))])))
        elif oid == 0x3C:
            out.append((oid, bytes([draw(st.integers(1, 2)), draw(st.integers(0, 255))])))
        else:
            out.append((oid, draw(st.binary(min_size=size, max_size=size))))
    return out


@given(
    bthome_objects(),
    st.integers(0, 255),
    st.booleans(),
    st.binary(min_size=16, max_size=16),
    st.integers(1, 2**32 - 1),
)
def test_generated_bthome_agrees_with_bthome_ble(
    objects: list[tuple[int, bytes]], packet_id: int, encrypted: bool, key: bytes, counter: int
) -> None:
    plain = bthome.encode(objects, packet_id=packet_id)
    data = bthome.encrypt(plain, mac_bytes(ADDRESS), counter, key) if encrypted else plain
    agree("bthome", ADDRESS, {bthome.UUID: data}, {}, "", key if encrypted else None)


MIBEACON_OBJECTS = {
    0x1004: st.integers(-400, 600).map(lambda t: struct.pack("<h", t)),
    0x1006: st.integers(0, 1000).map(lambda h: struct.pack("<H", h)),
    0x100A: st.integers(0, 100).map(lambda b: bytes([b])),
    0x100D: st.tuples(st.integers(-400, 600), st.integers(0, 1000)).map(
        lambda th: struct.pack("<hH", *th)
    ),
    0x1008: st.integers(0, 100).map(lambda m: bytes([m])),
    0x1009: st.integers(0, 5000).map(lambda c: struct.pack("<H", c)),
    0x4C02: st.integers(0, 100).map(lambda h: bytes([h])),
}


def mibeacon_objects(kinds: list[int]) -> st.SearchStrategy[tuple[tuple[int, bytes], ...]]:
    return st.tuples(*(MIBEACON_OBJECTS[k].map(functools.partial(_tagged, k)) for k in kinds))


def _tagged(kind: int, value: bytes) -> tuple[int, bytes]:
    return kind, value


#: Product ids of thermometers and plant sensors the reference knows.
PRODUCTS = [0x055B, 0x0347, 0x01AA, 0x045B, 0x0387, 0x0098, 0x16E4]


@given(
    st.sampled_from(PRODUCTS),
    st.integers(0, 255),
    st.lists(
        st.sampled_from(sorted(MIBEACON_OBJECTS)), min_size=1, max_size=3, unique=True
    ).flatmap(mibeacon_objects),
    st.booleans(),
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**24 - 1),
)
def test_generated_mibeacon_agrees_with_xiaomi_ble(
    product: int,
    frame: int,
    objects: tuple[tuple[int, bytes], ...],
    encrypted: bool,
    key: bytes,
    ext: int,
) -> None:
    plain = mibeacon.encode(product, frame, list(objects), mac=mac_bytes(ADDRESS))
    data = mibeacon.encrypt(plain, mac_bytes(ADDRESS), ext, key) if encrypted else plain
    agree("mibeacon", ADDRESS, {mibeacon.UUID: data}, {}, "", key if encrypted else None)


@given(
    st.integers(-32767, 32767),
    st.integers(0, 40000),
    st.integers(50000, 115534),
    st.tuples(st.integers(-32767, 32767), st.integers(-32767, 32767), st.integers(-32767, 32767)),
    st.integers(1600, 3646),
    st.integers(-20, 10).map(lambda p: p * 2),
    st.integers(0, 254),
    st.integers(0, 65534),
)
def test_generated_ruuvi_agrees_with_ruuvitag_ble(
    t: int, h: int, p: int, acc: tuple[int, int, int], mv: int, tx: int, moves: int, seq: int
) -> None:
    data = ruuvi.encode(mac_bytes(ADDRESS), t * 0.005, h * 0.0025, p, acc, mv, tx, moves, seq)
    agree("ruuvi", ADDRESS, {}, {ruuvi.COMPANY_ID: data}, "", None)


@given(
    st.integers(-399, 999).map(lambda t: t / 10),
    st.integers(0, 999).map(lambda h: h / 10),
    st.integers(0, 100),
)
def test_generated_govee_h5075_agrees_with_govee_ble(temp: float, hum: float, battery: int) -> None:
    from drivers.parsers.ble import govee

    agree(
        "govee", ADDRESS, {}, {0xEC88: govee.encode_h5075(temp, hum, battery)}, "GVH5075_1E2D", None
    )


@given(st.integers(-4000, 6000), st.integers(0, 9999), st.integers(0, 100))
def test_generated_inkbird_agrees_with_inkbird_ble(t: int, h: int, battery: int) -> None:
    company = t & 0xFFFF
    data = struct.pack("<H", h) + b"\x00\x00\x00" + bytes([battery]) + b"\x08"
    agree("inkbird", ADDRESS, {}, {company: data}, "sps", None)


@given(
    st.sampled_from("Tiw"),
    st.integers(-300, 600).map(lambda t: t / 10),
    st.integers(1, 99),
    st.integers(0, 100),
)
def test_generated_switchbot_agrees_with_pyswitchbot(
    model: str, temp: float, hum: int, battery: int
) -> None:
    agree(
        "switchbot",
        ADDRESS,
        {switchbot.UUIDS[0]: switchbot.encode(model, temp, hum, battery)},
        {},
        "",
        None,
    )


# ---------------------------------------------------------------- units, refusals, encoders


def samples(decoded: Decoded) -> list[tuple[str, Any, str]]:
    return [(s.field, s.value, s.unit) for s in decoded.samples]


EDDYSTONE_NAMESPACE = bytes.fromhex("edd1ebeac04e5defa017")
EDDYSTONE_INSTANCE = bytes.fromhex("0123456789ab")


def test_an_eddystone_tlm_frame_gives_each_value_in_its_unit() -> None:
    """TLM (google/eddystone, eddystone-tlm): battery in mV, temperature in 8.8 fixed
    point, an advert count, the time since power-on in 0.1 s, published in V, °C and s
    (the vectors check the numbers only). A unit written wrong reaches Home Assistant
    and every subscriber as another quantity, or none."""
    data = bytes.fromhex("20000bb817800000006400000bb8")  # 3000 mV, 23.5 °C, 100, 300 s
    assert samples(beacons.decode_eddystone(data, Context(ADDRESS))) == [
        ("voltage", 3.0, "V"),
        ("temperature", 23.5, "°C"),
        ("advert_count", 100, ""),
        ("uptime", 300.0, "s"),
    ]


@pytest.mark.parametrize(
    ("hex_data", "expected"),
    [
        ("20000bb817800000006400000b", ("short", "TLM frame of 13 bytes, needs 14", 13)),
        ("05ec", ("unsupported", "Eddystone frame type 0x05", 0)),
    ],
)
def test_each_eddystone_refusal_names_its_reason_text_and_byte(
    hex_data: str, expected: tuple[str, str, int]
) -> None:
    """What the device's log line and its count by reason say of a frame not read."""
    data = bytes.fromhex(hex_data)
    assert refusal(lambda: beacons.decode_eddystone(data, Context(ADDRESS))) == expected


def test_the_eddystone_uid_encoder_writes_the_tx_power_as_a_signed_byte() -> None:
    """``encode_eddystone_uid`` (the beacons the tests make) lays a UID frame out as the
    specification does: type 0x00, the tx power at 0 m as an int8, the namespace, the
    instance, two reserved zero bytes. Its power comes back, below zero too."""
    frame = beacons.encode_eddystone_uid(EDDYSTONE_NAMESPACE, EDDYSTONE_INSTANCE, -20)
    assert frame == bytes.fromhex("00ecedd1ebeac04e5defa0170123456789ab0000")  # the vector
    for power in (-100, -1, 0, 4, 20):
        data = beacons.encode_eddystone_uid(EDDYSTONE_NAMESPACE, EDDYSTONE_INSTANCE, power)
        assert data[1] == power & 0xFF
        decoded = beacons.decode_eddystone(data, Context(ADDRESS))
        assert samples(decoded) == [("tx_power", power, "dBm")]
        assert decoded.identity == "edd1ebeac04e5defa017/0123456789ab"


def test_govee_values_carry_their_units_in_every_layout() -> None:
    """Real adverts captured in govee-ble's tests (tests/test_parser.py: GVH5075,
    GVH5074, GVH5179 service infos), one per layout; each value with its unit."""
    h5075 = bytes.fromhex("000341c26400")
    assert samples(govee.decode(h5075, Context(ADDRESS, company_id=0xEC88))) == [
        ("temperature", 21.3, "°C"),
        ("humidity", 44.2, "%"),
        ("battery", 100, "%"),
    ]
    h5074 = bytes.fromhex("00e609bc126402")  # int16 LE 2534, uint16 LE 4796, 100 %
    assert samples(govee.decode(h5074, Context(ADDRESS, company_id=0xEC88))) == [
        ("temperature", 25.34, "°C"),
        ("humidity", 47.96, "%"),
        ("battery", 100, "%"),
    ]
    h5179 = bytes.fromhex("ec0001010a0aa40664")  # at byte 4: 2570, 1700, 100 %
    assert samples(govee.decode(h5179, Context(ADDRESS, company_id=0x8801))) == [
        ("temperature", 25.7, "°C"),
        ("humidity", 17.0, "%"),
        ("battery", 100, "%"),
    ]


def test_the_h5075_encoder_sends_what_the_sensor_sends() -> None:
    """``encode_h5075`` (the fake H5075 of the gateway tests) reproduces adverts of real
    H5075s byte for byte (govee-ble's GVH5075 captures), the last byte zero as theirs."""
    assert govee.encode_h5075(21.3, 44.2, 100) == bytes.fromhex("000341c26400")
    assert govee.encode_h5075(21.6, 49.8, 100) == bytes.fromhex("00034db26400")
    assert govee.encode_h5075(20.0, 64.9, 53) == bytes.fromhex("00030fc93500")


# ---------------------------------------------------------------- hostile bytes


@pytest.mark.parametrize("name", sorted(FORMATS))
@given(
    data=st.binary(max_size=64),
    company=st.integers(0, 0xFFFF),
    named=st.sampled_from(["", "sps", "tps", "iBBQ", "x"]),
)
def test_any_bytes_give_samples_or_an_advert_error(
    name: str, data: bytes, company: int, named: str
) -> None:
    """Fuzz: whatever arrives, a decoder returns samples or raises AdvertError (with a
    reason and an offset inside the element), never anything else."""
    for key in (None, b"k" * 16):
        ctx = Context(ADDRESS, name=named, company_id=company, cipher=Cipher(key) if key else None)
        for source in FORMATS[name].sources:
            try:
                decoded = source.decode(data, ctx)
            except AdvertError as exc:
                assert exc.reason and 0 <= exc.offset <= len(data)
            else:
                for sample in decoded.samples:
                    assert isinstance(sample.value, int | float | str | bool)
                    assert not isinstance(sample.value, float) or math.isfinite(sample.value)


@pytest.mark.parametrize(
    "v", VECTORS[:1] + [v for v in VECTORS if "expect" in v], ids=lambda v: v["hex"][:20]
)
def test_every_prefix_of_a_vector_is_handled(v: dict[str, Any]) -> None:
    """A cut-off advert is an AdvertError or a shorter decode, never a crash."""
    whole = bytes.fromhex(v["hex"])
    for end in range(len(whole)):
        cut = dict(v, hex=whole[:end].hex())
        with contextlib.suppress(AdvertError):
            decode(cut)


def test_a_bindkey_with_a_plain_advert_is_refused() -> None:
    """A device with a bindkey that suddenly sends plain adverts is not believed (a
    downgrade): counted as not_encrypted."""
    ctx = Context(ADDRESS, cipher=Cipher(b"k" * 16))
    with pytest.raises(AdvertError) as info:
        bthome.decode(bytes.fromhex("4002ca09"), ctx)
    assert info.value.reason == "not_encrypted"


def test_pvvx_and_atc_are_told_apart_by_length() -> None:
    mac = mac_bytes(ADDRESS)
    ctx = Context(ADDRESS)
    svc_p = {pvvx.UUID: pvvx.encode_pvvx(mac, 20.0, 50.0, 3000, 90, 1)}
    svc_a = {pvvx.UUID: pvvx.encode_atc(mac, 20.0, 50, 90, 3000, 1)}
    assert (recognise(svc_p, {}, ctx) or FORMATS["bthome"]).name == "pvvx"
    assert (recognise(svc_a, {}, ctx) or FORMATS["bthome"]).name == "atc1441"


# ---------------------------------------------------------------- AES-CCM


def test_aes128_fips197_vector() -> None:
    """FIPS 197, appendix C.1 (AES-128)."""
    rk = expand_key(bytes(range(16)))
    block = int.from_bytes(bytes.fromhex("00112233445566778899aabbccddeeff"), "big")
    got = encrypt_block(rk, block).to_bytes(16, "big")
    assert got.hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"


@pytest.mark.parametrize(
    ("key", "nonce", "associated", "plain", "tag_length", "sealed"),
    [
        (  # NIST SP 800-38C, appendix C, example 1: a 4-byte tag, as BTHome and MiBeacon
            "404142434445464748494a4b4c4d4e4f",
            "10111213141516",
            "0001020304050607",
            "20212223",
            4,
            "7162015b4dac255d",
        ),
        (  # RFC 3610, packet vector #1: a 13-byte nonce (BTHome's and MiBeacon's size)
            "c0c1c2c3c4c5c6c7c8c9cacbcccdcecf",
            "00000003020100a0a1a2a3a4a5",
            "0001020304050607",
            "08090a0b0c0d0e0f101112131415161718191a1b1c1d1e",
            8,
            "588c979a61c663d2f066d0c2c0f989806d5f6b61dac38417e8d12cfdf926e0",
        ),
    ],
    ids=["sp800-38c-example-1", "rfc3610-packet-1"],
)
def test_aes_ccm_published_vectors(
    key: str, nonce: str, associated: str, plain: str, tag_length: int, sealed: str
) -> None:
    cipher = Cipher(bytes.fromhex(key), tag_length)
    n, a, p = bytes.fromhex(nonce), bytes.fromhex(associated), bytes.fromhex(plain)
    assert cipher.seal(n, p, a).hex() == sealed
    assert cipher.open(n, bytes.fromhex(sealed), a) == p
    for i in range(len(sealed) // 2):  # any bit changed anywhere: refused
        bad = bytearray.fromhex(sealed)
        bad[i] ^= 0x80
        assert cipher.open(n, bytes(bad), a) is None
    assert cipher.open(n, bytes.fromhex(sealed), a + b"x") is None
    assert cipher.open(n, bytes.fromhex(sealed)[: tag_length - 1], a) is None  # too short


@given(
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=7, max_size=13),
    st.binary(max_size=80),
    st.one_of(st.none(), st.binary(min_size=1, max_size=40)),
    st.sampled_from([4, 6, 8, 10, 12, 14, 16]),
)
def test_aes_ccm_agrees_with_the_cryptography_package(
    key: bytes, nonce: bytes, plain: bytes, associated: bytes | None, tag_length: int
) -> None:
    """Ledge's AES-CCM beside OpenSSL's (through ``cryptography``, which the reference
    decoders bring into the test environment; the gateway does without it)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESCCM

    theirs = AESCCM(key, tag_length=tag_length).encrypt(nonce, plain, associated)
    cipher = Cipher(key, tag_length)
    assert cipher.seal(nonce, plain, associated) == theirs
    assert cipher.open(nonce, theirs, associated) == plain


def test_a_nonce_of_14_bytes_or_6_is_refused() -> None:
    """CCM's nonce is 15 - L bytes, its length field L 2 to 8 bytes (NIST SP 800-38C
    A.1, RFC 3610 section 2): 7 to 13 bytes. A 14-byte nonce would leave a one-byte
    length field that neither standard (nor OpenSSL) accepts: refused, not sealed."""
    cipher = Cipher(bytes(range(16)))
    for n in (6, 14):
        with pytest.raises(ValueError, match=f"^a CCM nonce is 7 to 13 bytes, not {n}$"):
            cipher.seal(bytes(n), b"plain", None)
        with pytest.raises(ValueError, match=f"^a CCM nonce is 7 to 13 bytes, not {n}$"):
            cipher.open(bytes(n), bytes(9), None)
    for n in (7, 13):
        assert cipher.open(bytes(n), cipher.seal(bytes(n), b"plain", None), None) == b"plain"


def test_a_bindkey_is_read_with_colons_spaces_or_capitals() -> None:
    """A bindkey pasted as tools print it (hex pairs split by colons or spaces, in
    capitals, with blanks around) is the same key as its 32 bare digits."""
    key = bytes.fromhex("231d39c1d7cc1ab1aee224cd096db932")
    for text in (
        "231d39c1d7cc1ab1aee224cd096db932",
        "23:1d:39:c1:d7:cc:1a:b1:ae:e2:24:cd:09:6d:b9:32",
        "23 1D 39 C1 D7 CC 1A B1 AE E2 24 CD 09 6D B9 32",
        "  231D39C1D7CC1AB1AEE224CD096DB932\n",
    ):
        assert parse_key(text) == key, text
