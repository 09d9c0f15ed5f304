"""``ledge status``: the status document as a terminal shows it, whole, for a gateway
with something in every section; and the units its numbers are written in."""

from __future__ import annotations

import re

import pytest

from gateway.metrics import page
from gateway.metrics.view import (
    MAX_DEVICES,
    BridgeStatus,
    DeviceStatus,
    ListenerStatus,
    Rates,
    Snapshot,
    StatusPart,
    ValueStatus,
    counter,
    gauge,
    status_document,
)
from tests.test_metrics_view import many_devices, snapshot

MIB = 1024 * 1024
NOW = 1_700_000_000.0


def doc() -> dict[str, object]:
    """A gateway up a day, with clients, a full store, four bridges (down, up,
    connecting, up since a time not known), two sensors (one away), drops, warnings."""
    snap = Snapshot(
        gateway="edge-7",
        version="1.4.2",
        wall_time=NOW,
        uptime=93_784.0,
        listeners=(
            ListenerStatus("lan", "tcp", "0.0.0.0:1883"),
            ListenerStatus("web", "websocket", "0.0.0.0:8080"),
        ),
        samples=(
            gauge("ledge_clients_connected", "c", 3, listener="lan", protocol="3.1.1"),
            gauge("ledge_clients_connected", "c", 1200, listener="lan", protocol="5.0"),
            gauge("ledge_clients_connected", "c", 0, listener="web", protocol="5.0"),
            gauge("ledge_clients_maximum", "m", 1500),
            gauge("ledge_sessions", "s", 1250, state="connected"),
            gauge("ledge_clients_slow", "s", 2),
            counter("ledge_messages_received_total", "r", 1234567),
            counter("ledge_messages_sent_total", "s", 2345678),
            gauge("ledge_subscriptions", "s", 4321),
            gauge("ledge_retained_messages", "r", 17),
            gauge("process_resident_memory_bytes", "r", 31.5 * MIB),
            gauge("ledge_store_size_bytes", "s", 3 * 1024 + 512),
            gauge("ledge_store_limit_bytes", "s", 100 * MIB),
            gauge("ledge_data_dir_free_bytes", "f", 5 * 1024 * MIB),
            gauge("ledge_store_full", "f", 1),
            counter("ledge_messages_dropped_total", "d", 5, reason="expired"),
            counter("ledge_messages_dropped_total", "d", 0, reason="queue_full"),
        ),
        parts=(
            StatusPart(
                bridges=(
                    BridgeStatus(
                        "cloud",
                        "disconnected",
                        "mqtt.example.com:8883",
                        "connection refused",
                        last_error_at=NOW - 75,
                        since=NOW - 302,
                        queued=1234,
                        bytes=2 * MIB + 1,
                        max_messages=100000,
                        oldest_age=3725.0,
                        sent=99,
                        acknowledged=98,
                        dropped=1,
                    ),
                    BridgeStatus(
                        "backup",
                        "connected",
                        "10.0.0.2:1883",
                        since=NOW - 86400 * 2,
                        sent=5,
                        acknowledged=5,
                    ),
                    BridgeStatus("lab", "connecting", "lab:1883", since=NOW - 10),
                    BridgeStatus("spare", "connected", "spare:1883"),
                )
            ),
            StatusPart(
                devices=(
                    DeviceStatus(
                        "serial",
                        "env",
                        True,
                        NOW - 4,
                        (
                            ValueStatus("temp", 21.5, "°C", (21.0, 21.5)),
                            ValueStatus("door", True, "", ()),
                        ),
                    ),
                    DeviceStatus("ble", "thermo", False, None, (), state="away"),
                ),
                warnings=("adapter hci0 failed",),
            ),
        ),
        rates=Rates(10, 20, (100.0, 10.0, 20.0), (0.0, 20.0, 40.5)),
    )
    return status_document(snap)


#: What ``ledge status`` prints for ``doc()``, line by line.
TERMINAL = [
    "gateway edge-7 (ledge 1.4.2), up 1 d 2 h",
    "  clients        1,203 connected (peak 1,500), 1,250 sessions, 2 slow",
    "  messages       10/s in, 20/s out (1,234,567 in, 2,345,678 out since start)",
    "  subscriptions  4,321, retained messages 17",
    "  memory         31.5 MiB",
    "  store          3.5 KiB, 5.0 GiB free (FULL)",
    "listeners",
    "  lan            tcp           0.0.0.0:1883           clients: 3 on 3.1.1, 1200 on 5.0",
    "  web            websocket     0.0.0.0:8080           no clients",
    "bridges",
    "  cloud          disconnected  mqtt.example.com:8883  outbox 1,234 (2.0 MiB), "
    "oldest 1 h 2 min, sent 99, acknowledged 98, dropped 1, "
    "down since 22:08:18 UTC (5 min 2 s), last error: connection refused (1 min 15 s ago)",
    "  backup         connected     10.0.0.2:1883          outbox 0 (0 B), oldest 0 s, "
    "sent 5, acknowledged 5, dropped 0, up since 22:13:20 UTC (2 d 0 h)",
    "  lab            connecting    lab:1883               outbox 0 (0 B), oldest 0 s, "
    "sent 0, acknowledged 0, dropped 0, down since 22:13:10 UTC (10 s)",
    "  spare          connected     spare:1883             outbox 0 (0 B), oldest 0 s, "
    "sent 0, acknowledged 0, dropped 0",
    "sensors",
    "  env            serial   connected     seen 4 s ago      temp 21.5 °C, door true",
    "  thermo         ble      away          seen never        ",
    "drops",
    "  expired                                  5",
    "warnings",
    "  ! store full: QoS 1/2 messages for persistent sessions are being refused",
    "  ! 2 slow consumer(s): QoS 0 messages to them are being dropped",
    "  ! bridge cloud disconnected (connection refused), down for 5 min 2 s: "
    "1234 message(s) waiting",
    "  ! bridge lab connecting, down for 10 s: 0 message(s) waiting",
    "  ! ble device thermo is away",
    "  ! adapter hci0 failed",
]


