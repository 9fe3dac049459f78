"""A parallel-coordinates chart (inline SVG): hyperparameters against the metric.

One vertical axis per hyperparameter that varies (``const`` ones are left out),
in the order given, and the metric's axis last; one polyline per trial through its
value on each axis it has a value for (so a trial has exactly one vertex per such
axis). Axis kinds follow :class:`~dlhpc.report._page_data.HParamView`: ``log`` axes
are log10-scaled, ``categorical`` ones spread their values (numbers first, by
value, then text) evenly; the rest are linear. A trial is coloured by its metric
on a fixed ramp (:data:`RAMP`, dark = best of the chart, light = worst) and drawn
in that order, best on top; a trial without a result is grey and dashed, with no
vertex on the metric axis. Colours are presentation attributes from fixed values;
every user string goes through :func:`~dlhpc.report._svg.esc`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dlhpc.report._page_data import HParamView, TrialView
from dlhpc.report._svg import _category_key, _Scale, _svg, esc, fmt

__all__ = ["RAMP", "Axis", "axes_of", "parallel_svg", "ramp"]

RAMP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))  # viridis
_W, _TOP, _BOTTOM, _SIDE = 960, 48, 330, 110
_H = 400
_NO_RESULT = "#9ca3af"


def ramp(goodness: float) -> str:
    """The colour for ``goodness`` in [0, 1] (1: best): dark purple to yellow."""
    g = min(1.0, max(0.0, goodness))
    pos = (1.0 - g) * (len(RAMP) - 1)
    i = min(int(pos), len(RAMP) - 2)
    f = pos - i
    rgb = (round(a + (b - a) * f) for a, b in zip(RAMP[i], RAMP[i + 1], strict=True))
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _is_finite_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


class Axis:
    """One vertical axis: where a value lands on it (None: not on this axis)."""

    def __init__(self, name: str, kind: str, values: Sequence[Any]) -> None:
        self.name, self.kind = name, kind
        self.cats: list[str] = []
        if kind == "categorical":
            ordered = sorted(values, key=_category_key)
            self.cats = list(dict.fromkeys(str(v) for v in ordered))
            self.scale = _Scale(-0.5, len(self.cats) - 0.5, _BOTTOM, _TOP)
        else:
            nums = [float(v) for v in values if _is_finite_number(v)]
            log = kind == "log" and all(v > 0 for v in nums)
            self.kind = "log" if log else "double"
            lo, hi = (min(nums), max(nums)) if nums else (0.0, 1.0)
            self.scale = _Scale(lo, hi, _BOTTOM, _TOP, log=log)

    def y(self, value: Any) -> float | None:
        if self.cats:
            text = str(value)
            return self.scale(self.cats.index(text)) if text in self.cats else None
        if not _is_finite_number(value) or (self.kind == "log" and value <= 0):
            return None
        return self.scale(float(value))

    def labels(self) -> list[tuple[float, str]]:
        """(y, text) of the axis's tick labels."""
        if self.cats:
            step = max(1, math.ceil(len(self.cats) / 12))
            return [(self.scale(i), c) for i, c in enumerate(self.cats)][::step]
        ticks = self.scale.ticks(4)
        if len(ticks) < 2:  # e.g. a log axis within one decade: its ends
            lo, hi = self.scale.lo, self.scale.hi
            ticks = [10**lo, 10**hi] if self.kind == "log" else [lo, hi]
        return [(self.scale(t), fmt(t, 3)) for t in ticks]


def axes_of(hparams: Sequence[HParamView], trials: Sequence[TrialView]) -> list[Axis]:
    """The hyperparameter axes: every non-constant one some trial has a value for."""
    out = []
    for hp in hparams:
        values = [t.hparams[hp.name] for t in trials if hp.name in t.hparams]
        if hp.kind != "const" and values:
            out.append(Axis(hp.name, hp.kind, values))
    return out


def _tip(label: str, t: TrialView, metric: str) -> str:
    hp = ", ".join(f"{k}={v}" for k, v in sorted(t.hparams.items()))
    hp = hp if len(hp) <= 160 else hp[:159] + "…"
    return f"{label}, trial {t.id}: {metric} {fmt(t.best)}; {hp}"


