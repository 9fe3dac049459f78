"""Building a listed trial of :mod:`dlhpc.report.status` from its rows: one row of
:func:`listing_columns` per attempt and GPU (the trial's columns, the attempt's, and one
of the attempt's ``gpu_summaries`` rows: an attempt's rows follow each other, and a
trial without attempts, or an attempt without GPU rows, has one row of NULLs there),
times read as their stored text. :func:`trial` builds the typed trial from them.
"""

from __future__ import annotations

import json
from collections import namedtuple
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import String, type_coerce

from dlhpc.report._status_gpu import ATTEMPT_COLS, GpuRows, Row, gpu_summary, utc
from dlhpc.report._status_lab import EMPTY_LAB, Lab
from dlhpc.report.status_types import (
    AttemptStatus,
    GpuUse,
    IdleGpu,
    JsonText,
    TrialGpu,
    TrialStatus,
)
from dlhpc.states import LIVE_ATTEMPT_STATES, TrialState
from dlhpc.store import Trial
from dlhpc.store.tables import GpuSummary

__all__ = [
    "TRIAL_COLS",
    "Ctx",
    "Shape",
    "TrialRow",
    "listing_columns",
    "raw",
    "run_hours",
    "target_length",
    "trial",
    "when",
]

TRIAL_COLS = (
    Trial.id,
    Trial.experiment_id,
    Trial.state,
    Trial.hparams_json,
    Trial.steps_completed,
    Trial.max_length,
    Trial.best_metric,
    Trial.latest_metric,
    Trial.restarts,
    Trial.crashes,
    Trial.error,
    Trial.run_dir,
)
# grant was a rung: progress toward the final length
_RUNG_STATES = {TrialState.PAUSED.value, TrialState.STOPPED_EARLY.value}


@dataclass(frozen=True)
class Shape:
    """What an experiment's resolved config says about each job (for resource hours)."""

    gpus: int  # per job: nodes x gpus_per_node
    cpus: int  # per job: nodes x tasks_per_node x cpus_per_task
    max_length: int | None  # the searcher's final length

    @classmethod
    def of(cls, config_json: str) -> Shape:
        try:
            cfg = json.loads(config_json or "{}")
        except ValueError:
            cfg = {}
        res = cfg.get("resources") or {}
        nodes = int(res.get("nodes") or 1)
        gpn = int(res.get("gpus_per_node") or 0)
        tasks = int(res.get("tasks_per_node") or max(1, gpn))
        length = (cfg.get("searcher") or {}).get("max_length")
        return cls(nodes * gpn, nodes * tasks * int(res.get("cpus_per_task") or 1), length)


def raw(col: Any) -> Any:
    """``col`` (a DateTime) as its stored text: :func:`when` reads 10,000s of them
    several times faster than SQLAlchemy's result processing does."""
    return type_coerce(col, String).label(col.key)


_fromiso = datetime.fromisoformat


def when(text: str | None) -> datetime | None:
    """A time read by :func:`raw` as the DB's naive UTC datetime."""
    return None if text is None else datetime.fromisoformat(text)


_TIMES = {"started_at", "ended_at", "terminal_seen_at"}
RAW_ATTEMPT_COLS = tuple(raw(c) if c.key in _TIMES else c for c in ATTEMPT_COLS)
TrialRow = namedtuple("TrialRow", [c.key for c in TRIAL_COLS])  # type: ignore[misc]
# one of an attempt's GPUs' summaries (its ended telemetry), summed per attempt here: a
# GROUP BY in SQL costs more than the listing's other work (docs/BENCHMARKS.md)
_GPU_COLS = (GpuSummary.n_util, GpuSummary.sum_util, GpuSummary.newest)
_NT = len(TRIAL_COLS)
_GPU_AT = _NT + len(ATTEMPT_COLS)
# an attempt as :func:`attempts_of` reads it: its first listing row, started, ended,
# terminal_seen_at, its hours and its GPU use
Derived = tuple[Any, datetime | None, datetime | None, datetime | None, float, GpuUse | None]


def run_hours(
    state: str,
    started: datetime | None,
    ended: datetime | None,
    seen: datetime | None,
    now: datetime,
) -> float:
    """Hours an attempt held its allocation, from its start to its end (its recorded
    end, else ``now`` while it is live, else when its end was seen)."""
    if started is None:
        return 0.0
    end = ended
    if end is None:
        end = now if state in LIVE_ATTEMPT_STATES else seen
    if end is None:
        return 0.0
    return float(max(0.0, (end - started).total_seconds())) / 3600.0


@dataclass(frozen=True)
class Ctx:
    """What every trial of an experiment is judged with."""

    live_gpu: GpuRows  # live attempt id -> its per-GPU digests (from its samples)
    idle: dict[int, list[IdleGpu]]  # trial id -> its idle GPUs
    shape: Shape
    now: datetime
    # where given, :func:`trial` records here each trial's hours (the sum of its
    # attempts', in their order), by trial id, for trials with attempts
    hours: dict[int, float] | None = None
    lab: Lab = EMPTY_LAB  # the trials' tags and latest notes


