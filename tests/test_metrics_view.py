"""The pure metrics view: the Prometheus text format, the status document and its
warnings, the Home Assistant state, and the status page's size, escaping and policy."""

from __future__ import annotations

import base64
import hashlib
import math
import re
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.metrics import page
from gateway.metrics.view import (
    MAX_DEVICES,
    BridgeStatus,
    DeviceStatus,
    ListenerStatus,
    MetricError,
    Rates,
    Sample,
    Snapshot,
    StatusPart,
    ValueStatus,
    counter,
    exposition,
    format_value,
    gateway_state,
    gauge,
    message_rates,
    status_document,
)
from tests.support.prometheus import promtool_problems

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian prometheus)"
)


def test_families_are_written_together_with_help_and_type_once() -> None:
    text = exposition(
        [
            counter("ledge_x_total", "X things.", 3, reason="a"),
            gauge("ledge_y", "Y now.", 1.5),
            counter("ledge_x_total", "X things.", 4, reason="b"),
        ]
    )
    assert text == (
        "# HELP ledge_x_total X things.\n"
        "# TYPE ledge_x_total counter\n"
        'ledge_x_total{reason="a"} 3\n'
        'ledge_x_total{reason="b"} 4\n'
        "# HELP ledge_y Y now.\n"
        "# TYPE ledge_y gauge\n"
        "ledge_y 1.5\n"
    )


def test_label_values_and_help_are_escaped() -> None:
    text = exposition([gauge("ledge_g", 'Back\\slash\nnewline "q"', 1, name='a"b\\c\nd')])
    assert '# HELP ledge_g Back\\\\slash\\nnewline "q"\n' in text
    assert 'ledge_g{name="a\\"b\\\\c\\nd"} 1\n' in text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (3.0, "3"), (2.5, "2.5"), (math.inf, "+Inf"), (-math.inf, "-Inf"), (1e20, "1e+20")],
)
def test_values_are_written_as_the_format_says(value: float, text: str) -> None:
    assert format_value(value) == text
    assert format_value(math.nan) == "NaN"


@pytest.mark.parametrize(
    "samples",
    [
        [Sample("ledge_a", "gauge", "h", 1), Sample("ledge_a", "counter", "h", 1)],
        [gauge("ledge_a", "h", 1), gauge("ledge_a", "other help", 1)],
        [gauge("ledge_a", "h", 1, x="1"), gauge("ledge_a", "h", 2, x="1")],
        [gauge("ledge-a", "h", 1)],
        [gauge("ledge_a", "h", 1, **{"__reserved": "x"})],
        [gauge("ledge_a", "h", 1, **{"bad-label": "x"})],
    ],
    ids=["two-types", "two-helps", "same-labels-twice", "bad-name", "reserved-label", "bad-label"],
)
def test_what_the_format_cannot_carry_is_an_error(samples: list[Sample]) -> None:
    with pytest.raises(MetricError):
        exposition(samples)


def test_a_counter_must_end_in_total() -> None:
    with pytest.raises(MetricError, match="_total"):
        counter("ledge_messages", "h", 1)


# A reference reader of the text format, independent of the writer.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse_exposition(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    types: dict[str, str] = {}
    for line in text.split("\n")[:-1]:  # the format's lines end in \n, and only there
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"TYPE of {name} twice"
            types[name] = kind
            continue
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, line
        name, labels_text, value = m.groups()
        assert name in types, f"{name} before its TYPE"
        labels = []
        for lm in _LABEL.finditer(labels_text or ""):
            raw = lm.group(2)
            unescaped = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), raw)
            labels.append((lm.group(1), unescaped))
        out[(name, tuple(sorted(labels)))] = float(value.replace("Inf", "inf"))
    return out


names = st.from_regex(r"ledge_[a-z][a-z0-9_]{0,12}", fullmatch=True)
label_names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
values = st.floats(allow_nan=False) | st.integers(-(2**60), 2**60)


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            names, st.sampled_from(["counter", "gauge"]), st.dictionaries(label_names, st.text())
        ),
        max_size=12,
    ),
    st.data(),
)
def test_every_sample_reads_back_from_the_text(
    specs: list[tuple[str, str, dict[str, str]]], data: st.DataObject
) -> None:
    samples: list[Sample] = []
    kinds: dict[str, str] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for base, drawn_kind, labels in specs:
        kind = kinds.setdefault(base, drawn_kind)
        name = base + "_total" if kind == "counter" else base
        key = (name, tuple(sorted(labels.items())))
        if key in seen or (name != base and base in kinds and kinds.get(name)):
            continue
        seen.add(key)
        value = data.draw(values)
        samples.append(Sample(name, kind, f"help of {base}", value, tuple(labels.items())))  # type: ignore[arg-type]
    parsed = parse_exposition(exposition(samples))
    assert parsed == {
        (s.name, tuple(sorted(s.labels))): float(format_value(s.value).replace("Inf", "inf"))
        for s in samples
    }