def _axis_marks(axes: Sequence[Axis], xs: Sequence[float]) -> list[str]:
    out = []
    for axis, x in zip(axes, xs, strict=True):
        px = round(x)
        out.append(f'<line class="frame" x1="{px}" x2="{px}" y1="{_TOP}" y2="{_BOTTOM}"/>')
        name = axis.name if len(axis.name) <= 18 else axis.name[:17] + "…"
        log = " (log)" if axis.kind == "log" else ""
        out.append(f'<text class="lx" x="{px}" y="{_TOP - 22}">{esc(name + log)}</text>')
        for y, text in axis.labels():
            label = text if len(text) <= 14 else text[:13] + "…"
            out.append(f'<text class="ty" x="{px - 4}" y="{round(y)}">{esc(label)}</text>')
    return out


def _legend(lo: float, hi: float, smaller_is_better: bool, metric: str) -> list[str]:
    """The colour ramp under the axes: worst (light) to best (dark)."""
    name = metric if len(metric) <= 24 else metric[:23] + "…"
    y = _H - 24
    out = [f'<text x="{_SIDE - 60}" y="{y + 4}">{esc(name)}: worst</text>']
    for i in range(10):
        out.append(
            f'<rect x="{_SIDE + 150 + 16 * i}" y="{y - 6}" width="16" height="12"'
            f' fill="{ramp(i / 9)}"/>'
        )
    worst, best = (hi, lo) if smaller_is_better else (lo, hi)
    out.append(
        f'<text x="{_SIDE + 318}" y="{y + 4}">best ({esc(fmt(best))}; worst {esc(fmt(worst))})'
        "</text>"
    )
    out.append(
        f'<polyline points="{_SIDE + 540},{y} {_SIDE + 580},{y}" fill="none"'
        f' stroke="{_NO_RESULT}" stroke-dasharray="4 3"/>'
        f'<text x="{_SIDE + 586}" y="{y + 4}">no result yet</text>'
    )
    return out


def parallel_svg(
    hparams: Sequence[HParamView],
    trials: Sequence[tuple[str, TrialView]],
    metric: str,
    smaller_is_better: bool,
) -> str | None:
    """The chart of ``trials`` (``(label, trial)``, e.g. ``("experiment 3", t)``); None
    without a varying hyperparameter or a trial."""
    views = [t for _, t in trials]
    axes = axes_of(hparams, views)
    if not axes or not trials:
        return None
    scores = [t.best for t in views if t.best is not None and math.isfinite(t.best)]
    metric_axis = Axis(metric, "double", scores)
    all_axes = [*axes, metric_axis]
    gap = (_W - 2 * _SIDE) / max(1, len(all_axes) - 1)
    xs = [_SIDE + i * gap for i in range(len(all_axes))]
    lo, hi = (min(scores), max(scores)) if scores else (0.0, 1.0)

    def goodness(t: TrialView) -> float:
        if t.best is None or not math.isfinite(t.best):
            return -1.0
        g = (t.best - lo) / (hi - lo) if hi > lo else 1.0
        return 1.0 - g if smaller_is_better else g

    body = _axis_marks(all_axes, xs)
    for label, t in sorted(trials, key=lambda lt: (goodness(lt[1]), lt[1].id)):
        g = goodness(t)
        values = [*(t.hparams.get(a.name) if a.name in t.hparams else None for a in axes), t.best]
        points = [
            f"{round(x)},{round(y)}"
            for a, x, v in zip(all_axes, xs, values, strict=True)
            if v is not None and (y := a.y(v)) is not None
        ]
        paint = f'stroke="{_NO_RESULT}" stroke-dasharray="4 3"' if g < 0 else f'stroke="{ramp(g)}"'
        body.append(
            f'<polyline class="pc" data-trial="{t.id}" points="{" ".join(points)}" fill="none"'
            f' {paint} stroke-width="1.5" opacity="0.85"><title>{esc(_tip(label, t, metric))}'
            "</title></polyline>"
        )
    body += _legend(lo, hi, smaller_is_better, metric)
    return _svg(_W, _H, f"parallel coordinates: hyperparameters against {metric}", body)
