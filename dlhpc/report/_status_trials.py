"""Building a listed trial of :mod:`dlhpc.report.status` from its rows: one row of
:func:`listing_columns` per attempt and GPU (the trial's columns, the attempt's, and one
of the attempt's ``gpu_summaries`` rows: an attempt's rows follow each other, and a
trial without attempts, or an attempt without GPU rows, has one row of NULLs there),
times read as their stored text, each column read by its label. :func:`trial` builds the
typed trial from them.
"""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import String, select, type_coerce

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
    "listed_trial_id",
    "listing_columns",
    "raw",
    "run_hours",
    "target_length",
    "trial",
    "trial_row",
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


def raw(col: Any, name: str | None = None) -> Any:
    """``col`` (a DateTime) as its stored text, labelled ``name`` (else its key):
    :func:`when` reads 10,000s of them several times faster than SQLAlchemy's result
    processing does."""
    return type_coerce(col, String).label(name or col.key)


_fromiso = datetime.fromisoformat


def when(text: str | None) -> datetime | None:
    """A time read by :func:`raw` as the DB's naive UTC datetime."""
    return None if text is None else datetime.fromisoformat(text)


_TIMES = {"started_at", "ended_at", "terminal_seen_at"}
TrialRow = namedtuple("TrialRow", [c.key for c in TRIAL_COLS])  # type: ignore[misc]
# one of an attempt's GPUs' summaries (its ended telemetry), summed per attempt here: a
# GROUP BY in SQL costs more than the listing's other work
_GPU_COLS = (GpuSummary.n_util, GpuSummary.sum_util, GpuSummary.newest)


def listing_columns() -> tuple[Any, ...]:
    """The columns of a listing row, labelled: the trial's by their keys, the attempt's
    as ``a_<key>`` (its times read by :func:`raw`), the GPU summary's as ``g_<key>``."""
    attempt = (
        raw(c, f"a_{c.key}") if c.key in _TIMES else c.label(f"a_{c.key}") for c in ATTEMPT_COLS
    )
    return (*TRIAL_COLS, *attempt, *(c.label(f"g_{c.key}") for c in _GPU_COLS))


_LABELS = select(*listing_columns()).selected_columns.keys()


def _columns(*names: str) -> Callable[[Any], Any]:
    """Reads the listing row's columns ``names`` (their labels): a tuple of them, or
    the one column's value. Bound once to where the labels sit in the row: the listing
    reads 100,000s of rows, and a row's attribute lookup costs several times more."""
    return itemgetter(*(_LABELS.index(n) for n in names))


listed_trial_id = _columns("id")  # a listing row's trial id
_trial = _columns(*TrialRow._fields)
_attempt_id = _columns("a_id")
_attempt = _columns(
    "a_id",
    "a_attempt_key",
    "a_job_id",
    "a_state",
    "a_cause",
    "a_exit_code",
    "a_lost_steps",
    "a_node_list",
    "a_started_at",
    "a_ended_at",
    "a_terminal_seen_at",
    "a_exit_reason",
)
_gpu = _columns("g_n_util", "g_sum_util", "g_newest")


def trial_row(row: Any) -> Any:
    """A listing row's trial columns, as a :class:`TrialRow`."""
    return TrialRow._make(_trial(row))


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
    n_util, sum_util, newest = _gpu(rows[start])
    if newest is None:  # no summary (NOT NULL in the table): the outer join's NULLs
        return None
    gpus = stop - start
    if gpus > 1:
        n_utils, sum_utils, newests = zip(*map(_gpu, rows[start:stop]), strict=True)
        n_util, sum_util, newest = sum(n_utils), sum(sum_utils), max(newests)
    return GpuUse(gpus, round((sum_util or 0) / n_util, 1) if n_util else None, utc(newest))


def attempt_spans(rows: list[Any]) -> list[tuple[int, int]]:
    """Each attempt's ``(start, stop)`` in a trial's listing ``rows`` (one row per GPU
    summary), in order; none for the outer join's row of a trial without attempts."""
    out = []
    i, n = 0, len(rows)
    while i < n:
        aid = _attempt_id(rows[i])
        j = i + 1
        while j < n and _attempt_id(rows[j]) == aid:
            j += 1
        if aid is not None:
            out.append((i, j))
        i = j
    return out


def _attempt_of(rows: list[Any], start: int, stop: int, c: Ctx) -> tuple[AttemptStatus, float]:
    """The attempt of ``rows[start:stop]`` (one per GPU summary) and its hours
    (:func:`run_hours`)."""
    aid, key, job, state, cause, code, lost, nodes, started, ended, seen, reason = _attempt(
        rows[start]
    )
    started = None if started is None else _fromiso(started)  # when() inline: 100,000s
    ended = None if ended is None else _fromiso(ended)
    seen = None if seen is None else _fromiso(seen)
    hours = run_hours(state, started, ended, seen, c.now)
    live = c.live_gpu.get(aid)
    gpu = gpu_summary(live) if live is not None else _ended_gpu(rows, start, stop)
    gpus, cpus = c.shape.gpus, c.shape.cpus
    attempt = AttemptStatus(
        key, job, state, cause, code, lost, nodes, started, ended, gpu,
        round(hours * gpus, 4), round(hours * cpus, 4), reason, seen,
    )  # fmt: skip
    return attempt, hours


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
    for start, stop in attempt_spans(rows):
        attempt, h = _attempt_of(rows, start, stop, c)
        hours += h
        if attempt.gpu is not None:
            latest_gpu = (attempt.key, attempt.gpu)
        attempts.append(attempt)
    if len(attempts) == 1:  # most trials: the sum is the attempt's hours, rounded already
        gpu_h, cpu_h = attempts[0].gpu_hours, attempts[0].cpu_hours
    else:
        gpu_h, cpu_h = round(hours * c.shape.gpus, 4), round(hours * c.shape.cpus, 4)
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
