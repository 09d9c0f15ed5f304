"""``ledge-pipeline report``: one self-contained HTML page of fleet health and sensor series.

Spark reads the gold tables (and the quarantine's reasons) for the last ``days`` days of
data; the small results are drawn here as inline SVG charts, so the page needs nothing
but a browser (no scripts, no network). Rendering is pure: ``render(ReportData)``.
"""

from __future__ import annotations

import html
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline.jobs import DAY, read_table
from pipeline.progress import Progress
from pipeline.schema import FLEET_HEALTH, QUARANTINE, SENSOR_AGGREGATE
from pipeline.storage import Layout, Storage

log = logging.getLogger(__name__)

Point = tuple[datetime, float]
PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
    "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22",
)  # fmt: skip


@dataclass
class GatewaySummary:
    gateway: str
    messages: int
    rate: float
    lag_p95: float | None
    duplicates: int
    dropped: int
    implausible: int
    last_hour: datetime


@dataclass
class SensorSeries:
    name: str
    unit: str
    mean: list[Point]
    low: list[Point]
    high: list[Point]


@dataclass
class ReportData:
    root: str
    first: date | None = None
    last: date | None = None
    gateways: list[GatewaySummary] = field(default_factory=list)
    #: metric -> gateway -> hourly points
    health: dict[str, dict[str, list[Point]]] = field(default_factory=dict)
    quarantine: list[tuple[str, int]] = field(default_factory=list)
    sensors: list[SensorSeries] = field(default_factory=list)
    generated: datetime = field(default_factory=lambda: datetime.now(UTC))


HEALTH_CHARTS = (
    ("messages", "Messages per hour", ""),
    ("lag_p95", "Device-to-cloud lag, 95th percentile", "s"),
    ("dropped", "Messages the gateway dropped", ""),
    ("duplicates", "Redelivered copies folded", ""),
)


def collect(
    spark: SparkSession, layout: Layout, days: int = 7, max_series: int = 12, max_gateways: int = 10
) -> ReportData:
    """The report's data: the last ``days`` days that gold has, a few series each."""
    storage = Storage(spark)
    present = storage.partition_dates(layout.gold("health"))
    data = ReportData(layout.root)
    if not present:
        return data
    last = present[-1]
    wanted = {last - DAY * i for i in range(days)}
    data.first, data.last = min(wanted & set(present)), last
    health = read_table(spark, layout.gold("health"), FLEET_HEALTH, wanted, storage)
    rows = health.orderBy("gateway", "hour").collect()
    by_gateway: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_gateway.setdefault(row["gateway"], []).append(row.asDict())
    ranked = sorted(by_gateway, key=lambda g: -sum(int(r["messages"]) for r in by_gateway[g]))
    for gateway in sorted(by_gateway):
        hours = by_gateway[gateway]
        total = sum(int(r["messages"]) for r in hours)
        lags = [float(r["lag_p95"]) for r in hours if r["lag_p95"] is not None]
        data.gateways.append(
            GatewaySummary(
                gateway,
                total,
                total / (3600.0 * len(hours)),
                max(lags) if lags else None,
                sum(int(r["duplicates"]) for r in hours),
                sum(int(r["dropped"]) for r in hours),
                sum(int(r["implausible"]) for r in hours),
                max(r["hour"] for r in hours),
            )
        )
    for metric, _, _ in HEALTH_CHARTS:
        data.health[metric] = {
            g: [(_utc(r["hour"]), float(r[metric])) for r in by_gateway[g] if r[metric] is not None]
            for g in ranked[:max_gateways]
        }

    quarantine = read_table(spark, layout.quarantine, QUARANTINE, wanted, storage)
    kinds = F.regexp_replace(F.regexp_replace("reason", r"'[^']*'", "'…'"), r"\d+", "N")
    data.quarantine = [
        (r["kind"], int(r["count"]))
        for r in quarantine.groupBy(kinds.alias("kind"))
        .count()
        .orderBy(F.desc("count"))
        .limit(20)
        .collect()
    ]

    hourly = read_table(spark, layout.gold("sensor_hour"), SENSOR_AGGREGATE, wanted, storage)
    name = F.concat_ws("/", "gateway", "driver", "device", "quantity")
    top = [
        r["name"]
        for r in hourly.groupBy(name.alias("name"))
        .agg(F.sum("count").alias("n"))
        .orderBy(F.desc("n"), "name")
        .limit(max_series)
        .collect()
    ]
    series: dict[str, SensorSeries] = {}
    for r in (
        hourly.where(name.isin(top))
        .select(name.alias("name"), "*")
        .orderBy("name", "start")
        .collect()
    ):
        s = series.setdefault(r["name"], SensorSeries(r["name"], r["unit"], [], [], []))
        at = _utc(r["start"])
        s.mean.append((at, float(r["mean"])))
        s.low.append((at, float(r["min"])))
        s.high.append((at, float(r["max"])))
    data.sensors = [series[n] for n in sorted(series)]
    return data


