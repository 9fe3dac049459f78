"""The models index page (``models.html``): every registered model name, its
versions and where each came from. Every user string (model names, notes, users,
experiment names) goes through :func:`~dlhpc.report._svg.esc`; the page is one
self-contained file under the reports' Content-Security-Policy (:func:`document`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timezone

from dlhpc._version import __version__
from dlhpc.report._page import document, num_td, when
from dlhpc.report._svg import esc
from dlhpc.store.model_registry import VersionRow

__all__ = ["render_models"]

_HEAD = ("version", "experiment", "trial", "step", "{metric}", "checkpoint", "user", "registered")


def _row(r: VersionRow, href: str) -> str:
    ckpt = f"{r.checkpoint_id}" + ("" if r.checkpoint_state == "ACTIVE" else " (deleted)")
    registered = when(r.created_at.replace(tzinfo=timezone.utc).timestamp())  # stored in UTC
    return (
        f'<tr id="{esc(r.ref)}"><td class="n">{r.version}</td>'
        f'<td><a href="{esc(href)}">{r.experiment_id} {esc(r.experiment_name)}</a></td>'
        f'<td class="n">{r.trial_id}</td><td class="n">{r.step}</td>'
        f"{num_td(r.metric)}<td>{esc(ckpt)}</td><td>{esc(r.user or '-')}</td>"
        f'<td>{esc(registered)}</td><td class="msg">{esc(r.note)}</td></tr>'
    )


def _section(name: str, versions: Sequence[VersionRow], href: Callable[[int], str]) -> str:
    latest = versions[-1]
    better = "smaller" if latest.smaller_is_better else "larger"
    ths = "".join(f"<th>{esc(h.format(metric=latest.metric_name))}</th>" for h in _HEAD)
    rows = "".join(_row(r, href(r.experiment_id)) for r in reversed(versions))
    plural = "s" if len(versions) != 1 else ""
    return (
        f'<section class="model"><h2>{esc(name)} <span class="badge">{len(versions)}'
        f" version{plural}</span></h2>"
        f'<p class="mute">latest: {esc(latest.ref)}; metric {esc(latest.metric_name)},'
        f" {better} is better</p>"
        f'<table class="sortable"><thead><tr>{ths}<th>note</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></section>"
    )


def render_models(
    models: Mapping[str, Sequence[VersionRow]],
    generated: float,
    href: Callable[[int], str],
    index_href: str,
) -> str:
    """The page: one section per model name (in name order), its versions newest
    first, each linking to its experiment's page (``href(experiment_id)``)."""
    body = [
        f'<h1>dlhpc models</h1><p class="mute">generated {when(generated)} by dlhpc'
        f' {esc(__version__)}; <a href="{esc(index_href)}">all experiments</a></p>'
    ]
    if not models:
        body.append(
            '<p class="mute">No registered models yet: dlhpc model register TRIAL_ID NAME.</p>'
        )
    body += [_section(name, versions, href) for name, versions in models.items()]
    return document("dlhpc models", body)
