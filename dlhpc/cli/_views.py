"""Rich renderings of the status model."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dlhpc.report.status import pick_trials
from dlhpc.report.status_types import (
    CheckedDiskUse,
    ExperimentStatus,
    LatestNote,
    Status,
    TrialStatus,
)

__all__ = ["best_trial", "experiment_view", "experiments_table", "human_bytes", "idle_gpu_lines"]

_STATE_STYLE = {
    "COMPLETED": "green",
    "RUNNING": "cyan",
    "ACTIVE": "cyan",
    "PENDING": "yellow",
    "PAUSED": "yellow",
    "FAILED": "red",
    "KILLED": "magenta",
    "STOPPED_EARLY": "blue",
}


def _state(state: str) -> Text:
    return Text(state, style=_STATE_STYLE.get(state, ""))


def _metric(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _hparams(hp: dict[str, Any]) -> Text:
    return Text(" ".join(f"{k}={json.dumps(v)}" for k, v in sorted(hp.items())))


def _restarts(t: TrialStatus) -> str:
    causes = [a.cause for a in t.attempts[:-1] if a.cause]
    lost = sum(a.lost_steps or 0 for a in t.attempts[:-1])
    if not t.restarts:
        return "0"
    detail = ", ".join(f"{c} x{causes.count(c)}" for c in dict.fromkeys(causes))
    return f"{t.restarts} ({detail}; {lost} steps lost)" if detail else str(t.restarts)


def _bar(done: int, total: int, width: int = 8) -> str:
    total = max(total, 1)
    filled = min(width, round(width * min(done, total) / total))
    return f"{'█' * filled}{'░' * (width - filled)} {done}/{total}"


def _progress(t: TrialStatus) -> str:
    """Steps toward the trial's target: the searcher's final length for a paused or
    stopped trial, the current grant (its rung) otherwise."""
    return _bar(t.steps_completed, t.target_length or t.max_length)


def _hours(h: float | None) -> str:
    if not h:
        return "0"
    return "<0.01" if h < 0.01 else f"{h:.2f}" if h < 100 else f"{h:.0f}"


def _uses_gpus(e: ExperimentStatus) -> bool:
    return bool(e.gpus_per_job) or bool(e.gpu_hours)


def _gpu(t: TrialStatus) -> Text:
    """Mean utilization over the newest attempt with GPU samples, and how many GPUs."""
    if t.gpu is None:
        return Text("-")
    g = t.gpu
    util = "-" if g.util_mean is None else f"{g.util_mean:.0f}%"
    return Text(f"{util} x{g.gpus}", style="bold yellow" if t.idle_gpus else "")


def idle_gpu_lines(exp: ExperimentStatus, limit: int = 20) -> list[Text]:
    """One warning line per idle GPU of the experiment's live attempts."""
    idle = exp.idle_gpus
    lines = [
        Text(
            f"GPU idle: trial {g.trial_id} on {g.host} GPU {g.gpu_index} "
            f"below {g.below_pct:g}% for {g.idle_minutes:.0f} min",
            style="bold yellow",
        )
        for g in idle[:limit]
    ]
    if len(idle) > limit:
        lines.append(Text(f"... and {len(idle) - limit} more idle GPUs", style="bold yellow"))
    return lines


def best_trial(exp: ExperimentStatus) -> TrialStatus | None:
    """The listed trial with the best ``best_metric`` (None: no trial has one)."""
    scored = [t for t in exp.trials if t.best_metric is not None]
    if not scored:
        return None
    pick = min if exp.smaller_is_better else max
    return pick(scored, key=_best_metric)


def _best_metric(t: TrialStatus) -> float:
    return t.best_metric if t.best_metric is not None else float("nan")


NOTE_CHARS = 100  # a note shortened to this in the terminal (status --json has it whole)


def short_note(n: LatestNote, limit: int = NOTE_CHARS) -> Text:
    """``note (user, date; N notes): text`` on one line, the text cut to ``limit``."""
    text = " ".join(n.text.split())
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    more = f"; {n.count} notes" if n.count > 1 else ""
    return Text(f"note ({n.user or '?'}, {n.created_at:%Y-%m-%d}{more}): {text}", style="italic")


def experiments_table(data: Status) -> Table:
    table = Table(title="experiments", title_justify="left")
    cols = ["id", "name", "state", "searcher", "trials", "best", "GPU-h", "created (UTC)"]
    with_tags = any(e.tags for e in data.experiments)  # no column where nothing is tagged
    if with_tags:
        cols.append("tags")
    for col in cols:
        table.add_column(col, no_wrap=col != "name", justify="right" if col == "GPU-h" else "left")
    for e in data.experiments:
        done, total = e.trial_counts.get("COMPLETED", 0), e.trials_total
        best = best_trial(e)
        table.add_row(
            str(e.id),
            Text(e.name),
            _state(e.state),
            e.searcher,
            f"{done}/{total} done",
            f"{e.metric}={_metric(best.best_metric)}" if best else "-",
            _hours(e.gpu_hours),
            e.created_at.isoformat(sep=" ")[:16],
            *([Text(" ".join(e.tags))] if with_tags else []),
        )
    return table


def _decision_line(exp: ExperimentStatus) -> list[Text]:
    d = exp.decisions
    if not d:
        return []
    text = f"searcher decisions: {d.promotions} promoted, {d.stops} stopped early"
    if d.pending:
        text += f", {d.pending} waiting for a job"
    lat = d.latency_s
    if lat:
        text += f"; decision latency median {lat.median:.1f} s, max {lat.max:.1f} s"
    return [Text(text, style="dim")]


