"""Medians over rounds, the printed tables and the JSON document."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from bench.scenarios import PERSIST_RUNS, SCENARIOS, Outcome

#: How the report names each broker; the command line names "base" after its commit.
NAMES = {
    "ledge": "Ledge",
    "base": "base",
    "mosquitto": "Mosquitto",
    "amqtt": "amqtt",
    "relay": "ceiling",
}
#: The order of the brokers in every table.
ORDER = tuple(NAMES)


def _median(values: Iterable[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(outcomes: Sequence[Outcome]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{scenario: {broker: medians and counts}}`` over the successful rounds."""
    grouped: dict[str, dict[str, list[Outcome]]] = {}
    for o in outcomes:
        grouped.setdefault(o.scenario, {}).setdefault(o.broker, []).append(o)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for scenario, by_broker in grouped.items():
        summary[scenario] = {}
        for broker, runs in by_broker.items():
            ok = [r for r in runs if r.ok]
            entry: dict[str, Any] = {
                "unit": runs[0].unit or SCENARIOS[scenario].unit,
                "runs": len(runs),
                "ok_runs": len(ok),
                "figure": _median(r.figure for r in ok),
                "figures": [r.figure for r in ok],
                "peak_rss_kib": _median(r.peak_rss_kib for r in ok),
                "idle_rss_kib": _median(r.idle_rss_kib for r in ok),
                "drops": _median(r.drops for r in ok),
                "errors": [r.error for r in runs if r.error],
            }
            for key in (
                "p50_ms",
                "p99_ms",
                "p999_ms",
                "kib_per_conn",
                "accept_ms",
                "broker_cpu",
                *PERSIST_KEYS,
            ):
                value = _median(r.details.get(key) for r in ok)
                if value is not None:
                    entry[key] = value
            summary[scenario][broker] = entry
    return summary


#: The persist scenario's details summarized over rounds (see scenarios.run_persist).
PERSIST_KEYS = (
    "memory_msgs",
    *(
        f"{name}_{what}"
        for name, _, _ in PERSIST_RUNS[1:]
        for what in ("msgs", "ratio", "bytes_per_1000")
    ),
    "commit_interval",
)


