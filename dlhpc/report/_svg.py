"""Hand-written inline SVG charts for the report (no matplotlib, no script).

Every string that comes from a user (names, hyperparameter values, metric names,
states, causes) goes through :func:`esc` (``html.escape(..., quote=True)``), in
text and in attributes alike; colours come from CSS classes chosen from fixed sets,
so a hostile state or cause can only select the fallback class. Tooltips are SVG
``<title>`` elements. Coordinates are rounded to whole pixels (curves) or tenths.

Learning curves are decimated when a chart holds more than :data:`POINT_BUDGET`
points: each curve keeps every k-th point (first and last always), and
consecutive points that land on the same pixel are dropped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from dlhpc.report._page_data import HParamView, TrialView
from dlhpc.states import JobState, TrialState

__all__ = [
    "CAUSES",
    "POINT_BUDGET",
    "cause_class",
    "cause_label",
    "curves_svg",
    "esc",
    "fmt",
    "gpu_svg",
    "scatter_svg",
    "state_class",
    "timeline_svg",
]

POINT_BUDGET = 60_000  # curve points drawn per chart, over all trials
_TRIAL_STATES = frozenset(st.value for st in TrialState)  # each has its CSS class
CAUSES = (
    "completed",
    "paused",
    "stopped",
    "crash",
    "preempted",
    "timeout",
    "requeued",
    "lost",
    "cancelled",
    "running",
    "setup",  # a site modules or environment.setup line failed before the worker started
)
# a cause's words in the legend where its name alone says too little
CAUSE_LABELS = {"setup": "setup failed (modules, environment.setup)"}
_W, _H = 960, 360
_L, _R, _T, _B = 64, 16, 12, 40


def esc(value: Any) -> str:
    """Text or attribute-safe HTML/SVG for any value."""
    return html.escape(str(value), quote=True)


def fmt(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}g}"


def state_class(state: str) -> str:
    return f"s-{state.lower()}" if state in _TRIAL_STATES else "s-other"


def cause_class(cause: str) -> str:
    return f"c-{cause}" if cause in CAUSES else "c-other"


def cause_label(cause: str) -> str:
    """What the legend says for a cause of :data:`CAUSES`."""
    return CAUSE_LABELS.get(cause, cause)


def _n(v: float) -> str:
    r = round(v, 1)
    return str(int(r)) if r == int(r) else str(r)


class _Scale:
    """Maps [lo, hi] (log10 when ``log``) onto pixels [p0, p1]."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float, log: bool = False) -> None:
        self.log = log
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if not hi > lo:
            pad = abs(lo) * 0.05 or 1.0
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.p0, self.p1 = lo, hi, p0, p1

    def __call__(self, v: float) -> float:
        x = math.log10(v) if self.log else v
        x = min(max(x, self.lo), self.hi)
        return self.p0 + (x - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)

    def ticks(self, n: int = 5) -> list[float]:
        if self.log:
            return [10.0**k for k in range(math.ceil(self.lo), math.floor(self.hi) + 1)]
        raw = (self.hi - self.lo) / max(1, n)
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        first = math.ceil(self.lo / step) * step
        count = int((self.hi - first) / step + 1e-9) + 1
        return [first + i * step for i in range(count)]


def _robust_range(values: Sequence[float]) -> tuple[float, float]:
    """Min/max, trimmed to the 0.5%..99.5% quantiles when there are many values
    (a diverged trial should not flatten the others), padded by 5%."""
    v = sorted(values)
    if not v:
        return 0.0, 1.0
    lo, hi = v[int(0.005 * (len(v) - 1))], v[int(math.ceil(0.995 * (len(v) - 1)))]
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def _ylabel(text: str, h: int) -> str:
    """A y-axis title, written upwards along the left edge."""
    y = (h - _B + _T) // 2
    return f'<text class="ly" x="14" y="{y}" transform="rotate(-90 14 {y})">{esc(text)}</text>'


def _axes(x: _Scale, y: _Scale, xlabel: str, ylabel: str, w: int, h: int) -> list[str]:
    out = [f'<rect class="frame" x="{_L}" y="{_T}" width="{w - _L - _R}" height="{h - _T - _B}"/>']
    for t in x.ticks():
        px = _n(x(t))
        out.append(f'<line class="grid" x1="{px}" x2="{px}" y1="{_T}" y2="{h - _B}"/>')
        out.append(f'<text class="tx" x="{px}" y="{h - _B + 14}">{esc(fmt(t, 3))}</text>')
    for t in y.ticks():
        py = _n(y(t))
        out.append(f'<line class="grid" x1="{_L}" x2="{w - _R}" y1="{py}" y2="{py}"/>')
        out.append(f'<text class="ty" x="{_L - 4}" y="{py}">{esc(fmt(t, 3))}</text>')
    out.append(f'<text class="lx" x="{(w + _L) // 2}" y="{h - 6}">{esc(xlabel)}</text>')
    out.append(_ylabel(ylabel, h))
    return out


