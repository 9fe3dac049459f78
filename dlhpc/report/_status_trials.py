"""Building a listed trial of :mod:`dlhpc.report.status` from its rows: one row of
:func:`listing_columns` per attempt (the trial's columns, the attempt's, and the
attempt's GPU summaries summed over its GPUs), times read as their stored text.
"""

from __future__ import annotations

import json
from collections import namedtuple
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import String, func, type_coerce

from dlhpc.report._status_gpu import ATTEMPT_COLS, GpuRows, Row, gpu_summary
from dlhpc.report.status_model import AttemptStatus, GpuUse, IdleGpu, TrialStatus
from dlhpc.states import LIVE_ATTEMPT_STATES, TrialState
from dlhpc.store import Trial
from dlhpc.store.models import GpuSummary

__all__ = [
    "TRIAL_COLS",
    "Ctx",
    "Shape",
    "TrialRow",
    "listing_columns",
    "raw",
    "run_hours",
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


def when(text: str | None) -> datetime | None:
    """A time read by :func:`raw` as the DB's naive UTC datetime."""
    return None if text is None else datetime.fromisoformat(text)


_TIMES = {"started_at", "ended_at", "terminal_seen_at"}
RAW_ATTEMPT_COLS = tuple(raw(c) if c.key in _TIMES else c for c in ATTEMPT_COLS)
TrialRow = namedtuple("TrialRow", [c.key for c in TRIAL_COLS])  # type: ignore[misc]
# per attempt, its ended GPU telemetry summed over its GPUs (gpu_summaries)
_GPU_COLS = (
    func.count(GpuSummary.attempt_id),
    func.sum(GpuSummary.n_util),
    func.sum(GpuSummary.sum_util),
    func.max(GpuSummary.newest),
)
_NT = len(TRIAL_COLS)
_GPU_AT = _NT + len(ATTEMPT_COLS)


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


def _ended_gpu(row: Any) -> GpuUse | None:
    """An ended attempt's GPU use from its GPUs' summed summaries (as :func:`gpu_summary`)."""
    gpus, n_util, sum_util, newest = row[_GPU_AT : _GPU_AT + 4]
    if not gpus or newest is None:
        return None
    mean = round((sum_util or 0) / n_util, 1) if n_util else None
    return GpuUse(gpus, mean, datetime.fromtimestamp(newest, tz=timezone.utc).replace(tzinfo=None))


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
if tuple(c.key for c in ATTEMPT_COLS) != _ATTEMPT_ORDER:  # _attempt_status unpacks them so
    raise ImportError("report._status_gpu.ATTEMPT_COLS changed: update _ATTEMPT_ORDER")


def _attempt_status(row: Any, c: Ctx) -> tuple[AttemptStatus, float]:
    """An attempt (a row of :func:`listing_columns`) and its hours."""
    aid, _, key, job, state, cause, code, lost, nodes, started, ended, seen, reason = row[
        _NT:_GPU_AT
    ]
    started, ended, seen = when(started), when(ended), when(seen)
    hours = run_hours(state, started, ended, seen, c.now)
    live = c.live_gpu.get(aid)
    gpu = gpu_summary(live) if live is not None else _ended_gpu(row)
    gpus, cpus = c.shape.gpus, c.shape.cpus
    attempt = AttemptStatus(
        key, job, state, cause, code, lost, nodes, started, ended, gpu,
        round(hours * gpus, 4), round(hours * cpus, 4), reason, seen,
    )  # fmt: skip
    return attempt, hours


def trial(t: Row, rows: list[Any], c: Ctx) -> TrialStatus:
    """A listed trial from its joined rows (one per attempt: trial, attempt, GPU sums)."""
    attempts = []
    latest_gpu = None
    hours = 0.0
    for row in rows:
        if row[_NT] is None:  # no attempt yet (the outer join's row)
            continue
        attempt, h = _attempt_status(row, c)
        hours += h
        if attempt.gpu is not None:
            latest_gpu = (attempt.key, attempt.gpu)
        attempts.append(attempt)
    target = t.max_length
    if t.state in _RUNG_STATES and c.shape.max_length:
        target = max(t.max_length, int(c.shape.max_length))
    return TrialStatus(
        id=t.id,
        state=t.state,
        hparams_json=t.hparams_json,
        steps_completed=t.steps_completed,
        max_length=t.max_length,
        target_length=target,
        best_metric=t.best_metric,
        latest_metric=t.latest_metric,
        restarts=t.restarts,
        crashes=t.crashes,
        slurm_job_ids=tuple(dict.fromkeys(a.job_id for a in attempts)),
        error=t.error,
        gpu=latest_gpu,
        idle_gpus=tuple(c.idle.get(t.id, ())),
        gpu_hours=round(hours * c.shape.gpus, 4),
        cpu_hours=round(hours * c.shape.cpus, 4),
        attempts=tuple(attempts),
        run_dir=t.run_dir,
    )


def listing_columns() -> tuple[Any, ...]:
    """The columns of a listing row, in the order :func:`trial` reads them."""
    return (*TRIAL_COLS, *RAW_ATTEMPT_COLS, *_GPU_COLS)
