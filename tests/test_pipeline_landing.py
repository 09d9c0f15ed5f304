"""The lander against Debian's Mosquitto, and the whole chain: a pty serial sensor -> Ledge
-> its cloud bridge -> Mosquitto -> the lander -> Spark -> gold, checked against the
readings sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pyspark.sql import SparkSession

from drivers.model import GATEWAY_PROPERTY, SEQUENCE_PROPERTY
from pipeline import jobs
from pipeline.config import PipelineConfig
from pipeline.landing import Broker, Lander, LanderConfig
from pipeline.storage import Layout
from tests.support.clients import Paho
from tests.support.procs import LedgeProcess, MosquittoProcess
from tests.support.wait import wait_for
from tests.test_serial import FakeDevice


class Crash(Exception):
    """The lander dies after writing and fsyncing a batch, before acknowledging it."""


class CrashingLander(Lander):
    crashed_with = 0

    def _commit(self, client: aiomqtt.Client, pending: list[aiomqtt.Message]) -> None:
        if pending:
            self.files.sync()
            self.crashed_with = len(pending)
            raise Crash


class Running:
    """A lander on its own event loop in a thread, stopped by cancelling its task."""

    def __init__(self, lander: Lander) -> None:
        self.lander = lander
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_for(lambda: lander.subscribed.is_set() or self.error, 10, "the lander to subscribe")

    def _run(self) -> None:
        async def main() -> None:
            self.task = asyncio.current_task()
            await self.lander.run()

        try:
            self.loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass  # stopped
        except BaseException as exc:
            self.error = exc
        finally:
            self.loop.close()

    def stop(self) -> None:
        if self.thread.is_alive() and self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)
        assert not self.thread.is_alive()


def landed_lines(root: Path) -> list[dict[str, object]]:
    """Every line landed so far, finished files and the open one (whose last line may
    be half written while we read: only lines ended by a newline count)."""
    out = []
    for path in sorted((root / "landing").rglob("*.jsonl")):
        whole = path.read_text().rpartition("\n")[0]
        out += [json.loads(line) for line in whole.splitlines()]
    return out


def lander(port: int, root: Path) -> LanderConfig:
    return LanderConfig(Broker("127.0.0.1", port), ("ledge/#",), root, max_file_age=30)


def marks(gateway: str, seq: int) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [(GATEWAY_PROPERTY, gateway), (SEQUENCE_PROPERTY, str(seq))]
    return props


def test_a_crash_before_the_ack_redelivers_and_silver_counts_each_once(
    spark: SparkSession, tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    root = tmp_path / "tables"
    crashing = CrashingLander(lander(mosquitto.port, root))
    first = Running(crashing)  # the persistent session exists from here on
    pub = Paho(mosquitto.port, "bridge-standin").connect()
    count = 40
    # measured now: the lander stamps its receive time with the clock, and silver
    # quarantines what arrives beyond the late-data horizon
    now = datetime.now(UTC).isoformat().encode()
    for seq in range(1, count + 1):
        payload = b'{"value":%d,"unit":"","timestamp":"%s"}' % (seq, now)
        pub.publish(f"ledge/gw1/serial/env/n{seq % 3}", payload, 1, properties=marks("gw1", seq))
    pub.disconnect()
    first.thread.join(10)
    assert isinstance(first.error, Crash)
    written = len(landed_lines(root))
    assert written >= 1  # on disk, never acknowledged

    second = Running(Lander(lander(mosquitto.port, root)))
    try:
        # Every message landed, and every one the crash left unacknowledged came again
        # (the crashed run's recovered file alone already holds every sequence number).
        wait_for(
            lambda: (
                {line["seq"] for line in landed_lines(root)} == {str(s) for s in range(1, 41)}
                and len(landed_lines(root)) >= count + crashing.crashed_with
            ),
            15,
            "every message landed, each unacknowledged one redelivered",
        )
    finally:
        second.stop()
    assert second.error is None
    assert not list((root / "landing" / "_incoming").glob("*.jsonl"))  # all finished
    files = list((root / "landing").glob("date=*/hour=*/*.jsonl"))
    assert len(files) >= 2  # the crashed run's file was recovered into its partition
    copies = Counter(str(line["seq"]) for line in landed_lines(root))
    redelivered = sum(copies.values()) - count
    assert redelivered >= crashing.crashed_with

    result = jobs.silver(spark, Layout(str(root)), PipelineConfig(), progress=False)
    assert (result.readings, result.duplicates, result.quarantined) == (count, redelivered, 0)


@pytest.fixture
def device(tmp_path: Path) -> Iterator[FakeDevice]:
    d = FakeDevice(tmp_path / "serial-by-id-usb-env")
    yield d
    d.close()


def test_the_chain_from_a_serial_sensor_to_gold(
    spark: SparkSession, tmp_path: Path, mosquitto: MosquittoProcess, device: FakeDevice
) -> None:
    root = tmp_path / "tables"
    landing = Running(Lander(lander(mosquitto.port, root)))
    config = tmp_path / "ledge.toml"
    config.write_text(
        '[gateway]\nid = "gw1"\n'
        f'[[serial]]\nname = "env"\npath = "{device.link}"\nprotocol = "kv"\n'
        'fields = { t = { quantity = "temperature", unit = "°C" } }\n'
        f'[[bridges]]\nname = "cloud"\naddress = "127.0.0.1:{mosquitto.port}"\n'
        '[[bridges.rules]]\nfilter = "ledge/#"\n'
    )
    gateway = LedgeProcess(config=config).start()
    sent = [round(20 + i / 100, 2) for i in range(200)]
    topic = "ledge/gw1/serial/env/temperature"
    try:
        gateway.wait_log("connected at")
        gateway.wait_log("bridge cloud: connected to")
        device.send(b"".join(b"t=%.2f\n" % v for v in sent))
        wait_for(
            lambda: sum(line["topic"] == topic for line in landed_lines(root)) >= len(sent),
            20,
            "every reading landed",
        )
    finally:
        assert gateway.stop() == 0
        landing.stop()
    assert landing.error is None

    layout = Layout(str(root))
    done, gold = jobs.run(spark, layout, PipelineConfig(), progress=False)
    rows = spark.read.parquet(str(root / "silver/readings")).collect()
    assert sorted(r.value for r in rows) == sent
    assert {(r.gateway, r.bridge, r.quantity, r.unit) for r in rows} == {
        ("gw1", "gw1", "temperature", "°C")
    }
    assert len({r.seq for r in rows}) == len(sent) and all(r.copies == 1 for r in rows)
    q = jobs.table_rows(spark, str(root / "quarantine"))
    assert done.quarantined == 0, q
    assert done.ignored >= 2  # gateway and device status topics
    minutes = spark.read.parquet(str(root / "gold/sensor_minute")).collect()
    assert sum(r["count"] for r in minutes) == len(sent)
    assert min(r["min"] for r in minutes) == sent[0] and max(r["max"] for r in minutes) == sent[-1]
    assert gold.rows["health"] >= 1
