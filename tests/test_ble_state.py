"""The pure parts of BLE: per-device decoding state, publishing policy, presence and the
watchdog, driven with a fake clock."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from drivers.ble import counters
from drivers.ble.policy import Presence, Publisher
from drivers.ble.tracker import PACKET_WINDOW, DeviceDecoder
from drivers.ble.watchdog import FIRST_RETRY, Action, State, Watchdog
from drivers.parsers import Sample
from drivers.parsers.ble import FORMATS, bthome, mibeacon
from drivers.parsers.ble.base import Context, mac_bytes
from drivers.parsers.ble.ccm import Cipher

ADDRESS = "A4:C1:38:00:00:01"
KEY = bytes.fromhex("231d39c1d7cc1ab1aee224cd096db932")


def temp(packet: int, centi: int) -> bytes:
    return bthome.encode([(0x02, struct.pack("<h", centi))], packet_id=packet)


def feed(dec: DeviceDecoder, data: bytes, now: float) -> tuple[list[object], list[str], int]:
    out = dec.feed({bthome.UUID: data}, {}, "", now)
    assert out is not None
    return [s.value for s in out.samples], [p.reason for p in out.problems], out.repeats


def test_repeats_of_one_packet_count_once() -> None:
    dec = DeviceDecoder(Context(ADDRESS), FORMATS["bthome"])
    assert feed(dec, temp(1, 2000), 0.0) == ([20.0], [], 0)
    assert feed(dec, temp(1, 2000), 0.5) == ([], [], 1)  # the same bytes (BlueZ merges)
    assert feed(dec, temp(2, 2100), 1.0) == ([21.0], [], 0)
    # the same packet id with other bytes inside the window: a repeat ...
    assert feed(dec, temp(2, 2200), 1.5) == ([], [], 1)
    # ... and after the window a new packet that happens to reuse the id
    assert feed(dec, temp(2, 2300), 1.5 + PACKET_WINDOW) == ([23.0], [], 0)
    # BlueZ re-reports the last data with every RSSI change, long after: still a repeat
    assert feed(dec, temp(2, 2300), 100.0) == ([], [], 1)


def test_an_auto_device_is_recognised_once_and_ignores_other_elements() -> None:
    dec = DeviceDecoder(Context(ADDRESS))
    assert dec.feed({}, {0x1234: b"\x00"}, "", 0.0) is None  # nothing it knows yet
    assert feed(dec, temp(1, 500), 1.0)[0] == [5.0]
    assert dec.format is FORMATS["bthome"]


def sealed(counter: int, centi: int, key: bytes = KEY) -> bytes:
    return bthome.encrypt(temp(counter & 0xFF, centi), mac_bytes(ADDRESS), counter, key)


def keyed() -> DeviceDecoder:
    return DeviceDecoder(Context(ADDRESS, cipher=Cipher(KEY)), FORMATS["bthome"])


def test_an_encrypted_advert_is_accepted_only_with_a_counter_above_the_last() -> None:
    dec = keyed()
    assert feed(dec, sealed(100, 1000), 0)[:2] == ([10.0], [])
    assert feed(dec, sealed(101, 1010), 10)[:2] == ([10.1], [])
    assert dec.counter == 101


def test_an_equal_counter_is_a_replay() -> None:
    """The same counter with other bytes (the packet id changed, so it is no repeat of
    the same bytes): refused, and the counter stays."""
    dec = keyed()
    assert feed(dec, sealed(100, 1000), 0)[:2] == ([10.0], [])
    equal = bthome.encrypt(temp(7, 1111), mac_bytes(ADDRESS), 100, KEY)
    assert feed(dec, equal, 10)[:2] == ([], ["replay"])
    assert dec.counter == 100


def test_a_smaller_counter_is_a_replay() -> None:
    dec = keyed()
    assert feed(dec, sealed(100, 1000), 0)[:2] == ([10.0], [])
    assert feed(dec, sealed(99, 990), 10)[:2] == ([], ["replay"])
    assert feed(dec, sealed(0, 0), 20)[:2] == ([], ["replay"])
    assert dec.counter == 100


def test_recorded_consecutive_adverts_never_roll_the_counter_back() -> None:
    """Three authenticated adverts with growing counters below the last (recorded from
    the device, or sent by the device after it restarted its counter) are refused, as is
    any longer run; only the explicit reset lets lower counters in again."""
    dec = keyed()
    recorded = [sealed(c, c * 10) for c in (1, 2, 3)]
    assert [feed(dec, data, n)[:2] for n, data in enumerate(recorded)] == [
        ([0.1], []),
        ([0.2], []),
        ([0.3], []),
    ]
    assert feed(dec, sealed(500, 5000), 10)[:2] == ([50.0], [])
    for n, data in enumerate(recorded * 3):  # played back in order, three times over
        assert feed(dec, data, 20 + n)[:2] == ([], ["replay"])
    assert dec.counter == 500
    assert dec.reset_counter() == 500
    assert dec.counter is None
    assert feed(dec, recorded[0], 40)[:2] == ([0.1], [])  # after the reset: believed
    assert feed(dec, recorded[1], 41)[:2] == ([0.2], [])
    assert feed(dec, recorded[0], 42)[:2] == ([], ["replay"])  # and guarded again
    assert dec.counter == 2


def test_only_a_fresh_authenticated_element_marks_the_advert_authenticated() -> None:
    dec = keyed()
    out = dec.feed({bthome.UUID: sealed(5, 50)}, {}, "", 0)
    assert out is not None and out.authenticated
    out = dec.feed({bthome.UUID: sealed(5, 50)}, {}, "", 1)  # BlueZ re-reports it
    assert out is not None and out.repeats == 1 and not out.authenticated
    out = dec.feed({bthome.UUID: sealed(4, 40)}, {}, "", 2)
    assert out is not None and not out.authenticated  # replayed
    out = dec.feed({bthome.UUID: sealed(6, 60, bytes(16))}, {}, "", 3)
    assert out is not None and not out.authenticated  # another key
    out = dec.feed({bthome.UUID: temp(9, 90)}, {}, "", 4)
    assert out is not None and not out.authenticated  # plain, from a device with a key
    assert [p.reason for p in out.problems] == ["not_encrypted"]


def test_one_decryption_failure_is_tolerated_then_reported() -> None:
    dec = DeviceDecoder(Context(ADDRESS, cipher=Cipher(KEY)), FORMATS["bthome"])
    wrong = bytes(16)
    assert feed(dec, sealed(1, 100, wrong), 0)[1] == ["decrypt_retry"]
    assert feed(dec, sealed(2, 100, wrong), 10)[1] == ["wrong_key"]
    assert feed(dec, sealed(3, 300), 20)[:2] == ([3.0], [])  # a good one resets the count
    assert feed(dec, sealed(4, 100, wrong), 30)[1] == ["decrypt_retry"]


def test_policy_on_change_at_most_every_interval_and_heartbeat() -> None:
    pub = Publisher(min_interval=10, heartbeat=60)
    t = Sample("temperature", 20.0, "°C")
    assert pub.offer([t], (), 0) == [t]
    assert pub.offer([t], (), 1) == []  # unchanged
    t2, t3 = Sample("temperature", 20.5, "°C"), Sample("temperature", 21.0, "°C")
    assert pub.offer([t2], (), 2) == []  # changed, too soon: held
    assert pub.offer([t3], (), 3) == []  # the newer value replaces it
    assert pub.due(9.9, True) == []
    assert pub.due(10, True) == [t3]  # the latest, once the interval has passed
    assert pub.due(69.9, True) == []
    assert pub.due(70, True) == [Sample("temperature", 21.0, "°C")]  # heartbeat
    assert pub.due(200, False) == []  # no heartbeat for an absent device
    press = Sample("button", "press", "")
    assert pub.offer([press], {"button"}, 200) == [press]
    assert pub.offer([press], {"button"}, 200.1) == [press]  # events always go out


def test_a_held_change_that_reverts_is_not_sent() -> None:
    pub = Publisher(min_interval=10, heartbeat=0)
    assert len(pub.offer([Sample("x", 1)], (), 0)) == 1
    assert pub.offer([Sample("x", 2)], (), 1) == []
    assert pub.offer([Sample("x", 1)], (), 2) == []
    assert pub.due(20, True) == []


def test_presence() -> None:
    p = Presence(away_after=30)
    p.start()
    assert p.home is False
    assert p.heard(0) is True
    assert p.heard(10) is False
    assert p.check(39.9) is False
    assert p.check(40) is True and p.home is False
    assert p.check(100) is False
    assert p.heard(101) is True


def state(w: Watchdog) -> State:
    return w.state


def test_watchdog_escalates_step_by_step_and_recovers() -> None:
    w = Watchdog(silence=60, backoff_max=240)
    w.start(0)
    w.heard(10)
    assert w.tick(69) is None
    assert w.tick(70) is Action.RESTART and state(w) is State.RESTARTED
    assert w.tick(129) is None
    assert w.tick(130) is Action.POWER_CYCLE
    assert w.tick(190) is Action.REPORT_FAILED and state(w) is State.FAILED
    # failed: retry with a doubling backoff, up to the maximum
    assert w.tick(249) is None
    assert w.tick(250) is Action.RETRY
    assert w.tick(369) is None
    assert w.tick(370) is Action.RETRY
    assert w.tick(610) is Action.RETRY
    assert w.tick(849) is None and w.tick(850) is Action.RETRY  # capped at 240
    assert w.heard(900) is Action.RECOVERED and state(w) is State.SCANNING
    c = w.counts
    assert (c.restarts, c.power_cycles, c.failures, c.retries, c.recoveries) == (1, 1, 1, 4, 1)


def test_watchdog_bluez_gone_and_back() -> None:
    w = Watchdog(silence=60)
    w.start(0)
    assert w.lost(5, "bluez") is Action.REPORT_FAILED and state(w) is State.ABSENT
    assert w.heard(6) is None  # a straggler does not end it
    assert w.back(10) is Action.RESTART and state(w) is State.FAILED
    assert w.heard(11) is Action.RECOVERED
    assert w.counts.bluez_lost == 1
    w.lost(20, "adapter")
    assert w.counts.adapter_lost == 1


def test_the_counters_file_round_trips_and_bad_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / counters.FILE_NAME
    assert counters.load(path) == {}  # none yet
    kept = {"A4:C1:38:00:00:01": (counters.fingerprint(KEY), 2**32 - 1)}
    counters.save(path, kept)
    assert counters.load(path) == kept
    assert [p.name for p in tmp_path.iterdir()] == [counters.FILE_NAME]  # no .tmp left
    assert counters.fingerprint(KEY) != counters.fingerprint(bytes(16))
    assert KEY.hex() not in path.read_text()
    for bad, why in [
        (b"{", "not JSON"),
        (b"\xff", "not JSON"),
        (b"[]", "not a version 1 counters file"),
        (b'{"version": 2, "devices": {}}', "not a version 1 counters file"),
        (b'{"version": 1}', "no 'devices' table"),
        (b'{"version": 1, "devices": {"A": {"key": "k", "counter": "1"}}}', "device 'A'"),
        (b'{"version": 1, "devices": {"A": {"key": "k", "counter": -1}}}', "device 'A'"),
        (b'{"version": 1, "devices": {"A": {"key": "k", "counter": true}}}', "device 'A'"),
        (b'{"version": 1, "devices": {"A": {"key": 1, "counter": 1}}}', "device 'A'"),
        (b'{"version": 1, "devices": {"A": 5}}', "device 'A'"),
    ]:
        path.write_bytes(bad)
        with pytest.raises(counters.CounterFileError, match=why):
            counters.load(path)


def test_watchdog_a_scanner_that_did_not_start_is_failed_at_once() -> None:
    w = Watchdog(silence=60, backoff_max=240)
    w.start(0)
    assert w.start_failed(1, "cannot reach the system bus: no such file") is Action.REPORT_FAILED
    assert state(w) is State.FAILED and w.reason == "cannot reach the system bus: no such file"
    assert w.start_failed(2, "the scanner did not start: refused") is None  # reported once
    assert w.reason == "the scanner did not start: refused" and w.counts.failures == 1
    assert w.tick(60) is None and w.tick(61) is Action.RETRY  # the backoff of a failure
    assert w.heard(70) is Action.RECOVERED and state(w) is State.SCANNING
    w.lost(80, "bluez")
    assert w.start_failed(81, "the scanner did not start") is None
    assert state(w) is State.ABSENT and w.reason == "BlueZ (org.bluez) left the system bus"


def test_watchdog_off_still_retries_a_scanner_that_did_not_start() -> None:
    """watchdog = 0 turns off the silence escalation, not the retries of a start that
    failed (a gateway started before the bus would never scan otherwise)."""
    w = Watchdog(silence=0, backoff_max=12)
    w.start(0)
    assert w.tick(1000) is None  # silence alone: nothing
    assert w.start_failed(1000, "no bus") is Action.REPORT_FAILED
    assert w.tick(1000 + FIRST_RETRY - 0.1) is None
    assert w.tick(1000 + FIRST_RETRY) is Action.RETRY
    assert w.tick(1000 + FIRST_RETRY + 10) is Action.RETRY  # doubled to 10
    assert w.tick(1000 + FIRST_RETRY + 21) is None
    assert w.tick(1000 + FIRST_RETRY + 22) is Action.RETRY  # capped at 12


def test_mibeacon_counters_are_guarded_alike() -> None:
    """MiBeacon v4/v5: the counter is the frame counter and the 3-byte extension."""
    dec = DeviceDecoder(Context(ADDRESS, cipher=Cipher(KEY)), FORMATS["mibeacon"])
    mac = mac_bytes(ADDRESS)

    def frame(counter: int, deci: int) -> dict[str, bytes]:
        plain = mibeacon.encode(
            0x055B, counter & 0xFF, [(0x1004, struct.pack("<h", deci))], mac=mac
        )
        return {mibeacon.UUID: mibeacon.encrypt(plain, mac, counter >> 8, KEY)}

    def fed(counter: int, deci: int, now: float) -> tuple[list[object], list[str]]:
        out = dec.feed(frame(counter, deci), {}, "", now)
        assert out is not None
        return [s.value for s in out.samples], [p.reason for p in out.problems]

    assert fed(0x1234, 215, 0) == ([21.5], [])
    assert dec.counter == 0x1234
    assert fed(0x1234, 216, 10) == ([], ["replay"])  # equal, other bytes
    assert fed(0x1233, 217, 20) == ([], ["replay"])  # smaller
    assert fed(0x1300, 218, 30) == ([21.8], [])  # the extension carries into the count
