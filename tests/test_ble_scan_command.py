"""``ledge ble scan`` in the test's own process: the real bleak scanning the mock BlueZ
(tests/fakes/fake_bluez.py), the command's table and ``[[ble]]`` tables compared whole.

tests/test_ble.py runs the command as a user does (a process) and pastes its output
into a gateway's config; here a planted bug in the command (a mutant) is judged."""

from __future__ import annotations

import argparse
import asyncio
import struct

import pytest

from drivers.ble import scan
from drivers.parsers.ble import bthome
from drivers.parsers.ble.base import mac_bytes
from drivers.parsers.ble.beacons import APPLE, encode_ibeacon
from tests.support.bluez import BTHOME, FakeBlueZ

KEY = "231d39c1d7cc1ab1aee224cd096db932"
OTHER_KEY = "00112233445566778899aabbccddeeff"
RUUVI = bytes.fromhex("0512FC5394C37C0004FFFC040CAC364200CDCBB8334C884F")
PLAIN = "A4:C1:38:00:00:0A"
RUUVI_ADDRESS = "CB:B8:33:4C:88:4F"
SEALED = "A4:C1:38:00:00:0D"
BEACON = "4C:00:00:00:00:01"
UNKNOWN = "11:22:33:44:55:66"
UUID = bytes.fromhex("fda50693a4e24fb1afcfc6eb07647825")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ledge ble")
    scan.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["scan", "--seconds", "1", *argv])


def sealed(counter: int, centi: int) -> bytes:
    plain = bthome.encode([(0x02, struct.pack("<h", centi))], packet_id=counter & 0xFF)
    return bthome.encrypt(plain, mac_bytes(SEALED), counter, bytes.fromhex(KEY))


def nearby(bluez: FakeBlueZ) -> None:
    """Five devices advertising while discovery runs (strongest first below)."""
    for address, name, rssi, svc, mfr in (
        (PLAIN, "ATC_00000A", -48, {BTHOME: bytes.fromhex("40016102ca09")}, None),
        (SEALED, "(SBHT-003C) living room", -55, {BTHOME: sealed(7, 1234)}, None),
        (BEACON, "", -61, None, {APPLE: encode_ibeacon(UUID, 1, 2, -59)}),
        (RUUVI_ADDRESS, "Ruuvi 884F", -70, None, {0x0499: RUUVI}),
        (UNKNOWN, "kettle", -80, {"0000abcd-0000-1000-8000-00805f9b34fb": b"\x01\x02"},
         {0x1234: b"\xff"}),
    ):  # fmt: skip
        bluez.beacon(bluez.add_device(address, name, rssi=rssi, svc=svc, mfr=mfr), 50)