def _utc(value: datetime) -> datetime:
    # Spark hands back naive datetimes in the session time zone, which is UTC here.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


# ---------------------------------------------------------------------------- rendering

WIDTH, HEIGHT = 760, 230
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 34


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    step = (high - low) / (count - 1)
    return [low + step * i for i in range(count)]


def _number(value: float) -> str:
    if value != 0 and (abs(value) >= 10000 or abs(value) < 0.01):
        return f"{value:.2g}"
    return f"{value:.2f}".rstrip("0").rstrip(".")


def line_chart(
    title: str,
    series: Mapping[str, Sequence[Point]],
    unit: str = "",
    bands: Mapping[str, tuple[Sequence[Point], Sequence[Point]]] | None = None,
) -> str:
    """An SVG line chart of time series, with optional min/max bands; empty input gives
    a chart that says so. A silence longer than three steps breaks the line."""
    bands = bands or {}
    points = [p for s in series.values() for p in s]
    points += [p for lo, hi in bands.values() for p in (*lo, *hi)]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{html.escape(title)}">'
        f'<text x="{LEFT}" y="18" class="title">{html.escape(title)}</text>'
    )
    if not points:
        return head + f'<text x="{LEFT}" y="{HEIGHT // 2}">no data</text></svg>'
    t0 = min(p[0] for p in points).timestamp()
    t1 = max(p[0] for p in points).timestamp()
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1
    span_t = max(t1 - t0, 1.0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at: datetime) -> float:
        return LEFT + (at.timestamp() - t0) / span_t * plot_w

    def y(v: float) -> float:
        return TOP + (1 - (v - y0) / (y1 - y0)) * plot_h

    parts = [head]
    for v in _ticks(y0, y1):
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" class="axis" text-anchor="end">'
            f"{_number(v)}{html.escape(unit)}</text>"
        )
    for t in _ticks(t0, t1, 4):
        at = datetime.fromtimestamp(t, UTC)
        parts.append(
            f'<text x="{x(at):.1f}" y="{HEIGHT - 12}" class="axis" text-anchor="middle">'
            f"{at:%Y-%m-%d %H:%M}</text>"
        )
    for i, (name, (lo, hi)) in enumerate(bands.items()):
        if lo and hi:
            outline = [f"{x(a):.1f},{y(v):.1f}" for a, v in (*hi, *reversed(lo))]
            parts.append(
                f'<polygon points="{" ".join(outline)}" fill="{PALETTE[i % len(PALETTE)]}" '
                f'opacity="0.15"><title>{html.escape(name)} min-max</title></polygon>'
            )
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        for run in _runs(sorted(pts)):
            coords = " ".join(f"{x(a):.1f},{y(v):.1f}" for a, v in run)
            if len(run) == 1:
                a, v = run[0]
                parts.append(f'<circle cx="{x(a):.1f}" cy="{y(v):.1f}" r="2" fill="{color}"/>')
            else:
                parts.append(
                    f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5">'
                    f"<title>{html.escape(name)}</title></polyline>"
                )
        parts.append(
            f'<text x="{WIDTH - RIGHT}" y="{TOP + 12 * i}" class="legend" '
            f'text-anchor="end" fill="{color}">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _runs(points: Sequence[Point]) -> list[list[Point]]:
    """Split where the time step is more than three times the usual one."""
    if len(points) < 3:
        return [list(points)] if points else []
    steps = sorted((b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(points))
    usual = steps[len(steps) // 2] or 1.0
    runs, current = [], [points[0]]
    for a, b in itertools.pairwise(points):
        if (b[0] - a[0]).total_seconds() > 3 * usual:
            runs.append(current)
            current = []
        current.append(b)
    runs.append(current)
    return runs


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 800px; color: #222 }
table { border-collapse: collapse; margin: 1em 0 } td, th { padding: 2px 10px; text-align: right }
th { border-bottom: 1px solid #999 } td:first-child, th:first-child { text-align: left }
svg { display: block; margin: 1em 0 } .title { font-weight: bold }
.axis, .legend { font-size: 11px }
.grid { stroke: #e4e4e4 } .note { color: #666 }
"""


def render(data: ReportData) -> str:
    """The whole page."""
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Ledge fleet report — {html.escape(data.root)}</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>Ledge fleet report</h1>",
        f"<p class='note'>{html.escape(data.root)} · generated {data.generated:%Y-%m-%d %H:%M} UTC",
    ]
    if data.first is None:
        out.append(
            " · no gold data yet: run <code>ledge-pipeline run</code> first.</p></body></html>"
        )
        return "".join(out)
    out.append(f" · data of {data.first} to {data.last} (UTC)</p>")
    out.append(
        "<h2>Fleet health</h2><table><tr><th>gateway</th><th>messages</th>"
        "<th>msg/s</th><th>lag p95 (s)</th><th>duplicates</th><th>dropped</th>"
        "<th>implausible</th><th>last hour</th></tr>"
    )
    for g in data.gateways:
        lag = "" if g.lag_p95 is None else _number(g.lag_p95)
        out.append(
            f"<tr><td>{html.escape(g.gateway)}</td><td>{g.messages}</td><td>{_number(g.rate)}</td>"
            f"<td>{lag}</td><td>{g.duplicates}</td><td>{g.dropped}</td><td>{g.implausible}</td>"
            f"<td>{g.last_hour:%Y-%m-%d %H:00}</td></tr>"
        )
    out.append("</table>")
    for metric, title, unit in HEALTH_CHARTS:
        out.append(line_chart(title, data.health.get(metric, {}), unit))
    out.append("<h2>Quarantine</h2>")
    if data.quarantine:
        out.append("<table><tr><th>reason</th><th>messages</th></tr>")
        out.extend(
            f"<tr><td>{html.escape(reason)}</td><td>{n}</td></tr>" for reason, n in data.quarantine
        )
        out.append("</table>")
    else:
        out.append("<p>Nothing quarantined.</p>")
    out.append(
        "<h2>Sensors</h2><p class='note'>"
        "Hourly mean, with the hour's minimum and maximum shaded.</p>"
    )
    for s in data.sensors:
        out.append(line_chart(s.name, {"mean": s.mean}, s.unit, {"mean": (s.low, s.high)}))
    out.append("</body></html>")
    return "\n".join(out)


def write_report(
    spark: SparkSession,
    layout: Layout,
    out: Path,
    days: int = 7,
    max_series: int = 12,
    progress: bool = True,
) -> ReportData:
    with Progress(spark, "report", enabled=progress):
        data = collect(spark, layout, days, max_series)
    out.write_text(render(data), encoding="utf-8")
    log.info(
        "report: %s (%d gateways, %d sensor series)", out, len(data.gateways), len(data.sensors)
    )
    return data
