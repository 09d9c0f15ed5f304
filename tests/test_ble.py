"""BLE sensors end to end: ``ledge run`` with the real bleak talks to a fake BlueZ on a
private system bus (tests/fakes/fake_bluez.py: this machine has no Bluetooth, so
bluetoothd cannot run); a real MQTT client (paho) watches what comes out."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drivers.ble import counters
from drivers.parsers.ble import bthome, govee, mibeacon, pvvx, ruuvi
from drivers.parsers.ble.base import mac_bytes
from drivers.parsers.ble.beacons import encode_ibeacon
from tests.support.bluez import BTHOME, FakeBlueZ
from tests.support.clients import Paho
from tests.support.procs import REPO, LedgeProcess
from tests.support.prometheus import metrics_text, promtool_problems, scrape
from tests.support.wait import wait_for

PVVX = "0000181a-0000-1000-8000-00805f9b34fb"
MIBEACON = "0000fe95-0000-1000-8000-00805f9b34fb"
KEY = "231d39c1d7cc1ab1aee224cd096db932"
#: Ruuvi's data format 5 test vector (dataformat_05.md, "valid data").
RUUVI_VALID = "0512FC5394C37C0004FFFC040CAC364200CDCBB8334C884F"


class Gateway:
    """``ledge run`` with a BLE config, and a paho client subscribed to its topics."""

    def __init__(
        self,
        tmp_path: Path,
        config: str,
        sys_interval: float = 0,
        listeners: int = 1,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        health_interval: float = 0,
    ) -> None:
        path = self.path = tmp_path / "ledge.toml"
        extra = f"[broker]\nsys_interval = {sys_interval}\n" if sys_interval else ""
        path.write_text(
            f'[gateway]\nid = "gw1"\nhealth_interval = {health_interval}\n{extra}{config}'
        )
        self.proc = LedgeProcess(*args, config=path, env=env).start(listeners=listeners)
        self.sub = Paho(self.proc.port, "watch").connect()
        self.sub.subscribe("ledge/gw1/#", 0)
        if sys_interval:
            self.sub.subscribe("$SYS/broker/sensors/ble/#", 0)

    def values(self, device: str, quantity: str) -> list[Any]:
        topic = f"ledge/gw1/ble/{device}/{quantity}"
        return [json.loads(m.payload)["value"] for m in list(self.sub.messages) if m.topic == topic]

    def payloads(self, topic: str) -> list[bytes]:
        return [m.payload for m in list(self.sub.messages) if m.topic == topic]

    def wait_value(self, device: str, quantity: str, value: Any, timeout: float = 5) -> None:
        wait_for(
            lambda: value in self.values(device, quantity),
            timeout,
            f"{device}/{quantity} = {value!r}",
        )

    def sys(self, key: str) -> bytes | None:
        topic = f"$SYS/broker/sensors/ble/{key}"
        got = [m.payload for m in list(self.sub.messages) if m.topic == topic]
        return got[-1] if got else None

    def adapter(self) -> dict[str, Any]:
        got = self.payloads("ledge/gw1/ble/adapter")
        return json.loads(got[-1]) if got else {}

    def metrics(self) -> dict[str, float]:
        """``/metrics`` of the HTTP listener (the second listener when ``[http]`` is on)."""
        return scrape(self.proc.ports[1])

    def wait_metric(self, series: str, value: float, what: str) -> dict[str, float]:
        """The metrics once ``series`` has ``value``."""

        def scraped() -> dict[str, float]:
            m = self.metrics()
            return m if m.get(series) == value else {}

        return wait_for(scraped, 5, what)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.proc.ports[1]}/api/status") as r:
            doc: dict[str, Any] = json.load(r)
        return doc

    def stop(self) -> None:
        self.sub.disconnect()
        if self.proc.proc is not None and self.proc.proc.returncode is None:
            assert self.proc.stop() == 0, self.proc.log

    def kill(self) -> None:
        """SIGKILL (a power cut, as far as the gateway can tell)."""
        self.sub.disconnect()
        self.proc.kill()


@pytest.fixture
def gateways() -> Iterator[list[Gateway]]:
    started: list[Gateway] = []
    yield started
    for gw in started:
        gw.stop()


def start(gateways: list[Gateway], tmp_path: Path, config: str, **kw: Any) -> Gateway:
    gw = Gateway(tmp_path, config, **kw)
    gateways.append(gw)
    gw.proc.wait_log(r"ble hci0: (passive|active) scanning", 10)
    return gw


def keep_advertising(
    bluez: FakeBlueZ, gw: Gateway, path: str, payload: bytes, device: str, value: float
) -> None:
    """A device in range advertises again and again (every 50 ms, as a real one
    would at most): until the gateway reports it, 20 s at most on a loaded machine."""
    sent = [float("-inf")]

    def arrived() -> bool:
        if time.monotonic() - sent[0] >= 0.05:
            bluez.advertise(path, svc={BTHOME: payload})
            sent[0] = time.monotonic()
        return value in gw.values(device, "temperature")

    wait_for(arrived, 20, f"{device} = {value} after the scanner is back")


def bthome_temp(packet: int, centi: int) -> bytes:
    return bthome.encode([(0x02, struct.pack("<h", centi))], packet_id=packet & 0xFF)


# ---------------------------------------------------------------- scanning


def test_passive_scanning_decodes_mixed_formats(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    gw = start(
        gateways,
        tmp_path,
        '[[ble]]\nname = "kitchen"\naddress = "A4:C1:38:00:00:01"\n'
        '[[ble]]\nname = "garden"\naddress = "CB:B8:33:4C:88:4F"\nformat = "ruuvi"\n'
        '[[ble]]\nname = "cellar"\naddress = "A4:C1:38:2B:3C:4D"\nformat = "pvvx"\n',
    )
    line = gw.proc.wait_log(r"ble hci0: passive scanning")
    assert "AdvertisementMonitorManager1" in line  # says why
    bluez.add_device(
        "A4:C1:38:00:00:01", svc={BTHOME: bytes.fromhex("40016102ca0903bf13")}, uuids=[BTHOME]
    )
    bluez.add_device("CB:B8:33:4C:88:4F", "Ruuvi 884F", rssi=-75,
                     mfr={0x0499: bytes.fromhex(RUUVI_VALID)})  # fmt: skip
    bluez.add_device(
        "A4:C1:38:2B:3C:4D",
        svc={PVVX: pvvx.encode_pvvx(mac_bytes("A4:C1:38:2B:3C:4D"), 11.5, 70.25, 2900, 80, 1)},
    )
    gw.wait_value("kitchen", "temperature", 25.06)
    gw.wait_value("kitchen", "battery", 97)
    gw.wait_value("garden", "pressure", 1000.44)
    gw.wait_value("garden", "rssi", -75)
    gw.wait_value("cellar", "humidity", 70.25)
    reading = json.loads(gw.payloads("ledge/gw1/ble/kitchen/temperature")[0])
    assert reading["unit"] == "°C" and reading["timestamp"].endswith("+00:00")
    assert gw.payloads("ledge/gw1/ble/kitchen/status")[-1] == b"online"
    assert "RegisterMonitor" in bluez.calls("/org/bluez/hci0")
    assert "StartDiscovery" not in bluez.calls("/org/bluez/hci0")
    assert gw.adapter()["mode"] == "passive"


def test_the_health_report_carries_the_adapters_state(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """Broken, a gateway with BLE would publish no health reports at all (or reports
    without the adapter): the other BLE tests turn the reports off."""
    gw = start(
        gateways,
        tmp_path,
        '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:21"\nmin_interval = 0\n',
        health_interval=0.2,
    )
    bluez.add_device("A4:C1:38:00:00:21", svc={BTHOME: bthome_temp(1, 1000)})
    gw.wait_value("t", "temperature", 10.0)

    def reported() -> dict[str, Any]:
        for payload in reversed(gw.payloads("ledge/gw1/health")):
            body: dict[str, Any] = json.loads(payload)
            if body.get("ble", {}).get("adverts", 0) >= 1:
                return body
        return {}

    health = wait_for(reported, 10, "a health report counting the advert")
    assert {"timestamp", "dropped", "queued", "uptime"} <= health.keys()
    ble = health["ble"]
    assert (ble["adapter"], ble["state"], ble["mode"], ble["reason"]) == (
        "hci0",
        "scanning",
        "passive",
        "",
    )


def test_auto_without_passive_support_scans_actively_and_says_why(
    bluez_active_only: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    gw = start(gateways, tmp_path, '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:02"\n')
    line = gw.proc.wait_log(r"ble hci0: active scanning")
    assert "no AdvertisementMonitorManager1" in line
    bluez_active_only.add_device("A4:C1:38:00:00:02", svc={BTHOME: bthome_temp(1, 2000)})
    gw.wait_value("t", "temperature", 20.0)
    assert bluez_active_only.calls("/org/bluez/hci0")[:2] == [
        "SetDiscoveryFilter",
        "StartDiscovery",
    ]


def test_auto_scans_actively_for_a_device_that_sends_values_in_scan_responses(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """Govee sends its values in scan responses: with a Govee device configured, `auto`
    scans actively even where BlueZ offers passive scanning, and says why."""
    gw = start(
        gateways,
        tmp_path,
        '[[ble]]\nname = "garage"\naddress = "A4:C1:38:00:00:0E"\nformat = "govee"\n'
        '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:0F"\n',
    )
    line = gw.proc.wait_log(r"ble hci0: active scanning")
    assert "garage send values in scan responses" in line
    calls = bluez.calls("/org/bluez/hci0")
    assert "StartDiscovery" in calls and "RegisterMonitor" not in calls
    bluez.add_device(
        "A4:C1:38:00:00:0E", "GVH5075_000E", mfr={0xEC88: govee.encode_h5075(-3.5, 41.2, 77)}
    )
    gw.wait_value("garage", "temperature", -3.5)
    gw.wait_value("garage", "battery", 77)


def test_passive_configured_where_bluez_cannot_falls_back_loudly(
    bluez_active_only: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """scanning = "passive" on an adapter without it: a warning, then active scanning
    (the scanner is never left stopped)."""
    gw = start(
        gateways,
        tmp_path,
        '[bluetooth]\nscanning = "passive"\n[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:03"\n',
    )
    gw.proc.wait_log(r"passive scanning did not start .*trying active scanning")
    bluez_active_only.add_device("A4:C1:38:00:00:03", svc={BTHOME: bthome_temp(1, 1500)})
    gw.wait_value("t", "temperature", 15.0)


def test_fifty_devices_of_mixed_formats_and_unknown_devices_bounded(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    kinds = ["bthome", "pvvx", "ruuvi", "mibeacon", "atc1441"]
    devices = [(f"d{i:02d}", f"A4:C1:38:10:00:{i:02X}", kinds[i % 5]) for i in range(50)]
    config = "[bluetooth]\nmax_devices = 20\n" + "".join(
        f'[[ble]]\nname = "{n}"\naddress = "{a}"\nformat = "{k}"\nrssi = false\n'
        for n, a, k in devices
    )
    gw = start(gateways, tmp_path, config, sys_interval=0.3)
    for i, (_, address, kind) in enumerate(devices):
        temp = 10 + i / 10
        mac = mac_bytes(address)
        if kind == "bthome":
            bluez.add_device(address, svc={BTHOME: bthome_temp(1, round(temp * 100))})
        elif kind == "pvvx":
            bluez.add_device(address, svc={PVVX: pvvx.encode_pvvx(mac, temp, 50, 3000, 90, 1)})
        elif kind == "atc1441":
            bluez.add_device(address, svc={PVVX: pvvx.encode_atc(mac, temp, 50, 90, 3000, 1)})
        elif kind == "ruuvi":
            bluez.add_device(
                address,
                mfr={0x0499: ruuvi.encode(mac, temp, 50, 100000, (0, 0, 1000), 3000, 4, 0, 1)},
            )
        else:
            frame = mibeacon.encode(
                0x055B, 1, [(0x1004, struct.pack("<h", round(temp * 10)))], mac=mac
            )
            bluez.add_device(address, svc={MIBEACON: frame})
    for i in range(300):  # strangers: counted in a bounded LRU, never tracked
        bluez.add_device(
            f"11:22:33:44:{i // 256:02X}:{i % 256:02X}", svc={BTHOME: bthome_temp(1, 100)}
        )
    for i, (name, _, _) in enumerate(devices):
        gw.wait_value(name, "temperature", round(10 + i / 10, 2), timeout=10)
    wait_for(lambda: gw.sys("adapter/unknown evicted") == b"280", 10, "evicted strangers counted")
    assert gw.sys("adapter/unknown devices") == b"20"
    assert gw.sys("d00/readings") is not None


# ---------------------------------------------------------------- policy, presence


def test_publishing_policy_coalesces_a_chatty_sensor(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """40 adverts in a burst with a changing value: the first is published at once, the
    rest are held back and the latest goes out after min_interval; an unchanged value
    comes back as a heartbeat."""
    gw = start(
        gateways,
        tmp_path,
        '[[ble]]\nname = "chatty"\naddress = "A4:C1:38:00:00:04"\n'
        "min_interval = 1.5\nheartbeat = 3\nrssi = false\n",
    )
    path = bluez.add_device("A4:C1:38:00:00:04", svc={BTHOME: bthome_temp(0, 2000)})
    gw.wait_value("chatty", "temperature", 20.0)
    for n in range(1, 40):
        bluez.advertise(path, svc={BTHOME: bthome_temp(n, 2000 + n)})
    gw.wait_value("chatty", "temperature", 20.39, timeout=4)
    assert gw.values("chatty", "temperature") == [20.0, 20.39]  # not 40 messages
    wait_for(lambda: len(gw.values("chatty", "temperature")) == 3, 6, "heartbeat")
    assert gw.values("chatty", "temperature")[-1] == 20.39
    repeats_of_same = gw.values("chatty", "temperature")
    bluez.advertise(path, svc={BTHOME: bthome_temp(39, 2039)})  # the same packet again
    assert gw.values("chatty", "temperature") == repeats_of_same


def test_a_beacon_format_reports_presence_and_a_thermometer_does_not(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """Without ``presence`` set: a device of a beacon format (here by address, no
    identity) publishes home/away; a sensor publishes its values only."""
    gw = start(
        gateways,
        tmp_path,
        '[[ble]]\nname = "tag"\naddress = "4C:00:00:00:00:21"\nformat = "ibeacon"\n'
        '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:22"\nmin_interval = 0\n',
    )
    uuid = bytes.fromhex("b9407f30f5f8466eaff925556b57fe6d")
    bluez.add_device("4C:00:00:00:00:21", mfr={0x004C: encode_ibeacon(uuid, 1, 2, -59)})
    bluez.add_device("A4:C1:38:00:00:22", svc={BTHOME: bthome_temp(1, 1000)})
    gw.wait_value("tag", "presence", "home")
    gw.wait_value("t", "temperature", 10.0)
    assert gw.payloads("ledge/gw1/ble/t/presence") == []


def test_presence_of_a_beacon_by_identity_home_and_away(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    uuid = bytes.fromhex("b9407f30f5f8466eaff925556b57fe6d")
    gw = start(
        gateways,
        tmp_path,
        '[[ble]]\nname = "keys"\nbeacon = "b9407f30-f5f8-466e-aff9-25556b57fe6d/1/2"\n'
        "away_after = 1.5\n",
    )
    frame = encode_ibeacon(uuid, 1, 2, -59)
    bluez.add_device("4C:00:00:00:00:01", mfr={0x004C: frame})
    gw.wait_value("keys", "presence", "home")
    wait_for(lambda: gw.values("keys", "presence") == ["home", "away"], 5, "away after 1.5 s")
    assert gw.payloads("ledge/gw1/ble/keys/status")[-1] == b"offline"
    bluez.add_device("4C:00:00:00:00:02", mfr={0x004C: frame})  # the phone's new address
    wait_for(lambda: gw.values("keys", "presence") == ["home", "away", "home"], 5, "home again")
    assert gw.payloads("ledge/gw1/ble/keys/status")[-1] == b"online"
    bluez.add_device(
        "4C:00:00:00:00:03", mfr={0x004C: encode_ibeacon(uuid, 1, 3, -59)}
    )  # someone else's
    gw.proc.wait_log(r"ble: keys is home")
    assert gw.values("keys", "presence") == ["home", "away", "home"]


# ---------------------------------------------------------------- encryption


def test_encrypted_bthome_right_key_wrong_key_and_replay(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    good, bad = "A4:C1:38:00:00:05", "A4:C1:38:00:00:06"
    gw = start(
        gateways,
        tmp_path,
        f'[[ble]]\nname = "sealed"\naddress = "{good}"\nbindkey = "{KEY}"\nmin_interval = 0\n'
        f'[[ble]]\nname = "wrongkey"\naddress = "{bad}"\nbindkey = "{"00" * 16}"\n',
        sys_interval=0.3,
    )
    key = bytes.fromhex(KEY)

    def sealed(counter: int, centi: int) -> bytes:
        return bthome.encrypt(bthome_temp(counter, centi), mac_bytes(good), counter, key)

    path = bluez.add_device(good, svc={BTHOME: sealed(10, 2100)})
    gw.wait_value("sealed", "temperature", 21.0)
    old = sealed(11, 2200)
    bluez.advertise(path, svc={BTHOME: old})
    gw.wait_value("sealed", "temperature", 22.0)
    bluez.advertise(path, svc={BTHOME: sealed(12, 2300)})
    gw.wait_value("sealed", "temperature", 23.0)
    bluez.advertise(path, svc={BTHOME: old})  # a captured advert played back
    line = gw.proc.wait_log(
        r"sealed \(A4:C1:38:00:00:05\): replay: encryption counter 11 is not above 12"
    )
    assert "fcd2" in line and old.hex() in line  # the offending bytes
    assert gw.values("sealed", "temperature") == [21.0, 22.0, 23.0]
    wait_for(lambda: gw.sys("sealed/errors/replay") == b"1", 5, "replay counted")
    # the last counter again, other bytes (another packet id and value): a replay too
    equal = bthome.encrypt(bthome_temp(99, 2400), mac_bytes(good), 12, key)
    bluez.advertise(path, svc={BTHOME: equal})
    wait_for(lambda: gw.sys("sealed/errors/replay") == b"2", 5, "equal counter counted")
    assert gw.values("sealed", "temperature") == [21.0, 22.0, 23.0]
    # a wrong key: the first failure is tolerated (not a warning), the second is reported
    path = bluez.add_device(
        bad, svc={BTHOME: bthome.encrypt(bthome_temp(1, 100), mac_bytes(bad), 1, key)}
    )
    gw.proc.wait_log(r"INFO .*wrongkey: .*does not decrypt")
    assert "WARNING" not in "\n".join(line for line in gw.proc.lines if "wrongkey" in line)
    bluez.advertise(path, svc={BTHOME: bthome.encrypt(bthome_temp(2, 100), mac_bytes(bad), 2, key)})
    gw.proc.wait_log(
        r"WARNING .*wrongkey \(A4:C1:38:00:00:06\): wrong_key: BTHome advert does not decrypt"
    )
    wait_for(lambda: gw.sys("wrongkey/errors/wrong_key") == b"1", 5, "wrong key counted")
    assert gw.sys("wrongkey/errors/decrypt_retry") == b"1"
    assert gw.values("wrongkey", "temperature") == []


def test_adverts_that_fail_authentication_change_nothing_about_the_device(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """Someone copies an encrypted device's address: adverts under another key, plain
    ones, replayed and repeated ones are counted by reason and change no state -- the
    device is not online, has no RSSI, is not home. Only its own adverts do."""
    address = "A4:C1:38:00:00:0B"
    gw = start(
        gateways,
        tmp_path,
        f'[[ble]]\nname = "door"\naddress = "{address}"\nbindkey = "{KEY}"\n'
        "presence = true\naway_after = 1.5\nmin_interval = 0\n",
        sys_interval=0.3,
    )
    key, mac = bytes.fromhex(KEY), mac_bytes(address)

    def sealed(counter: int, centi: int, with_key: bytes = key) -> bytes:
        return bthome.encrypt(bthome_temp(counter, centi), mac, counter, with_key)

    def errors(reason: str) -> int:
        return int(gw.sys(f"door/errors/{reason}") or 0)

    forged = bytes(16)
    path = bluez.add_device(address, svc={BTHOME: sealed(1, 100, forged)})
    bluez.advertise(path, svc={BTHOME: sealed(2, 200, forged)})
    bluez.advertise(path, svc={BTHOME: sealed(2, 200, forged)}, rssi=-30)  # a repeat
    bluez.advertise(path, svc={BTHOME: bthome_temp(3, 300)})  # plain
    wait_for(
        lambda: (
            (errors("decrypt_retry"), errors("wrong_key"), errors("not_encrypted")) == (1, 1, 1)
        ),
        5,
        "the refusals counted by reason",
    )
    wait_for(lambda: gw.sys("door/repeats") == b"1", 5, "the repeat counted")
    for counter in (4, 5, 6):  # more of the same: counted, one log line a minute
        bluez.advertise(path, svc={BTHOME: sealed(counter, 100, forged)})
    wait_for(lambda: errors("wrong_key") == 4, 5, "every refusal counted")
    lines = [line for line in gw.proc.lines if "door (A4:C1:38:00:00:0B): wrong_key" in line]
    assert len(lines) == 1, lines

    def untouched() -> None:
        assert gw.payloads("ledge/gw1/ble/door/status") == [b"offline"]
        assert gw.values("door", "rssi") == [] and gw.values("door", "presence") == []
        assert gw.values("door", "temperature") == []
        assert gw.sys("door/present") == b"0" and gw.sys("door/adverts") == b"0"
        assert gw.sys("door/rssi") is None

    untouched()
    # the device itself: online, home, its values and RSSI
    recorded = sealed(9, 900)  # sent earlier, recorded by someone, never heard here
    bluez.advertise(path, svc={BTHOME: sealed(10, 1000)}, rssi=-55)
    gw.wait_value("door", "temperature", 10.0)
    gw.wait_value("door", "rssi", -55)
    gw.wait_value("door", "presence", "home")
    assert gw.payloads("ledge/gw1/ble/door/status")[-1] == b"online"
    wait_for(lambda: gw.values("door", "presence") == ["home", "away"], 5, "away after 1.5 s")
    assert gw.payloads("ledge/gw1/ble/door/status")[-1] == b"offline"
    # its last advert played back (the same bytes: a repeat), and an older recorded one
    bluez.advertise(path, svc={BTHOME: sealed(10, 1000)}, rssi=-40)
    wait_for(lambda: gw.sys("door/repeats") == b"2", 5, "the copy counted as a repeat")
    bluez.advertise(path, svc={BTHOME: recorded}, rssi=-40)
    # $SYS values go out in order (rssi before errors): once the replay is counted,
    # what it changed (or, here, did not) has arrived
    wait_for(lambda: errors("replay") == 1, 5, "the replay counted")
    assert gw.sys("door/present") == b"0"
    assert gw.values("door", "presence") == ["home", "away"]
    assert gw.payloads("ledge/gw1/ble/door/status")[-1] == b"offline"
    assert gw.values("door", "rssi") == [-55] and gw.sys("door/rssi") == b"-55"
    assert gw.values("door", "temperature") == [10.0] and gw.sys("door/adverts") == b"1"
    bluez.advertise(path, svc={BTHOME: sealed(11, 1100)}, rssi=-50)
    gw.wait_value("door", "presence", "home")
    gw.wait_value("door", "temperature", 11.0)
    assert gw.payloads("ledge/gw1/ble/door/status")[-1] == b"online"


def ledge_ble(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "ble", *args],
        capture_output=True, text=True, timeout=30, cwd=REPO, env=dict(os.environ), check=False,
    )  # fmt: skip


def test_the_last_counter_survives_restarts_and_only_the_explicit_reset_lowers_it(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """The counter is in data_dir: after a clean stop (written at shutdown) and after a
    kill -9 (written within a second with counter_save_interval = 0), recorded adverts
    are still replays. The device restarted its counter: refused until
    ``ledge ble reset-counter``, then its new counters are believed."""
    address = "A4:C1:38:00:00:0C"
    key, mac = bytes.fromhex(KEY), mac_bytes(address)
    data = tmp_path / "data"
    counters_file = data / "ble-counters.json"
    device = f'[[ble]]\nname = "door"\naddress = "{address}"\nbindkey = "{KEY}"\nmin_interval = 0\n'

    def sealed(counter: int, centi: int, with_key: bytes = key) -> bytes:
        return bthome.encrypt(bthome_temp(counter, centi), mac, counter, with_key)

    def run(save_interval: int, sub: str) -> Gateway:
        (tmp_path / sub).mkdir()
        return start(
            gateways,
            tmp_path / sub,
            f"[bluetooth]\ncounter_save_interval = {save_interval}\n{device}",
            sys_interval=0.3,
            args=("--data-dir", str(data)),
        )

    def saved() -> int | None:
        if not counters_file.exists():
            return None
        entry = json.loads(counters_file.read_text())["devices"].get(address)
        return None if entry is None else int(entry["counter"])

    recorded = [sealed(c, c * 100) for c in (50, 51, 52)]  # heard by someone, not here
    # 1. a clean stop writes the counter (the interval alone would not, for an hour)
    gw = run(3600, "one")
    path = bluez.add_device(address, svc={BTHOME: sealed(100, 1000)})
    gw.wait_value("door", "temperature", 10.0)
    assert saved() is None
    gw.stop()
    assert saved() == 100
    # 2. after the restart, recorded adverts are replays; a new counter is written at once
    gw = run(0, "two")
    gw.proc.wait_log(r"encryption counters of 1 device\(s\) read from .*ble-counters.json")
    for n, advert in enumerate(recorded, start=1):
        bluez.advertise(path, svc={BTHOME: advert})

        def counted(n: int = n) -> bool:
            return gw.sys("door/errors/replay") == str(n).encode()

        wait_for(counted, 5, f"replay {n}")
    assert gw.values("door", "temperature") == []
    bluez.advertise(path, svc={BTHOME: sealed(101, 1010)})
    gw.wait_value("door", "temperature", 10.1)
    wait_for(lambda: saved() == 101, 5, "counter 101 written")
    gw.kill()
    # 3. after a kill -9: still guarded (also the exact bytes of the last accepted advert)
    gw = run(0, "three")
    bluez.advertise(path, svc={BTHOME: sealed(101, 1010)})
    bluez.advertise(path, svc={BTHOME: recorded[0]})
    wait_for(lambda: gw.sys("door/errors/replay") == b"2", 5, "both refused")
    # 4. the device restarted its counter: refused until the explicit reset
    bluez.advertise(path, svc={BTHOME: sealed(1, 111)})
    wait_for(lambda: gw.sys("door/errors/replay") == b"3", 5, "the restarted device refused")
    assert gw.values("door", "temperature") == []
    out = ledge_ble(
        "reset-counter", address, "-c", str(gw.path), "--broker", f"127.0.0.1:{gw.proc.port}"
    )
    assert out.returncode == 0, out.stderr
    assert "door (A4:C1:38:00:00:0C): encryption counter reset (it was 101)" in out.stdout
    gw.proc.wait_log(r"WARNING .*door \(A4:C1:38:00:00:0C\): encryption counter reset on request")
    wait_for(lambda: saved() is None, 5, "the reset written")
    bluez.advertise(path, svc={BTHOME: sealed(2, 222)})
    gw.wait_value("door", "temperature", 2.22)
    wait_for(lambda: saved() == 2, 5, "the new counter written")
    bluez.advertise(path, svc={BTHOME: sealed(1, 111)})
    wait_for(lambda: gw.sys("door/errors/replay") == b"4", 5, "guarded again after the reset")
    assert gw.values("door", "temperature") == [2.22]
    # a device the config does not have: the command says so, nothing is sent
    out = ledge_ble("reset-counter", "nosuch", "-c", str(gw.path))
    assert out.returncode == 2 and "no [[ble]] device with address or name 'nosuch'" in out.stderr
    # 5. a reset published retained acts once; the store keeps it, a restart ignores it
    paho = Paho(gw.proc.port, "resetter").connect()
    # (not empty: an empty retained message would only clear the topic's retained one)
    paho.publish("ledge/gw1/ble/door/reset-counter", b"reset", 1, retain=True)
    paho.disconnect()
    gw.proc.wait_log(r"encryption counter reset on request \(it was 2\)")
    bluez.advertise(path, svc={BTHOME: sealed(3, 333)})
    gw.wait_value("door", "temperature", 3.33)
    wait_for(lambda: saved() == 3, 5, "counter 3 written")
    gw.stop()
    gw = run(0, "four")
    gw.proc.wait_log(r"encryption counters of 1 device\(s\) read")
    bluez.advertise(path, svc={BTHOME: sealed(2, 222)})
    wait_for(lambda: gw.sys("door/errors/replay") == b"1", 5, "still guarded after the restart")
    assert "reset on request" not in gw.proc.log
    gw.stop()
    # 6. a new bindkey is a new device for replay: its counter starts afresh
    other = "00112233445566778899aabbccddeeff"
    device = device.replace(KEY, other)
    gw = run(0, "five")
    gw.proc.wait_log(r"door \(A4:C1:38:00:00:0C\): the bindkey changed")
    bluez.advertise(path, svc={BTHOME: sealed(1, 333, bytes.fromhex(other))})
    gw.wait_value("door", "temperature", 3.33)


def test_the_counter_of_a_device_no_longer_configured_leaves_the_file(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """A device taken out of the config: its counter is dropped from the file at the
    next save, without waiting for another device's counter to change. Broken, the
    file would keep it until something else is written."""
    kept, removed = "A4:C1:38:00:00:0D", "A4:C1:38:00:00:0E"
    data = tmp_path / "data"
    data.mkdir()
    key = counters.fingerprint(bytes.fromhex(KEY))
    path = data / "ble-counters.json"
    counters.save(path, {kept: (key, 40), removed: (key, 7)})
    gw = start(
        gateways,
        tmp_path,
        "[bluetooth]\ncounter_save_interval = 0\n"
        f'[[ble]]\nname = "door"\naddress = "{kept}"\nbindkey = "{KEY}"\n',
        args=("--data-dir", str(data)),
    )
    gw.proc.wait_log(r"encryption counters of 1 device\(s\) read")
    wait_for(lambda: removed not in counters.load(path), 10, "the removed device dropped")
    assert counters.load(path) == {kept: (key, 40)}


# ---------------------------------------------------------------- metrics

HTTP = "[http]\nenabled = true\nport = 0\n"


def test_metrics_count_ble_readings_errors_by_reason_and_unknown_devices(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    plain, bad, stranger = "A4:C1:38:00:00:11", "A4:C1:38:00:00:12", "11:22:33:44:55:66"
    gw = start(
        gateways,
        tmp_path,
        f'{HTTP}[[ble]]\nname = "t"\naddress = "{plain}"\nmin_interval = 0\n'
        f'[[ble]]\nname = "wrongkey"\naddress = "{bad}"\nbindkey = "{"00" * 16}"\n',
        sys_interval=0.3,
        listeners=2,
    )
    path = bluez.add_device(plain, svc={BTHOME: bthome_temp(1, 1000)})
    gw.wait_value("t", "temperature", 10.0)
    bluez.advertise(path, svc={BTHOME: bthome_temp(2, 1100)})
    gw.wait_value("t", "temperature", 11.0)
    key = bytes.fromhex(KEY)  # not the key the gateway has for this device
    path = bluez.add_device(
        bad, svc={BTHOME: bthome.encrypt(bthome_temp(1, 100), mac_bytes(bad), 1, key)}
    )
    bluez.advertise(path, svc={BTHOME: bthome.encrypt(bthome_temp(2, 100), mac_bytes(bad), 2, key)})
    gw.proc.wait_log(r"WARNING .*wrongkey .*wrong_key")
    bluez.add_device(stranger, svc={BTHOME: bthome_temp(1, 100)})

    def settled() -> dict[str, float]:
        """The metrics once they and the latest $SYS values (which arrive one by one)
        agree on every advert and every reading."""
        m = gw.metrics()
        adverts = float(gw.sys("adapter/adverts") or "nan")
        readings = sum(float(gw.sys(f"{n}/readings") or "nan") for n in ("t", "wrongkey"))
        if m.get("ledge_ble_unknown_devices") != 1 or m["ledge_ble_adverts_total"] != adverts:
            return {}
        return m if m['ledge_sensor_readings_total{driver="ble"}'] == readings else {}

    m = wait_for(settled, 5, "the metrics to agree with $SYS")
    assert m['ledge_sensor_readings_total{driver="ble"}'] >= 2
    assert m['ledge_ble_errors_total{reason="wrong_key"}'] == 1
    assert m['ledge_ble_errors_total{reason="decrypt_retry"}'] == 1
    # the device with the wrong key was never heard: its adverts did not authenticate
    assert m['ledge_sensor_devices{driver="ble",state="present"}'] == 1
    assert m['ledge_sensor_devices{driver="ble",state="away"}'] == 1
    assert m['ledge_ble_adapter_state{adapter="hci0",state="scanning"}'] == 1
    assert m['ledge_ble_adapter_state{adapter="hci0",state="failed"}'] == 0
    assert not any("wrongkey" in series or plain in series for series in m)  # no device labels
    assert not promtool_problems(metrics_text(gw.proc.ports[1]))
    devices = {d["name"]: d for d in gw.status()["devices"] if d["driver"] == "ble"}
    assert devices["t"]["online"] is True
    temperature = next(v for v in devices["t"]["values"] if v["quantity"] == "temperature")
    assert temperature["value"] == 11.0


def test_metrics_show_adapter_resets_and_a_failed_adapter(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    gw = start(
        gateways,
        tmp_path,
        f"{HTTP}[bluetooth]\nwatchdog = 1\nwatchdog_backoff_max = 2\n"
        '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:13"\nmin_interval = 0\n',
        listeners=2,
    )
    path = bluez.add_device("A4:C1:38:00:00:13", svc={BTHOME: bthome_temp(1, 1000)})
    gw.wait_value("t", "temperature", 10.0)
    gw.proc.wait_log(r"ERROR .*ble hci0: adapter failed", 10)
    failed = 'ledge_ble_adapter_state{adapter="hci0",state="failed"}'
    m = gw.wait_metric(failed, 1, "the failure scraped")
    assert m['ledge_ble_adapter_resets_total{action="power_cycle",adapter="hci0"}'] == 1
    assert m['ledge_ble_adapter_resets_total{action="restart",adapter="hci0"}'] >= 1
    assert m['ledge_ble_adapter_failures_total{adapter="hci0"}'] == 1
    assert any(w.startswith("BLE adapter hci0 failed") for w in gw.status()["warnings"])
    bluez.advertise(path, svc={BTHOME: bthome_temp(2, 1100)})
    gw.wait_value("t", "temperature", 11.0)
    scanning = 'ledge_ble_adapter_state{adapter="hci0",state="scanning"}'
    gw.wait_metric(scanning, 1, "the recovery scraped")
    assert not any(w.startswith("BLE adapter") for w in gw.status()["warnings"])


def test_no_system_bus_is_a_failed_adapter_at_once(gateways: list[Gateway], tmp_path: Path) -> None:
    """The system bus cannot be reached: the adapter is reported failed with the reason
    at once (metrics, status page, the retained adapter message), not scanning."""
    gw = Gateway(
        tmp_path,
        f'{HTTP}[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:14"\n',
        listeners=2,
        env={"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus-here"},
    )
    gateways.append(gw)
    gw.proc.wait_log(r"ERROR .*ble hci0: adapter failed: cannot reach the system bus")
    m = gw.wait_metric('ledge_ble_adapter_state{adapter="hci0",state="failed"}', 1, "failed")
    assert m['ledge_ble_adapter_state{adapter="hci0",state="scanning"}'] == 0
    assert m['ledge_ble_adapter_failures_total{adapter="hci0"}'] == 1
    [warning] = [w for w in gw.status()["warnings"] if w.startswith("BLE adapter")]
    assert warning.startswith("BLE adapter hci0 failed: cannot reach the system bus")
    state = gw.adapter()
    assert state["state"] == "failed" and "system bus" in state["reason"]


def test_bluez_missing_at_start_is_failed_until_it_comes(
    system_bus: object, gateways: list[Gateway], tmp_path: Path
) -> None:
    """BlueZ is not running when the gateway starts: failed at once (even with the
    silence watchdog off); when BlueZ appears the scanner starts and adverts end it."""
    gw = Gateway(
        tmp_path,
        f"{HTTP}[bluetooth]\nwatchdog = 0\n"
        '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:15"\nmin_interval = 0\n',
        listeners=2,
    )
    gateways.append(gw)
    gw.proc.wait_log(r"ERROR .*ble hci0: adapter failed: the scanner did not start")
    gw.wait_metric('ledge_ble_adapter_state{adapter="hci0",state="failed"}', 1, "failed")
    # The fake owns org.bluez a moment before its template is loaded: a call in between
    # is answered with dbusmock's Python traceback as the D-Bus error text, which the
    # gateway logs as the reason its start failed (and then starts on InterfacesAdded).
    gw.proc.tracebacks = True
    bluez = FakeBlueZ()
    try:
        gw.proc.wait_log(r"BlueZ \(org.bluez\) is back: restarting the scanner")
        path = bluez.add_device("A4:C1:38:00:00:15", svc={BTHOME: bthome_temp(1, 1500)})
        keep_advertising(bluez, gw, path, bthome_temp(2, 1600), "t", 16.0)
        gw.wait_metric('ledge_ble_adapter_state{adapter="hci0",state="scanning"}', 1, "back")
        assert not [w for w in gw.status()["warnings"] if w.startswith("BLE adapter")]
    finally:
        bluez.terminate()


# ---------------------------------------------------------------- watchdog


def test_watchdog_escalates_when_adverts_stop_and_recovers(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    gw = start(
        gateways,
        tmp_path,
        "[bluetooth]\nwatchdog = 1\nwatchdog_backoff_max = 2\n"
        '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:07"\nmin_interval = 0\n',
    )
    with bluez.watch_properties("/org/bluez/hci0") as seen:
        path = bluez.add_device("A4:C1:38:00:00:07", svc={BTHOME: bthome_temp(1, 1000)})
        gw.wait_value("t", "temperature", 10.0)
        gw.proc.wait_log(r"no advert from a known device for \d+ s: restarting discovery", 5)
        gw.proc.wait_log(r"power-cycling the adapter", 5)
        gw.proc.wait_log(r"ERROR .*ble hci0: adapter failed", 5)
        wait_for(lambda: gw.adapter().get("state") == "failed", 5, "adapter reported failed")
        powered = re.findall(r'string "Powered"\s+variant\s+boolean (\w+)', seen())
    assert powered[:2] == ["false", "true"]  # the power cycle, over D-Bus
    calls = bluez.calls("/org/bluez/hci0")
    assert calls.count("RegisterMonitor") >= 3  # first start, restart, after the power cycle
    bluez.advertise(path, svc={BTHOME: bthome_temp(2, 1100)})
    gw.wait_value("t", "temperature", 11.0)
    gw.proc.wait_log(r"adverts again, the adapter works")
    state = gw.adapter()
    assert state["state"] == "scanning" and state["restarts"] >= 1 and state["power_cycles"] == 1
    assert state["failures"] == 1 and state["recoveries"] == 1


def test_bluez_killed_and_restarted(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    gw = start(
        gateways,
        tmp_path,
        "[bluetooth]\nwatchdog = 30\n"
        '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:08"\nmin_interval = 0\n',
    )
    bluez.add_device("A4:C1:38:00:00:08", svc={BTHOME: bthome_temp(1, 1000)})
    gw.wait_value("t", "temperature", 10.0)
    bluez.kill()
    gw.proc.wait_log(r"ERROR .*BlueZ \(org.bluez\) is gone")
    wait_for(lambda: gw.adapter().get("state") == "absent", 5, "adapter reported absent")
    bluez.spawn()
    gw.proc.wait_log(r"BlueZ \(org.bluez\) is back: restarting the scanner")
    path = bluez.add_device("A4:C1:38:00:00:08", svc={BTHOME: bthome_temp(2, 1200)})
    keep_advertising(bluez, gw, path, bthome_temp(2, 1200), "t", 12.0)
    wait_for(lambda: gw.adapter().get("state") == "scanning", 5, "scanning again")
    assert gw.adapter()["bluez_lost"] == 1


def test_adapter_removed_and_added_again(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    gw = start(
        gateways, tmp_path, '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:09"\nmin_interval = 0\n'
    )
    bluez.add_device("A4:C1:38:00:00:09", svc={BTHOME: bthome_temp(1, 1000)})
    gw.wait_value("t", "temperature", 10.0)
    bluez.remove_adapter()
    gw.proc.wait_log(r"ERROR .*adapter hci0 is gone")
    bluez.add_adapter()
    gw.proc.wait_log(r"adapter hci0 is back: restarting the scanner")
    wait_for(
        lambda: bluez.calls("/org/bluez/hci0").count("RegisterMonitor") >= 1,
        5,
        "scanner restarted on the new adapter",
    )
    path = bluez.add_device("A4:C1:38:00:00:09", svc={BTHOME: bthome_temp(2, 1300)})
    keep_advertising(bluez, gw, path, bthome_temp(2, 1300), "t", 13.0)
    assert gw.adapter()["adapter_lost"] == 1


# ---------------------------------------------------------------- GATT

BATTERY = "00002a19-0000-1000-8000-00805f9b34fb"
NUS = "6e400001-b5a3-f393-e0a9-e50e24dcca9e"
NUS_RX = "6e400002-b5a3-f393-e0a9-e50e24dcca9e"
NUS_TX = "6e400003-b5a3-f393-e0a9-e50e24dcca9e"


def test_gatt_read_notify_link_loss_reconnect_and_command(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    address = "D0:00:00:00:00:01"
    dev = bluez.add_device(address, "pico-sensor", rssi=-50, uuids=[NUS])
    bluez.beacon(dev, 50)
    bas = bluez.add_service(dev, 0x000A, "0000180f-0000-1000-8000-00805f9b34fb")
    bluez.add_characteristic(bas, 0x000B, BATTERY, ["read"], b"\x5a")
    nus = bluez.add_service(dev, 0x0010, NUS)
    rx = bluez.add_characteristic(nus, 0x0011, NUS_RX, ["write"])
    tx = bluez.add_characteristic(nus, 0x0013, NUS_TX, ["notify"])
    gw = start(
        gateways,
        tmp_path,
        f'[bluetooth]\nreconnect_min = 0.2\n[[ble]]\nname = "pico"\naddress = "{address}"\n'
        'format = "gatt"\n'
        "keep_connected = true\npoll_interval = 60\nmin_interval = 0\nrssi = false\n"
        f'command_uuid = "{NUS_RX}"\n'
        '[[ble.characteristics]]\nuuid = "2a19"\n'
        'fields = [{ quantity = "battery", unit = "%" }]\n'
        f'[[ble.characteristics]]\nuuid = "{NUS_TX}"\nmode = "notify"\n'
        'fields = [{ quantity = "temperature", type = "int16", scale = 0.01, unit = "°C" }]\n',
    )
    gw.wait_value("pico", "battery", 90, timeout=10)
    wait_for(lambda: gw.payloads("ledge/gw1/ble/pico/status")[-1:] == [b"online"], 5, "connected")
    wait_for(lambda: "StartNotify" in bluez.calls(tx), 5, "subscribed")
    bluez.notify(tx, struct.pack("<h", 2155))
    gw.wait_value("pico", "temperature", 21.55)
    # a command from MQTT is written to the device
    ctl = Paho(gw.proc.port, "ctl").connect()
    ctl.subscribe("ledge/gw1/ble/pico/command/result", 1)
    ctl.publish("ledge/gw1/ble/pico/command", b"LED ON", 1)
    [result] = ctl.wait_messages(1)
    assert json.loads(result.payload) == {"ok": True, "bytes": 6}
    assert bluez.writes(rx) == [b"LED ON"]
    # link loss: reported, then the device is connected again with backoff
    bluez.drop_connection(dev)
    gw.proc.wait_log(r"pico \(D0:00:00:00:00:01\): GATT link_lost")
    wait_for(lambda: bluez.calls(dev).count("Connect") == 2, 10, "reconnected")
    wait_for(
        lambda: gw.payloads("ledge/gw1/ble/pico/status")[-2:] == [b"offline", b"online"],
        5,
        "status follows the link",
    )
    bluez.notify(tx, struct.pack("<h", -450))
    gw.wait_value("pico", "temperature", -4.5)
    ctl.disconnect()


def test_lywsd03mmc_preset_session_and_a_device_that_does_not_answer(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """Stock Xiaomi thermometer: connect, subscribe, take one notification, disconnect.
    A second device refuses to connect: counted, logged, retried with backoff."""
    address, dead = "A4:C1:38:77:00:01", "A4:C1:38:77:00:02"
    dev = bluez.add_device(address, "LYWSD03MMC")
    bluez.beacon(dev, 50)
    svc = bluez.add_service(dev, 0x0020, "ebe0ccb0-7a0a-4b0c-8a1a-6ff2997da3a6")
    char = bluez.add_characteristic(svc, 0x0021, "ebe0ccc1-7a0a-4b0c-8a1a-6ff2997da3a6", ["notify"])
    other = bluez.add_device(dead, "LYWSD03MMC")
    bluez.beacon(other, 50)
    bluez.fail_method(other, "org.bluez.Device1", "Connect", "", "", "org.bluez.Error.Failed")
    gw = start(
        gateways,
        tmp_path,
        f"[bluetooth]\ngatt_timeout = 3\nreconnect_min = 0.2\n"
        f'[[ble]]\nname = "bedroom"\naddress = "{address}"\nformat = "lywsd03mmc"\nrssi = false\n'
        f'[[ble]]\nname = "attic"\naddress = "{dead}"\nformat = "lywsd03mmc"\n',
        sys_interval=0.3,
    )
    wait_for(lambda: "StartNotify" in bluez.calls(char), 10, "subscribed")
    bluez.notify(char, struct.pack("<hBH", 2345, 56, 2980))
    gw.wait_value("bedroom", "temperature", 23.45)
    gw.wait_value("bedroom", "humidity", 56)
    gw.wait_value("bedroom", "voltage", 2.98)
    wait_for(lambda: bluez.calls(dev)[-1:] == ["Disconnect"], 5, "disconnected after the session")
    gw.proc.wait_log(r"attic \(A4:C1:38:77:00:02\): GATT gatt_error")
    wait_for(
        lambda: int(gw.sys("attic/errors/gatt_error") or 0) >= 2, 10, "failures counted and retried"
    )


# ---------------------------------------------------------------- command line


def test_ledge_ble_scan_lists_devices_with_their_decoder(bluez: FakeBlueZ) -> None:
    path = bluez.add_device(
        "A4:C1:38:00:00:0A", "ATC_00000A", rssi=-48, svc={BTHOME: bytes.fromhex("40016102ca09")}
    )
    bluez.beacon(path, 50)
    ruuvi_path = bluez.add_device("CB:B8:33:4C:88:4F", "Ruuvi 884F", rssi=-70,
                                  mfr={0x0499: bytes.fromhex(RUUVI_VALID)})  # fmt: skip
    bluez.beacon(ruuvi_path, 50)
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "ble", "scan", "--seconds", "1", "--adapter", "hci0"],
        capture_output=True, text=True, timeout=30, cwd=REPO, env=dict(os.environ), check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    row = next(line for line in lines if "A4:C1:38:00:00:0A" in line)
    assert "ATC_00000A" in row and "-48" in row and "bthome" in row
    assert "temperature=25.06" in row and "battery=97" in row
    row = next(line for line in lines if "CB:B8:33:4C:88:4F" in line)
    assert "ruuvi" in row and "pressure=1000.44" in row
    toml = subprocess.run(
        [sys.executable, "-m", "gateway", "ble", "scan", "--seconds", "1", "--toml"],
        capture_output=True, text=True, timeout=30, cwd=REPO, env=dict(os.environ), check=False,
    )  # fmt: skip
    assert 'address = "A4:C1:38:00:00:0A"' in toml.stdout and 'format = "bthome"' in toml.stdout


def test_ledge_ble_scan_toml_with_a_bindkey_gives_a_config_that_decrypts(
    bluez: FakeBlueZ, gateways: list[Gateway], tmp_path: Path
) -> None:
    """``--bindkey ADDRESS=KEY --toml`` prints that device's bindkey: the output, pasted
    as is into a config, decodes the device's encrypted adverts."""
    address = "A4:C1:38:00:00:0D"
    key, mac = bytes.fromhex(KEY), mac_bytes(address)

    def sealed(counter: int, centi: int) -> bytes:
        return bthome.encrypt(bthome_temp(counter, centi), mac, counter, key)

    path = bluez.add_device(address, "SBHT-003C", svc={BTHOME: sealed(1, 1234)})
    bluez.beacon(path, 50)
    out = ledge_ble(
        "scan", "--seconds", "1", "--bindkey", f"{address.lower()}={KEY.upper()}", "--toml"
    )
    assert out.returncode == 0, out.stderr
    assert "# temperature=12.34°C" in out.stdout  # decrypted while scanning
    assert f'bindkey = "{KEY}"' in out.stdout
    gw = start(gateways, tmp_path, out.stdout)
    bluez.advertise(path, svc={BTHOME: sealed(2, 2345)})
    gw.wait_value("sbht_003c_000d", "temperature", 23.45)
    assert not [line for line in gw.proc.lines if "_key" in line]  # no_key, wrong_key


