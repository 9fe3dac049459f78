"""The lab parts of the pages: an experiment's owner, tags and notes, the model versions
registered from its trials, and the index's user filter.

Tags, notes, user names and model names are user text: each goes through
:func:`~dlhpc.report._svg.esc`, and none is put inside the page's script (the user
filter reads ``data-user`` attributes and the ``<select>``'s values, never code).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dlhpc.report._page import num_td, when
from dlhpc.report._page_data import ModelView, NoteView, Page
from dlhpc.report._svg import esc, fmt

__all__ = ["lab_section", "models_section", "tags_html", "user_filter"]

NOTE_CELL_CHARS = 120  # a trial's note in the trials table (the notes table has it whole)


def tags_html(tags: Iterable[str]) -> str:
    """Each tag as a small label."""
    return " ".join(f'<span class="tag">{esc(t)}</span>' for t in tags)


def short(text: str, limit: int = NOTE_CELL_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters (not escaped)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _notes_table(notes: Sequence[NoteView]) -> str:
    rows = "".join(
        f"<tr><td>{when(n.time)}</td>"
        f"<td>{'experiment' if n.trial_id is None else f'trial {n.trial_id}'}</td>"
        f'<td>{esc(n.user)}</td><td class="msg">{esc(n.text)}</td></tr>'
        for n in notes
    )
    return (
        '<div class="scroll"><table class="sortable notes"><thead><tr><th>time</th><th>on</th>'
        f"<th>by</th><th>note</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def lab_section(p: Page) -> str:
    """Who launched the experiment, its tags and every note (its trials' too)."""
    who = esc(p.user) if p.user else "(not recorded)"
    tags = tags_html(p.tags) if p.tags else '<span class="mute">none</span>'
    trial_tags = sum(1 for t in p.trials if t.tags)
    parts = [
        f'<dl class="kv"><dt>launched by</dt><dd class="user">{who}</dd>'
        f'<dt>tags</dt><dd class="tags">{tags}</dd>'
        f"<dt>tagged trials</dt><dd>{trial_tags}</dd></dl>"
    ]
    if p.notes:
        parts.append(_notes_table(p.notes))
    else:
        parts.append('<p class="mute">No notes.</p>')
    parts.append(
        f'<p class="note">Add with <span class="cmd">dlhpc tag {p.id} +TAG -TAG [-t TRIAL]'
        f'</span> and <span class="cmd">dlhpc note {p.id} "text" [-t TRIAL]</span>, then'
        " rebuild the page.</p>"
    )
    return "".join(parts)


def _model_row(m: ModelView) -> str:
    return (
        f'<tr><td class="model">{esc(m.name)}:{m.version}</td><td class="n">{m.trial_id}</td>'
        f'<td class="n">{m.checkpoint_id}</td><td class="n">{m.step}</td>{num_td(m.metric)}'
        f'<td>{esc(m.user)}</td><td>{when(m.created)}</td><td class="msg">{esc(m.note)}</td></tr>'
    )


def models_section(p: Page) -> str:
    """The model versions registered from this experiment's trials."""
    if not p.models:
        return (
            '<p class="mute">No model version registered from this experiment'
            ' (<span class="cmd">dlhpc model register TRIAL_ID NAME</span>).</p>'
        )
    head = ["version", "trial", "checkpoint", "step", p.metric, "by", "registered", "note"]
    ths = "".join(f"<th>{esc(h)}</th>" for h in head)
    rows = "".join(_model_row(m) for m in p.models)
    best = min if p.smaller_is_better else max
    scored = [m for m in p.models if m.metric is not None]
    note = ""
    if scored:
        top = best(scored, key=lambda m: m.metric if m.metric is not None else 0.0)
        note = f"Best registered: {top.name}:{top.version} ({p.metric} {fmt(top.metric, 6)})."
    return (
        f'<div class="scroll"><table class="sortable"><thead><tr>{ths}</tr></thead>'
        f'<tbody>{rows}</tbody></table></div><p class="note">{esc(note)}</p>'
    )


def user_filter(users: Sequence[str]) -> str:
    """The index's per-user filter (the page's script hides the other users' rows)."""
    options = "".join(f'<option value="{esc(u)}">{esc(u or "(unknown)")}</option>' for u in users)
    return (
        '<p><label>Show experiments of <select id="user-filter">'
        f'<option value="*">everyone ({len(users)} user{"s" * (len(users) != 1)})</option>'
        f"{options}</select></label></p>"
    )
