"""The collector over a real broker core driven by fake clients: every ``$SYS`` value
has its metric with the same value, labels stay bounded, a new component plugs in,
and ``promtool`` accepts the whole exposition."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from drivers.model import Reading
from gateway.app.runtime import GatewaySettings, RuntimeConfig
from gateway.bridge.link import Bridge
from gateway.bridge.sequence import Sequence
from gateway.bridge.settings import BridgeSettings, RuleSettings
from gateway.broker.auth import ListenerPolicy, PasswordAuthenticator
from gateway.metrics.collect import (
    HISTORY,
    BleSource,
    BridgeSource,
    BrokerSource,
    Collector,
    MqttSnSource,
    ProcessSource,
    SensorSource,
    TapSource,
)
from gateway.metrics.view import (
    ListenerStatus,
    Sample,
    StatusPart,
    Values,
    counter,
    gauge,
)
from gateway.mqtt import MQTT_5, MQTT_311, Connect, Disconnect, Properties, Publish
from gateway.mqttsn.packets import Disconnect as SnDisconnect
from gateway.mqttsn.packets import Publish as SnPublish
from gateway.mqttsn.packets import TopicIdType
from gateway.sensors.ble_settings import BleDeviceSettings
from gateway.sensors.hub import SensorHub
from gateway.sensors.settings import SerialSettings
from gateway.taps import TapPlane
from tests.support.harness import FakeClient, Harness
from tests.support.mqttsn import SnHarness
from tests.support.prometheus import promtool_problems

#: ``$SYS/broker/<topic>`` -> (metric, labels): the value must be the same. Counts of
#: drops by reason are compared one by one; ``None`` labels mean "sum of the family",
#: a list of label sets the sum of those series.
SYS_METRICS: dict[str, tuple[str, dict[str, str] | list[dict[str, str]] | None]] = {
    "clients/connected": ("ledge_clients_connected", None),
    "clients/total": ("ledge_sessions", None),
    "clients/maximum": ("ledge_clients_maximum", {}),
    "clients/connecting": ("ledge_clients_connecting", {}),
    "clients/evicted/connecting full": (
        "ledge_connections_evicted_total",
        {"reason": "connecting_full"},
    ),
    "clients/evicted/address full": ("ledge_connections_evicted_total", {"reason": "address_full"}),
    "messages/received": ("ledge_packets_received_total", {}),
    "messages/sent": ("ledge_packets_sent_total", {}),
    "publish/messages/received": ("ledge_messages_received_total", {}),
    "publish/messages/sent": ("ledge_messages_sent_total", {}),
    "bytes/received": ("ledge_received_bytes_total", {}),
    "bytes/sent": ("ledge_sent_bytes_total", {}),
    "subscriptions/count": ("ledge_subscriptions", {}),
    "retained messages/count": ("ledge_retained_messages", {}),
    "publish/messages/dropped/slow consumer": (
        "ledge_messages_dropped_total",
        {"reason": "slow_consumer"},
    ),
    "publish/messages/dropped/queue full": (
        "ledge_messages_dropped_total",
        {"reason": "queue_full"},
    ),
    "publish/messages/dropped/expired": ("ledge_messages_dropped_total", {"reason": "expired"}),
    "publish/messages/dropped/too large": ("ledge_messages_dropped_total", {"reason": "too_large"}),
    "publish/messages/dropped/offline qos 0": (
        "ledge_messages_dropped_total",
        {"reason": "offline_qos0"},
    ),
    "publish/messages/denied": ("ledge_messages_denied_total", {}),
    "retained messages/refused": ("ledge_retained_refused_total", {}),
    "clients/refused": ("ledge_connections_refused_total", {}),
    "clients/protocol errors": ("ledge_protocol_errors_total", {}),
    "taps/queued": ("ledge_taps_queued_total", {}),
    "taps/handled": ("ledge_taps_handled_total", {}),
    "taps/failed": ("ledge_taps_failed_total", {}),
    "taps/dropped": ("ledge_taps_dropped_total", {}),
    "taps/waiting": ("ledge_taps_waiting", {}),
    # Per bridge: ``<bridge>`` is the bridge label.
    "bridge/<bridge>/queued": ("ledge_bridge_outbox_messages", {"bridge": "<bridge>"}),
    "bridge/<bridge>/bytes": ("ledge_bridge_outbox_bytes", {"bridge": "<bridge>"}),
    "bridge/<bridge>/sent": ("ledge_bridge_messages_sent_total", {"bridge": "<bridge>"}),
    "bridge/<bridge>/acknowledged": (
        "ledge_bridge_messages_acknowledged_total",
        {"bridge": "<bridge>"},
    ),
    "bridge/<bridge>/inflight": ("ledge_bridge_inflight", {"bridge": "<bridge>"}),
    "bridge/<bridge>/window": ("ledge_bridge_window", {"bridge": "<bridge>"}),
    "bridge/<bridge>/dropped": (
        "ledge_bridge_messages_dropped_total",
        [
            {"bridge": "<bridge>", "reason": reason}
            for reason in ("outbox_full", "expired", "qos0_offline", "rejected")
        ],
    ),
    "bridge/<bridge>/dropped/full": (
        "ledge_bridge_messages_dropped_total",
        {"bridge": "<bridge>", "reason": "outbox_full"},
    ),
    "bridge/<bridge>/dropped/expired": (
        "ledge_bridge_messages_dropped_total",
        {"bridge": "<bridge>", "reason": "expired"},
    ),
    "bridge/<bridge>/dropped/qos 0 offline": (
        "ledge_bridge_messages_dropped_total",
        {"bridge": "<bridge>", "reason": "qos0_offline"},
    ),
    "bridge/<bridge>/dropped/rejected": (
        "ledge_bridge_messages_dropped_total",
        {"bridge": "<bridge>", "reason": "rejected"},
    ),
    "bridge/<bridge>/dropped/loops": (
        "ledge_bridge_messages_dropped_total",
        {"bridge": "<bridge>", "reason": "loop"},
    ),
    "bridge/<bridge>/refused": ("ledge_bridge_messages_refused_total", {"bridge": "<bridge>"}),
    "bridge/<bridge>/received": ("ledge_bridge_messages_received_total", {"bridge": "<bridge>"}),
    "bridge/<bridge>/oldest message age": (
        "ledge_bridge_outbox_oldest_age_seconds",
        {"bridge": "<bridge>"},
    ),
    "bridge/<bridge>/connects": ("ledge_bridge_connects_total", {"bridge": "<bridge>"}),
    # Per sensor device: the values of every ``<device>`` are summed (devices are
    # never a label).
    "sensors/serial/<device>/connected": (
        "ledge_sensor_devices",
        {"driver": "serial", "state": "connected"},
    ),
    "sensors/serial/<device>/lines": ("ledge_sensor_lines_total", {"driver": "serial"}),
    "sensors/serial/<device>/readings": ("ledge_sensor_readings_total", {"driver": "serial"}),
    "sensors/serial/<device>/bad lines": (
        "ledge_sensor_bad_lines_total",
        {"driver": "serial", "reason": "unreadable"},
    ),
    "sensors/serial/<device>/garbage bytes": (
        "ledge_sensor_skipped_bytes_total",
        {"driver": "serial"},
    ),
    "sensors/ble/<device>/adverts": ("ledge_ble_device_adverts_total", {}),
    "sensors/ble/<device>/readings": ("ledge_sensor_readings_total", {"driver": "ble"}),
    "sensors/ble/<device>/repeats": ("ledge_ble_adverts_repeated_total", {}),
    "sensors/ble/<device>/connected": ("ledge_ble_gatt_connected", {}),
    "sensors/ble/<device>/sessions": ("ledge_ble_gatt_sessions_total", {}),
    "sensors/ble/<device>/errors/<reason>": ("ledge_ble_errors_total", {"reason": "<reason>"}),
    # The BLE adapter.
    "sensors/ble/adapter/restarts": (
        "ledge_ble_adapter_resets_total",
        {"adapter": "hci0", "action": "restart"},
    ),
    "sensors/ble/adapter/power cycles": (
        "ledge_ble_adapter_resets_total",
        {"adapter": "hci0", "action": "power_cycle"},
    ),
    "sensors/ble/adapter/failures": ("ledge_ble_adapter_failures_total", {"adapter": "hci0"}),
    "sensors/ble/adapter/retries": ("ledge_ble_adapter_retries_total", {"adapter": "hci0"}),
    "sensors/ble/adapter/recoveries": (
        "ledge_ble_adapter_recoveries_total",
        {"adapter": "hci0"},
    ),
    "sensors/ble/adapter/bluez lost": (
        "ledge_ble_adapter_lost_total",
        {"adapter": "hci0", "what": "bluez"},
    ),
    "sensors/ble/adapter/adapter lost": (
        "ledge_ble_adapter_lost_total",
        {"adapter": "hci0", "what": "adapter"},
    ),
    "sensors/ble/adapter/adverts": ("ledge_ble_adverts_total", {}),
    "sensors/ble/adapter/dropped": ("ledge_ble_adverts_dropped_total", {"reason": "queue_full"}),
    "sensors/ble/adapter/queue dropped": (
        "ledge_ble_adverts_dropped_total",
        {"reason": "queue_full"},
    ),
    "sensors/ble/adapter/unknown devices": ("ledge_ble_unknown_devices", {}),
    "sensors/ble/adapter/unknown evicted": ("ledge_ble_unknown_devices_evicted_total", {}),
    "sensors/ble/adapter/devices refused": ("ledge_ble_devices_refused_total", {}),
    "sensors/ble/adapter/callback errors": ("ledge_ble_callback_errors_total", {}),
    "sensors/ble/adapter/counter save errors": ("ledge_ble_replay_state_write_errors_total", {}),
}
#: $SYS values with no metric of their own, and why.
SYS_ELSEWHERE = {
    "version": "ledge_build_info{version}",
    "uptime": "ledge_uptime_seconds (the $SYS text says '<n> seconds')",
    "clients/disconnected": "ledge_sessions{state='offline'} plus in-process sessions",
    "publish/messages/dropped": "the sum of ledge_messages_dropped_total (checked below)",
    "bridge/<bridge>/address": "text: on the status page",
    "sensors/ble/adapter/adapter": "the adapter label",
    "sensors/ble/adapter/state": "ledge_ble_adapter_state{state} is 1 (checked below)",
    "sensors/ble/adapter/mode": "text: in the adapter's retained state message",
    "sensors/ble/adapter/reason": "text: on the status page while failed",
    "sensors/ble/<device>/rssi": "a reading of the device, not a count",
    "sensors/serial/<device>/silent since": "a time per device (what ledge health reads), "
    "not a count: summed over devices it means nothing",
    "sensors/ble/<device>/silent since": "a time per device (what ledge health reads), "
    "not a count: summed over devices it means nothing",
    "sensors/ble/<device>/present": "ledge_sensor_devices{driver='ble',state}: a GATT device "
    "counts there by its connection",
}
#: $SYS values that are another value again, under a second name.
SAME_COUNT_AS = {
    "sensors/ble/adapter/queue dropped": "sensors/ble/adapter/dropped",
    "bridge/<bridge>/dropped": "the sum of the bridge's drops by reason",
}
#: A $SYS key -> its pattern in the tables above, and the labels it fills in.
_PER_THING = (
    re.compile(r"(bridge)/(?P<bridge>[^/]+)/(?P<rest>.+)"),
    re.compile(r"(sensors/ble)/(?!adapter/)(?P<device>[^/]+)/errors/(?P<reason>.+)"),
    re.compile(r"(sensors/(?:serial|ble))/(?!adapter/)(?P<device>[^/]+)/(?P<rest>.+)"),
)


def sys_pattern(key: str) -> tuple[str, dict[str, str]]:
    """``bridge/cloud/sent`` -> (``bridge/<bridge>/sent``, {``<bridge>``: ``cloud``})."""
    for pattern in _PER_THING:
        m = pattern.fullmatch(key)
        if m is None:
            continue
        found = m.groupdict()
        if "reason" in found:
            return f"{m.group(1)}/<device>/errors/<reason>", {"<reason>": found["reason"]}
        if "bridge" in found:
            return f"bridge/<bridge>/{found['rest']}", {"<bridge>": found["bridge"]}
        return f"{m.group(1)}/<device>/{found['rest']}", {}
    return key, {}


class World:
    """A broker with clients, sensors and taps, and a collector over all of it."""

    def __init__(self, ble: tuple[BleDeviceSettings, ...] = ()) -> None:
        self.h = Harness(max_queued_messages=2)
        self.broker = self.h.broker
        settings = RuntimeConfig(
            gateway=GatewaySettings("gw1"),
            serial=(SerialSettings("env", "/dev/null-not-opened", protocol="kv"),),
            ble=ble,
        ).sensors
        self.hub = SensorHub(self.broker, settings, lambda: self.h.now)
        self.taps = TapPlane(self.broker, lambda: self.h.now, [], queue_size=5)
        self.broker.sys_sources.append(self.hub.sys_values)
        self.broker.sys_sources.append(self.taps.sys_values)
        self.collector = Collector(
            self.broker, "gw1", lambda: self.h.now, (ListenerStatus("test", "tcp", "x:1"),)
        )
        self.collector.register(BrokerSource(self.broker, lambda: self.h.now))
        self.collector.register(ProcessSource(1_700_000_000.0))
        self.sensors = SensorSource(self.hub)
        self.collector.register(self.sensors)
        self.collector.register(TapSource(self.taps))

    def values(self) -> Values:
        return Values(self.collector.samples())


def busy_world(ble: tuple[BleDeviceSettings, ...] = ()) -> tuple[World, list[FakeClient]]:
    """Clients of both versions publishing, subscribing, retaining, and every drop."""
    w = World(ble)
    h = w.h
    sub = h.client(MQTT_5)
    sub.connect("sub", clean_start=False, session_expiry_interval=300)
    sub.subscribe("a/#", qos=1)
    old = h.client(MQTT_311)
    old.connect("old")
    old.subscribe("a/b")
    pub = h.client(MQTT_5)
    pub.connect("pub")
    for i in range(3):
        pub.publish("a/b", b"x", qos=1)
        pub.publish(f"r/{i}", b"kept", retain=True)
    sub.send(Disconnect())
    for _ in range(3):  # offline with a queue of 2: one dropped as queue full
        pub.publish("a/c", b"y", qos=1)
    for _ in range(2):  # refused: $SYS is the broker's
        pub.send(Publish("$SYS/x", b"x", 1, False, False, pub.pid(), Properties()))
    w.broker.policies["capped"] = ListenerPolicy(PasswordAuthenticator(), None, 1)
    h.client(MQTT_5, listener="capped").connect("first")
    h.client(MQTT_5, listener="capped").send(Connect("second", MQTT_5))  # refused: limit
    bad = h.client(MQTT_5)
    bad.connect("bad")
    bad.send(Publish("a/#", b"x", 0, False, False, 0, Properties()))  # 0x90: a protocol error
    bad.drop()
    w.hub.sensors["env"]._data(b"temp=21.5 hum=40\nnot a reading\n")
    return w, [old, pub]


BTHOME = "0000fcd2-0000-1000-8000-00805f9b34fb"


def everything_world() -> World:
    """The busy world, plus a bridge that has worked a little and BLE devices (an
    advertising one, a GATT one) that were heard, with errors, strangers and an
    adapter the watchdog had to step in for."""
    from bleak.backends.device import BLEDevice
    from bleak.backends.scanner import AdvertisementData

    from drivers.model import now_utc

    w, (_old, pub) = busy_world(
        ble=(
            BleDeviceSettings("t1", address="A4:C1:38:00:00:01", format="bthome"),
            BleDeviceSettings("g1", address="A4:C1:38:00:00:02", format="lywsd03mmc"),
        )
    )
    # Every reason the broker drops a message for, each a count of its own, so that a
    # metric reading another reason's counter shows a value that is not $SYS's.
    for _ in range(3):  # QoS 0 for the offline session: dropped, not queued
        pub.publish("a/c", b"z")
    late = w.h.client(MQTT_5)
    late.connect("late", clean_start=False, session_expiry_interval=300)
    late.subscribe("e/#", qos=1)
    late.send(Disconnect())
    for _ in range(2):  # queued while it is away, expired before it comes back
        pub.publish("e/x", b"old", qos=1, message_expiry_interval=1)
    w.h.advance(2)
    w.h.client(MQTT_5).connect("late", clean_start=False, session_expiry_interval=300)
    tiny = w.h.client(MQTT_5)
    tiny.connect("tiny", maximum_packet_size=64)
    tiny.subscribe("big/#")
    for _ in range(4):  # larger than its Maximum Packet Size (MQTT-3.1.2-24)
        pub.publish("big/x", bytes(100))
    slow = w.h.client(MQTT_5)
    slow.connect("slow")
    slow.subscribe("s/#")
    w.broker.set_writable(slow.conn, False, w.h.now)
    for _ in range(5):  # QoS 0 for a client that stopped reading
        pub.publish("s/x", b"q")
    ble = w.hub.ble
    assert ble is not None

    def advert(address: str, service_data: dict[str, bytes]) -> None:
        readings: list[Reading] = []
        data = AdvertisementData(None, {}, service_data, list(service_data), None, -60, ())
        ble._advert(BLEDevice(address, None, None), data, w.h.now, now_utc(), readings)
        w.hub.publish_readings(readings)

    advert("A4:C1:38:00:00:01", {BTHOME: b"\x40\x02\xc4\x09"})  # 25.00 °C
    advert("A4:C1:38:00:00:01", {BTHOME: b"\x40\x02\xc4\x09"})  # a repeat
    advert("A4:C1:38:00:00:01", {BTHOME: b"\x40\xff"})  # an unknown object
    advert("A4:C1:38:00:00:02", {})
    advert("11:22:33:44:55:66", {})  # a stranger
    ble._on_advert(BLEDevice("x", None, None), None)  # type: ignore[arg-type]  # fails: counted
    for _ in range(2):  # the counters file could not be written, twice
        ble._counter_save_failed(Path("/full/ble-counters.json"), OSError(28, "No space left"))
    watchdog = ble.watchdog
    watchdog.start(0.0)
    for step in range(1, 4):  # restart, power cycle, failed
        watchdog.tick(step * watchdog.silence)
    watchdog.tick(3 * watchdog.silence + watchdog.backoff)  # tried again
    watchdog.heard(4 * watchdog.silence + watchdog.backoff)  # and it works
    w.collector.register(BleSource(ble))

    settings = BridgeSettings("cloud", (("127.0.0.1", 1),), (RuleSettings("#"),))
    bridge = Bridge(
        settings, gateway="gw1", prefix="ledge", broker=w.broker, sequence=Sequence(1),
    )  # fmt: skip
    bridge.window = 7  # as if the remote had a receive maximum of 7
    bridge.outbox.stats.dropped_full = 4
    bridge.stats.rejected = 1
    bridge.stats.loops = 2
    bridge.stats.dropped_qos0_offline = 3
    bridge.outbox.stats.dropped_expired = 5
    bridge.stats.echoes = 6
    # The other counts this world does not come to by itself, each set to a value of its
    # own (what moves each one is tested where it happens: test_limits.py,
    # test_core_retain_will_session.py, test_serial.py, test_ble_watchdog_counts.py,
    # test_ble.py, test_ble_gatt_sessions.py, test_local_and_taps.py,
    # test_bridge_link_more.py), so that a metric reading another's counter fails here.
    w.broker.stats.evicted_connecting_full = 11
    w.broker.stats.evicted_address_full = 12
    w.broker.stats.bytes_sent = 13
    w.broker.retained.refused = 14
    w.hub.sensors["env"].stats.garbage_bytes = 15
    watchdog.counts.restarts += 31  # (the world's steps gave one of each)
    watchdog.counts.bluez_lost = 16
    watchdog.counts.adapter_lost = 17
    ble.counts["dropped"] = 18
    ble.counts["unknown evicted"] = 19
    ble.counts["devices refused"] = 20
    gatt = ble.devices["g1"].gatt
    assert gatt is not None
    gatt.sessions = 21
    w.taps.stats.queued, w.taps.stats.handled = 22, 23
    w.taps.stats.failed, w.taps.stats.dropped = 24, 25
    bridge.outbox.stats.queued, bridge.outbox.stats.sent = 26, 27
    bridge.outbox.stats.acknowledged, bridge.outbox.stats.refused = 28, 29
    bridge.stats.received, bridge.stats.connects = 30, 33
    w.broker.sys_sources.append(bridge.sys_values)
    w.collector.register(BridgeSource([bridge]))
    return w


def test_every_sys_value_has_its_metric_with_the_same_value() -> None:
    """Every value under ``$SYS/broker/`` -- the broker's, the taps', each bridge's,
    each sensor device's (summed over devices), the BLE adapter's -- has its metric
    with the same value, or is named in ``SYS_ELSEWHERE``: a new one without either
    fails here."""
    w = everything_world()
    v = w.values()
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for topic, value in w.broker.sys_values(w.h.now).items():
        key = topic.removeprefix("$SYS/broker/")
        if key.startswith("load/"):
            continue  # rates: rate() computes them from the counters
        pattern, fill = sys_pattern(key)
        if pattern in SYS_ELSEWHERE:
            continue
        assert pattern in SYS_METRICS, f"$SYS/broker/{key} has no metric"
        slot = (pattern, tuple(sorted(fill.items())))
        sums[slot] = sums.get(slot, 0.0) + float(value)
    for (pattern, filled), total in sums.items():
        name, labels = SYS_METRICS[pattern]
        found = dict(filled)
        if labels is None:
            got = v.total(name)
        else:
            label_sets = labels if isinstance(labels, list) else [labels]
            got = sum(
                v.get(name, float("nan"), **{k: found.get(x, x) for k, x in one.items()})
                for one in label_sets
            )
        # (0.05: the age of the oldest outbox message is written with one decimal)
        assert abs(got - total) <= 0.05, f"{pattern} {found}: $SYS says {total}, {name} says {got}"
    assert {p for p, _ in sums} == set(SYS_METRICS), "a value in the table was not in $SYS"
    # Every count the table names (each drop, refusal, eviction and loss by its reason)
    # is something in this world, and the counts of one family differ from each other:
    # a metric whose labels point at another reason's counter cannot show $SYS's value
    # by chance. (Gauges are the moment's state.)
    families: dict[str, dict[str, float]] = {}
    for (pattern, filled), total in sums.items():
        name = SYS_METRICS[pattern][0]
        if name.endswith("_total") and pattern not in SAME_COUNT_AS:
            families.setdefault(name, {})[f"{pattern} {dict(filled)}"] = total
    zero = [key for family in families.values() for key, total in family.items() if total == 0]
    assert not zero, f"counts this world leaves at 0: {zero}"
    for name, family in families.items():
        assert len(set(family.values())) == len(family), (name, family)
    sys_values = w.broker.sys_values(w.h.now)
    state = sys_values["$SYS/broker/sensors/ble/adapter/state"]
    assert v.get("ledge_ble_adapter_state", state=state) == 1
    assert float(sys_values["$SYS/broker/publish/messages/dropped"]) == v.total(
        "ledge_messages_dropped_total"
    )
    # What the world caused, so that a metric that reads the wrong counter fails here.
    assert v.get("ledge_messages_dropped_total", reason="queue_full") == 1
    assert v.get("ledge_messages_dropped_total", reason="offline_qos0") == 3
    assert v.get("ledge_messages_dropped_total", reason="expired") == 2
    assert v.get("ledge_messages_dropped_total", reason="too_large") == 4
    assert v.get("ledge_messages_dropped_total", reason="slow_consumer") == 5
    for reason, count in (
        ("outbox_full", 4), ("rejected", 1), ("loop", 2), ("qos0_offline", 3),
        ("expired", 5), ("echo", 6),
    ):  # fmt: skip
        assert v.get("ledge_bridge_messages_dropped_total", bridge="cloud", reason=reason) == (
            count
        ), reason
    assert v.get("ledge_protocol_errors_total") == 1
    assert v.get("ledge_messages_denied_total") == 2
    assert v.get("ledge_connections_refused_total") == 1
    assert v.get("ledge_bridge_window", bridge="cloud") == 7
    assert v.get("ledge_ble_device_adverts_total") == 4
    assert v.get("ledge_ble_adverts_total") == 5
    assert v.get("ledge_ble_callback_errors_total") == 1
    assert v.get("ledge_ble_replay_state_write_errors_total") == 2
    assert v.get("ledge_ble_adapter_retries_total", adapter="hci0") == 1
    assert v.get("ledge_ble_adapter_recoveries_total", adapter="hci0") == 1
    assert v.get("ledge_ble_errors_total", reason="unknown_object") == 1


def test_the_serial_counts_match_their_sys_values() -> None:
    w, _clients = busy_world()
    sys_values = w.hub.sys_values()
    v = w.values()
    assert v.get("ledge_sensor_lines_total", driver="serial") == int(
        sys_values["sensors/serial/env/lines"]
    )
    assert v.get("ledge_sensor_readings_total", driver="serial") == 2
    assert v.get("ledge_sensor_bad_lines_total", driver="serial", reason="unreadable") == 1
    assert v.get("ledge_sensor_devices", driver="serial", state="disconnected") == 1


def test_clients_are_labelled_by_listener_and_version_only() -> None:
    w, _clients = busy_world()
    clients = {
        (dict(s.labels)["listener"], dict(s.labels)["protocol"]): s.value
        for s in w.collector.samples()
        if s.name == "ledge_clients_connected"
    }
    assert clients == {("test", "3.1.1"): 1, ("test", "5.0"): 1, ("capped", "5.0"): 1}
    for sample in w.collector.samples():
        labels = dict(sample.labels)
        assert set(labels) <= {"listener", "protocol", "reason", "state", "driver", "version"}
        assert "sub" not in labels.values() and "old" not in labels.values()


def test_sessions_are_counted_by_state() -> None:
    w, _clients = busy_world()
    v = w.values()
    assert v.get("ledge_sessions", state="connected") == 3
    assert v.get("ledge_sessions", state="offline") == 1
    assert v.get("ledge_sessions", state="in_process") == 2  # sensors and taps


def test_a_slow_consumer_is_counted_while_it_does_not_read() -> None:
    w, (old, _pub) = busy_world()
    assert w.values().get("ledge_clients_slow") == 0
    w.broker.set_writable(old.conn, False, w.h.now)
    assert w.values().get("ledge_clients_slow") == 1
    assert "1 slow consumer(s)" in " ".join(w.collector.status()["warnings"])


def test_rates_and_sparklines_come_from_ticks() -> None:
    w, (_old, pub) = busy_world()
    w.collector.tick()
    w.h.now += 5
    for _ in range(10):
        pub.publish("a/b", b"x")
    w.hub.sensors["env"]._data(b"temp=22.5\n")
    w.collector.tick()
    w.h.now += 5
    w.hub.sensors["env"]._data(b"temp=23.5\n")
    w.collector.tick()
    w.collector.tick()  # no new reading: the history does not grow
    doc = w.collector.status()
    assert doc["messages"]["received_history"][0] == 2.0  # 10 messages in 5 s
    env = next(d for d in doc["devices"] if d["name"] == "env")
    temperature = next(v for v in env["values"] if v["quantity"] == "temp")
    assert temperature["value"] == 23.5
    assert temperature["history"] == [21.5, 22.5, 23.5]
    for _ in range(HISTORY + 5):
        w.h.now += 1
        w.hub.sensors["env"]._data(b"temp=1\n")
        w.collector.tick()
    doc = w.collector.status()
    env = next(d for d in doc["devices"] if d["name"] == "env")
    temperature = next(v for v in env["values"] if v["quantity"] == "temp")
    assert len(temperature["history"]) == HISTORY
    assert len(doc["messages"]["received_history"]) == HISTORY


class BleLike:
    """A component the view has never heard of, plugging in by the two protocols."""

    def samples(self) -> Iterable[Sample]:
        yield counter("ledge_ble_adverts_total", "Adverts.", 7, driver="ble")
        yield gauge("ledge_sensor_devices", "Configured sensor devices, by state.", 3,
                    driver="ble", state="connected")  # fmt: skip

    def status(self) -> StatusPart:
        return StatusPart(warnings=("adapter hci0 failed: reset 3 times",))


class Broken:
    def samples(self) -> Iterator[Sample]:
        yield gauge("ledge_ok_before_failing", "h", 1)
        raise RuntimeError("a bug")


def test_a_new_component_plugs_in_without_touching_the_view() -> None:
    w, _clients = busy_world()
    w.collector.register(BleLike())
    text = w.collector.metrics()
    assert 'ledge_ble_adverts_total{driver="ble"} 7' in text
    # One family, two drivers, written together under one HELP/TYPE.
    assert text.count("# TYPE ledge_sensor_devices gauge") == 1
    assert 'ledge_sensor_devices{driver="ble",state="connected"} 3' in text
    assert "adapter hci0 failed: reset 3 times" in w.collector.status()["warnings"]


def test_a_failing_source_leaves_only_its_own_values_out(caplog: pytest.LogCaptureFixture) -> None:
    w, _clients = busy_world()
    w.collector.register(Broken())
    text = w.collector.metrics()
    assert "ledge_messages_received_total" in text
    assert "ledge_ok_before_failing" in text
    w.collector.metrics()
    assert sum("Broken failed" in r.message for r in caplog.records) == 1  # logged once


def test_bridge_values_are_labelled_by_bridge_and_reason() -> None:
    w = World()
    settings = BridgeSettings("cloud", (("127.0.0.1", 1),), (RuleSettings("#"),))
    bridge = Bridge(
        settings, gateway="gw1", prefix="ledge", broker=w.broker, sequence=Sequence(1),
    )  # fmt: skip
    bridge.outbox.stats.dropped_full = 4
    bridge.stats.rejected = 1
    bridge.last_error = "connection refused"
    source = BridgeSource([bridge])
    v = Values(source.samples())
    assert v.get("ledge_bridge_connected", bridge="cloud") == 0
    assert v.get("ledge_bridge_messages_dropped_total", bridge="cloud", reason="outbox_full") == 4
    assert v.get("ledge_bridge_messages_dropped_total", bridge="cloud", reason="rejected") == 1
    assert v.get("ledge_bridge_outbox_limit_bytes", bridge="cloud") == settings.outbox.max_bytes
    (status,) = source.status().bridges
    assert (status.state, status.last_error, status.dropped) == (
        "disconnected",
        "connection refused",
        5,
    )


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus)")
def test_promtool_accepts_the_whole_exposition(tmp_path: Path) -> None:
    w, _clients = busy_world()
    settings = BridgeSettings("cloud", (("127.0.0.1", 1),), (RuleSettings("#"),))
    bridge = Bridge(
        settings, gateway="gw1", prefix="ledge", broker=w.broker, sequence=Sequence(1),
    )  # fmt: skip
    w.collector.register(BridgeSource([bridge]))
    text = w.collector.metrics()
    assert not promtool_problems(text)
    for family in ("ledge_bridge_outbox_oldest_age_seconds", "process_cpu_seconds_total"):
        assert f"# TYPE {family} " in text


#: ``$SYS/broker/mqttsn/<key>`` -> (metric, labels): the value must be the same.
MQTTSN_METRICS: dict[str, tuple[str, dict[str, str]]] = {
    "clients/connected": ("ledge_mqttsn_clients", {"state": "connected"}),
    "clients/asleep": ("ledge_mqttsn_clients", {"state": "asleep"}),
    "clients/disconnected": ("ledge_mqttsn_clients", {"state": "disconnected"}),
    "clients/refused": ("ledge_mqttsn_clients_refused_total", {}),
    "clients/lost": ("ledge_mqttsn_clients_lost_total", {}),
    "clients/evicted": ("ledge_mqttsn_clients_evicted_total", {}),
    "clients/evicted silent": ("ledge_mqttsn_clients_evicted_silent_total", {}),
    "clients/refused per address": ("ledge_mqttsn_clients_refused_per_address_total", {}),
    "clients/refused rate": ("ledge_mqttsn_clients_refused_rate_total", {}),
    "clients/evicted unproven": ("ledge_mqttsn_clients_evicted_unproven_total", {}),
    "clients/unproven": ("ledge_mqttsn_clients_unproven", {}),
    "clients/wake refused": ("ledge_mqttsn_wakes_refused_total", {}),
    "messages/received": ("ledge_mqttsn_packets_received_total", {}),
    "messages/sent": ("ledge_mqttsn_packets_sent_total", {}),
    "messages/malformed": ("ledge_mqttsn_packets_malformed_total", {}),
    "messages/retransmitted": ("ledge_mqttsn_retransmissions_total", {}),
    "messages/without connection": ("ledge_mqttsn_packets_without_connection_total", {}),
    "publish/qos -1": ("ledge_mqttsn_messages_qos_minus_one_total", {}),
    "publish/refused": ("ledge_mqttsn_messages_refused_total", {}),
    "publish/dropped/queue full": ("ledge_mqttsn_messages_dropped_total", {"reason": "queue_full"}),
    "publish/dropped/topic table full": (
        "ledge_mqttsn_messages_dropped_total",
        {"reason": "topic_table_full"},
    ),
    "publish/dropped/offline qos 0": (
        "ledge_mqttsn_messages_dropped_total",
        {"reason": "offline_qos0"},
    ),
    "publish/dropped/too large": ("ledge_mqttsn_messages_dropped_total", {"reason": "too_large"}),
}


def mqttsn_world() -> tuple[SnHarness, MqttSnSource]:
    """The firmware bridge on a broker core, producing every count its metrics name,
    each a different number, so a metric that reads another counter fails here:
    clients in each state; unreadable and refused input; QoS -1; a retransmission;
    drops of each reason; each way a CONNECT is refused or a client evicted."""
    h = SnHarness(
        max_queued_messages=2,
        max_clients=4,
        max_clients_per_address=1,
        max_connect_rate_per_address=0.5,  # one CONNECT from an address, then one in 2 s
        max_topics_per_client=2,
        max_message_size=64,
        retry_interval=5,
        predefined_topics={1: "p/one"},
    )
    mqtt = h.client(MQTT_311)
    mqtt.connect("pub")
    idle = h.device(("10.0.0.6", 5000))
    idle.connect("idle", duration=0)
    idle.ping()
    h.advance(1)
    awake = h.device(("10.0.0.2", 5000))
    awake.connect("awake")
    awake.send_raw(b"\x03\x11\x00")  # malformed
    awake.send_raw(b"\x02\xff")  # malformed
    awake.publish(0x7777, b"x", qos=1)  # unknown topic id: refused
    awake.take()
    awake.subscribe("r", 1)  # its topic id is the first of a table of 2
    for topic in ("t/1", "t/2", "t/3", "t/4"):  # three refused
        awake.register(topic)
    mqtt.publish("r", b"late", qos=1)
    h.advance(5)  # not acknowledged: sent again
    first, again = awake.expect(SnPublish), awake.expect(SnPublish)
    assert again.dup and again.msg_id == first.msg_id
    awake.ack(again)
    awake.take()
    mqtt.publish("r", b"x" * 100, qos=1)  # longer than max_message_size: dropped
    sleeper = h.device(("10.0.0.3", 5000))
    sleeper.connect("sleeper")
    sleeper.subscribe("n", 0)
    sleeper.sleep(600)
    for i in range(7):  # a queue of 2: five dropped as queue full (two more below)
        mqtt.publish("n", str(i).encode())
    h.device(("10.0.0.66", 5000)).wake("sleeper")  # from elsewhere: refused
    quiet = h.device(("10.0.0.7", 5000))
    quiet.connect("quiet")  # never heard from again: unproven
    gone = h.device(("10.0.0.4", 5000))
    gone.connect("gone", clean=False)  # the pool is full: "quiet" is evicted
    gone.subscribe("n", 0)
    gone.send(SnDisconnect())
    gone.take()
    for i in range(2):  # QoS 0 for a disconnected client (and the sleeper): two dropped
        mqtt.publish("n", str(i).encode())
    late = h.device(("10.0.0.8", 5000))
    late.connect("late")  # the pool is full: the session of "gone" is forgotten
    late.ping()
    last = h.device(("10.0.0.9", 5000))
    last.connect("last")  # the pool is full: "idle" (no keep-alive) is evicted
    h.device(("10.0.0.5", 5000)).publish(1, b"m", qos=-1, id_type=TopicIdType.PREDEFINED)
    h.device(("10.0.0.2", 5001)).connect("twin")  # a second client from 10.0.0.2: refused
    h.device(("10.0.0.2", 5002)).connect("third")  # and a third CONNECT: over the rate
    return h, MqttSnSource(h.gateway)


def test_every_mqttsn_sys_value_has_its_metric_with_the_same_value() -> None:
    h, source = mqttsn_world()
    v = Values(source.samples())
    sys_values = h.gateway.sys_values()
    for topic, value in sys_values.items():
        key = topic.removeprefix("mqttsn/")
        assert key in MQTTSN_METRICS, f"$SYS/broker/{topic} has no metric"
        name, labels = MQTTSN_METRICS[key]
        got = v.get(name, float("nan"), **labels)
        assert got == float(value), f"{topic}: $SYS says {value}, {name} says {got}"
    assert len(sys_values) == len(MQTTSN_METRICS)
    # What the world caused, so that a metric that reads the wrong counter fails here.
    caused = {
        ("ledge_mqttsn_clients", "connected"): 3,  # awake, late, last
        ("ledge_mqttsn_clients", "asleep"): 1,
        ("ledge_mqttsn_clients", "disconnected"): 0,
        ("ledge_mqttsn_messages_dropped_total", "queue_full"): 7,
        ("ledge_mqttsn_messages_dropped_total", "topic_table_full"): 3,
        ("ledge_mqttsn_messages_dropped_total", "offline_qos0"): 2,
        ("ledge_mqttsn_messages_dropped_total", "too_large"): 1,
    }
    for (name, label), expected in caused.items():
        labels = {"reason" if "dropped" in name else "state": label}
        assert v.get(name, float("nan"), **labels) == expected, (name, label)
    assert v.get("ledge_mqttsn_packets_malformed_total") == 2
    assert v.get("ledge_mqttsn_messages_refused_total") == 1
    assert v.get("ledge_mqttsn_messages_qos_minus_one_total") == 1
    assert v.get("ledge_mqttsn_retransmissions_total") == 1
    assert v.get("ledge_mqttsn_connects_total") == 7
    assert v.get("ledge_mqttsn_clients_evicted_total") == 1
    assert v.get("ledge_mqttsn_clients_evicted_silent_total") == 1
    assert v.get("ledge_mqttsn_clients_evicted_unproven_total") == 1
    assert v.get("ledge_mqttsn_clients_unproven") == 1  # last
    assert v.get("ledge_mqttsn_wakes_refused_total") == 1
    assert v.get("ledge_mqttsn_packets_without_connection_total") == 1  # that wake
    assert v.get("ledge_mqttsn_clients_refused_per_address_total") == 1
    assert v.get("ledge_mqttsn_clients_refused_rate_total") == 1
    assert v.get("ledge_mqttsn_clients_refused_total") == 2
    assert v.get("ledge_mqttsn_clients_limit") == 4


def test_each_mqttsn_counter_is_read_by_its_own_sys_value_and_metric() -> None:
    """Every counter of the firmware bridge set to a value of its own: a ``$SYS`` value
    or a metric that reads another counter (a swapped label) shows another's value."""
    h, source = mqttsn_world()
    st = h.gateway.stats
    fields = list(type(st).__dataclass_fields__)
    for n, name in enumerate(fields):
        setattr(st, name, 1000 + n)
    v = Values(source.samples())
    sys_values = h.gateway.sys_values()
    counted = {}
    for topic, value in sys_values.items():
        name, labels = MQTTSN_METRICS[topic.removeprefix("mqttsn/")]
        assert v.get(name, float("nan"), **labels) == float(value), topic
        if int(value) >= 1000:
            counted[int(value)] = topic
    # connects is a metric without a $SYS value; every other counter has both.
    assert sorted(counted) == [1000 + n for n, f in enumerate(fields) if f != "connects"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus)")
