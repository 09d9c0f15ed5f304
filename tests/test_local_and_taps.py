"""The in-process client API and taps: no TCP, captures, a bounded plane."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway import taps
from gateway.broker.local import LocalClient
from gateway.broker.message import Message
from gateway.mqtt import MQTT_5, MQTT_311
from tests.support.clients import Paho
from tests.support.harness import Harness
from tests.support.procs import LedgeProcess
from tests.support.wait import async_wait_for

Got = list[tuple[str, bytes, int, bool, tuple[int, ...]]]


def collector() -> tuple[Got, taps.Handler]:
    got: Got = []

    def sink(msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> None:
        got.append((msg.topic, msg.payload, qos, retain, sub_ids))

    return got, sink


def test_local_client_receives_without_tcp_and_publishes_to_clients() -> None:
    h = Harness()
    got, sink = collector()
    local = LocalClient(h.broker, "inproc", sink)  # type: ignore[arg-type]
    local.subscribe("sensors/#", 1, h.now, identifier=7)
    remote = h.client()
    remote.connect("remote")
    remote.subscribe("cmd/#", 1)
    remote.publish("sensors/a", b"21.5", 1)
    assert got == [("sensors/a", b"21.5", 1, False, (7,))]
    assert local.publish("cmd/x", b"go", h.now, qos=1) == 1
    [msg] = remote.publishes()
    assert (msg.topic, msg.payload, msg.qos) == ("cmd/x", b"go", 1)


def test_local_subscribe_gets_retained_and_honours_no_local() -> None:
    h = Harness()
    got, sink = collector()
    local = LocalClient(h.broker, "inproc", sink)  # type: ignore[arg-type]
    local.publish("state/own", b"mine", h.now, retain=True)
    other = h.client()
    other.connect("other")
    other.publish("state/other", b"theirs", retain=True)
    local.subscribe("state/#", 0, h.now, no_local=True)
    assert [(t, p, r) for t, p, _q, r, _s in got] == [("state/other", b"theirs", True)]
    local.publish("state/own", b"again", h.now)
    assert len(got) == 1
    assert local.unsubscribe("state/#") and not local.unsubscribe("state/#")


def test_local_client_in_a_shared_group_with_a_network_client() -> None:
    h = Harness()
    got, sink = collector()
    local = LocalClient(h.broker, "worker-local", sink)  # type: ignore[arg-type]
    local.subscribe("$share/w/jobs", 1, h.now)
    remote = h.client(MQTT_5)
    remote.connect("worker-remote")
    remote.subscribe("$share/w/jobs", 1)
    pub = h.client()
    pub.connect("pub")
    for i in range(6):
        pub.publish("jobs", b"%d" % i, 1)
    assert len(got) == 3 and len(remote.publishes()) == 3


def test_local_client_ids_do_not_collide_and_close_cleans_up() -> None:
    h = Harness()
    local = LocalClient(h.broker, "x")
    with pytest.raises(ValueError, match="already in use"):
        LocalClient(h.broker, "x")
    with pytest.raises(ValueError):
        local.subscribe("a/#/b")
    with pytest.raises(ValueError):
        local.publish("a/+", b"", h.now)
    local.subscribe("a/b")
    local.close(h.now)
    assert "x" not in h.broker.sessions and h.broker.index.count == 0


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_network_clients_cannot_take_over_an_in_process_session(version: int) -> None:
    h = Harness()
    got, sink = collector()
    local = LocalClient(h.broker, "ledge-bridge-cloud", sink)  # type: ignore[arg-type]
    local.subscribe("a/#")
    intruder = h.client(version)
    ack = intruder.connect("ledge-bridge-cloud", clean_start=True)
    assert ack.reason_code == (0x85 if version == MQTT_5 else 2)  # identifier not valid
    assert h.broker.sessions["ledge-bridge-cloud"] is local.session
    other = h.client()
    other.connect("p")
    other.publish("a/b", b"still here")
    assert [m[1] for m in got] == [b"still here"]


# --------------------------------------------------------------------------- taps


@pytest.mark.parametrize(
    ("pattern", "topic_filter", "captures"),
    [
        ("sensors/{device}/temperature", "sensors/+/temperature", ((1, "device"),)),
        ("{site}/{device}/#", "+/+/#", ((0, "site"), (1, "device"))),
        ("plain/topic", "plain/topic", ()),
    ],
)
def test_tap_patterns(
    pattern: str, topic_filter: str, captures: tuple[tuple[int, str], ...]
) -> None:
    assert taps.compile_pattern(pattern) == (topic_filter, captures)


@pytest.mark.parametrize("bad", ["a/{x}y", "a/#/b", "{x}/{x}", "a/{x"])
def test_bad_tap_patterns(bad: str) -> None:
    with pytest.raises(ValueError):
        taps.compile_pattern(bad)


def test_tap_plane_runs_handlers_with_captures_and_survives_errors() -> None:
    async def scenario() -> None:
        h = Harness()
        seen: list[tuple[str, str]] = []

        async def temperature(message: taps.TapMessage, device: str) -> None:
            seen.append((device, message.text))

        def broken(message: taps.TapMessage) -> None:
            raise RuntimeError("bug in user code")

        plane = taps.TapPlane(
            h.broker,
            lambda: h.now,
            [
                taps.Tap(
                    "sensors/{device}/temperature",
                    temperature,
                    0,
                    *taps.compile_pattern("sensors/{device}/temperature"),
                ),
                taps.Tap("sensors/#", broken, 0, *taps.compile_pattern("sensors/#")),
            ],
            queue_size=10,
        )
        plane.start()
        try:
            pub = h.client()
            pub.connect("p")
            pub.publish("sensors/kitchen/temperature", b"21.5")
            pub.publish("sensors/cellar/temperature", b"12.0")
            await async_wait_for(lambda: plane.stats.handled == 2 and plane.stats.failed == 2, 5)
            assert seen == [("kitchen", "21.5"), ("cellar", "12.0")]
        finally:
            await plane.stop()

    asyncio.run(scenario())


def test_tap_queue_is_bounded_and_overflow_is_counted() -> None:
    async def scenario() -> None:
        h = Harness()
        release = asyncio.Event()

        async def slow(message: taps.TapMessage) -> None:
            await release.wait()

        plane = taps.TapPlane(
            h.broker,
            lambda: h.now,
            [taps.Tap("t", slow, 0, *taps.compile_pattern("t"))],
            queue_size=5,
        )
        plane.start()
        client = h.client()
        client.connect("sub")
        client.subscribe("t")
        pub = h.client()
        pub.connect("p")
        await asyncio.sleep(0)  # let the worker start
        for i in range(20):
            pub.publish("t", b"%d" % i)
        # clients got every message at once; the taps kept five and counted the rest
        assert len(client.publishes()) == 20
        assert plane.stats.dropped >= 14
        assert len(plane.queue) <= 5
        # the drops are in $SYS, next to the broker's own counters
        values = h.broker.sys_values(h.now)
        assert values["$SYS/broker/taps/dropped"] == str(plane.stats.dropped)
        assert values["$SYS/broker/taps/waiting"] == str(len(plane.queue))
        release.set()
        await plane.stop()
        assert "$SYS/broker/taps/dropped" not in h.broker.sys_values(h.now)

    asyncio.run(scenario())


def test_slow_tap_module_never_delays_clients(tmp_path: Path) -> None:
    module = tmp_path / "slow_taps.py"
    module.write_text(
        "import asyncio\n"
        "from gateway.taps import on_message, publish\n"
        "@on_message('tele/{device}/temp')\n"
        "async def mirror(message, device):\n"
        "    await asyncio.sleep(0.5)\n"
        "    publish(f'mirrored/{device}', message.payload)\n"
    )
    config = tmp_path / "c.toml"
    config.write_text(f'[taps]\nmodule = "{module}"\nqueue_size = 4\n')
    proc = LedgeProcess(config=config).start()
    try:
        proc.wait_log("1 tap\\(s\\) listening: tele/{device}/temp")
        sub = Paho(proc.port, "fast-sub").connect()
        sub.subscribe("tele/#", 0)
        sub.subscribe("mirrored/#", 0)
        pub = Paho(proc.port, "fast-pub").connect()
        started = time.monotonic()
        for i in range(50):
            pub.publish("tele/boiler/temp", b"%d" % i, 1)
        sub.wait_messages(50, 5)
        # Were the 0.5 s tap in the way, 50 messages would take 25 s.
        assert time.monotonic() - started < 10.0
        got = sub.wait_messages(51, 5)
        mirrored = [m for m in got if m.topic == "mirrored/boiler"]
        assert mirrored and mirrored[0].payload == b"0"
        proc.wait_log(r"tap queue full \(4\)")
        pub.disconnect()
        sub.disconnect()
    finally:
        assert proc.stop() == 0


def test_the_decorator_registers_a_tap_and_leaves_the_function_as_it_was() -> None:
    """Broken, ``@on_message`` would replace the user's function (with None), or
    subscribe at another QoS than the one asked."""
    before = len(taps.REGISTRY)

    def handler(message: taps.TapMessage, device: str) -> None:
        pass

    try:
        assert taps.on_message("sensors/{device}/t")(handler) is handler
        assert taps.on_message("alerts/#", qos=2)(handler) is handler
        assert taps.REGISTRY[before:] == [
            taps.Tap("sensors/{device}/t", handler, 0, "sensors/+/t", ((1, "device"),)),
            taps.Tap("alerts/#", handler, 2, "alerts/#", ()),
        ]
    finally:
        del taps.REGISTRY[before:]
    message = taps.TapMessage("t", b'{"value": 31.5}', 1, False)
    assert message.json() == {"value": 31.5} and message.text == '{"value": 31.5}'


def test_a_full_tap_queue_counts_a_drop_per_tap_and_logs_at_1_2_4_8(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two taps on one topic, a queue of one, the worker not yet run: the first message
    is queued for the first tap; every other (message, tap) is a drop, each counted,
    the warnings at the 1st, 2nd, 4th, 8th ... drop."""

    async def scenario() -> None:
        h = Harness()

        def noop(message: taps.TapMessage) -> None:
            pass

        plane = taps.TapPlane(
            h.broker,
            lambda: h.now,
            [taps.Tap(f"t{i}", noop, 0, *taps.compile_pattern("t")) for i in (1, 2)],
            queue_size=1,
        )
        plane.start()
        pub = h.client()
        pub.connect("p")
        for i in range(5):  # without yielding: the worker takes nothing meanwhile
            pub.publish("t", b"%d" % i)
        assert (plane.stats.queued, plane.stats.dropped) == (1, 9)
        await plane.stop()

    with caplog.at_level("WARNING", "ledge.taps"):
        asyncio.run(scenario())
    so_far = [r.getMessage().rsplit("(", 1)[1] for r in caplog.records]
    assert so_far == [
        "1 dropped so far)",
        "2 dropped so far)",
        "4 dropped so far)",
        "8 dropped so far)",
    ]


def test_taps_see_what_is_published_while_they_run_not_what_was_retained_before() -> None:
    async def scenario() -> None:
        h = Harness()
        seen: list[bytes] = []
        pub = h.client()
        pub.connect("p")
        pub.publish("t", b"stored earlier", retain=True)
        plane = taps.TapPlane(
            h.broker,
            lambda: h.now,
            [taps.Tap("t", lambda m: seen.append(m.payload), 0, *taps.compile_pattern("t"))],
        )
        plane.start()
        try:
            pub.publish("t", b"now")
            await async_wait_for(lambda: plane.stats.handled == 1, 5)
            assert seen == [b"now"]
        finally:
            await plane.stop()

    asyncio.run(scenario())


def test_a_tap_module_that_is_not_python_is_refused_by_name(tmp_path: Path) -> None:
    module = tmp_path / "taps.txt"
    module.write_text("print('not loaded')\n")
    with pytest.raises(ImportError, match=r"taps\.module: cannot load .*taps\.txt"):
        taps.load_module(str(module))
    with pytest.raises(FileNotFoundError, match=r"taps\.module: no file .*nothing\.py"):
        taps.load_module(str(tmp_path / "nothing.py"))
