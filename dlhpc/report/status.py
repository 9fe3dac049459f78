"""The status model: what ``dlhpc status`` shows, as :mod:`~dlhpc.report.status_model`'s
dataclasses (its --json is theirs).

A constant number of queries whatever the number of trials, read as plain rows (no ORM
objects): the experiments, their trials, their attempts, GPU telemetry, decisions and
checkpoint use. GPU telemetry comes as one row per (attempt, host, GPU): the samples'
count and sum of utilization and the newest sample time, from ``gpu_summaries`` (kept
by a trigger at ingest) for an ended attempt; for a live one (``RUNNING``, no exit
record yet) an aggregate of its own samples adds the first and last busy sample time.
From it each attempt gets a ``gpu`` summary (GPUs seen, mean utilization over the
attempt, newest sample) and each live attempt the idle rule of
:func:`dlhpc.harness.telemetry.idle_since`, judged at the attempt's newest sample: every
idle GPU is listed in ``idle_gpus``, per trial and per experiment.

Resource use: each attempt's run time (start to end, or to now while it runs) times the
experiment's ``nodes x gpus_per_node`` is its ``gpu_hours`` (``nodes x tasks_per_node x
cpus_per_task``: ``cpu_hours``), summed per trial and per experiment; CPU-only runs have 0
GPU-hours. A trial's ``target_length`` is what its progress counts toward: the searcher's
final ``max_length`` for a ``PAUSED`` or ``STOPPED_EARLY`` trial (its grant, ``max_length``,
was only a rung), else the grant.
"""

from __future__ import annotations

import json
from collections import defaultdict, namedtuple
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import String, and_, or_, select, type_coerce
from sqlalchemy.orm import Session

from dlhpc.errors import NotFoundError
from dlhpc.harness.telemetry import IDLE_BELOW_PCT, IDLE_WINDOW_S
from dlhpc.report._status_gpu import (
    ATTEMPT_COLS,
    GpuRows,
    Row,
    gpu_rows,
    gpu_summary,
    idle_gpus,
    idle_of,
)
from dlhpc.report._status_sql import (
    LIVE_ATTEMPT_STATES,
    TERMINAL_TRIAL_STATES,
    candidates,
    decision_stats,
    disk_usage,
    ended_hours,
    live_attempt,
    pick_trials,
)
from dlhpc.report.status_model import (
    AttemptStatus,
    DecisionStats,
    DiskUse,
    ExperimentStatus,
    IdleGpu,
    Status,
    TrialStatus,
)
from dlhpc.store import Attempt, Experiment, Trial

__all__ = ["TERMINAL_TRIAL_STATES", "idle_gpus", "pick_trials", "status_data"]