def _usage_line(exp: ExperimentStatus) -> list[Text]:
    text = f"resources used: {_hours(exp.gpu_hours)} GPU-hours"
    text += f", {_hours(exp.cpu_hours)} CPU-hours"
    return [Text(text, style="dim")]


def human_bytes(n: int | None) -> str:
    """``1.5 GiB``-style sizes (binary units)."""
    if n is None:
        return "-"
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(size) < 1024 or unit == "PiB":
            break
        size /= 1024
    return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"


def _disk_lines(exp: ExperimentStatus) -> list[Text]:
    """Checkpoint disk use (the ``disk`` of status_data), and a quota warning the CLI
    put there as ``quota_warning``."""
    d = exp.disk
    if not d:
        return []
    text = f"checkpoints: {d.checkpoints} kept, {human_bytes(d.checkpoint_bytes)}"
    if d.deleted_checkpoints:
        text += f"; GC freed {human_bytes(d.freed_bytes)} ({d.deleted_checkpoints} deleted)"
    lines = [Text(text, style="dim")]
    if isinstance(d, CheckedDiskUse) and d.quota_warning:
        lines.append(Text(d.quota_warning, style="bold red"))
    return lines


ROW_LIMIT = 40  # trials listed by default: a terminal cannot show 10,000 rows usefully


def _shown(exp: ExperimentStatus, limit: int | None) -> list[TrialStatus]:
    """The trials to list (status_data may have picked them already; see pick_trials)."""
    keep = pick_trials(
        [(t.id, t.state, t.best_metric) for t in exp.trials], exp.smaller_is_better, limit
    )
    return [t for t in exp.trials if t.id in keep]


def _counts_line(exp: ExperimentStatus, shown: int) -> list[Text]:
    total = exp.trials_total
    if shown >= total:
        return []
    by_state = ", ".join(f"{n} {state}" for state, n in exp.trial_counts.items())
    return [
        Text(
            f"{shown} of {total} trials listed (live first, then the best): {by_state};"
            " --all lists every trial, --json has them all",
            style="dim",
        )
    ]


def _lab_lines(exp: ExperimentStatus) -> list[Text]:
    """The experiment's owner, tags and latest note, above its trials."""
    head = [f"launched by {exp.user}"] if exp.user else []
    if exp.tags:
        head.append("tags: " + " ".join(exp.tags))
    lines = [Text("; ".join(head), style="dim")] if head else []
    if exp.note is not None:
        lines.append(short_note(exp.note))
    return lines


def experiment_view(
    exp: ExperimentStatus, note: str = "", limit: int | None = ROW_LIMIT
) -> RenderableType:
    """The experiment's trial table (at most ``limit`` rows; None: all) and notes."""
    direction = "min" if exp.smaller_is_better else "max"
    table = Table(
        # Text, not markup: a name like "[bold]x" or "[/]" is shown as written
        title=Text(
            f"experiment {exp.id} {exp.name} [{exp.state}]  metric: {exp.metric} ({direction})"
        ),
        title_justify="left",
    )
    metric = exp.metric
    for col in (
        "trial",
        "state",
        "progress",
        f"best {metric}",
        f"latest {metric}",
        "restarts",
        "jobs",
    ):
        table.add_column(col, no_wrap=True)
    gpu_hours = _uses_gpus(exp)  # CPU-only: CPU-hours
    table.add_column("GPU-h" if gpu_hours else "CPU-h", justify="right")
    with_gpu = any(t.gpu for t in exp.trials)  # no column for CPU-only runs
    if with_gpu:
        table.add_column("GPU util", no_wrap=True)
    table.add_column("hparams", overflow="fold")
    best = best_trial(exp)
    shown = _shown(exp, limit)
    trial_tags = any(t.tags for t in shown)
    if trial_tags:
        table.add_column("tags", overflow="fold")
    for t in shown:
        style = "bold" if best is not None and t.id == best.id else ""
        cells: list[RenderableType] = [
            str(t.id),
            _state(t.state),
            _progress(t),
            _metric(t.best_metric),
            _metric(t.latest_metric),
            _restarts(t),
            ",".join(t.slurm_job_ids[-2:]),
            _hours(t.gpu_hours if gpu_hours else t.cpu_hours),
        ]
        if with_gpu:
            cells.append(_gpu(t))
        tags = [Text(" ".join(t.tags))] if trial_tags else []
        table.add_row(*cells, _hparams(t.hparams_dict), *tags, style=style)
    parts: list[RenderableType] = [
        *_lab_lines(exp),
        table,
        *_counts_line(exp, len(shown)),
        *idle_gpu_lines(exp),
        *_decision_line(exp),
        *_usage_line(exp),
        *_disk_lines(exp),
    ]
    noted = [(t.id, n) for t in shown if (n := t.note) is not None]
    for tid, n in noted[:5]:
        parts.append(Text.assemble(f"trial {tid} ", short_note(n)))
    failed = [t for t in exp.trials if t.state == "FAILED" and t.error]
    for t in failed[:5]:
        parts.append(Text(f"trial {t.id} failed: {t.error}", style="red"))
    # a problem of a trial that goes on, e.g. a file of its job quarantined by ingest
    troubled = [t for t in exp.trials if t.state != "FAILED" and t.error]
    for t in troubled[:5]:
        parts.append(Text(f"trial {t.id}: {t.error}", style="yellow"))
    if note:
        parts.append(Text(note, style="dim"))
    return Group(*parts)