@needs_promtool
def test_promtool_accepts_hostile_label_values() -> None:
    text = exposition(
        [
            counter("ledge_things_total", "Things.", 1, reason='qu"ote\\back\nline'),
            gauge("ledge_level", "Level.", -math.inf),
            gauge("ledge_ratio", "Ratio.", 0.25, listener="ünïcode ✓"),
        ]
    )
    assert not promtool_problems(text)


# ----------------------------------------------------------------------------- rates


def test_rates_are_per_interval_and_never_negative() -> None:
    rates = message_rates([(0.0, 0, 0), (5.0, 50, 100), (10.0, 150, 100), (15.0, 100, 90)])
    assert rates.received_history == (10.0, 20.0, 0.0)
    assert rates.sent_history == (20.0, 0.0, 0.0)
    assert (rates.received, rates.sent) == (0.0, 0.0)
    assert message_rates([(0.0, 1, 1)]) == Rates()


# ----------------------------------------------------------------------------- status


def snapshot(*samples: Sample, parts: tuple[StatusPart, ...] = ()) -> Snapshot:
    return Snapshot(
        gateway="gw1",
        version="1.2.3",
        wall_time=1_700_000_000.0,
        uptime=3725.0,
        listeners=(ListenerStatus("lan", "tcp", "0.0.0.0:1883"),),
        samples=samples,
        parts=parts,
    )


def test_clients_are_counted_per_listener_and_protocol() -> None:
    doc = status_document(
        snapshot(
            gauge("ledge_clients_connected", "c", 3, listener="lan", protocol="3.1.1"),
            gauge("ledge_clients_connected", "c", 4, listener="lan", protocol="5.0"),
            gauge("ledge_clients_connected", "c", 9, listener="other", protocol="5.0"),
        )
    )
    assert doc["listeners"] == [
        {"name": "lan", "type": "tcp", "address": "0.0.0.0:1883", "clients": {"3.1.1": 3, "5.0": 4}}
    ]
    assert doc["clients"]["connected"] == 16


def test_drops_are_summed_by_where_and_why() -> None:
    doc = status_document(
        snapshot(
            counter("ledge_messages_dropped_total", "d", 2, reason="queue_full"),
            counter(
                "ledge_bridge_messages_dropped_total", "b", 5, bridge="cloud", reason="expired"
            ),
            counter("ledge_taps_dropped_total", "t", 7),
            counter("ledge_ble_adverts_dropped_total", "a", 1, driver="ble", reason="bad_mic"),
            counter("ledge_messages_dropped_total", "d", 3, reason="offline_qos0"),
            counter(
                "ledge_bridge_messages_dropped_total", "b", 4, bridge="cloud", reason="qos0_offline"
            ),
        )
    )
    assert doc["drops"] == {
        "queue full": 2,
        "bridge cloud: expired": 5,
        "taps": 7,
        "ble adverts ble: bad mic": 1,
        # Reasons in words where the label alone would be cryptic.
        "QoS 0 for an offline session": 3,
        "bridge cloud: QoS 0 while the link is down": 4,
    }


def test_warnings_follow_the_values() -> None:
    mib = 1024 * 1024
    quiet = snapshot(
        gauge("ledge_store_size_bytes", "s", 10 * mib),
        gauge("ledge_store_limit_bytes", "s", 100 * mib),
        gauge("ledge_data_dir_free_bytes", "s", 1000 * mib),
        gauge("ledge_store_full", "s", 0),
        gauge("ledge_clients_slow", "s", 0),
        parts=(
            StatusPart(bridges=(BridgeStatus("cloud", "connected", max_bytes=100),)),
            StatusPart(devices=(DeviceStatus("serial", "env", True),)),
        ),
    )
    assert status_document(quiet)["warnings"] == []
    loud = snapshot(
        gauge("ledge_store_size_bytes", "s", 85 * mib),
        gauge("ledge_store_limit_bytes", "s", 100 * mib),
        gauge("ledge_data_dir_free_bytes", "s", 10 * mib),
        gauge("ledge_store_full", "s", 1),
        gauge("ledge_clients_slow", "s", 2),
        parts=(
            StatusPart(
                bridges=(
                    BridgeStatus(
                        "cloud",
                        "disconnected",
                        last_error="connection refused",
                        queued=9,
                        bytes=90,
                        max_bytes=100,
                        since=1_700_000_000.0 - 302,
                    ),
                )
            ),
            StatusPart(
                devices=(
                    DeviceStatus("serial", "env", False),
                    DeviceStatus("ble", "thermo", False, state="away"),
                    # A beacon's presence is what it reports: away is not a fault.
                    DeviceStatus("ble", "keys", False, state="away", presence=True),
                ),
                warnings=("adapter hci0 failed",),
            ),
        ),
    )
    assert status_document(loud)["warnings"] == [
        "store full: QoS 1/2 messages for persistent sessions are being refused",
        "store near full: 85.0 MiB of 100.0 MiB (store.max_bytes)",
        "disk near full: 10.0 MiB free under data_dir",
        "2 slow consumer(s): QoS 0 messages to them are being dropped",
        "bridge cloud disconnected (connection refused), down for 5 min 2 s: 9 message(s) waiting",
        "bridge cloud: outbox near full (9 messages, 0.0 MiB)",
        "serial device env is disconnected",
        "ble device thermo is away",
        "adapter hci0 failed",
    ]


