"""The status page: one self-contained HTML document. Pure (a status document in, text out).

Readable without JavaScript -- every section is rendered here -- and live with it: the
inline script polls ``/api/status`` and renders the same sections again from the JSON
(``render_*`` below and ``JS`` mirror each other; the browser test holds them
together). No external assets (the LAN may be offline), no secrets (the status
document has none), a Content Security Policy that allows exactly the inline script
and style below and requests to this origin.
"""

from __future__ import annotations

import base64
import hashlib
import html
from datetime import UTC, datetime
from typing import Any, Final

from gateway.metrics.view import duration

#: Seconds between the page's requests for ``/api/status``.
POLL_SECONDS: Final = 2
#: The page's size bound in bytes (the status page must load fast on a slow LAN).
PAGE_LIMIT: Final = 48 * 1024

CSS: Final = """
:root{--bg:#fff;--fg:#1d232a;--mute:#5c6670;--line:#d8dde2;--card:#f5f7f9;--ok:#1a7f37;
--bad:#c62828;--warn:#8a5a00;--warnbg:#fff4d6;--spark:#2f6fdb}
@media (prefers-color-scheme:dark){:root{--bg:#14181c;--fg:#e4e8ec;--mute:#98a2ad;
--line:#2c343c;--card:#1c2228;--ok:#56d364;--bad:#ff7b72;--warn:#e3b341;--warnbg:#2e2616;
--spark:#6ea8ff}}
*{box-sizing:border-box}
body{margin:0;padding:1rem 1.25rem 2rem;font:15px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,sans-serif;background:var(--bg);color:var(--fg)}
h1{font-size:1.4rem;margin:0}h2{font-size:1.05rem;margin:1.6rem 0 .5rem}
.mute,#meta{color:var(--mute)}#meta{margin:.2rem 0 1rem}#meta.stale{color:var(--bad)}
ul.warn{list-style:none;margin:0 0 1rem;padding:0}
ul.warn li{background:var(--warnbg);color:var(--warn);border-left:4px solid var(--warn);
padding:.45rem .7rem;margin:.3rem 0;border-radius:4px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(9.5rem,1fr));gap:.6rem}
.card{background:var(--card);border-radius:6px;padding:.6rem .75rem}
.card b{display:block;font-size:1.35rem;font-weight:600}.card span{color:var(--mute);
font-size:.85rem}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{text-align:left;padding:.35rem .6rem .35rem 0;border-bottom:1px solid var(--line);
vertical-align:top}th{color:var(--mute);font-weight:500;font-size:.85rem}
th.n,td.n{text-align:right}.ok{color:var(--ok)}.bad{color:var(--bad)}
.v{display:inline-block;margin:0 1.1rem .2rem 0;white-space:nowrap}
svg.spark{width:5rem;height:1.1rem;vertical-align:middle;margin-left:.3rem}
svg.spark polyline{fill:none;stroke:var(--spark);stroke-width:1.5;
vector-effect:non-scaling-stroke}
"""