def _ended_gpu(rows: list[Any], start: int, stop: int) -> GpuUse | None:
    """An ended attempt's GPU use from its GPUs' summaries, ``rows[start:stop]`` (as
    :func:`gpu_summary`); None without a summary."""
    n_util, sum_util, newest = rows[start][_GPU_AT : _GPU_AT + 3]
    if newest is None:  # no summary (NOT NULL in the table): the outer join's NULLs
        return None
    gpus = stop - start
    if gpus > 1:
        sums = [r[_GPU_AT : _GPU_AT + 3] for r in rows[start:stop]]
        n_util = sum(g[0] for g in sums)
        sum_util = sum(g[1] for g in sums)
        newest = max(g[2] for g in sums)
    return GpuUse(gpus, round((sum_util or 0) / n_util, 1) if n_util else None, utc(newest))


_ATTEMPT_ORDER = (
    "id",
    "trial_id",
    "attempt_key",
    "job_id",
    "state",
    "cause",
    "exit_code",
    "lost_steps",
    "node_list",
    "started_at",
    "ended_at",
    "terminal_seen_at",
    "exit_reason",
)
if tuple(c.key for c in ATTEMPT_COLS) != _ATTEMPT_ORDER:  # read by position below
    raise ImportError("report._status_gpu.ATTEMPT_COLS changed: update _ATTEMPT_ORDER")


def row_hours(row: Any, now: datetime) -> tuple[Any, Any, Any, float]:
    """An attempt's listing row's started, ended and terminal_seen_at (datetimes or None)
    and its hours (:func:`run_hours`)."""
    started, ended, seen = row[_NT + 9 : _NT + 12]  # when() inline: 100,000s of attempts
    started = None if started is None else _fromiso(started)
    ended = None if ended is None else _fromiso(ended)
    seen = None if seen is None else _fromiso(seen)
    return started, ended, seen, run_hours(row[_NT + 4], started, ended, seen, now)


def _derive(rows: list[Any], start: int, stop: int, c: Ctx) -> Derived:
    """The attempt of ``rows[start:stop]`` (one per GPU summary)."""
    row = rows[start]
    started, ended, seen, hours = row_hours(row, c.now)
    live = c.live_gpu.get(row[_NT])
    gpu = gpu_summary(live) if live is not None else _ended_gpu(rows, start, stop)
    return row, started, ended, seen, hours, gpu


def attempt_spans(rows: list[Any]) -> list[tuple[int, int]]:
    """Each attempt's ``(start, stop)`` in a trial's listing ``rows`` (one row per GPU
    summary), in order; none for the outer join's row of a trial without attempts."""
    out = []
    i, n = 0, len(rows)
    while i < n:
        aid = rows[i][_NT]
        j = i + 1
        while j < n and rows[j][_NT] == aid:
            j += 1
        if aid is not None:
            out.append((i, j))
        i = j
    return out


def attempts_of(rows: list[Any], c: Ctx) -> list[Derived]:
    """A trial's attempts, in order, from its listing rows (none for the outer join's
    row of a trial without attempts)."""
    return [_derive(rows, i, j, c) for i, j in attempt_spans(rows)]


def target_length(state: str, max_length: int, shape: Shape) -> int:
    """What a trial's progress counts toward (see :mod:`dlhpc.report.status`)."""
    if state in _RUNG_STATES and shape.max_length:
        return max(max_length, int(shape.max_length))
    return max_length


def trial(t: Row, rows: list[Any], c: Ctx) -> TrialStatus:
    """A listed trial from its joined rows (:func:`listing_columns`); its hours are
    recorded in ``c.hours`` where given."""
    attempts = []
    latest_gpu = None
    hours = 0.0
    gpus, cpus = c.shape.gpus, c.shape.cpus
    for row, started, ended, seen, h, gpu in attempts_of(rows, c):
        key, job, state, cause, code, lost, nodes = row[_NT + 2 : _NT + 9]
        attempt = AttemptStatus(
            key, job, state, cause, code, lost, nodes, started, ended, gpu,
            round(h * gpus, 4), round(h * cpus, 4), row[_NT + 12], seen,
        )  # fmt: skip
        hours += h
        if gpu is not None:
            latest_gpu = (key, gpu)
        attempts.append(attempt)
    if len(attempts) == 1:  # most trials: the sum is the attempt's hours, rounded already
        gpu_h, cpu_h = attempts[0].gpu_hours, attempts[0].cpu_hours
    else:
        gpu_h, cpu_h = round(hours * gpus, 4), round(hours * cpus, 4)
    if c.hours is not None and attempts:
        c.hours[t.id] = hours
    return TrialStatus(
        id=t.id,
        state=t.state,
        hparams=JsonText(t.hparams_json),
        steps_completed=t.steps_completed,
        max_length=t.max_length,
        target_length=target_length(t.state, t.max_length, c.shape),
        best_metric=t.best_metric,
        latest_metric=t.latest_metric,
        restarts=t.restarts,
        crashes=t.crashes,
        slurm_job_ids=tuple(dict.fromkeys(a.job_id for a in attempts)),
        error=t.error,
        gpu=None if latest_gpu is None else TrialGpu.of(*latest_gpu),
        idle_gpus=tuple(c.idle.get(t.id, ())),
        gpu_hours=gpu_h,
        cpu_hours=cpu_h,
        attempts=tuple(attempts),
        _run_dir=t.run_dir,
        tags=c.lab.trial_tags(t.id),
        note=c.lab.trial_note(t.id),
    )


def listing_columns() -> tuple[Any, ...]:
    """The columns of a listing row, in the order :func:`trial` reads them."""
    return (*TRIAL_COLS, *RAW_ATTEMPT_COLS, *_GPU_COLS)