_TRIAL_COLS = (
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
_FULL_ROWS_MAX = 5000  # listed trials fetched by id (IN list) up to this many, else all
_RUNG_STATES = {"PAUSED", "STOPPED_EARLY"}  # grant was a rung: progress toward the final length


@dataclass(frozen=True)
class _Shape:
    """What an experiment's resolved config says about each job (for resource hours)."""

    gpus: int  # per job: nodes x gpus_per_node
    cpus: int  # per job: nodes x tasks_per_node x cpus_per_task
    max_length: int | None  # the searcher's final length

    @classmethod
    def of(cls, config_json: str) -> _Shape:
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


def _raw(col: Any) -> Any:
    """``col`` (a DateTime) as its stored text: :func:`_when` reads 10,000s of them
    several times faster than SQLAlchemy's result processing does."""
    return type_coerce(col, String).label(col.key)


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


_TIMES = {"started_at", "ended_at", "terminal_seen_at"}
_RAW_ATTEMPT_COLS = tuple(_raw(c) if c.key in _TIMES else c for c in ATTEMPT_COLS)
_AttemptRow = namedtuple("_AttemptRow", [c.key for c in ATTEMPT_COLS])  # type: ignore[misc]
_TIME_AT = [i for i, c in enumerate(ATTEMPT_COLS) if c.key in _TIMES]


def _attempt(row: Row) -> Row:
    values = list(row)
    for i in _TIME_AT:
        values[i] = _when(values[i])
    return _AttemptRow._make(values)


def _run_hours(a: Row, now: datetime) -> float:
    """Hours the attempt held its allocation (to ``now`` while it still runs)."""
    if a.started_at is None:
        return 0.0
    end = a.ended_at
    if end is None:
        end = now if a.state in LIVE_ATTEMPT_STATES else a.terminal_seen_at
    if end is None:
        return 0.0
    return float(max(0.0, (end - a.started_at).total_seconds())) / 3600.0


@dataclass(frozen=True)
class _Ctx:
    """What every trial of an experiment is judged with."""

    gpu: GpuRows
    below_pct: float
    window_s: float
    shape: _Shape
    now: datetime


@dataclass(frozen=True, slots=True)
class _Usage:
    """What an unlisted trial adds to its experiment's totals."""

    gpu_hours: float
    cpu_hours: float
    idle_gpus: tuple[IdleGpu, ...]


def _attempt_status(a: Row, rows: list[Row], c: _Ctx) -> AttemptStatus:
    hours = _run_hours(a, c.now)
    return AttemptStatus(
        key=a.attempt_key,
        job_id=a.job_id,
        state=a.state,
        cause=a.cause,
        exit_code=a.exit_code,
        lost_steps=a.lost_steps,
        node_list=a.node_list,
        started_at=a.started_at,
        ended_at=a.ended_at,
        gpu=gpu_summary(rows),
        gpu_hours=round(hours * c.shape.gpus, 4),
        cpu_hours=round(hours * c.shape.cpus, 4),
        exit_reason=a.exit_reason,
        terminal_seen_at=a.terminal_seen_at,
    )


def _trial(t: Row, t_attempts: list[Row], c: _Ctx) -> TrialStatus:
    attempts = []
    latest_gpu = None
    idle: list[IdleGpu] = []
    gpu_h = cpu_h = 0.0
    for a in t_attempts:
        hours = _run_hours(a, c.now)
        gpu_h += hours * c.shape.gpus
        cpu_h += hours * c.shape.cpus
        rows = c.gpu.get(a.id, [])
        attempt = _attempt_status(a, rows, c)
        if attempt.gpu is not None:
            latest_gpu = (a.attempt_key, attempt.gpu)
        idle.extend(idle_of(t.id, a, rows, c.below_pct, c.window_s))
        attempts.append(attempt)
    target = t.max_length
    if t.state in _RUNG_STATES and c.shape.max_length:
        target = max(t.max_length, int(c.shape.max_length))
    return TrialStatus(
        id=t.id,
        state=t.state,
        hparams=json.loads(t.hparams_json),
        steps_completed=t.steps_completed,
        max_length=t.max_length,
        target_length=target,
        best_metric=t.best_metric,
        latest_metric=t.latest_metric,
        restarts=t.restarts,
        crashes=t.crashes,
        slurm_job_ids=tuple(dict.fromkeys(a.job_id for a in t_attempts)),
        error=t.error,
        gpu=latest_gpu,
        idle_gpus=tuple(idle),
        gpu_hours=round(gpu_h, 4),
        cpu_hours=round(cpu_h, 4),
        attempts=tuple(attempts),
        run_dir=t.run_dir,
    )


def _usage(t: Row, t_attempts: list[Row], c: _Ctx) -> _Usage:
    """What an unlisted trial adds to its experiment's totals (as :func:`_trial`)."""
    hours = sum(_run_hours(a, c.now) for a in t_attempts)
    idle = [
        g
        for a in t_attempts
        for g in idle_of(t.id, a, c.gpu.get(a.id, []), c.below_pct, c.window_s)
    ]
    return _Usage(round(hours * c.shape.gpus, 4), round(hours * c.shape.cpus, 4), tuple(idle))


@dataclass
class _Rows:
    """The rows one status read fetched (see :func:`_read_rows`)."""

    candidates: dict[int, list[Row]]  # experiment -> trials pick_trials may list (PICK_COLS)
    counts: dict[int, dict[str, int]]  # experiment -> trials by state
    shown: dict[int, set[int]]  # experiment -> listed trial ids
    full: dict[int, Row]  # trial id -> its _TRIAL_COLS row (the listed trials, or all)
    attempts: dict[int, list[Row]]  # trial id -> its attempts' rows
    unlisted_hours: dict[int, float]  # experiment -> its unlisted trials' ended hours
    partial: bool  # some trials are not listed


def _read_rows(conn: Any, exps: list[Experiment], limit: int | None) -> _Rows:
    """The trials and attempts of ``exps`` a status reads: the candidates and counts
    (:func:`candidates`), the listed trials' full rows, and their attempts (of unlisted
    trials only the live ones: the ended ones' hours are summed in SQL)."""
    ids = [e.id for e in exps]
    trials_of, counts = candidates(conn, exps, limit)
    shown = {
        e.id: pick_trials(
            [(t.id, t.state, t.best_metric) for t in trials_of[e.id]], e.smaller_is_better, limit
        )
        for e in exps
    }
    listed = [tid for tids in shown.values() for tid in tids]
    total = sum(sum(c.values()) for c in counts.values())
    full_rows = select(*_TRIAL_COLS).where(Trial.experiment_id.in_(ids))
    if len(listed) <= _FULL_ROWS_MAX and len(listed) < total:
        full_rows = full_rows.where(Trial.id.in_(listed))
    full = {t.id: t for t in conn.execute(full_rows)}
    attempts = select(*_RAW_ATTEMPT_COLS).join(
        Trial, and_(Trial.id == Attempt.trial_id, Trial.experiment_id.in_(ids))
    )
    partial = len(full) < total
    unlisted_hours: dict[int, float] = {}
    if partial:
        attempts = attempts.where(or_(Attempt.trial_id.in_(list(full)), live_attempt()))
        unlisted_hours = ended_hours(conn, ids, list(full))
    attempts_of: dict[int, list[Row]] = defaultdict(list)
    for a in conn.execute(attempts.order_by(Attempt.id)):
        attempts_of[a.trial_id].append(_attempt(a))
    return _Rows(trials_of, counts, shown, full, attempts_of, unlisted_hours, partial)


def _experiment(
    e: Experiment, rows: _Rows, ctx: _Ctx, decisions: DecisionStats | None, disk: DiskUse | None
) -> ExperimentStatus:
    trials: list[TrialStatus] = []
    usage: list[_Usage | TrialStatus] = []
    for t in rows.candidates[e.id]:
        if t.id in rows.shown[e.id]:
            trial = _trial(rows.full[t.id], rows.attempts.get(t.id, []), ctx)
            trials.append(trial)
            usage.append(trial)
        else:
            usage.append(_usage(t, rows.attempts.get(t.id, []), ctx))
    hours = rows.unlisted_hours.get(e.id, 0.0)
    shape = ctx.shape
    counts = rows.counts.get(e.id, {})
    return ExperimentStatus(
        id=e.id,
        name=e.name,
        state=e.state,
        searcher=e.searcher,
        metric=e.metric,
        smaller_is_better=e.smaller_is_better,
        backend=e.backend,
        created_at=e.created_at,
        ended_at=e.ended_at,
        run_dir=e.run_dir,
        max_length=shape.max_length,
        gpus_per_job=shape.gpus,
        cpus_per_job=shape.cpus,
        gpu_hours=round(sum(u.gpu_hours for u in usage) + hours * shape.gpus, 4),
        cpu_hours=round(sum(u.cpu_hours for u in usage) + hours * shape.cpus, 4),
        idle_gpus=tuple(g for u in usage for g in u.idle_gpus),
        trials_total=sum(counts.values()),
        trial_counts=dict(sorted(counts.items())),
        decisions=decisions,
        disk=disk,
        trials=tuple(trials),
    )


def status_data(
    session: Session,
    experiment_id: int | None = None,
    *,
    idle_below_pct: float = IDLE_BELOW_PCT,
    idle_window_s: float = IDLE_WINDOW_S,
    limit: int | None = None,
) -> Status:
    """The experiments, newest first; one experiment when an id is given (raises
    :class:`~dlhpc.errors.NotFoundError` when there is none).

    ``limit``: each experiment's ``trials`` holds at most that many (see
    :func:`pick_trials`); its totals, ``trial_counts`` (by state) and
    ``trials_total`` still cover every trial."""
    query = select(Experiment).order_by(Experiment.id.desc())
    if experiment_id is not None:
        query = query.where(Experiment.id == experiment_id)
    exps = list(session.scalars(query).all())
    if experiment_id is not None and not exps:
        raise NotFoundError(f"no experiment {experiment_id}")
    if not exps:
        return Status(())
    ids = [e.id for e in exps]
    conn = session.connection()  # plain rows: no ORM row processing for 10,000s of rows
    rows = _read_rows(conn, exps, limit)
    # unlisted trials' ended attempts need no GPU digest (their hours come from SQL)
    gpu = gpu_rows(session, ids, idle_below_pct, list(rows.full) if rows.partial else None)
    decisions = decision_stats(session, ids)
    disk = disk_usage(session, exps)
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # the DB's naive UTC
    out = []
    for e in exps:
        ctx = _Ctx(gpu, idle_below_pct, idle_window_s, _Shape.of(e.config_json), now)
        out.append(_experiment(e, rows, ctx, decisions.get(e.id), disk.get(e.id)))
    return Status(tuple(out))