JS: Final = """
"use strict";
const esc=s=>String(s).replace(/[&<>"']/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",
'"':"&quot;","'":"&#39;"}[c]));
const num=v=>Number.isInteger(v)?v.toLocaleString("en"):v.toLocaleString("en",
{maximumFractionDigits:2});
function bytes(v){const u=["B","KiB","MiB","GiB","TiB"];let i=0;
while(v>=1024&&i<u.length-1){v/=1024;i++}return (i?v.toFixed(1):v)+" "+u[i]}
function dur(s){s=Math.max(0,Math.floor(s));if(s<60)return s+" s";if(s<3600)
return Math.floor(s/60)+" min "+(s%60)+" s";if(s<86400)return Math.floor(s/3600)+" h "+
Math.floor(s%3600/60)+" min";return Math.floor(s/86400)+" d "+Math.floor(s%86400/3600)+" h"}
function spark(h){if(!h||h.length<2)return "";const lo=Math.min(...h),hi=Math.max(...h),
r=hi-lo||1,n=h.length-1;const p=h.map((v,i)=>(100*i/n).toFixed(1)+","+
(19-18*(v-lo)/r).toFixed(1)).join(" ");
return '<svg class="spark" viewBox="0 0 100 20" preserveAspectRatio="none" aria-hidden="true">'+
'<polyline points="'+p+'"/></svg>'}
function table(head,rows,empty,num){if(!rows.length)return '<p class="mute">'+esc(empty)+
"</p>";return "<table><tr>"+head.map((h,i)=>((num||[]).includes(i)?'<th class="n">':"<th>")+
esc(h)+"</th>").join("")+"</tr>"+rows.join("")+"</table>"}
const clock=t=>new Date(t*1000).toISOString().slice(11,19)+" UTC";
function val(v){return typeof v==="number"?num(v):esc(v)}
const R={
meta:d=>"version "+esc(d.version)+" \\u00b7 up "+dur(d.uptime_seconds)+
" \\u00b7 updated "+esc(new Date(d.time*1000).toLocaleTimeString("en-GB")),
warnings:d=>d.warnings.length?'<ul class="warn">'+d.warnings.map(w=>"<li>"+esc(w)+"</li>")
.join("")+"</ul>":"",
summary:d=>{const m=d.messages,c=[["clients",num(d.clients.connected),""],
["messages in/s",num(m.received_per_second),spark(m.received_history)],
["messages out/s",num(m.sent_per_second),spark(m.sent_history)],
["subscriptions",num(d.subscriptions),""],["retained",num(d.retained),""],
["memory",bytes(d.process.rss_bytes),""]];
if(d.store)c.push(["store",bytes(d.store.size_bytes),""],
["free disk",bytes(d.store.free_disk_bytes),""]);
return '<div class="cards">'+c.map(x=>'<div class="card"><b>'+x[1]+x[2]+"</b><span>"+
esc(x[0])+"</span></div>").join("")+"</div>"},
listeners:d=>"<h2>Listeners</h2>"+table(["listener","type","address","MQTT 3.1.1",
"MQTT 5.0"],d.listeners.map(l=>'<tr data-listener="'+esc(l.name)+'"><td>'+esc(l.name)+
"</td><td>"+esc(l.type)+"</td><td>"+esc(l.address)+'</td><td class="n">'+
num(l.clients["3.1.1"]||0)+'</td><td class="n">'+num(l.clients["5.0"]||0)+"</td></tr>"),
"no listeners",[3,4]),
bridges:d=>"<h2>Bridges</h2>"+table(["bridge","state","since","address","outbox","oldest",
"sent","acknowledged","dropped","last error"],d.bridges.map(b=>{const up=b.state===
"connected";return '<tr data-bridge="'+esc(b.name)+'"><td>'+esc(b.name)+
'</td><td class="state '+(up?"ok":"bad")+'">'+esc(b.state)+'</td><td class="since">'+
(b.since===null?"":(up?"up":"down")+" since "+clock(b.since)+" ("+dur(d.time-b.since)+")")+
"</td><td>"+esc(b.address)+'</td><td class="n">'+num(b.outbox_messages)+" ("+
bytes(b.outbox_bytes)+')</td><td class="n">'+dur(b.oldest_age_seconds)+'</td><td class="n">'+
num(b.sent)+'</td><td class="n">'+num(b.acknowledged)+'</td><td class="n">'+num(b.dropped)+
'</td><td class="error'+(up?" mute":"")+'">'+(b.last_error?esc(b.last_error)+
(b.last_error_at===null?"":" ("+dur(d.time-b.last_error_at)+" ago)"):"")+"</td></tr>"}),
"no bridges configured",[4,5,6,7,8]),
devices:d=>"<h2>Sensors</h2>"+table(["device","driver","state","last seen","values"],
d.devices.map(s=>'<tr data-device="'+esc(s.name)+'"><td>'+esc(s.name)+"</td><td>"+
esc(s.driver)+'</td><td class="'+(s.online?"ok":s.presence?"mute":"bad")+'">'+
esc(s.state)+"</td><td>"+(s.last_seen===null?"never":dur(d.time-s.last_seen)+" ago")+
"</td><td>"+s.values.map(v=>'<span class="v" data-quantity="'+esc(v.quantity)+'">'+
esc(v.quantity)+" <b>"+val(v.value)+"</b> "+esc(v.unit)+spark(v.history)+"</span>")
.join("")+"</td></tr>"),"no sensor devices")+(d.devices_not_shown?'<p class="mute">and '+
d.devices_not_shown+" more devices</p>":""),
drops:d=>{const k=Object.keys(d.drops).filter(x=>d.drops[x]).sort();return "<h2>Drops</h2>"+
table(["where and why","messages"],k.map(x=>"<tr><td>"+esc(x)+'</td><td class="n">'+
num(d.drops[x])+"</td></tr>"),"nothing dropped",[1])}};
function render(d){for(const id in R){document.getElementById(id).innerHTML=R[id](d)}
document.title="Ledge "+d.gateway}
async function poll(){const m=document.getElementById("meta");try{const r=await fetch(
"/api/status",{cache:"no-store",credentials:"same-origin"});if(!r.ok)throw new Error(
"HTTP "+r.status);render(await r.json());m.classList.remove("stale");
document.body.dataset.live="1"}catch(e){m.classList.add("stale");
m.textContent="not updating: "+e.message}setTimeout(poll,POLL)}
setTimeout(poll,POLL);
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


_SCRIPT: Final = f"const POLL={POLL_SECONDS * 1000};{JS}"

#: Only the inline script and style of this page, and requests to this origin.
CONTENT_SECURITY_POLICY: Final = (
    f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(CSS)}; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def num(value: float) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def size(value: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while value >= 1024 and i < len(units) - 1:
        value /= 1024
        i += 1
    return f"{value:.1f} {units[i]}" if i else f"{int(value)} {units[i]}"


def spark(history: list[float]) -> str:
    """A sparkline of ``history`` (oldest first) as inline SVG; nothing below 2 points."""
    if len(history) < 2:
        return ""
    lo, hi = min(history), max(history)
    span = (hi - lo) or 1
    n = len(history) - 1
    points = " ".join(
        f"{100 * i / n:.1f},{19 - 18 * (v - lo) / span:.1f}" for i, v in enumerate(history)
    )
    return (
        '<svg class="spark" viewBox="0 0 100 20" preserveAspectRatio="none" aria-hidden="true">'
        f'<polyline points="{points}"/></svg>'
    )


def _table(head: list[str], rows: list[str], empty: str, numeric: tuple[int, ...] = ()) -> str:
    """A table, or ``empty`` without rows; the columns at ``numeric`` are right-aligned,
    their headings too (the cells say ``class="n"``)."""
    if not rows:
        return f'<p class="mute">{esc(empty)}</p>'
    heads = "".join(
        f'<th class="n">{esc(h)}</th>' if i in numeric else f"<th>{esc(h)}</th>"
        for i, h in enumerate(head)
    )
    return f"<table><tr>{heads}</tr>{''.join(rows)}</table>"


def clock(wall: float) -> str:
    """A wall-clock time of day, UTC (the script writes it the same way)."""
    return datetime.fromtimestamp(wall, UTC).strftime("%H:%M:%S UTC")


def render_meta(d: dict[str, Any]) -> str:
    return (
        f"version {esc(d['version'])} · up {duration(d['uptime_seconds'])} "
        f"· updated {clock(d['time'])}"
    )


def render_warnings(d: dict[str, Any]) -> str:
    if not d["warnings"]:
        return ""
    return '<ul class="warn">' + "".join(f"<li>{esc(w)}</li>" for w in d["warnings"]) + "</ul>"


def render_summary(d: dict[str, Any]) -> str:
    m = d["messages"]
    cards = [
        ("clients", num(d["clients"]["connected"]), ""),
        ("messages in/s", num(m["received_per_second"]), spark(m["received_history"])),
        ("messages out/s", num(m["sent_per_second"]), spark(m["sent_history"])),
        ("subscriptions", num(d["subscriptions"]), ""),
        ("retained", num(d["retained"]), ""),
        ("memory", size(d["process"]["rss_bytes"]), ""),
    ]
    if d["store"] is not None:
        cards.append(("store", size(d["store"]["size_bytes"]), ""))
        cards.append(("free disk", size(d["store"]["free_disk_bytes"]), ""))
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><b>{value}{line}</b><span>{esc(label)}</span></div>'
            for label, value, line in cards
        )
        + "</div>"
    )


def render_listeners(d: dict[str, Any]) -> str:
    rows = [
        f'<tr data-listener="{esc(lst["name"])}"><td>{esc(lst["name"])}</td>'
        f"<td>{esc(lst['type'])}</td><td>{esc(lst['address'])}</td>"
        f'<td class="n">{num(lst["clients"].get("3.1.1", 0))}</td>'
        f'<td class="n">{num(lst["clients"].get("5.0", 0))}</td></tr>'
        for lst in d["listeners"]
    ]
    head = ["listener", "type", "address", "MQTT 3.1.1", "MQTT 5.0"]
    return "<h2>Listeners</h2>" + _table(head, rows, "no listeners", (3, 4))


def bridge_since(b: dict[str, Any], now: float) -> str:
    """ "down since 12:03:04 UTC (5 min 2 s)", or "up since ..." ("": not known)."""
    if b["since"] is None:
        return ""
    up = "up" if b["state"] == "connected" else "down"
    return f"{up} since {clock(b['since'])} ({duration(now - b['since'])})"


def bridge_error(b: dict[str, Any], now: float) -> str:
    """The last error and how long ago it was ("": none)."""
    if not b["last_error"]:
        return ""
    at = b["last_error_at"]
    return str(b["last_error"]) + ("" if at is None else f" ({duration(now - at)} ago)")


def render_bridges(d: dict[str, Any]) -> str:
    rows = []
    for b in d["bridges"]:
        up = b["state"] == "connected"
        rows.append(
            f'<tr data-bridge="{esc(b["name"])}"><td>{esc(b["name"])}</td>'
            f'<td class="state {"ok" if up else "bad"}">{esc(b["state"])}</td>'
            f'<td class="since">{bridge_since(b, d["time"])}</td>'
            f"<td>{esc(b['address'])}</td>"
            f'<td class="n">{num(b["outbox_messages"])} ({size(b["outbox_bytes"])})</td>'
            f'<td class="n">{duration(b["oldest_age_seconds"])}</td>'
            f'<td class="n">{num(b["sent"])}</td><td class="n">{num(b["acknowledged"])}</td>'
            f'<td class="n">{num(b["dropped"])}</td>'
            # An error from before the link came up is history: shown, muted.
            f'<td class="error{" mute" if up else ""}">{esc(bridge_error(b, d["time"]))}</td>'
            "</tr>"
        )
    head = ["bridge", "state", "since", "address", "outbox", "oldest", "sent"]
    head += ["acknowledged", "dropped", "last error"]
    return "<h2>Bridges</h2>" + _table(head, rows, "no bridges configured", (4, 5, 6, 7, 8))


def _value(value: object) -> str:
    """A reading's value as the terminal and the page's script write it: a boolean as
    ``true``/``false`` (the page said ``True`` until the script redrew it)."""
    return esc(_plain(value))


def render_devices(d: dict[str, Any], budget: int = PAGE_LIMIT) -> str:
    """The sensor table, in at most ``budget`` bytes: devices that do not fit are
    counted instead (the script shows them all, with sparklines, from the JSON)."""
    head = ["device", "driver", "state", "last seen", "values"]
    rows: list[str] = []
    used = 512
    shown = 0
    for s in d["devices"]:
        seen = "never" if s["last_seen"] is None else f"{duration(d['time'] - s['last_seen'])} ago"
        values = "".join(
            f'<span class="v" data-quantity="{esc(v["quantity"])}">{esc(v["quantity"])} '
            f"<b>{_value(v['value'])}</b> {esc(v['unit'])}</span>"
            for v in s["values"]
        )
        row = (
            f'<tr data-device="{esc(s["name"])}"><td>{esc(s["name"])}</td>'
            f'<td>{esc(s["driver"])}</td><td class="{_state_class(s)}">'
            f"{esc(s['state'])}</td><td>{seen}</td>"
            f"<td>{values}</td></tr>"
        )
        used += len(row.encode())
        if used > budget:
            break
        rows.append(row)
        shown += 1
    more = d["devices_not_shown"] + len(d["devices"]) - shown
    tail = f'<p class="mute">and {more} more devices</p>' if more else ""
    return "<h2>Sensors</h2>" + _table(head, rows, "no sensor devices") + tail


def _state_class(s: dict[str, Any]) -> str:
    """Green when online; a beacon away is not a fault (muted); red otherwise."""
    return "ok" if s["online"] else "mute" if s["presence"] else "bad"


def render_drops(d: dict[str, Any]) -> str:
    rows = [
        f'<tr><td>{esc(k)}</td><td class="n">{num(d["drops"][k])}</td></tr>'
        for k in sorted(d["drops"])
        if d["drops"][k]
    ]
    head = ["where and why", "messages"]
    return "<h2>Drops</h2>" + _table(head, rows, "nothing dropped", (1,))


def render(d: dict[str, Any]) -> str:
    """The whole page for status document ``d``: under ``PAGE_LIMIT`` bytes whatever
    the status holds (the sensor table gets what the rest leaves)."""
    parts = {
        "warnings": render_warnings(d),
        "summary": render_summary(d),
        "listeners": render_listeners(d),
        "bridges": render_bridges(d),
        "devices": "",
        "drops": render_drops(d),
    }
    fixed = sum(len(p.encode()) for p in parts.values()) + len(CSS) + len(_SCRIPT) + 1024
    parts["devices"] = render_devices(d, PAGE_LIMIT - fixed)
    body = "".join(f'<section id="{name}">{text}</section>' for name, text in parts.items())
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request
        f"<title>Ledge {esc(d['gateway'])}</title><style>{CSS}</style></head><body>"
        f'<header><h1>Ledge {esc(d["gateway"])}</h1><p id="meta">{render_meta(d)}</p></header>'
        f"<main>{body}</main><script>{_SCRIPT}</script></body></html>"
    )


# ----------------------------------------------------------------------------- terminal


def render_text(d: dict[str, Any]) -> str:
    """The same summary for a terminal (``ledge status``)."""
    m, c = d["messages"], d["clients"]
    lines = [
        f"gateway {d['gateway']} (ledge {d['version']}), up {duration(d['uptime_seconds'])}",
        f"  clients        {num(c['connected'])} connected (peak {num(c['maximum'])}), "
        f"{num(c['sessions'])} sessions, {num(c['slow'])} slow",
        f"  messages       {num(m['received_per_second'])}/s in, {num(m['sent_per_second'])}/s "
        f"out ({num(m['received'])} in, {num(m['sent'])} out since start)",
        f"  subscriptions  {num(d['subscriptions'])}, retained messages {num(d['retained'])}",
        f"  memory         {size(d['process']['rss_bytes'])}",
    ]
    if d["store"] is not None:
        st = d["store"]
        lines.append(
            f"  store          {size(st['size_bytes'])}, {size(st['free_disk_bytes'])} free"
            + (" (FULL)" if st["full"] else "")
        )
    lines.append("listeners")
    for lst in d["listeners"]:
        counts = ", ".join(f"{v} on {k}" for k, v in sorted(lst["clients"].items()) if v)
        counts = f"clients: {counts}" if counts else "no clients"
        lines.append(f"  {lst['name']:<14} {lst['type']:<13} {lst['address']:<22} {counts}")
    if d["bridges"]:
        lines.append("bridges")
        for b in d["bridges"]:
            lines.append(
                f"  {b['name']:<14} {b['state']:<13} {b['address']:<22} outbox "
                f"{num(b['outbox_messages'])} ({size(b['outbox_bytes'])}), oldest "
                f"{duration(b['oldest_age_seconds'])}, sent {num(b['sent'])}, acknowledged "
                f"{num(b['acknowledged'])}, dropped {num(b['dropped'])}"
                + (f", {bridge_since(b, d['time'])}" if b["since"] is not None else "")
                + (f", last error: {bridge_error(b, d['time'])}" if b["last_error"] else "")
            )
    if d["devices"]:
        lines.append("sensors")
        for s in d["devices"]:
            seen = (
                "never" if s["last_seen"] is None else f"{duration(d['time'] - s['last_seen'])} ago"
            )
            values = ", ".join(
                f"{v['quantity']} {_plain(v['value'])}{' ' + v['unit'] if v['unit'] else ''}"
                for v in s["values"]
            )
            state = s["state"]
            lines.append(f"  {s['name']:<14} {s['driver']:<8} {state:<13} seen {seen:<12} {values}")
        if d["devices_not_shown"]:
            lines.append(f"  and {d['devices_not_shown']} more")
    drops = {k: v for k, v in sorted(d["drops"].items()) if v}
    if drops:
        lines.append("drops")
        lines.extend(f"  {k:<40} {num(v)}" for k, v in drops.items())
    if d["warnings"]:
        lines.append("warnings")
        lines.extend(f"  ! {w}" for w in d["warnings"])
    return "\n".join(lines) + "\n"


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return num(value) if isinstance(value, int | float) else str(value)