def test_the_terminal_summary_of_a_gateway_with_something_in_every_section() -> None:
    assert page.render_text(doc()).split("\n") == [*TERMINAL, ""]


def test_devices_past_the_cap_are_counted_on_a_line_of_their_own() -> None:
    text = page.render_text(status_document(snapshot(parts=(many_devices(MAX_DEVICES + 3),))))
    lines = text.splitlines()
    assert lines[lines.index("sensors") + MAX_DEVICES + 1] == "  and 3 more"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
        (1024**2 - 1, "1024.0 KiB"), (1024**2, "1.0 MiB"), (5 * 1024**3, "5.0 GiB"),
        (3 * 1024**4, "3.0 TiB"), (2048 * 1024**4, "2048.0 TiB"),  # no unit past TiB
    ],
)  # fmt: skip
def test_sizes_are_written_in_the_largest_binary_unit_under_1024(value: float, text: str) -> None:
    assert page.size(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"), (1234567, "1,234,567"), (2.0, "2"), (2.5, "2.5"), (2.125, "2.12"),
        (1234.567, "1,234.57"), (0.1, "0.1"), (True, "true"), (False, "false"),
    ],
)  # fmt: skip
def test_numbers_are_grouped_and_rounded_to_two_places(value: float, text: str) -> None:
    assert page.num(value) == text


def test_the_page_says_the_same_in_its_tables() -> None:
    """The status page's server-side tables, for the same gateway: since when and
    how long ago, as the terminal says it."""
    html = page.render(doc())
    assert '<td class="since">down since 22:08:18 UTC (5 min 2 s)</td>' in html
    assert '<td class="error">connection refused (1 min 15 s ago)</td>' in html
    assert '<td class="since">up since 22:13:20 UTC (2 d 0 h)</td>' in html
    assert '<td class="state bad">connecting</td><td class="since">down since 22:13:10' in html
    assert '<td class="state ok">connected</td><td class="since"></td><td>spare:1883' in html
    assert '<td class="ok">connected</td><td>4 s ago</td>' in html
    assert '<td class="bad">away</td><td>never</td>' in html


def test_the_pages_cards_show_each_figure_under_its_label() -> None:
    cards = re.findall(
        r'<div class="card"><b>(.*?)</b><span>(.*?)</span></div>', page.render(doc())
    )
    shown = {label: re.sub(r"<svg.*</svg>", "", value) for value, label in cards}
    assert shown == {
        "clients": "1,203", "messages in/s": "10", "messages out/s": "20",
        "subscriptions": "4,321", "retained": "17", "memory": "31.5 MiB",
        "store": "3.5 KiB", "free disk": "5.0 GiB",
    }  # fmt: skip
    lines = {label: re.findall(r'points="([^"]*)"', value) for value, label in cards}
    assert lines["messages in/s"] == ["0.0,1.0 50.0,19.0 100.0,17.0"]  # 100, 10, 20 per s
    assert lines["messages out/s"] == ["0.0,19.0 50.0,10.1 100.0,1.0"]  # 0, 20, 40.5 per s
    assert lines["clients"] == []


@pytest.mark.parametrize(
    ("history", "points"),
    [
        ([], None),
        ([5.0], None),  # one point is no line
        ([1.0, 2.0], "0.0,19.0 100.0,1.0"),
        ([3.0, 3.0, 3.0], "0.0,19.0 50.0,19.0 100.0,19.0"),  # flat: along the bottom
        ([-4.0, 0.0, -2.0, 4.0], "0.0,19.0 33.3,10.0 66.7,14.5 100.0,1.0"),
    ],
)
def test_a_sparkline_spans_its_box_from_the_lowest_to_the_highest_value(
    history: list[float], points: str | None
) -> None:
    svg = page.spark(history)
    if points is None:
        assert svg == ""
        return
    assert svg == (
        '<svg class="spark" viewBox="0 0 100 20" preserveAspectRatio="none" aria-hidden="true">'
        f'<polyline points="{points}"/></svg>'
    )


def test_the_pages_tables_of_listeners_sensors_and_drops() -> None:
    html = page.render(doc())
    assert (
        '<tr data-listener="lan"><td>lan</td><td>tcp</td><td>0.0.0.0:1883</td>'
        '<td class="n">3</td><td class="n">1,200</td></tr>'
        '<tr data-listener="web"><td>web</td><td>websocket</td><td>0.0.0.0:8080</td>'
        '<td class="n">0</td><td class="n">0</td></tr>'
    ) in html
    # a boolean reads as the terminal and the page's script write it
    assert (
        '<span class="v" data-quantity="temp">temp <b>21.5</b> °C</span>'
        '<span class="v" data-quantity="door">door <b>true</b> </span>'
    ) in html
    assert (
        '<h2>Drops</h2><table><tr><th>where and why</th><th class="n">messages</th></tr>'
        '<tr><td>expired</td><td class="n">5</td></tr></table>'
    ) in html  # the reasons with none are left out
    warnings = re.findall(r"<li>(.*?)</li>", html.split('<ul class="warn">')[1].split("</ul>")[0])
    assert warnings == [line.removeprefix("  ! ") for line in TERMINAL if line.startswith("  ! ")]
