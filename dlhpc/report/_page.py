"""The page shell of dlhpc's HTML reports (inline CSS, the sorting script, the
Content-Security-Policy that pins both by their sha256) and the small text formatters
the sections share. Every user string goes through :func:`~dlhpc.report._svg.esc`.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone

from dlhpc.report._svg import esc, fmt

__all__ = [
    "LAB_META",
    "bytes_text",
    "document",
    "duration",
    "hours",
    "hp_value",
    "kv",
    "legend",
    "num_td",
    "when",
]

_CSS = """
:root{--fg:#1f2937;--mute:#6b7280;--line:#e5e7eb;font:14px/1.45 system-ui,-apple-system,
"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg)}
body{margin:0 auto;max-width:1000px;padding:16px 20px 48px}
h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
var(--line);padding-bottom:4px}
.mute,.note{color:var(--mute)}.note{font-size:12px}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:0}
dl.kv dt{color:var(--mute)}dl.kv dd{margin:0;overflow-wrap:anywhere}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;background:#eef2ff;font-size:12px}
.chart{width:100%;height:auto;display:block;font-size:11px}
.grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:8px}
.frame{fill:none;stroke:#d1d5db}.grid{stroke:#f3f4f6}
.tx{text-anchor:middle;fill:var(--mute)}.e{text-anchor:end}.ty{text-anchor:end;dominant-baseline:middle;
fill:var(--mute)}.lx{text-anchor:middle}.ly{text-anchor:middle;dominant-baseline:middle}
.rung{stroke:#111827;stroke-dasharray:4 4;opacity:.45}.rl{fill:var(--mute);font-size:10px}
.rl:not(.e){transform:translateX(3px)}.rl.e{transform:translateX(-3px)}
.chart g{fill:none;stroke:var(--c);stroke-width:1;opacity:.55}
.chart g .pt{stroke-width:5;stroke-linecap:round}
.chart.many g{opacity:.2}.chart g.best{stroke-width:3;opacity:1}
.chart circle{fill:var(--c);opacity:.75}
.chart circle.best{stroke:#111827;stroke-width:1.5;opacity:1}
.chart rect[class^=c-]{fill:var(--c)}.gpu{stroke:#059669;stroke-width:3}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:4px 0 0}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:4px;
vertical-align:-2px;background:var(--c)}
.s-completed{--c:#1d4ed8}.s-stopped_early{--c:#60a5fa}.s-paused{--c:#8b5cf6}
.s-running{--c:#10b981}.s-pending{--c:#cbd5e1}.s-failed{--c:#f59e0b}.s-killed{--c:#6b7280}
.s-other{--c:#a3a3a3}.best{--c:#dc2626}
.c-completed{--c:#16a34a}.c-paused{--c:#8b5cf6}.c-stopped{--c:#9ca3af}.c-crash{--c:#dc2626}
.c-preempted{--c:#f97316}.c-timeout{--c:#eab308}.c-requeued{--c:#0ea5e9}.c-lost{--c:#7c3aed}
.c-cancelled{--c:#4b5563}.c-running{--c:#34d399}.c-other{--c:#d1d5db}.c-setup{--c:#db2777}
.scroll{max-height:560px;overflow:auto;border:1px solid var(--line)}
table{border-collapse:collapse;font-size:12px;width:100%}
th,td{padding:2px 6px;border-bottom:1px solid var(--line);text-align:left;white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}
thead th{position:sticky;top:0;background:#f9fafb}
table.sortable th{cursor:pointer}table.sortable th:hover{background:#eef2ff}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
tr.best td{background:#fef2f2}
pre{background:#f9fafb;border:1px solid var(--line);padding:8px;overflow:auto;max-height:420px;
font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere}
td.msg{white-space:pre-wrap;overflow-wrap:anywhere}
.tag{display:inline-block;padding:0 6px;border-radius:8px;background:#ecfdf5;color:#065f46;
font-size:11px;margin:0 2px 0 0}
.cmd{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
"""

# Sorts a table.sortable by the clicked column: numbers by value (data-v when the
# shown text is formatted), else text; empty cells last either way.
_JS = """(function(){
function key(r,i){var c=r.cells[i];if(!c)return"";return c.hasAttribute("data-v")?
c.getAttribute("data-v"):c.textContent}
function num(s){return s.trim()===""?NaN:Number(s)}
document.querySelectorAll("table.sortable").forEach(function(t){
var ths=t.tHead.rows[0].cells;Array.prototype.forEach.call(ths,function(th,i){
th.tabIndex=0;function go(){var asc=th.getAttribute("aria-sort")!=="ascending";
Array.prototype.forEach.call(ths,function(h){h.removeAttribute("aria-sort")});
th.setAttribute("aria-sort",asc?"ascending":"descending");var b=t.tBodies[0];
var rows=Array.prototype.slice.call(b.rows);rows.sort(function(p,q){
var x=key(p,i),y=key(q,i),nx=num(x),ny=num(y),ex=x.trim()===""||x==="-",
ey=y.trim()===""||y==="-";if(ex!==ey)return ex?1:-1;var d;
if(!isNaN(nx)&&!isNaN(ny))d=nx-ny;else if(!isNaN(nx))d=-1;else if(!isNaN(ny))d=1;
else d=x.localeCompare(y);return asc?d:-d});rows.forEach(function(r){b.appendChild(r)})}
th.addEventListener("click",go);th.addEventListener("keydown",function(e){
if(e.key==="Enter"||e.key===" "){e.preventDefault();go()}})})});
var f=document.getElementById("user-filter");if(f){f.addEventListener("change",function(){
var u=f.value;document.querySelectorAll("tr[data-user]").forEach(function(r){
r.hidden=u!=="*"&&r.getAttribute("data-user")!==u})})}})();"""


def _sha(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


LAB_META = "dlhpc-lab"  # an experiment page's meta: the digest of its tags, notes, models


def document(title: str, body: Iterable[str], css: str = "", lab_stamp: str | None = None) -> str:
    """The page: ``body`` in the shell; ``css``: a page's own rules after the shared ones
    (pinned by the CSP with them, as one style block); ``lab_stamp`` (an experiment
    page's) goes into a meta tag near the top, where ``report.build`` reads it back."""
    style = _CSS + css
    stamp = "" if lab_stamp is None else f'<meta name="{LAB_META}" content="{esc(lab_stamp)}">'
    csp = (
        f"default-src 'none'; style-src '{_sha(style)}'; script-src '{_sha(_JS)}';"
        " img-src data:; base-uri 'none'; form-action 'none'"
    )
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            stamp,
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
            '<meta name="viewport" content="width=device-width,initial-scale=1">',
            '<link rel="icon" href="data:,">',
            f"<title>{esc(title)}</title><style>{style}</style></head><body>",
            *body,
            f"<script>{_JS}</script></body></html>\n",
        ]
    )


def when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h{s % 3600 // 60:02d}m"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def bytes_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"


def kv(items: Mapping[str, str]) -> str:
    """A definition list; labels and values are escaped here."""
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items.items())
    return f'<dl class="kv">{rows}</dl>'


def legend(items: Sequence[tuple[str, str]]) -> str:
    spans = "".join(f'<span class="{cls}"><i></i>{esc(label)}</span>' for cls, label in items)
    return f'<div class="legend">{spans}</div>'


def num_td(v: float | None, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return '<td class="n">-</td>'
    shown = fmt(v, digits)
    data = "" if shown == repr(v) else f' data-v="{esc(repr(float(v)))}"'
    return f'<td class="n"{data}>{esc(shown)}</td>'


def hp_value(v: object) -> str:
    if isinstance(v, float):
        return fmt(v, 4)
    return str(v)