def loaded_modules(code: str) -> str:
    """What ``code``, run in a fresh interpreter, prints (the modules it lists)."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_gateway_without_ble_never_loads_bleak() -> None:
    """The default config's process imports neither bleak, dbus-fast nor cryptography."""
    code = (
        "import asyncio, sys\n"
        "from gateway.app.config import Config\n"
        "from gateway.app.root import Gateway\n"
        "async def main():\n"
        "    from gateway.app.config import Overrides\n"
        "    gw = Gateway(Overrides(listen=(('127.0.0.1', 0),)).apply(Config()).to_runtime())\n"
        "    await gw.start()\n"
        "    await gw.close()\n"
        "asyncio.run(main())\n"
        "heavy = ('bleak', 'dbus_fast', 'cryptography')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    assert loaded_modules(code) == "[]"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            '[[ble]]\nname = "a"\naddress = "A4:C1:38"\n',
            r"ble\[0\]\.address \(line 3\): .*not a Bluetooth address",
        ),
        (
            '[[ble]]\nname = "a"\naddress = "A4:C1:38:00:00:01"\nbindkey = "abc"\n',
            r"ble\[0\]\.bindkey \(line 4\): .*32 hex digits",
        ),
        ('[[ble]]\nname = "a"\n', r"ble\[0\] \(line 1\): .*address"),
        (
            '[[ble]]\nname = "a"\naddress = "A4:C1:38:00:00:01"\nformat = "ruuvi"\nbindkey = "'
            + KEY
            + '"\n',
            r"bindkey applies to",
        ),
        ('[bluetooth]\nscanning = "sometimes"\n', r"bluetooth\.scanning \(line 2\)"),
        (
            '[[ble]]\nname = "a"\naddress = "A4:C1:38:00:00:01"\n'
            '[[ble]]\nname = "a"\naddress = "A4:C1:38:00:00:02"\n',
            r"two BLE devices are named 'a'",
        ),
    ],
)
def test_ble_config_errors_name_key_path_and_line(config: str, expected: str) -> None:
    import re

    from gateway.app.config import parse_config
    from gateway.app.runtime import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config(config, "t.toml")
    assert re.search(expected, str(info.value)), str(info.value)


def test_building_the_command_line_loads_no_ble_decoder() -> None:
    """``ledge run`` builds the whole parser, ``ble scan`` included: the decoders (and
    the journal's operations, needed only with a store) stay unloaded on the default
    config, which keeps its idle memory."""
    code = (
        "import asyncio, sys\n"
        "from gateway.cli.main import build_parser\n"
        "from gateway.app.config import Config, Overrides\n"
        "from gateway.app.root import Gateway\n"
        "build_parser()\n"
        "async def main():\n"
        "    gw = Gateway(Overrides(listen=(('127.0.0.1', 0),)).apply(Config()).to_runtime())\n"
        "    await gw.start()\n"
        "    await gw.close()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules\n"
        "    if m.startswith('drivers.parsers.ble') or m == 'gateway.broker.journal'))\n"
    )
    assert loaded_modules(code) == "[]"