def test_devices_are_capped_and_the_rest_counted() -> None:
    doc = status_document(snapshot(parts=(many_devices(MAX_DEVICES + 7),)))
    assert len(doc["devices"]) == MAX_DEVICES
    assert doc["devices_not_shown"] == 7


def test_home_assistant_state_averages_rates_over_its_window() -> None:
    mib = 1024 * 1024
    doc = status_document(
        Snapshot(
            "gw1", "1", 0.0, 42.9,
            samples=(
                gauge("ledge_clients_connected", "c", 5, listener="l", protocol="5.0"),
                gauge("process_resident_memory_bytes", "r", 30 * mib),
                gauge("ledge_store_size_bytes", "s", 1),
                gauge("ledge_data_dir_free_bytes", "f", 512 * mib),
                counter("ledge_messages_dropped_total", "d", 3, reason="expired"),
            ),
            parts=(
                StatusPart(
                    bridges=(BridgeStatus("cloud", "connected", queued=4, oldest_age=1.25),)
                ),
            ),
            rates=Rates(10, 20, (100.0, 10.0, 20.0), (0.0, 20.0, 40.0)),
        )
    )  # fmt: skip
    assert gateway_state(doc, 2) == {
        "clients": 5,
        "messages_in": 15.0,
        "messages_out": 30.0,
        "dropped": 3,
        "rss_mib": 30.0,
        "uptime": 42,
        "free_disk_mib": 512.0,
        "bridges": {"cloud": {"connected": True, "outbox": 4, "oldest_age": 1.2}},
    }


# ----------------------------------------------------------------------------- page


def many_devices(count: int, quantities: int = 4, name: str = "device") -> StatusPart:
    return StatusPart(
        devices=tuple(
            DeviceStatus(
                "serial",
                f"{name}-{i}",
                i % 2 == 0,
                1_700_000_000.0 - i,
                tuple(
                    ValueStatus(f"quantity_{q}", 21.123456 + q, "°C", tuple(map(float, range(60))))
                    for q in range(quantities)
                ),
            )
            for i in range(count)
        ),
        warnings=tuple(f"warning {i}" for i in range(count)),
    )


def test_the_page_stays_under_50_kb_whatever_the_status_holds() -> None:
    long = "n" * 200
    doc = status_document(
        snapshot(
            parts=(
                many_devices(MAX_DEVICES + 50, quantities=12, name=long),
                StatusPart(
                    bridges=tuple(
                        BridgeStatus(f"bridge{i}", "disconnected", last_error="e" * 200)
                        for i in range(8)
                    )
                ),
            )
        )
    )
    assert len(doc["warnings"]) == 20 and doc["warnings"][-1].startswith("and ")
    html = page.render(doc).encode()
    assert len(html) < 50 * 1024, len(html)
    shown = len(re.findall(rb'<tr data-device="[^\x27]', html))
    assert 0 < shown < MAX_DEVICES
    assert f"and {MAX_DEVICES + 50 - shown} more devices".encode() in html


def test_a_page_with_twenty_devices_shows_them_all() -> None:
    doc = status_document(snapshot(parts=(many_devices(20),)))
    html = page.render(doc).encode()
    assert len(re.findall(rb'<tr data-device="[^\x27]', html)) == 20
    assert not re.search(rb'<p class="mute">and \d', html)
    assert len(html) < 50 * 1024, len(html)


def test_names_from_the_field_are_escaped_everywhere() -> None:
    evil = '<script>alert("x")</script>'
    doc = status_document(
        snapshot(
            parts=(
                StatusPart(
                    devices=(DeviceStatus("serial", evil, True, None, (ValueStatus("q", evil),)),),
                    bridges=(BridgeStatus(evil, "disconnected", last_error=evil),),
                    warnings=(evil,),
                ),
            )
        )
    )
    html = page.render(doc)
    assert evil not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html


