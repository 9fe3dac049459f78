"""Render a :class:`~dlhpc.report._page_data.Page` (and the index) as one self-contained
HTML file: inline CSS, inline SVG, one small inline script that sorts tables.

Nothing leaves the page: no external stylesheet, font, image or script, and a
``Content-Security-Policy`` that forbids any fetch (``default-src 'none'``) and
allows only this file's own style block and script, by their sha256 (so even
markup injected by a bug could not run a script). Every user-provided string goes
through :func:`~dlhpc.report._svg.esc`; no user string is ever put inside the
script, which reads cell text and ``data-v`` attributes only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from dlhpc._version import __version__
from dlhpc.report._lab_html import lab_section, models_section, short, tags_html, user_filter
from dlhpc.report._page import (
    bytes_text,
    document,
    duration,
    hours,
    hp_value,
    kv,
    legend,
    num_td,
    when,
)
from dlhpc.report._page_data import Page
from dlhpc.report._svg import (
    CAUSES,
    cause_class,
    cause_label,
    curves_svg,
    esc,
    fmt,
    gpu_svg,
    scatter_svg,
    state_class,
    timeline_svg,
)

__all__ = ["IndexEntry", "render_index", "render_page"]


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
        "launched": when(p.created),
        "ended": when(p.ended) if p.ended is not None else "(still running)",
        "elapsed": duration(p.elapsed_s),
        f"{unit} used": f"{hours(u.used_h)} ({per})",
        f"{unit} saved by early stopping": f"{hours(u.saved_h)} (measured, {u.stopped_trials}"
        " trials stopped early"
        + (
            f"; {u.startup_trials} timed with their start-up: an upper bound)"
            if u.startup_trials
            else ")"
        ),
    }
    if p.best is not None:
        items["best trial"] = f"trial {p.best.id}: {p.metric} {fmt(p.best.best, 6)}"
        items["best hyperparameters"] = ", ".join(
            f"{k}={hp_value(v)}" for k, v in sorted(p.best.hparams.items())
        )
    else:
        items["best trial"] = "(no result yet)"
    if p.decisions:
        d = p.decisions
        lat = d.latency_s
        items["searcher decisions"] = f"{d.promotions} promotions, {d.stops} stops" + (
            f"; latency median {lat.median} s, max {lat.max} s" if lat else ""
        )
    if p.disk:
        items["checkpoint disk use"] = (
            f"{bytes_text(p.disk.checkpoint_bytes)} in {p.disk.checkpoints} checkpoint(s)"
            f"; {bytes_text(p.disk.freed_bytes)} freed by the keep policy"
            f" ({p.disk.deleted_checkpoints} deleted)"
        )
    if p.idle_gpus:
        items["idle GPUs now"] = "; ".join(
            f"trial {g.trial_id} {g.host} GPU {g.gpu_index} idle {g.idle_minutes} min"
            for g in p.idle_gpus
        )
    note = (
        f"{unit} used: each attempt's run time (start record to exit record) times {per}. "
        f"Saved: for each trial stopped early, (max_length {p.max_length} - its steps) x its "
        f"seconds per step x {per}, i.e. what running it to the end would have cost; seconds "
        "per step are its own: the time between its consecutive metric reports within one "
        "attempt over the steps they span; a trial that reported once per attempt is timed "
        "from each attempt's start to its first report, start-up included."
    )
    if u.uncounted_attempts:
        note += f" {u.uncounted_attempts} attempt(s) with no end time are not counted."
    desc = f"<p>{esc(p.description)}</p>" if p.description else ""
    return f'{desc}{kv(items)}<p class="note">{esc(note)}</p>'


def _curves_section(p: Page) -> str:
    best_id = p.best.id if p.best else None
    svg = curves_svg(p.trials, best_id, p.rungs, p.metric)
    if svg is None:
        return '<p class="mute">No metric reported yet.</p>'
    states = sorted({t.state for t in p.trials if t.curve is not None})
    keys = [(state_class(s), s) for s in states] + [("best", f"best (trial {best_id})")]
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
    return f'{svg}{legend(keys)}<p class="note">{esc(note)}</p>'


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
    with_tags, with_notes = any(t.tags for t in p.trials), any(t.note for t in p.trials)
    head += ["tags"] * with_tags + ["note"] * with_notes
    rows = []
    best_id = p.best.id if p.best else None
    for t in p.trials:
        gpu = next((a.gpu_util for a in reversed(t.attempts) if a.gpu_util is not None), None)
        cells = [
            f'<td class="n">{t.id}</td>',
            f"<td>{esc(t.state)}</td>",
            *(
                f"<td>{esc(hp_value(t.hparams[n]))}</td>" if n in t.hparams else "<td></td>"
                for n in names
            ),
            f'<td class="n">{t.steps}</td>',
            num_td(t.best),
            num_td(t.latest),
            f'<td class="n">{t.restarts}</td>',
            f'<td class="n">{t.crashes}</td>',
            f'<td class="n">{len(t.attempts)}</td>',
            f'<td class="n" data-v="{int(t.run_s)}">{duration(t.run_s)}</td>',
            num_td(gpu, 3),
        ]
        if with_tags:
            cells.append(f'<td class="tags">{tags_html(t.tags)}</td>')
        if with_notes:
            cells.append(f'<td class="msg" title="{esc(t.note)}">{esc(short(t.note))}</td>')
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
        items = [(cause_class(c), cause_label(c)) for c in causes]
        attempts = [a for t in p.trials for a in t.attempts]
        if any(not a.cause for a in attempts):
            items.append(("c-running", "running / not yet judged"))
        if any(a.cause and a.cause not in CAUSES for a in attempts):
            items.append(("c-other", "other"))
        parts += [svg, legend(items)]
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
            f'<tr><td>{when(e.time)}</td><td class="n">{"" if e.trial_id is None else e.trial_id}'
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
    return kv(p.repro) + folded


def render_page(p: Page) -> str:
    """The HTML of one experiment's report (pure)."""
    title = f"dlhpc experiment {p.id}: {p.name}"
    body = [
        f'<p class="mute"><a href="index.html">all experiments</a> · generated {when(p.generated)}'
        f" by dlhpc {esc(__version__)}</p>",
        f'<h1>Experiment {p.id}: {esc(p.name)} <span class="badge">{esc(p.state)}</span></h1>',
        "<h2>Summary</h2>",
        _summary(p),
        "<h2>Tags and notes</h2>",
        lab_section(p),
        "<h2>Model versions</h2>",
        models_section(p),
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
    return document(title, body, lab_stamp=p.lab_stamp)


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
    user: str = ""  # who launched it
    tags: tuple[str, ...] = ()


def _index_row(e: IndexEntry) -> str:
    return (
        f'<tr data-user="{esc(e.user)}"><td class="n">{e.id}</td>'
        f'<td><a href="{esc(e.href)}">{esc(e.name)}</a></td><td class="user">{esc(e.user)}</td>'
        f"<td>{esc(e.state)}</td><td>{esc(e.searcher)}</td><td>{esc(e.metric)}</td>"
        f'{num_td(e.best)}<td class="n">{e.trials}</td><td>{when(e.created)}</td>'
        f'<td class="n" data-v="{int(e.elapsed_s)}">{duration(e.elapsed_s)}</td>'
        f'<td class="tags">{tags_html(e.tags)}</td></tr>'
    )


def render_index(
    entries: Sequence[IndexEntry], generated: float, shared: str = "", models: str = ""
) -> str:
    """The index page: one row per experiment, newest first, linking to its page, with
    who launched it and its tags, and a per-user filter. ``shared``: a line saying whose
    experiments these are (a lab's shared state folder); ``models``: the models index's
    file name, linked from the header (none: no link)."""
    head = ["id", "name", "user", "state", "searcher", "metric", "best", "trials"]
    head += ["launched", "elapsed", "tags"]
    rows = "".join(_index_row(e) for e in sorted(entries, key=lambda e: -e.id))
    ths = "".join(f"<th>{h}</th>" for h in head)
    runs = Counter(e.user for e in entries)
    who = ", ".join(f"{u or '(unknown)'}: {n}" for u, n in sorted(runs.items()))
    body = [
        f'<h1>dlhpc experiments</h1><p class="mute">generated {when(generated)} by dlhpc'
        f" {esc(__version__)}"
        + (f'; <a href="{esc(models)}">registered models</a>' if models else "")
        + "</p>",
        f'<p class="lab">{esc(shared)} Experiments by user: {esc(who or "none")}.</p>',
        user_filter(sorted(runs)),
        f'<table class="sortable" id="experiments"><thead><tr>{ths}</tr></thead>'
        f"<tbody>{rows}</tbody></table>",
    ]
    return document("dlhpc experiments", body)
