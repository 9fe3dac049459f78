"""Render a :class:`~dlhpc.report._compare_data.CompareData` as one self-contained
page, in the shell of the experiment pages (:func:`~dlhpc.report._page.document`:
inline CSS and SVG, the sorting script, a CSP that forbids every fetch).

Sections: who is compared (a colour per side), a summary table, the learning
curves overlaid (one chart per metric name), the hyperparameters side by side,
the parallel-coordinates chart (one per metric name) and the reproducibility
record's differences. In the tables a row whose cells differ is marked (``≠``
before its name, and a tinted background). Every user string goes through
:func:`~dlhpc.report._svg.esc`.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlhpc._version import __version__
from dlhpc.report._compare_data import CompareData, Row, Side
from dlhpc.report._compare_svg import Series, overlay_svg, swatch
from dlhpc.report._page import document, when
from dlhpc.report._page_data import TrialView
from dlhpc.report._parallel import parallel_svg
from dlhpc.report._svg import esc

__all__ = ["COMPARE_CSS", "render_compare"]

COMPARE_CSS = """
.sw{vertical-align:-1px;margin-right:4px}
.sides{margin:4px 0;display:flex;flex-wrap:wrap;gap:4px 18px}
td.v{white-space:normal;overflow-wrap:anywhere;max-width:360px}
tr.diff td.v{background:#fff7ed}.ne{color:#c2410c;font-weight:600}
"""


def _label(s: Side, mode: str) -> str:
    if mode == "trials":
        return f"{s.key} (experiment {s.experiment_id}: {s.experiment_name})"
    return f"{s.key}: {s.experiment_name}"


def _sides(m: CompareData) -> str:
    items = "".join(
        f"<span>{swatch(i)}{esc(_label(s, m.mode))}</span>" for i, s in enumerate(m.sides)
    )
    return f'<p class="sides">{items}</p>'


def _table(m: CompareData, rows: Sequence[Row], group: str | None) -> str:
    """A side-by-side table; ``group``: the heading of the rows' group column (None:
    no such column)."""
    if not rows:
        return '<p class="mute">Nothing to show.</p>'
    heads = [group] if group is not None else []
    ths = "".join(f"<th>{esc(h)}</th>" for h in [*heads, "item"])
    ths += "".join(f"<th>{swatch(i)}{esc(s.key)}</th>" for i, s in enumerate(m.sides))
    body = []
    for r in rows:
        mark = '<span class="ne" title="differs">≠ </span>' if r.differs else ""
        cells = [f"<td>{esc(r.group)}</td>"] if group is not None else []
        cells.append(f"<td>{mark}{esc(r.name)}</td>")
        cells += [f'<td class="v">{esc(v)}</td>' for v in r.values]
        cls = ' class="diff"' if r.differs else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table class="sortable"><thead><tr>{ths}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _by_metric(sides: Sequence[Side]) -> dict[str, list[int]]:
    """Side positions grouped by metric name, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(sides):
        groups.setdefault(s.metric, []).append(i)
    return groups


def _is_best(side: Side, t: TrialView) -> bool:
    return side.best is not None and side.best.id == t.id


def _curves(m: CompareData) -> str:
    parts = []
    for metric, idx in _by_metric(m.sides).items():
        series = [
            Series(i, _label(m.sides[i], m.mode), t, m.mode == "trials" or _is_best(m.sides[i], t))
            for i in idx
            for t in m.sides[i].trials
        ]
        svg = overlay_svg(series, metric)
        parts.append(svg or f'<p class="mute">No {esc(metric)} reported yet.</p>')
    note = (
        "Every trial of each experiment drawn faint, the experiment's best trial bold;"
        " one colour per experiment."
        if m.mode == "experiments"
        else "One curve per trial, one colour per trial."
    )
    if len(parts) > 1:
        note += " The sides optimise different metrics: one chart per metric."
    return "".join(parts) + f'<p class="note">{esc(note)} Hover a curve for its trial.</p>'


def _parallel(m: CompareData) -> str:
    parts = []
    for metric, idx in _by_metric(m.sides).items():
        trials = [(m.sides[i].key, t) for i in idx for t in m.sides[i].trials]
        smaller = m.sides[idx[0]].smaller_is_better
        svg = parallel_svg(m.hparams, trials, metric, smaller)
        parts.append(svg or '<p class="mute">No hyperparameter varies across these trials.</p>')
    note = (
        "One line per trial through its value of each hyperparameter and its best result"
        " (last axis), coloured by that result; log-scale axes for log-type hyperparameters,"
        " categories spread evenly; constants left out. Hover a line for its trial."
    )
    return "".join(parts) + f'<p class="note">{esc(note)}</p>'


def _title(m: CompareData) -> str:
    return "dlhpc compare: " + " vs ".join(s.key for s in m.sides)


def render_compare(m: CompareData) -> str:
    """The compare page's HTML (pure)."""
    what = "experiments" if m.mode == "experiments" else "trials"
    body = [
        f'<p class="mute">generated {when(m.generated)} by dlhpc {esc(__version__)}</p>',
        f"<h1>Comparing {len(m.sides)} {what}</h1>",
        _sides(m),
        "<h2>Summary</h2>",
        _table(m, m.summary, None),
        "<h2>Learning curves</h2>",
        _curves(m),
        "<h2>Hyperparameters</h2>",
        _table(m, m.hparam_rows, "of"),
        '<p class="note">≠ marks a row whose values differ.'
        + (
            " space: the experiment's search space; best trial: its best trial's values."
            if m.mode == "experiments"
            else ""
        )
        + "</p>",
        "<h2>Hyperparameters against the metric (parallel coordinates)</h2>",
        _parallel(m),
        "<h2>Reproducibility record: what differs</h2>",
        _table(m, m.record_rows, "section")
        if m.record_rows
        else '<p class="mute">The records do not differ.</p>',
        f'<p class="note">{esc(m.record_note)}</p>',
    ]
    return document(_title(m), body, COMPARE_CSS)
