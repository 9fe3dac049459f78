"""Render a :class:`~dlhpc.report._model.Page` (and the index) as one self-contained
HTML file: inline CSS, inline SVG, one small inline script that sorts tables.

Nothing leaves the page: no external stylesheet, font, image or script, and a
``Content-Security-Policy`` that forbids any fetch (``default-src 'none'``) and
allows only this file's own style block and script, by their sha256 (so even
markup injected by a bug could not run a script). Every user-provided string goes
through :func:`~dlhpc.report._svg.esc`; no user string is ever put inside the
script, which reads cell text and ``data-v`` attributes only.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from dlhpc import __version__
from dlhpc.report._model import Page
from dlhpc.report._svg import (
    CAUSES,
    cause_class,
    curves_svg,
    esc,
    fmt,
    gpu_svg,
    scatter_svg,
    state_class,
    timeline_svg,
)

__all__ = ["IndexEntry", "render_index", "render_page"]

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
.c-cancelled{--c:#4b5563}.c-running{--c:#34d399}.c-other{--c:#d1d5db}
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
if(e.key==="Enter"||e.key===" "){e.preventDefault();go()}})})})})();"""


def _sha(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def _document(title: str, body: Iterable[str]) -> str:
    csp = (
        f"default-src 'none'; style-src '{_sha(_CSS)}'; script-src '{_sha(_JS)}';"
        " img-src data:; base-uri 'none'; form-action 'none'"
    )
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
            '<meta name="viewport" content="width=device-width,initial-scale=1">',
            '<link rel="icon" href="data:,">',
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
            *body,
            f"<script>{_JS}</script></body></html>\n",
        ]
    )


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h{s % 3600 // 60:02d}m"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"


def _kv(items: Mapping[str, str]) -> str:
    """A definition list; labels and values are escaped here."""
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items.items())
    return f'<dl class="kv">{rows}</dl>'


def _legend(items: Sequence[tuple[str, str]]) -> str:
    spans = "".join(f'<span class="{cls}"><i></i>{esc(label)}</span>' for cls, label in items)
    return f'<div class="legend">{spans}</div>'


