"""``python -m bench.ble``: BLE decoders beside the reference decoders, and adverts end to
end through bleak and a fake BlueZ into readings at an MQTT subscriber.

1. Decoders: microseconds per advert per format, Ledge's (the per-device decoder with
   its duplicate and replay checks) beside the reference decoder from PyPI, in the
   same process and run, on the same adverts (each advert distinct).
2. End to end: N devices advertising BTHome at R adverts/s in total through the fake
   BlueZ (python-dbusmock on a private D-Bus; no Bluetooth hardware here) and the real
   bleak into ``ledge run``; adverts emitted by the fake and readings received by a
   subscriber are both counted, and the gateway's CPU share measured.
3. The highest sustained rate before any advert is lost (rates doubling).
4. RSS of the gateway with BLE configured, minus the default config's: one plain and
   one encrypted BTHome device (each after its first reading), and N devices.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.procs import cpu_seconds, rss_kib
from drivers.ble.tracker import DeviceDecoder
from drivers.parsers.ble import FORMATS, bthome, govee, mibeacon, pvvx, ruuvi, switchbot
from drivers.parsers.ble.base import Context, mac_bytes
from drivers.parsers.ble.ccm import Cipher

ADDRESS = "A4:C1:38:0F:1E:2D"
KEY = bytes.fromhex("231d39c1d7cc1ab1aee224cd096db932")
N_ADVERTS = 1000


def adverts(fmt: str) -> tuple[list[tuple[dict[str, bytes], dict[int, bytes]]], str, bytes | None]:
    """N distinct adverts of a format (what a sensor sends over time), its name, key."""
    mac = mac_bytes(ADDRESS)
    out: list[tuple[dict[str, bytes], dict[int, bytes]]] = []
    for i in range(N_ADVERTS):
        t = 2000 + i
        if fmt == "bthome":
            data = bthome.encode(
                [
                    (0x01, bytes([90])),
                    (0x02, struct.pack("<h", t)),
                    (0x03, struct.pack("<H", 5000)),
                ],
                packet_id=i & 0xFF,
            )
            out.append(({bthome.UUID: data}, {}))
        elif fmt == "bthome-encrypted":
            data = bthome.encode(
                [
                    (0x01, bytes([90])),
                    (0x02, struct.pack("<h", t)),
                    (0x03, struct.pack("<H", 5000)),
                ],
                packet_id=i & 0xFF,
            )
            out.append(({bthome.UUID: bthome.encrypt(data, mac, i + 1, KEY)}, {}))
        elif fmt in ("mibeacon", "mibeacon-encrypted"):
            frame = mibeacon.encode(
                0x055B, i & 0xFF, [(0x100D, struct.pack("<hH", t // 10, 500))], mac=mac
            )
            if fmt == "mibeacon-encrypted":
                frame = mibeacon.encrypt(frame, mac, i >> 8, KEY)
            out.append(({mibeacon.UUID: frame}, {}))
        elif fmt == "ruuvi":
            data = ruuvi.encode(mac, t / 100, 50, 100000, (0, 0, 1000), 3000, 4, 0, i)
            out.append(({}, {ruuvi.COMPANY_ID: data}))
        elif fmt == "govee":
            out.append(({}, {0xEC88: govee.encode_h5075((t % 600) / 10, 50.0, 80)}))
        elif fmt == "switchbot":
            out.append(({switchbot.UUIDS[0]: switchbot.encode("T", (t % 400) / 10, 50, 90)}, {}))
        elif fmt == "pvvx":
            out.append(({pvvx.UUID: pvvx.encode_pvvx(mac, t / 100, 50, 3000, 90, i & 0xFF)}, {}))
    key = KEY if fmt.endswith("encrypted") else None
    name = {"govee": "GVH5075_1E2D"}.get(fmt, "")
    return out, name, key


def time_per_advert(run: Callable[[], None], repeat: int) -> float:
    """Median microseconds per advert of ``run`` (which handles N_ADVERTS)."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) / N_ADVERTS * 1e6)
    return statistics.median(samples)