def fmt_rate(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def fmt_figure(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit.endswith("/s"):
        return fmt_rate(v)
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_mib(kib: float | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}M"


def fmt_count(v: float | None) -> str:
    if v is None:
        return "-"
    v = round(v)
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    return str(v)


def _cell(summary: dict[str, dict[str, Any]], broker: str, key: str) -> Any:
    entry = summary.get(broker)
    if entry is None:
        return None
    if key == "figure" and entry["ok_runs"] == 0:
        return None
    return entry.get(key)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def table(
    summary: dict[str, dict[str, dict[str, Any]]],
    brokers: Sequence[str],
    names: Mapping[str, str] = NAMES,
) -> str:
    """The main table: one row per scenario, medians of the rounds.

    With "base" among ``brokers`` (``--base``) it gets its own figure, ``new/base``
    (Ledge's figure over base's, read like Ledge/Mosq), peak RSS and drops columns.
    """
    base = "base" in brokers
    head = ["scenario", "unit", "Ledge"]
    head += [names["base"]] if base else []
    head += ["Mosquitto", "amqtt", "ceiling", "Ledge/Mosq"]
    head += ["new/base"] if base else []
    head += ["Ledge RSS"] + (["base RSS"] if base else []) + ["Mosq RSS"]
    head += ["drops L/B/M" if base else "drops L/M"]
    dropped = ("ledge", "base", "mosquitto") if base else ("ledge", "mosquitto")
    rows = [head]
    for name, scen in SCENARIOS.items():
        per = summary.get(name)
        if not per:
            continue
        unit = scen.unit if scen.higher_is_better else f"{scen.unit} (lower)"
        figs = {b: _cell(per, b, "figure") for b in ORDER}
        drops = "-"
        if name in ("fan-in", "fan-out", "qos1", "filters", "latency", "idle-conns"):
            drops = "/".join(fmt_count(_cell(per, b, "drops")) for b in dropped)
        amqtt = fmt_figure(figs["amqtt"], scen.unit) if "amqtt" in brokers else "n/a"
        ceiling = fmt_figure(figs["relay"], scen.unit) if scen.with_relay else "-"
        if scen.with_relay and "relay" not in brokers:
            ceiling = "n/a"
        row = [name, unit, fmt_figure(figs["ledge"], scen.unit)]
        row += [fmt_figure(figs["base"], scen.unit)] if base else []
        row += [
            fmt_figure(figs["mosquitto"], scen.unit),
            amqtt,
            ceiling,
            _ratio(figs["ledge"], figs["mosquitto"]),
        ]
        row += [_ratio(figs["ledge"], figs["base"])] if base else []
        row += [fmt_mib(_cell(per, "ledge", "peak_rss_kib"))]
        row += [fmt_mib(_cell(per, "base", "peak_rss_kib"))] if base else []
        row += [fmt_mib(_cell(per, "mosquitto", "peak_rss_kib")), drops]
        rows.append(row)
    return _render(rows)


def _render(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            row[i].ljust(widths[i]) if i < 2 else row[i].rjust(widths[i]) for i in range(len(row))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def details(
    summary: dict[str, dict[str, dict[str, Any]]],
    brokers: Sequence[str],
    idle_conns: int,
    names: Mapping[str, str] = NAMES,
    window: int = 100,
) -> str:
    """Latency percentiles, idle RSS, memory per connection and accept time per broker;
    the persist runs (``window``: the publisher's QoS 1 messages in flight)."""
    order = [b for b in ORDER if b in brokers]
    out: list[str] = []
    lat = summary.get("latency")
    if lat:
        rows = [["latency (ms)", "p50", "p99", "p99.9"]]
        for b in order:
            e = lat.get(b)
            if e and e["ok_runs"]:
                label = "relay (floor)" if b == "relay" else names[b]
                rows.append(
                    [label] + [f"{e.get(k, 0.0):.3f}" for k in ("p50_ms", "p99_ms", "p999_ms")]
                )
        out.append(_render(rows))
    conns = summary.get("idle-conns")
    idle = summary.get("idle-rss")
    if conns or idle:
        rows = [["memory / connections", "idle RSS", f"accept {idle_conns:,}", "KiB/conn"]]
        for b in order:
            ce = (conns or {}).get(b)
            ie = (idle or {}).get(b)
            if not ce and not ie:
                continue
            label = "relay (floor)" if b == "relay" else names[b]
            idle_rss = fmt_mib(ie["figure"] * 1024) if ie and ie["ok_runs"] else "-"
            accept = f"{ce['accept_ms']:.0f} ms" if ce and "accept_ms" in ce else "-"
            per = f"{ce['kib_per_conn']:.1f}" if ce and "kib_per_conn" in ce else "-"
            if b == "relay":
                per = "-"  # the relay keeps no session state: not comparable
            rows.append([label, idle_rss, accept, per])
        out.append(_render(rows))
    rows = [["QoS 1 into a persistent session", "msg/s", "x memory", "bytes written / 1,000"]]
    intervals: set[float] = set()
    for b in ("ledge", "base"):
        persist = summary.get("persist", {}).get(b)
        if not (persist and persist["ok_runs"] and "memory_msgs" in persist):
            continue
        if "commit_interval" in persist:
            intervals.add(persist["commit_interval"])
        rows.append([f"{names[b]}, in memory", fmt_rate(persist["memory_msgs"]), "1.00", "-"])
        for variant, durability, setting in PERSIST_RUNS[1:]:
            written = persist.get(f"{variant}_bytes_per_1000")
            rows.append(
                [
                    f'{names[b]}, store.durability = "{durability}", '
                    + _commit_setting(setting, persist.get("commit_interval")),
                    fmt_rate(persist.get(f"{variant}_msgs")),
                    f"{persist.get(f'{variant}_ratio', 0.0):.2f}",
                    "-" if written is None else f"{written / 1024:.0f} KiB",
                ]
            )
    if len(rows) > 1:
        text = _render(rows)
        for interval in sorted(i for i in intervals if i > 0):
            text += (
                f"\nThe default rows commit at most once per {interval:g} s: the publisher's "
                f"{window} messages in flight get at most {window} per interval through "
                f"({fmt_rate(window / interval)} msg/s).\ncommit_interval = 0 commits as "
                "soon as possible: the store's own speed."
            )
        out.append(text)
    return "\n\n".join(out)


def _commit_setting(interval: str, default: float | None) -> str:
    """How a persist row's store commits: ``interval`` as its run set it ("": the
    default config), ``default`` the checkout's default (None: it has no such option)."""
    if interval:
        return f"commit_interval = {interval}" + (
            " (not an option there)" if default is None else ""
        )
    if default is None:
        return "default (no commit_interval: commits at once)"
    return f"default commit_interval ({default:g} s)"


def ceiling_check(summary: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Whether the relay ceiling is clearly above every broker's throughput figure."""
    lines = []
    for name, scen in SCENARIOS.items():
        per = summary.get(name)
        if not per or not scen.higher_is_better or "relay" not in per:
            continue
        ceiling = _cell(per, "relay", "figure")
        best = max(
            (f for b in ORDER if b != "relay" and (f := _cell(per, b, "figure")) is not None),
            default=None,
        )
        if ceiling is None or best is None:
            continue
        factor = ceiling / best if best else float("inf")
        verdict = "ok" if factor >= 1.5 else "NOT clearly above the brokers: figures may be capped"
        lines.append(
            f"{name}: ceiling {fmt_rate(ceiling)} {scen.unit} = {factor:.1f}x the best broker "
            f"({verdict})"
        )
    return lines


def document(
    outcomes: Sequence[Outcome], summary: dict[str, Any], meta: dict[str, Any]
) -> dict[str, Any]:
    return {"meta": meta, "summary": summary, "runs": [asdict(o) for o in outcomes]}