def test_promtool_accepts_the_mqttsn_metrics_and_the_page_shows_their_drops() -> None:
    h, source = mqttsn_world()
    collector = Collector(h.broker, "gw1", lambda: h.now)
    collector.register(BrokerSource(h.broker, lambda: h.now))
    collector.register(source)
    text = collector.metrics()
    assert not promtool_problems(text)
    assert 'ledge_mqttsn_messages_dropped_total{reason="queue_full"} 7' in text
    assert collector.status()["drops"]["mqttsn: queue full"] == 7


def test_a_ble_device_is_present_or_away_and_a_beacon_away_is_no_fault() -> None:
    w = World(
        ble=(
            BleDeviceSettings("keys", beacon="e2c56db5-dffb-48d2-b060-d0f5a71096e0/1/2"),
            BleDeviceSettings("t1", address="A4:C1:38:00:00:01", format="bthome"),
            BleDeviceSettings("t2", address="A4:C1:38:00:00:02", format="bthome"),
        )
    )
    ble = w.hub.ble
    assert ble is not None
    for device in ble.devices.values():
        device.presence.start()  # as the driver does: away until heard
    ble.devices["t1"].presence.heard(w.h.now)
    doc = w.collector.status()
    states = {d["name"]: (d["state"], d["online"], d["presence"]) for d in doc["devices"]}
    assert states["keys"] == ("away", False, True)
    assert states["t1"] == ("present", True, False)
    assert states["t2"] == ("away", False, False)
    assert "ble device t2 is away" in doc["warnings"]
    assert not [x for x in doc["warnings"] if "keys" in x]
