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
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from itertools import groupby
from operator import itemgetter
from typing import Any

from sqlalchemy import String, and_, func, or_, select, type_coerce
from sqlalchemy.orm import Session

from dlhpc.errors import NotFoundError
from dlhpc.harness.telemetry import IDLE_BELOW_PCT, IDLE_WINDOW_S
from dlhpc.report._status_gpu import (
    ATTEMPT_COLS,
    GpuRows,
    Row,
    gpu_summary,
    idle_gpus,
    live_idle,
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
    trial_counts,
)
from dlhpc.report.status_model import (
    AttemptStatus,
    DecisionStats,
    DiskUse,
    ExperimentStatus,
    GpuUse,
    IdleGpu,
    Status,
    TrialStatus,
)
from dlhpc.store import Attempt, Experiment, Trial
from dlhpc.store.models import GpuSummary

__all__ = [
    "TERMINAL_TRIAL_STATES",
    "idle_gpus",
    "iter_status",
    "pick_trials",
    "status_data",
]

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
_TrialRow = namedtuple("_TrialRow", [c.key for c in _TRIAL_COLS])  # type: ignore[misc]
# per attempt, its ended GPU telemetry summed over its GPUs (gpu_summaries)
_GPU_COLS = (
    func.count(GpuSummary.attempt_id),
    func.sum(GpuSummary.n_util),
    func.sum(GpuSummary.sum_util),
    func.max(GpuSummary.newest),
)
_NT = len(_TRIAL_COLS)
# where each attempt column sits in a row of _listing (after the trial's columns)
_AT = {c.key: _NT + i for i, c in enumerate(ATTEMPT_COLS)}
_GPU_AT = _NT + len(ATTEMPT_COLS)


def _run_hours(
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
class _Ctx:
    """What every trial of an experiment is judged with."""

    live_gpu: GpuRows  # live attempt id -> its per-GPU digests (from its samples)
    idle: dict[int, list[IdleGpu]]  # trial id -> its idle GPUs
    shape: _Shape
    now: datetime


def _ended_gpu(row: Any) -> GpuUse | None:
    """An ended attempt's GPU use from its GPUs' summed summaries (as :func:`gpu_summary`)."""
    gpus, n_util, sum_util, newest = row[_GPU_AT : _GPU_AT + 4]
    if not gpus or newest is None:
        return None
    mean = round((sum_util or 0) / n_util, 1) if n_util else None
    return GpuUse(gpus, mean, datetime.fromtimestamp(newest, tz=timezone.utc).replace(tzinfo=None))


def _attempt_status(row: Any, c: _Ctx) -> tuple[AttemptStatus, float]:
    """An attempt (a row of :func:`_listing`) and its hours."""
    state = row[_AT["state"]]
    started = _when(row[_AT["started_at"]])
    ended = _when(row[_AT["ended_at"]])
    seen = _when(row[_AT["terminal_seen_at"]])
    hours = _run_hours(state, started, ended, seen, c.now)
    live = c.live_gpu.get(row[_AT["id"]])
    attempt = AttemptStatus(
        row[_AT["attempt_key"]],
        row[_AT["job_id"]],
        state,
        row[_AT["cause"]],
        row[_AT["exit_code"]],
        row[_AT["lost_steps"]],
        row[_AT["node_list"]],
        started,
        ended,
        gpu_summary(live) if live is not None else _ended_gpu(row),
        round(hours * c.shape.gpus, 4),
        round(hours * c.shape.cpus, 4),
        row[_AT["exit_reason"]],
        seen,
    )
    return attempt, hours


def _trial(t: Row, rows: list[Any], c: _Ctx) -> TrialStatus:
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


@dataclass
class _Plan:
    """What a status read lists and what it sums (see :func:`_plan`)."""

    counts: dict[int, dict[str, int]]  # experiment -> trials by state
    shown: dict[int, set[int]] | None  # experiment -> listed trial ids (None: every trial)
    hours: dict[int, dict[int, float]]  # experiment -> trial -> hours of the attempts read
    unlisted_hours: dict[int, float]  # experiment -> its unlisted trials' ended hours
    live: GpuRows  # live attempt id -> per-GPU digests
    idle: dict[int, list[IdleGpu]]  # trial id -> idle GPUs


def _plan(
    session: Session,
    exps: list[Experiment],
    limit: int | None,
    now: datetime,
    idle_rule: tuple[float, float],
) -> _Plan:
    """Counts, the listed trials (:func:`pick_trials` over :func:`candidates`; every
    trial without a ``limit``), each trial's hours from its attempts (of unlisted trials
    only the live ones: the ended ones' hours are summed in SQL), and the idle GPUs."""
    conn = session.connection()  # plain rows: no ORM row processing for 10,000s of rows
    ids = [e.id for e in exps]
    shown: dict[int, set[int]] | None = None
    unlisted: dict[int, float] = {}
    raw_times = (_raw(getattr(Attempt, k)) for k in ("started_at", "ended_at", "terminal_seen_at"))
    attempts = select(Trial.experiment_id, Attempt.trial_id, Attempt.state, *raw_times).join(
        Trial, and_(Trial.id == Attempt.trial_id, Trial.experiment_id.in_(ids))
    )
    counts = trial_counts(conn, ids)
    if limit is not None:
        trials_of = candidates(conn, exps, limit)
        shown = {
            e.id: pick_trials(
                [(t.id, t.state, t.best_metric) for t in trials_of[e.id]],
                e.smaller_is_better,
                limit,
            )
            for e in exps
        }
        listed = [tid for tids in shown.values() for tid in tids]
        if len(listed) < sum(sum(c.values()) for c in counts.values()):
            attempts = attempts.where(or_(Attempt.trial_id.in_(listed), live_attempt()))
            unlisted = ended_hours(conn, ids, listed)
        else:
            shown = None
    hours: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for exp_id, trial_id, state, started, ended, seen in conn.execute(attempts):
        h = _run_hours(state, _when(started), _when(ended), _when(seen), now)
        hours[exp_id][trial_id] += h
    live, idle = live_idle(session, ids, *idle_rule)
    return _Plan(counts, shown, hours, unlisted, live, idle)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # the DB's naive UTC


def _head(
    e: Experiment, plan: _Plan, shape: _Shape, decisions: DecisionStats | None, disk: DiskUse | None
) -> ExperimentStatus:
    """The experiment and its totals over every trial (``trials`` left empty)."""
    hours = plan.hours.get(e.id, {})
    unlisted = plan.unlisted_hours.get(e.id, 0.0)
    gpu_h = sum(round(h * shape.gpus, 4) for h in hours.values()) + unlisted * shape.gpus
    cpu_h = sum(round(h * shape.cpus, 4) for h in hours.values()) + unlisted * shape.cpus
    counts = plan.counts.get(e.id, {})
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
        gpu_hours=round(gpu_h, 4),
        cpu_hours=round(cpu_h, 4),
        idle_gpus=tuple(g for tid in sorted(hours) for g in plan.idle.get(tid, ())),
        trials_total=sum(counts.values()),
        trial_counts=dict(sorted(counts.items())),
        decisions=decisions,
        disk=disk,
        trials=(),
    )