def _num_td(v: float | None, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return '<td class="n">-</td>'
    shown = fmt(v, digits)
    data = "" if shown == repr(v) else f' data-v="{esc(repr(float(v)))}"'
    return f'<td class="n"{data}>{esc(shown)}</td>'


def _hp_value(v: object) -> str:
    if isinstance(v, float):
        return fmt(v, 4)
    return str(v)


def _summary(p: Page) -> str:
    direction = "smaller is better" if p.smaller_is_better else "larger is better"
    states = Counter(t.state for t in p.trials)
    u = p.usage
    unit = f"{u.unit}-hours"
    per = f"{u.per_attempt} {u.unit}{'s' if u.per_attempt != 1 else ''} per attempt"
    items = {
        "goal metric": f"{p.metric} ({direction})",
        "state": p.state,
        "searcher": p.searcher,
        "trials": f"{len(p.trials)}: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())),
        "launched": _when(p.created),
        "ended": _when(p.ended) if p.ended is not None else "(still running)",
        "elapsed": _duration(p.elapsed_s),
        f"{unit} used": f"{_hours(u.used_h)} ({per})",
        f"{unit} saved by early stopping": f"{_hours(u.saved_h)} (estimate, {u.stopped_trials}"
        " trials stopped early)",
    }
    if p.best is not None:
        items["best trial"] = f"trial {p.best.id}: {p.metric} {fmt(p.best.best, 6)}"
        items["best hyperparameters"] = ", ".join(
            f"{k}={_hp_value(v)}" for k, v in sorted(p.best.hparams.items())
        )
    else:
        items["best trial"] = "(no result yet)"
    if p.decisions:
        d = p.decisions
        lat = d.get("latency_s")
        items["searcher decisions"] = (
            f"{d.get('promotions', 0)} promotions, {d.get('stops', 0)} stops"
            + (f"; latency median {lat['median']} s, max {lat['max']} s" if lat else "")
        )
    if p.disk:
        items["checkpoint disk use"] = (
            f"{_bytes(p.disk.get('checkpoint_bytes') or 0)} in"
            f" {p.disk.get('checkpoints', 0)} checkpoint(s)"
            f"; {_bytes(p.disk.get('freed_bytes') or 0)} freed by the keep policy"
            f" ({p.disk.get('deleted_checkpoints', 0)} deleted)"
        )
    if p.idle_gpus:
        items["idle GPUs now"] = "; ".join(
            f"trial {g['trial_id']} {g['host']} GPU {g['gpu_index']} idle {g['idle_minutes']} min"
            for g in p.idle_gpus
        )
    note = (
        f"{unit} used: each attempt's run time (start record to exit record) times {per}. "
        f"Saved: for each trial stopped early, (max_length {p.max_length} - its steps) x its "
        f"seconds per step x {per}, i.e. what running it to the end would have cost; seconds "
        "per step are the median time between its consecutive metric reports (the median of "
        "all trials when it has fewer than 3)."
    )
    if u.uncounted_attempts:
        note += f" {u.uncounted_attempts} attempt(s) with no end time are not counted."
    desc = f"<p>{esc(p.description)}</p>" if p.description else ""
    return f'{desc}{_kv(items)}<p class="note">{esc(note)}</p>'


def _curves_section(p: Page) -> str:
    best_id = p.best.id if p.best else None
    svg = curves_svg(p.trials, best_id, p.rungs, p.metric)
    if svg is None:
        return '<p class="mute">No metric reported yet.</p>'
    states = sorted({t.state for t in p.trials if t.curve is not None})
    legend = [(state_class(s), s) for s in states] + [("best", f"best (trial {best_id})")]
    src = p.curve_sources
    notes = [
        f"{p.metric} per step for every trial; the best trial drawn last, in red.",
        f"Dashed lines: rung lengths {', '.join(map(str, p.rungs))}." if p.rungs else "",
        f"Curves read from the HDF5 archive for {src.get('hdf5', 0)} trial(s), from the DB for "
        f"{src.get('db', 0)} (archive missing or behind)."
        if src
        else "",
        "Over 60,000 points in all, each curve keeps every k-th point (first and last kept).",
        f"Other metrics recorded: {', '.join(p.other_metrics)}." if p.other_metrics else "",
    ]
    note = " ".join(n for n in notes if n)
    return f'{svg}{_legend(legend)}<p class="note">{esc(note)}</p>'


def _scatter_section(p: Page) -> str:
    best_id = p.best.id if p.best else None
    charts = [
        svg for hp in p.hparams if (svg := scatter_svg(hp, p.trials, best_id, p.metric)) is not None
    ]
    consts = [hp.name for hp in p.hparams if hp.kind == "const"]
    if not charts:
        return '<p class="mute">No trial with both hyperparameters and a result yet.</p>'
    note = (
        f"Each trial's best {p.metric} (at whatever length it reached) against each"
        " hyperparameter; log-scale x for log-type ones; categories jittered."
    )
    if consts:
        note += f" Constants not plotted: {', '.join(consts)}."
    return f'<div class="grid2">{"".join(charts)}</div><p class="note">{esc(note)}</p>'


def _trials_table(p: Page) -> str:
    names = [hp.name for hp in p.hparams]
    head = ["trial", "state", *names, "steps", f"best {p.metric}", "latest", "restarts"]
    head += ["crashes", "attempts", "run time", "GPU util %"]
    rows = []
    best_id = p.best.id if p.best else None
    for t in p.trials:
        gpu = next((a.gpu_util for a in reversed(t.attempts) if a.gpu_util is not None), None)
        cells = [
            f'<td class="n">{t.id}</td>',
            f"<td>{esc(t.state)}</td>",
            *(
                f"<td>{esc(_hp_value(t.hparams[n]))}</td>" if n in t.hparams else "<td></td>"
                for n in names
            ),
            f'<td class="n">{t.steps}</td>',
            _num_td(t.best),
            _num_td(t.latest),
            f'<td class="n">{t.restarts}</td>',
            f'<td class="n">{t.crashes}</td>',
            f'<td class="n">{len(t.attempts)}</td>',
            f'<td class="n" data-v="{int(t.run_s)}">{_duration(t.run_s)}</td>',
            _num_td(gpu, 3),
        ]
        cls = ' class="best"' if t.id == best_id else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    ths = "".join(f"<th>{esc(h)}</th>" for h in head)
    return (
        f'<div class="scroll"><table class="sortable"><thead><tr>{ths}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
        '<p class="note">Click a column header to sort.</p>'
    )


def _timeline_section(p: Page) -> str:
    svg = timeline_svg(p.trials, p.created)
    parts = []
    if svg is None:
        parts.append('<p class="mute">No attempt has started yet.</p>')
    else:
        causes = sorted({a.cause for t in p.trials for a in t.attempts if a.cause in CAUSES})
        items = [(cause_class(c), c) for c in causes]
        if any(a.cause not in CAUSES for t in p.trials for a in t.attempts):
            items.append(("c-running", "running / not yet judged"))
        parts += [svg, _legend(items)]
        parts.append(
            '<p class="note">One row per trial, one bar per attempt, coloured by why it ended;'
            " hover a bar for its exit code, lost steps and nodes.</p>"
        )
    failed = [t for t in p.trials if t.error]
    if failed:
        rows = "".join(
            f'<tr><td class="n">{t.id}</td><td>{esc(t.state)}</td>'
            f'<td class="msg">{esc(t.error)}</td></tr>'
            for t in failed
        )
        parts.append(
            '<h3>Trial errors</h3><div class="scroll"><table><thead><tr><th>trial</th>'
            f"<th>state</th><th>error (and log tail)</th></tr></thead><tbody>{rows}</tbody>"
            "</table></div>"
        )
    if p.events:
        rows = "".join(
            f'<tr><td>{_when(e.time)}</td><td class="n">{"" if e.trial_id is None else e.trial_id}'
            f'</td><td>{esc(e.kind)}</td><td class="msg">{esc(e.message)}</td></tr>'
            for e in p.events
        )
        more = f" ({p.events_hidden} older not shown)" if p.events_hidden else ""
        parts.append(
            f'<h3>Events{esc(more)}</h3><div class="scroll"><table class="sortable"><thead>'
            "<tr><th>time</th><th>trial</th><th>kind</th><th>message</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>"
        )
    return "".join(parts)


def _gpu_section(p: Page) -> str:
    svg = gpu_svg(p.trials, p.created)
    if svg is None:
        return (
            '<p class="mute">No GPU telemetry for this experiment (a CPU run, or no NVML on its'
            " nodes).</p>"
        )
    return (
        f'{svg}<p class="note">Each segment: one attempt, at its mean utilization over all its'
        " GPUs and samples.</p>"
    )


def _repro_section(p: Page) -> str:
    texts = {"Experiment file as given": p.yaml_text, "Resolved config": p.config_text}
    texts.update(p.repro_texts)
    folded = "".join(
        f"<details><summary>{esc(title)}</summary><pre>{esc(text)}</pre></details>"
        for title, text in texts.items()
    )
    return _kv(p.repro) + folded


def render_page(p: Page) -> str:
    """The HTML of one experiment's report (pure)."""
    title = f"dlhpc experiment {p.id}: {p.name}"
    body = [
        f'<p class="mute"><a href="index.html">all experiments</a> · generated {_when(p.generated)}'
        f" by dlhpc {esc(__version__)}</p>",
        f'<h1>Experiment {p.id}: {esc(p.name)} <span class="badge">{esc(p.state)}</span></h1>',
        "<h2>Summary</h2>",
        _summary(p),
        "<h2>Learning curves</h2>",
        _curves_section(p),
        "<h2>Hyperparameters against the metric</h2>",
        _scatter_section(p),
        "<h2>Trials</h2>",
        _trials_table(p),
        "<h2>Attempts: timeline, preemptions, requeues, failures</h2>",
        _timeline_section(p),
        "<h2>GPU utilization</h2>",
        _gpu_section(p),
        "<h2>Reproducibility record</h2>",
        _repro_section(p),
    ]
    return _document(title, body)


@dataclass(frozen=True)
class IndexEntry:
    """One experiment's line in the index."""

    id: int
    name: str
    state: str
    searcher: str
    metric: str
    best: float | None
    trials: int
    created: float
    elapsed_s: float
    href: str


def render_index(entries: Sequence[IndexEntry], generated: float) -> str:
    """The index page: one row per experiment, newest first, linking to its page."""
    head = ["id", "name", "state", "searcher", "metric", "best", "trials", "launched", "elapsed"]
    rows = "".join(
        f'<tr><td class="n">{e.id}</td><td><a href="{esc(e.href)}">{esc(e.name)}</a></td>'
        f"<td>{esc(e.state)}</td><td>{esc(e.searcher)}</td><td>{esc(e.metric)}</td>"
        f'{_num_td(e.best)}<td class="n">{e.trials}</td><td>{_when(e.created)}</td>'
        f'<td class="n" data-v="{int(e.elapsed_s)}">{_duration(e.elapsed_s)}</td></tr>'
        for e in sorted(entries, key=lambda e: -e.id)
    )
    ths = "".join(f"<th>{h}</th>" for h in head)
    body = [
        f'<h1>dlhpc experiments</h1><p class="mute">generated {_when(generated)} by dlhpc'
        f" {esc(__version__)}</p>",
        f'<table class="sortable"><thead><tr>{ths}</tr></thead><tbody>{rows}</tbody></table>',
    ]
    return _document("dlhpc experiments", body)