def test_the_content_security_policy_allows_exactly_the_inline_code() -> None:
    html = page.render(status_document(snapshot()))
    script = re.search(r"<script>(.*)</script>", html, re.S)
    style = re.search(r"<style>(.*)</style>", html, re.S)
    assert script and style

    def digest(text: str) -> str:
        return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()

    policy = page.CONTENT_SECURITY_POLICY
    assert f"script-src 'sha256-{digest(script.group(1))}'" in policy
    assert f"style-src 'sha256-{digest(style.group(1))}'" in policy
    assert "http://" not in html and "https://" not in html  # no external assets
    assert " style=" not in html  # inline style attributes would be blocked


def test_the_page_shows_everything_without_javascript() -> None:
    doc = status_document(
        snapshot(
            gauge("ledge_clients_connected", "c", 3, listener="lan", protocol="3.1.1"),
            parts=(
                StatusPart(
                    devices=(
                        DeviceStatus(
                            "serial", "env", True, 1_699_999_990.0,
                            (ValueStatus("temperature", 21.5, "°C", (20.0, 21.0, 21.5)),),
                        ),
                    ),
                    bridges=(
                        BridgeStatus(
                            "cloud", "connected", "cloud.example:8883", since=1_699_996_400.0
                        ),
                    ),
                ),
            ),
        )
    )  # fmt: skip
    html = page.render(doc)
    assert (
        '<tr data-listener="lan"><td>lan</td><td>tcp</td><td>0.0.0.0:1883</td><td class="n">3</td>'
        in html
    )
    assert (
        '<td class="state ok">connected</td><td class="since">up since 21:13:20 UTC (1 h 0 min)'
        "</td><td>cloud.example:8883</td>" in html
    )
    assert 'data-quantity="temperature">temperature <b>21.5</b> °C</span>' in html
    assert "10 s ago" in html
    assert "up 1 h 2 min" in html


def test_a_bridge_shows_since_when_it_is_up_or_down_and_when_its_last_error_was() -> None:
    now = 1_700_000_000.0
    doc = status_document(
        snapshot(
            parts=(
                StatusPart(
                    bridges=(
                        BridgeStatus(
                            "up", "connected", last_error="connection refused",
                            last_error_at=now - 600, since=now - 590,
                        ),
                        BridgeStatus(
                            "down", "disconnected", last_error="timed out",
                            last_error_at=now - 5, since=now - 125,
                        ),
                    )
                ),
            )
        )
    )  # fmt: skip
    html = page.render(doc)
    # Connected: its last error is history, with its time, muted.
    assert (
        '<td class="since">up since 22:03:30 UTC (9 min 50 s)</td>' in html
        and '<td class="error mute">connection refused (10 min 0 s ago)</td>' in html
    )
    assert '<td class="since">down since 22:11:15 UTC (2 min 5 s)</td>' in html
    assert '<td class="error">timed out (5 s ago)</td>' in html
    text = page.render_text(doc)
    assert "down since 22:11:15 UTC (2 min 5 s), last error: timed out (5 s ago)" in text


def test_a_device_shows_its_state_in_its_own_words() -> None:
    doc = status_document(
        snapshot(
            parts=(
                StatusPart(
                    devices=(
                        DeviceStatus("serial", "env", False),
                        DeviceStatus("ble", "keys", False, state="away", presence=True),
                        DeviceStatus("ble", "thermo", True, state="present"),
                    )
                ),
            )
        )
    )
    html = page.render(doc)
    assert '<tr data-device="env"><td>env</td><td>serial</td><td class="bad">disconnected' in html
    assert '<tr data-device="keys"><td>keys</td><td>ble</td><td class="mute">away' in html
    assert '<tr data-device="thermo"><td>thermo</td><td>ble</td><td class="ok">present' in html
    assert [d["state"] for d in doc["devices"]] == ["disconnected", "away", "present"]
    assert "keys" not in " ".join(doc["warnings"])


def test_numeric_columns_are_right_aligned_headings_and_all() -> None:
    doc = status_document(
        snapshot(
            gauge("ledge_clients_connected", "c", 3, listener="lan", protocol="3.1.1"),
            counter("ledge_messages_dropped_total", "d", 2, reason="queue_full"),
            parts=(StatusPart(bridges=(BridgeStatus("cloud", "connected"),)),),
        )
    )
    html = page.render(doc)
    heads = {name: bool(n) for n, name in re.findall(r'<th( class="n")?>([^<]+)</th>', html)}
    assert [h for h, right in heads.items() if right] == [
        "MQTT 3.1.1", "MQTT 5.0", "outbox", "oldest", "sent", "acknowledged", "dropped",
        "messages",
    ]  # fmt: skip
