"""The system clock set while the gateway runs.

A Raspberry Pi has no real-time clock: it boots with the time of its last shutdown and
systemd-timesyncd sets the right time at the first synchronisation, possibly months
later. Timers run on the monotonic clock; what the gateway keeps in wall-clock time
(session expiry deadlines, message ages and expiry in the store and in the bridges'
outboxes) must move with the step instead of running out at once.

The step is made by Debian's libfaketime, preloaded into ``ledge run`` only: the file it
reads says "+30d" from a given moment on, and FAKETIME_DONT_FAKE_MONOTONIC leaves the
monotonic clock alone -- what settimeofday() does to a running process.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.clients import Paho
from tests.support.procs import LedgeProcess, MosquittoProcess, free_port

LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")), "")

pytestmark = [
    pytest.mark.skipif(
        not MosquittoProcess.available(), reason="Debian's mosquitto is not installed"
    ),
    pytest.mark.skipif(not LIBFAKETIME, reason="Debian's faketime is not installed"),
]

EXPIRY = 3600
MONTH = 30 * 86400


def faketime(control: Path) -> dict[str, str]:
    return {
        "LD_PRELOAD": LIBFAKETIME,
        "FAKETIME_TIMESTAMP_FILE": str(control),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def config(tmp_path: Path, clouds: dict[str, int]) -> Path:
    text = "[broker]\nsys_interval = 0\n[gateway]\nid = 'gw1'\n"
    for name, port in clouds.items():
        text += (
            f"[[bridges]]\nname = '{name}'\naddress = '127.0.0.1:{port}'\n"
            "reconnect_min = 0.05\nreconnect_max = 0.5\n"
            "[[bridges.rules]]\nfilter = 't/#'\nqos = 1\n"
        )
    path = tmp_path / "ledge.toml"
    path.write_text(text)
    return path


def persistent_cloud(workdir: Path) -> tuple[MosquittoProcess, int]:
    """A Mosquitto keeping sessions on disk, with a consumer session subscribed to t/#
    (then disconnected, so what arrives meanwhile is queued for it)."""
    workdir.mkdir()
    cloud = MosquittoProcess(
        workdir, f"persistence true\npersistence_location {workdir}/\nuser root\n"
    ).start()
    consumer = Paho(cloud.port, "consumer").connect(clean=False, session_expiry=MONTH)
    consumer.subscribe("t/#", 1)
    consumer.disconnect()
    return cloud, cloud.port


def expiry_left(message: object) -> int:
    value: int = message.properties.MessageExpiryInterval  # type: ignore[attr-defined]
    return value


def test_expiry_deadlines_survive_the_clock_jumping_a_month_forward(tmp_path: Path) -> None:
    control = tmp_path / "faketime"
    control.write_text("+0\n")
    # Bridge "live" gets its uplink back while the gateway runs (the outbox in memory);
    # bridge "later" only after a restart (the outbox read back from the store).
    live, live_port = persistent_cloud(tmp_path / "live")
    live.stop()
    later_port = free_port()
    path = config(tmp_path, {"live": live_port, "later": later_port})
    data = str(tmp_path / "data")
    proc = LedgeProcess("--data-dir", data, config=path, env=faketime(control)).start()
    try:
        # A persistent session with an hour's expiry, offline, with a message queued.
        keeper = Paho(proc.port, "keeper").connect(clean=False, session_expiry=EXPIRY)
        keeper.subscribe("t/#", 1)
        keeper.disconnect()
        props = Properties(PacketTypes.PUBLISH)
        props.MessageExpiryInterval = EXPIRY
        pub = Paho(proc.port, "producer").connect()
        pub.publish("t/reading", b"42", 1, properties=props)  # acknowledged: durable
        pub.disconnect()

        control.write_text("+30d\n")  # timesyncd's first synchronisation
        proc.wait_log("system clock was set forward by 25920[0-9][0-9].[0-9] s", timeout=15)

        # The uplink comes back: the message goes up with (nearly) its hour left,
        # instead of being dropped as a month old.
        live.start(live_port)
        consumer = Paho(live_port, "consumer").connect(clean=False, session_expiry=MONTH)
        [got] = consumer.wait_messages(1, 15)
        assert got.payload == b"42"
        assert EXPIRY - 120 < expiry_left(got) <= EXPIRY
        consumer.disconnect()
    finally:
        assert proc.stop() == 0

    # Restarted in the new time frame: what the store kept from before the step.
    later = MosquittoProcess(tmp_path, "").start(later_port)
    upstream = Paho(later_port, "up").connect()
    upstream.subscribe("t/#", 1)
    proc = LedgeProcess("--data-dir", data, config=path, env=faketime(control)).start()
    try:
        [got] = upstream.wait_messages(1, 15)
        assert got.payload == b"42"
        assert EXPIRY - 120 < expiry_left(got) <= EXPIRY
        keeper = Paho(proc.port, "keeper").connect(clean=False, session_expiry=EXPIRY)
        assert keeper.session_present  # not expired by the jump
        [queued] = keeper.wait_messages(1)
        assert queued.payload == b"42"
        assert EXPIRY - 120 < expiry_left(queued) <= EXPIRY
        keeper.disconnect()
        upstream.disconnect()
    finally:
        assert proc.stop() == 0
        later.stop()
        live.stop()