def decoder_rows(repeat: int) -> list[tuple[str, float, float | None, str]]:
    from tests.support.reference import service_info

    rows = []
    cases = [
        ("bthome", "bthome", "bthome-ble"),
        ("bthome-encrypted", "bthome", "bthome-ble"),
        ("mibeacon", "mibeacon", "xiaomi-ble"),
        ("mibeacon-encrypted", "mibeacon", "xiaomi-ble"),
        ("ruuvi", "ruuvi", "ruuvitag-ble"),
        ("govee", "govee", "govee-ble"),
        ("switchbot", "switchbot", "pySwitchbot"),
        ("pvvx", "pvvx", ""),
    ]
    for label, fmt_name, ref in cases:
        batch, name, key = adverts(label)
        fmt = FORMATS[fmt_name]

        def ours(
            batch: Any = batch, name: str = name, key: bytes | None = key, fmt: Any = fmt
        ) -> None:
            dec = DeviceDecoder(Context(ADDRESS, cipher=Cipher(key) if key else None), fmt)
            for i, (svc, mfr) in enumerate(batch):
                out = dec.feed(svc, mfr, name, float(i))
                assert out is not None and out.samples and not out.problems, out

        ours_us = time_per_advert(ours, repeat)
        theirs_us = None
        if ref:
            infos = [service_info(ADDRESS, svc, mfr, name) for svc, mfr in batch]
            theirs_fn = reference_runner(fmt_name, infos, key, batch, name)
            theirs_us = time_per_advert(theirs_fn, repeat)
        rows.append((label, ours_us, theirs_us, ref))
    return rows


def reference_runner(
    fmt: str, infos: list[Any], key: bytes | None, batch: Any, name: str
) -> Callable[[], None]:
    ref: Any
    if fmt == "bthome":
        from bthome_ble import BTHomeBluetoothDeviceData as ref
    elif fmt == "mibeacon":
        from xiaomi_ble import XiaomiBluetoothDeviceData as ref
    elif fmt == "ruuvi":
        from ruuvitag_ble import RuuvitagBluetoothDeviceData as ref
    elif fmt == "govee":
        from govee_ble import GoveeBluetoothDeviceData as ref
    else:
        from bleak.backends.device import BLEDevice
        from bleak.backends.scanner import AdvertisementData
        from switchbot.adv_parser import parse_advertisement_data

        device = BLEDevice(ADDRESS, None, None)
        advs = [AdvertisementData(None, m, s, list(s), None, -60, ()) for s, m in batch]

        def switchbot_run() -> None:
            for adv in advs:
                assert parse_advertisement_data(device, adv) is not None

        return switchbot_run

    def run() -> None:
        parser = ref(key) if fmt in ("bthome", "mibeacon") else ref()
        for info in infos:
            update = parser.update(info)
            assert update.entity_values, update

    return run


# ---------------------------------------------------------------- end to end


def _gateway_config(path: Path, devices: list[str], bindkey: bytes | None = None) -> None:
    text = '[gateway]\nid = "bench"\nhealth_interval = 0\n'
    text += "[bluetooth]\nwatchdog = 0\nqueue_size = 100000\n"
    for i, address in enumerate(devices):
        text += f'[[ble]]\nname = "d{i:03d}"\naddress = "{address}"\nformat = "bthome"\n'
        text += "min_interval = 0\nheartbeat = 0\nrssi = false\n"
        if bindkey is not None:
            text += f'bindkey = "{bindkey.hex()}"\n'
    path.write_text(text)


def one_device_rss(bluez: Any, tmpdir: Path, bindkey: bytes | None) -> int:
    """RSS of a gateway with one BTHome device (encrypted with ``bindkey``), once its
    first reading arrived (the decoder and, encrypted, the cipher have run)."""
    address = "A4:C1:38:21:00:01" if bindkey is None else "A4:C1:38:21:00:02"
    label = "one-plain" if bindkey is None else "one-encrypted"
    config = tmpdir / f"{label}.toml"
    _gateway_config(config, [address], bindkey)
    proc, port = _start_ledge(config, tmpdir / f"{label}.log")
    counter = Counter(port)
    try:
        time.sleep(1)  # the scanner is up (the first advert would be lost before)
        data = bthome.encode([(0x02, struct.pack("<h", 2150))], packet_id=1)
        if bindkey is not None:
            data = bthome.encrypt(data, mac_bytes(address), 1, bindkey)
        bluez.add_device(address, svc={bthome.UUID: data})
        deadline = time.monotonic() + 10
        while counter.count < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        if counter.count < 1:
            raise RuntimeError(f"no reading from the {label} device")
        time.sleep(1)
        return rss_kib(proc.pid) or 0
    finally:
        counter.close()
        proc.terminate()
        proc.wait(10)


