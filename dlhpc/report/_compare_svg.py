"""The compare page's learning-curve overlay (inline SVG, as :mod:`dlhpc.report._svg`).

One colour per side (:data:`PALETTE`, by the side's position; past ten sides the
colours repeat and the legend and tooltips tell them apart). Colours are SVG
presentation attributes chosen from that fixed list, never from user text; every
user string goes through :func:`~dlhpc.report._svg.esc`. Faint series (every trial
of a compared experiment) are drawn first, bold ones (each experiment's best, or
each compared trial) last, so they stay on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dlhpc.report._page_data import TrialView
from dlhpc.report._svg import (
    _B,
    _H,
    _L,
    _R,
    _T,
    _W,
    POINT_BUDGET,
    _axes,
    _curve_points,
    _decimate,
    _robust_range,
    _Scale,
    _svg,
    esc,
    fmt,
)

__all__ = ["PALETTE", "Series", "colour", "overlay_svg", "swatch"]

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


def colour(side: int) -> str:
    """The colour of the side at position ``side``."""
    return PALETTE[side % len(PALETTE)]


@dataclass(frozen=True)
class Series:
    """One trial's curve on the overlay: its side's position and label, and whether
    it is drawn bold."""

    side: int
    label: str  # "experiment 3: digits-grid" or "trial 12 (experiment 3)"
    trial: TrialView
    bold: bool


def _tip(s: Series) -> str:
    t = s.trial
    hp = ", ".join(f"{k}={v}" for k, v in sorted(t.hparams.items()))
    hp = hp if len(hp) <= 160 else hp[:159] + "…"
    return f"{s.label}, trial {t.id} ({t.state}): best {fmt(t.best)} after {t.steps} steps; {hp}"


def overlay_svg(series: Sequence[Series], metric: str) -> str | None:
    """Every series' curve of ``metric`` on one chart; None when none has a point.
    Decimated as the experiment pages' charts are (:data:`POINT_BUDGET` in all)."""
    curves = [(s, pts) for s in series if (pts := _curve_points(s.trial))]
    if not curves:
        return None
    total = sum(len(pts) for _, pts in curves)
    limit = max(8, POINT_BUDGET // len(curves)) if total > POINT_BUDGET else total
    max_x = max([*(pts[-1][0] for _, pts in curves), 1])
    x = _Scale(0, max_x, _L, _W - _R)
    y = _Scale(*_robust_range([v for _, pts in curves for _, v in pts]), _H - _B, _T)
    body = _axes(x, y, "step", metric, _W, _H)
    for s, points in sorted(curves, key=lambda c: (c[0].bold, c[0].side, c[0].trial.id)):
        xy: list[str] = []
        for step, v in _decimate(points, limit):
            p = f"{round(x(step))},{round(y(v))}"
            if not xy or xy[-1] != p:
                xy.append(p)
        width, opacity = ("2.5", "1") if s.bold else ("1", "0.3")
        paint = f'fill="none" stroke="{colour(s.side)}" opacity="{opacity}"'
        title = f"<title>{esc(_tip(s))}</title>"
        if len(xy) == 1:  # a single point: a round dot
            shape = f'<path d="M{xy[0]}h0" {paint} stroke-width="6" stroke-linecap="round">'
            body.append(f"{shape}{title}</path>")
        else:
            shape = f'<polyline points="{" ".join(xy)}" {paint} stroke-width="{width}">'
            body.append(f"{shape}{title}</polyline>")
    return _svg(_W, _H, f"learning curves of {metric}", body)


def swatch(side: int) -> str:
    """A small square of the side's colour, for legends and table headers."""
    return (
        f'<svg class="sw" width="12" height="12" viewBox="0 0 12 12" aria-hidden="true">'
        f'<rect width="12" height="12" rx="2" fill="{colour(side)}"/></svg>'
    )