def output(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = scan.run(parse(*argv))
    out, err = capsys.readouterr()
    return code, out, err


ROWS = [
    "ADDRESS            NAME              RSSI  FORMAT      VALUES",
    "A4:C1:38:00:00:0A  ATC_00000A         -48  bthome      battery=97% temperature=25.06°C",
    "A4:C1:38:00:00:0D  (SBHT-003C) livi   -55  bthome      (no_key: encrypted BTHome advert "
    "and no bindkey configured (byte 0))",
    "4C:00:00:00:00:01                     -61  ibeacon     measured_power=-59 "
    "beacon=fda50693-a4e2-4fb1-afcf-c6eb07647825/1/2",
    # the specification's valid vector (acceleration in m/s², pressure in hPa)
    "CB:B8:33:4C:88:4F  Ruuvi 884F         -70  ruuvi       temperature=24.3°C humidity=53.49% "
    "pressure=1000.44 acceleration_x=0.039 acceleration_y=-0.039 acceleration_z=10.16 "
    "voltage=2.977 tx_power=4 movement_counter=66",
]
UNKNOWN_ROW = "11:22:33:44:55:66  kettle             -80  ?           svc 0xabcd=0102 mfr 0x1234=ff"


def test_the_table_lists_recognised_devices_strongest_first_with_their_values(
    bluez: FakeBlueZ, capsys: pytest.CaptureFixture[str]
) -> None:
    nearby(bluez)
    assert output(capsys) == (0, "\n".join([*ROWS, "4 device(s) in 1 s"]) + "\n", "")


def test_with_all_devices_no_decoder_recognises_are_listed_with_their_raw_data(
    bluez: FakeBlueZ, capsys: pytest.CaptureFixture[str]
) -> None:
    nearby(bluez)
    assert output(capsys, "--all") == (
        0, "\n".join([*ROWS, UNKNOWN_ROW, "5 device(s) in 1 s"]) + "\n", ""
    )  # fmt: skip


#: The encrypted device's name: its name as heard, made a key, and its address's end.
SEALED_NAME = "sbht_003c__living_room_000d"


def sealed_table(*key_lines: str) -> list[str]:
    """The encrypted device's ``[[ble]]`` table, ending with what is said of its key."""
    return [
        "[[ble]]",
        f'name = "{SEALED_NAME}"',
        'address = "A4:C1:38:00:00:0D"',
        'format = "bthome"',
        *key_lines,
    ]


def block(out: str, name: str) -> list[str]:
    """The lines of one device's ``[[ble]]`` table (its comment line first)."""
    tables = out.split("\n\n")
    found = [t.splitlines() for t in tables if f'name = "{name}"' in t]
    assert len(found) == 1, out
    return found[0]


def test_toml_gives_each_recognised_device_a_table_by_address_or_beacon_identity(
    bluez: FakeBlueZ, capsys: pytest.CaptureFixture[str]
) -> None:
    nearby(bluez)
    code, out, err = output(capsys, "--toml", "--all")
    assert (code, err) == (0, "")
    assert out.count("[[ble]]") == 4  # the kettle has no decoder: no table, even with --all
    assert block(out, "atc_00000a_000a") == [
        "# battery=97% temperature=25.06°C",
        "[[ble]]",
        'name = "atc_00000a_000a"',
        'address = "A4:C1:38:00:00:0A"',
        'format = "bthome"',
    ]
    assert block(out, SEALED_NAME)[1:] == sealed_table(
        'bindkey = "..."  # the device encrypts: its 32-digit key'
    )
    assert block(out, "ibeacon_0001") == [
        "# measured_power=-59 beacon=fda50693-a4e2-4fb1-afcf-c6eb07647825/1/2",
        "[[ble]]",
        'name = "ibeacon_0001"',  # no name heard: the format's, then the address's end
        'beacon = "fda50693-a4e2-4fb1-afcf-c6eb07647825/1/2"',
        'format = "ibeacon"',
    ]
    assert block(out, "ruuvi_884f_884f")[1:] == [
        "[[ble]]",
        'name = "ruuvi_884f_884f"',
        'address = "CB:B8:33:4C:88:4F"',
        'format = "ruuvi"',
    ]


def test_toml_with_the_devices_bindkey_decrypts_while_scanning_and_prints_the_key(
    bluez: FakeBlueZ, capsys: pytest.CaptureFixture[str]
) -> None:
    nearby(bluez)
    code, out, _ = output(capsys, "--toml", "--bindkey", f"{SEALED.lower()}={KEY.upper()}")
    assert code == 0
    assert block(out, SEALED_NAME) == [
        "# temperature=12.34°C",
        *sealed_table(f'bindkey = "{KEY}"'),
    ]
    assert block(out, "atc_00000a_000a")[-1] == 'format = "bthome"'  # keys are per device


def test_toml_with_a_key_that_does_not_decrypt_says_so_beside_it(
    bluez: FakeBlueZ, capsys: pytest.CaptureFixture[str]
) -> None:
    nearby(bluez)
    code, out, _ = output(capsys, "--toml", "--bindkey", f"{SEALED}={OTHER_KEY}")
    assert code == 0
    assert block(out, SEALED_NAME) == [
        "# (wrong_key: BTHome advert does not decrypt with the bindkey (byte 0))",
        *sealed_table(
            "# the key given with --bindkey does not decrypt these adverts",
            f'bindkey = "{OTHER_KEY}"',
        ),
    ]


@pytest.mark.parametrize(
    ("bindkey", "said"),
    [
        (f"{SEALED}", "expected ADDRESS=KEY"),
        (f"{SEALED}=abc", "32 hex digits"),
    ],
)
def test_a_malformed_bindkey_is_refused_before_scanning(
    bluez: FakeBlueZ, capsys: pytest.CaptureFixture[str], bindkey: str, said: str
) -> None:
    code, out, err = output(capsys, "--bindkey", bindkey)
    assert (code, out) == (2, "")
    assert err.startswith(f"ledge ble scan: --bindkey {bindkey!r}: ") and said in err, err
    assert "StartDiscovery" not in bluez.calls("/org/bluez/hci0")


def test_without_options_it_scans_hci0_for_ten_seconds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ledge ble scan`` alone scans the first adapter for 10 s, as its help says, and
    the table's last line says how long it listened."""
    asked: list[tuple[str, float]] = []

    async def scanned(adapter: str, seconds: float) -> dict[str, scan.Seen]:
        asked.append((adapter, seconds))
        return {}

    monkeypatch.setattr(scan, "scan", scanned)
    parser = argparse.ArgumentParser(prog="ledge ble")
    scan.add_parser(parser.add_subparsers(dest="command"))
    assert scan.run(parser.parse_args(["scan"])) == 0
    assert asked == [("hci0", 10.0)]
    assert capsys.readouterr().out.splitlines()[-1] == "0 device(s) in 10 s"


def test_an_adapter_that_is_not_there_is_named_in_the_error(
    bluez: FakeBlueZ, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = output(capsys, "--adapter", "hci7")
    assert (code, out) == (1, "")
    assert err.startswith("ledge ble scan: cannot scan with hci7: "), err


def test_a_device_heard_many_times_is_one_entry_with_its_latest_advert(
    bluez: FakeBlueZ, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under its address in capitals, however BlueZ spells it, counted each time."""
    path = bluez.add_device(
        PLAIN, "ATC_00000A", rssi=-48, svc={BTHOME: bytes.fromhex("40016102ca09")}
    )
    bluez.beacon(path, 50)
    seen = asyncio.run(scan.scan("hci0", 0.5))
    assert list(seen) == [PLAIN]
    assert seen[PLAIN].name == "ATC_00000A" and seen[PLAIN].rssi == -48
    assert seen[PLAIN].adverts >= 2
    assert seen[PLAIN].service_data == {BTHOME: bytes.fromhex("40016102ca09")}