def _start_ledge(config: Path | None, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    from bench.procs import free_port, port_open

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gateway",
        "run",
        "--listen",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
    ]
    if config is not None:
        cmd += ["--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    deadline = time.monotonic() + 20
    while not port_open(port):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"ledge did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, port


class Counter:
    """An MQTT subscriber counting readings (paho, in its own thread)."""

    def __init__(self, port: int) -> None:
        from tests.support.clients import Paho

        self.client = Paho(port, "bench-ble-sub").connect()
        self.client.subscribe("ledge/bench/ble/+/temperature", 0)

    @property
    def count(self) -> int:
        return len(self.client.messages)

    def close(self) -> None:
        self.client.disconnect()


def run_traffic(
    bluez: Any, paths: list[str], pid: int, counter: Counter, rate: float, seconds: float
) -> dict[str, float]:
    before = counter.count
    cpu0, t0 = cpu_seconds(pid) or 0.0, time.monotonic()
    mock_pid = bluez.mock.process.pid
    mock0 = cpu_seconds(mock_pid) or 0.0
    bluez.start_traffic(paths, rate, seconds)
    expected = int(rate * seconds)
    deadline = t0 + seconds + 30
    while bluez.traffic_count() < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    emit_end = time.monotonic()
    sent = bluez.traffic_count()
    while counter.count - before < sent and time.monotonic() < emit_end + 5:
        time.sleep(0.05)
    wall = time.monotonic() - t0
    cpu = (cpu_seconds(pid) or 0.0) - cpu0
    return {
        "rate": rate,
        "sent": sent,
        "received": counter.count - before,
        "emit_seconds": emit_end - t0,
        "cpu_share": cpu / (emit_end - t0),
        "cpu_us_per_advert": cpu / max(sent, 1) * 1e6,
        "mock_cpu_share": ((cpu_seconds(mock_pid) or 0.0) - mock0) / wall,
    }


def end_to_end(
    devices: int, rate: float, seconds: float, ramp: list[float], ramp_seconds: float
) -> dict[str, Any]:
    from dbusmock.testcase import BusType, PrivateDBus

    from tests.support.bluez import FakeBlueZ

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, PrivateDBus(BusType.SYSTEM):
        tmpdir = Path(tmp)
        default, _ = _start_ledge(None, tmpdir / "default.log")
        time.sleep(2)
        out["rss_default_kib"] = rss_kib(default.pid)
        default.terminate()
        default.wait(10)
        # sensors without BLE (one serial device): the Reading model's pydantic
        serial = tmpdir / "serial.toml"
        serial.write_text('[[serial]]\nname = "s"\npath = "/nonexistent/tty"\n')
        sensors, _ = _start_ledge(serial, tmpdir / "serial.log")
        time.sleep(2)
        out["rss_serial_kib"] = rss_kib(sensors.pid)
        sensors.terminate()
        sensors.wait(10)
        bluez = FakeBlueZ()
        out["rss_one_plain_kib"] = one_device_rss(bluez, tmpdir, None)
        out["rss_one_encrypted_kib"] = one_device_rss(bluez, tmpdir, KEY)
        addresses = [f"A4:C1:38:20:{i // 256:02X}:{i % 256:02X}" for i in range(devices)]
        paths = [bluez.add_device(a, svc={}) for a in addresses]
        config = tmpdir / "ble.toml"
        _gateway_config(config, addresses)
        proc, port = _start_ledge(config, tmpdir / "ble.log")
        counter = Counter(port)
        try:
            time.sleep(2)
            out["rss_ble_idle_kib"] = rss_kib(proc.pid)
            out["steady"] = run_traffic(bluez, paths, proc.pid, counter, rate, seconds)
            out["rss_ble_after_kib"] = rss_kib(proc.pid)
            out["ramp"] = []
            for r in ramp:
                row = run_traffic(bluez, paths, proc.pid, counter, r, ramp_seconds)
                out["ramp"].append(row)
                print(f"  ramp {r:>6.0f}/s: sent {row['sent']}, received {row['received']}, "
                      f"gateway CPU {row['cpu_share']:.0%}", flush=True)  # fmt: skip
                if row["received"] < row["sent"]:
                    break
        finally:
            counter.close()
            proc.terminate()
            proc.wait(10)
            bluez.terminate()
        out["log_warnings"] = [
            line
            for line in (tmpdir / "ble.log").read_text().splitlines()
            if "WARNING" in line or "ERROR" in line
        ][:5]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ble", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=7, help="timing repetitions per decoder (median)"
    )
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument(
        "--rate", type=float, default=50.0, help="adverts per second in total (steady run)"
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the steady run")
    parser.add_argument(
        "--ramp", default="100,200,400,800,1600,3200", help="rates to try, until one loses"
    )
    parser.add_argument("--ramp-seconds", type=float, default=10.0)
    parser.add_argument("--skip-e2e", action="store_true")
    args = parser.parse_args(argv)

    print(f"== decoders: microseconds per advert (median of {args.repeat} x {N_ADVERTS} adverts)")
    print(f"{'format':<20} {'Ledge':>8} {'reference':>10} {'ratio':>7}  reference")
    for label, ours, theirs, ref in decoder_rows(args.repeat):
        ratio = f"{theirs / ours:6.1f}x" if theirs else "      -"
        ref_text = f"{theirs:10.1f}" if theirs else f"{'-':>10}"
        print(f"{label:<20} {ours:8.1f} {ref_text} {ratio}  {ref or '(none on PyPI)'}")
    if args.skip_e2e:
        return 0
    print(f"== end to end: {args.devices} devices, {args.rate:g} adverts/s for {args.seconds:g} s "
          "(fake BlueZ -> bleak -> Ledge -> MQTT subscriber)", flush=True)  # fmt: skip
    result = end_to_end(
        args.devices,
        args.rate,
        args.seconds,
        [float(r) for r in args.ramp.split(",") if r],
        args.ramp_seconds,
    )
    s = result["steady"]
    sent, got = s["sent"], s["received"]
    print(f"sent by the fake {sent}, readings received {got}, lost {sent - got}")
    cpu, per = s["cpu_share"], s["cpu_us_per_advert"]
    print(f"gateway CPU {cpu:.1%} of one core ({per:.0f} µs per advert)", end="")
    print(f", fake BlueZ CPU {s['mock_cpu_share']:.1%}")
    lossless = [r for r in result["ramp"] if r["received"] >= r["sent"]]
    if lossless:
        best = lossless[-1]
        rate = best["sent"] / best["emit_seconds"]
        print(f"highest sustained rate without loss: {rate:.0f} adverts/s", end="")
        print(f" (asked {best['rate']:.0f}/s; gateway CPU {best['cpu_share']:.0%})")
    last = result["ramp"][-1] if result["ramp"] else None
    if last is not None and last["received"] < last["sent"]:
        emitted = last["sent"] / last["emit_seconds"]
        lost = last["sent"] - last["received"]
        print(f"first loss at {last['rate']:.0f}/s asked ({emitted:.0f}/s emitted): ", end="")
        print(f"{lost} of {last['sent']} lost")
    mib = 1024
    d, serial = result["rss_default_kib"] / mib, result["rss_serial_kib"] / mib
    idle, after = result["rss_ble_idle_kib"] / mib, result["rss_ble_after_kib"] / mib
    print(
        f"RSS: default config {d:.1f} MiB; one serial device {serial:.1f} MiB (+{serial - d:.1f})"
    )
    plain, sealed = result["rss_one_plain_kib"] / mib, result["rss_one_encrypted_kib"] / mib
    print(f"RSS: one BTHome device {plain:.1f} MiB (+{plain - d:.1f}); one encrypted ", end="")
    print(f"{sealed:.1f} MiB (+{sealed - d:.1f}; the cipher +{sealed - plain:.1f})")
    print(f"RSS: {args.devices} BLE devices {idle:.1f} MiB idle (+{idle - d:.1f}), ", end="")
    print(f"{after:.1f} MiB after the steady run (+{after - d:.1f}); BLE beyond the serial")
    print(f"     gateway's Reading model: +{idle - serial:.1f} MiB")
    for line in result["log_warnings"]:
        print("gateway log:", line)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