def _svg(w: int, h: int, label: str, body: Iterable[str], cls: str = "chart") -> str:
    return (
        f'<svg class="{cls}" viewBox="0 0 {w} {h}" role="img" aria-label="{esc(label)}">'
        + "".join(body)
        + "</svg>"
    )


def _hp_text(t: TrialView, limit: int = 160) -> str:
    text = ", ".join(f"{k}={v}" for k, v in sorted(t.hparams.items()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _curve_points(t: TrialView) -> list[tuple[int, float]]:
    if t.curve is None:
        return []
    return [(s, v) for s, v in zip(t.curve.steps, t.curve.values, strict=True) if math.isfinite(v)]


def _decimate(points: list[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    if len(points) <= limit:
        return points
    k = math.ceil(len(points) / limit)
    kept = points[::k]
    return kept if kept[-1] == points[-1] else [*kept, points[-1]]


def curves_svg(
    trials: Sequence[TrialView], best_id: int | None, rungs: Sequence[int], metric: str
) -> str | None:
    """All trials' curves of the searcher metric; None when no trial has a point."""
    curves = {t.id: c for t in trials if (c := _curve_points(t))}
    if not curves:
        return None
    total = sum(len(p) for p in curves.values())
    limit = max(8, POINT_BUDGET // len(curves)) if total > POINT_BUDGET else total
    max_x = max([*(p[-1][0] for p in curves.values()), *rungs, 1])
    x = _Scale(0, max_x, _L, _W - _R)
    y = _Scale(*_robust_range([v for p in curves.values() for _, v in p]), _H - _B, _T)
    body = _axes(x, y, "step", metric, _W, _H)
    for i, r in enumerate(rungs):
        px = _n(x(r))
        body.append(f'<line class="rung" x1="{px}" x2="{px}" y1="{_T}" y2="{_H - _B}"/>')
        end = " e" if x(r) > _W - _R - 80 else ""  # near the right edge: text to the left
        body.append(f'<text class="rl{end}" x="{px}" y="{_T + 10}">rung {i + 1}: {r}</text>')
    ordered = sorted(trials, key=lambda t: (t.id == best_id, t.id))
    for t in ordered:
        if t.id not in curves:
            continue
        xy: list[str] = []
        for s, v in _decimate(curves[t.id], limit):
            p = f"{round(x(s))},{round(y(v))}"
            if not xy or xy[-1] != p:
                xy.append(p)
        cls = "best" if t.id == best_id else state_class(t.state)
        tip = f"trial {t.id} ({t.state}): best {fmt(t.best)} after {t.steps} steps; {_hp_text(t)}"
        marks = "".join(f"M{p}h0" for p in xy) if len(xy) <= 3 or total <= 2000 else ""
        line = f'<polyline points="{" ".join(xy)}"/>' if len(xy) > 1 else ""
        dots = f'<path class="pt" d="{marks}"/>' if marks else ""
        body.append(f'<g class="{cls}"><title>{esc(tip)}</title>{line}{dots}</g>')
    many = " many" if len(curves) > 150 else ""  # fainter lines, so density shows
    return _svg(_W, _H, f"learning curves of {metric}", body, "chart" + many)


def _category_key(v: Any) -> tuple[int, float, str]:
    """Numbers first, by value; then everything else by its text."""
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return (0, float(v), "")
    return (1, 0.0, str(v))


def scatter_svg(
    hp: HParamView, trials: Sequence[TrialView], best_id: int | None, metric: str
) -> str | None:
    """Each trial's best metric against one hyperparameter (log x for ``log``)."""
    pts = [
        (t, t.hparams[hp.name])
        for t in trials
        if hp.name in t.hparams and t.best is not None and math.isfinite(t.best)
    ]
    if not pts or hp.kind == "const":
        return None
    w, h = 460, 260
    y = _Scale(*_robust_range([t.best for t, _ in pts if t.best is not None]), h - _B, _T)
    body: list[str] = []
    if hp.kind == "categorical":
        ordered = sorted((v for _, v in pts), key=_category_key)  # values may be unhashable
        cats = list(dict.fromkeys(str(v) for v in ordered))
        pos = {c: i for i, c in enumerate(cats)}
        x = _Scale(-0.5, len(cats) - 0.5, _L, w - _R)
        body += [b for b in _axes(x, y, hp.name, metric, w, h) if 'class="tx"' not in b]
        step = max(1, math.ceil(len(cats) / 12))
        for c in cats[::step]:
            label = c if len(c) <= 12 else c[:11] + "…"
            px = _n(x(pos[c]))
            body.append(f'<text class="tx" x="{px}" y="{h - _B + 14}">{esc(label)}</text>')

        def xpos(t: TrialView, v: Any) -> float:
            jitter = ((t.id * 2654435761) % 1000 / 1000 - 0.5) * 0.5
            return x(pos[str(v)] + jitter)

    else:
        vals = [float(v) for _, v in pts]
        log = hp.kind == "log"
        lo, hi = min(vals), max(vals)
        if not log:
            lo, hi = lo - (hi - lo) * 0.05, hi + (hi - lo) * 0.05
        x = _Scale(lo, hi, _L, w - _R, log=log)
        body += _axes(x, y, hp.name + (" (log)" if log else ""), metric, w, h)

        def xpos(t: TrialView, v: Any) -> float:
            return x(float(v))

    for t, v in sorted(pts, key=lambda p: p[0].id == best_id):
        cls = "best" if t.id == best_id else state_class(t.state)
        tip = f"trial {t.id}: {hp.name}={v} → {fmt(t.best)} at step {t.steps}"
        body.append(
            f'<circle class="{cls}" cx="{round(xpos(t, v))}" cy="{round(y(t.best or 0.0))}"'
            f' r="3"><title>{esc(tip)}</title></circle>'
        )
    return _svg(w, h, f"{metric} against {hp.name}", body)


def _clock(seconds: float) -> str:
    m = int(seconds // 60)
    return f"+{m // 60}h{m % 60:02d}" if m >= 60 else f"+{m}m{int(seconds % 60):02d}s"


def _time_axis(t0: float, t1: float, w: int, h: int) -> tuple[_Scale, list[str]]:
    x = _Scale(0.0, max(1.0, t1 - t0), _L, w - _R)
    out = []
    for t in x.ticks(6):
        px = _n(x(t))
        out.append(f'<line class="grid" x1="{px}" x2="{px}" y1="{_T}" y2="{h - _B}"/>')
        out.append(f'<text class="tx" x="{px}" y="{h - _B + 14}">{_clock(t)}</text>')
    out.append(f'<text class="lx" x="{(w + _L) // 2}" y="{h - 6}">time since launch</text>')
    return x, out


def _attempt_tip(t: TrialView, a: Any, t0: float) -> str:
    bits = [f"trial {t.id}, attempt {a.key}: {a.cause or a.state}"]
    if a.exit_code is not None:
        bits.append(f"exit {a.exit_code}" + (f" ({a.exit_reason})" if a.exit_reason else ""))
    if a.lost_steps:
        bits.append(f"{a.lost_steps} steps lost")
    if a.node_list:
        bits.append(f"on {a.node_list}")
    if a.start is not None and a.end is not None:
        bits.append(f"{_clock(a.start - t0)} to {_clock(a.end - t0)}")
        if not a.end_recorded:
            bits.append("(no exit record: end estimated)")
    return "; ".join(bits)


def timeline_svg(trials: Sequence[TrialView], t0: float) -> str | None:
    """One row per trial, one bar per attempt coloured by its cause."""
    spans = [a.end for t in trials for a in t.attempts if a.start is not None and a.end]
    if not spans:
        return None
    w = _W
    row = max(2.0, min(14.0, 1200 / max(1, len(trials))))
    h = int(_T + _B + row * len(trials)) + 1
    x, body = _time_axis(t0, max(spans), w, h)
    label_every = max(1, math.ceil(11 / row))
    for i, t in enumerate(trials):
        top = _T + i * row
        if i % label_every == 0:
            body.append(f'<text class="ty" x="{_L - 4}" y="{_n(top + row / 2)}">{t.id}</text>')
        for a in t.attempts:
            if a.start is None or a.end is None:
                continue
            cause = a.cause or (
                "running" if a.state in (JobState.RUNNING.value, JobState.PENDING.value) else ""
            )
            x0, x1 = x(a.start - t0), x(a.end - t0)
            body.append(
                f'<rect class="{cause_class(cause)}" x="{_n(x0)}" y="{_n(top)}"'
                f' width="{_n(max(1.0, x1 - x0))}" height="{_n(max(1.0, row - 1))}">'
                f"<title>{esc(_attempt_tip(t, a, t0))}</title></rect>"
            )
    body.append(_ylabel("trial", h))
    return _svg(w, h, "timeline of attempts", body)


def gpu_svg(trials: Sequence[TrialView], t0: float) -> str | None:
    """Each attempt's mean GPU utilization as a segment over its run; None without
    telemetry."""
    segs = [
        (t, a)
        for t in trials
        for a in t.attempts
        if a.gpu_util is not None and a.start is not None and a.end is not None
    ]
    if not segs:
        return None
    h = 240
    x, body = _time_axis(t0, max(a.end or 0.0 for _, a in segs), _W, h)
    y = _Scale(0, 100, h - _B, _T)
    for tk in y.ticks(4):
        py = _n(y(tk))
        body.append(f'<line class="grid" x1="{_L}" x2="{_W - _R}" y1="{py}" y2="{py}"/>')
        body.append(f'<text class="ty" x="{_L - 4}" y="{py}">{int(tk)}%</text>')
    body.append(_ylabel("GPU util", h))
    for t, a in segs:
        util = a.gpu_util or 0.0
        py = _n(y(util))
        tip = f"trial {t.id}, attempt {a.key}: mean {util:.0f}% over {a.gpus_seen} GPU(s)"
        body.append(
            f'<line class="gpu" x1="{_n(x((a.start or 0) - t0))}" x2="{_n(x((a.end or 0) - t0))}"'
            f' y1="{py}" y2="{py}"><title>{esc(tip)}</title></line>'
        )
    return _svg(_W, h, "GPU utilization per attempt", body)