def _listing(ids: list[int], shown: dict[int, set[int]] | None) -> Any:
    """The listed trials joined with their attempts and each attempt's summed GPU
    summaries: one row per attempt (one per trial without any), by experiment (newest
    first), trial and attempt."""
    query = (
        select(*_TRIAL_COLS, *_RAW_ATTEMPT_COLS, *_GPU_COLS)
        .select_from(Trial)
        .outerjoin(Attempt, Attempt.trial_id == Trial.id)
        .outerjoin(GpuSummary, GpuSummary.attempt_id == Attempt.id)
        .where(Trial.experiment_id.in_(ids))
        .group_by(Trial.id, Attempt.id)
        .order_by(Trial.experiment_id.desc(), Trial.id, Attempt.id)
    )
    listed = [tid for tids in (shown or {}).values() for tid in tids]
    if shown is not None and len(listed) <= _FULL_ROWS_MAX:
        query = query.where(Trial.id.in_(listed))
    return query


def _trials(rows: Iterator[Any], keep: set[int] | None, ctx: _Ctx) -> Iterator[TrialStatus]:
    for tid, trial_rows in groupby(rows, key=itemgetter(0)):
        if keep is None or tid in keep:
            block = list(trial_rows)
            yield _trial(_TrialRow._make(block[0][:_NT]), block, ctx)


def iter_status(
    session: Session,
    experiment_id: int | None = None,
    *,
    idle_below_pct: float = IDLE_BELOW_PCT,
    idle_window_s: float = IDLE_WINDOW_S,
    limit: int | None = None,
) -> Iterator[tuple[ExperimentStatus, Iterator[TrialStatus]]]:
    """:func:`status_data` one piece at a time: per experiment (newest first), its
    status with empty ``trials`` and an iterator of its listed trials, read from the DB
    as it is consumed (exhaust it, inside ``session``, before the next experiment). Its
    totals are read first: two passes over the attempts, so that 100,000s of trials are
    never held at once. Raises :class:`~dlhpc.errors.NotFoundError` for an unknown id."""
    query = select(Experiment).order_by(Experiment.id.desc())
    if experiment_id is not None:
        query = query.where(Experiment.id == experiment_id)
    exps = list(session.scalars(query).all())
    if experiment_id is not None and not exps:
        raise NotFoundError(f"no experiment {experiment_id}")
    if not exps:
        return
    ids = [e.id for e in exps]
    now = _now()
    plan = _plan(session, exps, limit, now, (idle_below_pct, idle_window_s))
    decisions = decision_stats(session, ids)
    disk = disk_usage(session, exps)
    groups = groupby(session.connection().execute(_listing(ids, plan.shown)), key=itemgetter(1))
    pending = next(groups, None)
    for e in exps:
        shape = _Shape.of(e.config_json)
        head = _head(e, plan, shape, decisions.get(e.id), disk.get(e.id))
        ctx = _Ctx(plan.live, plan.idle, shape, now)
        if pending is None or pending[0] != e.id:
            yield head, iter(())
            continue
        keep = None if plan.shown is None else plan.shown[e.id]
        yield head, _trials(pending[1], keep, ctx)
        pending = next(groups, None)


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
    pieces = iter_status(
        session,
        experiment_id,
        idle_below_pct=idle_below_pct,
        idle_window_s=idle_window_s,
        limit=limit,
    )
    return Status(tuple(replace(head, trials=tuple(trials)) for head, trials in pieces))
