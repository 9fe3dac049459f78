"""The status model: what ``dlhpc status`` shows, as :mod:`~dlhpc.report.status_types`'s
dataclasses (``--json`` is their encoding, :func:`~dlhpc.report.status_types.write_json`).

A number of queries that does not grow with the trials (a few per experiment), read
as plain rows (no ORM objects), in two passes (:func:`iter_status`): first the totals
(trial counts by state, each trial's hours from its attempts' times, the live attempts'
GPU telemetry and idle GPUs, decisions, checkpoint use), then the listed trials, one
query per experiment joining each trial's attempts and their ``gpu_summaries`` rows (kept
by a trigger at ingest; summed per attempt in Python), read in index order as the caller
consumes them: ``status --json`` writes 100,000 trials without holding them. A live
attempt (``RUNNING``, no exit record yet) gets its telemetry from an aggregate of its own
samples instead, one row per GPU with the first and last busy sample time. From it each
attempt gets a ``gpu`` summary (GPUs seen, mean utilization over the attempt, newest
sample) and each live attempt the idle rule of
:func:`dlhpc.protocol.gpu.idle_since`, judged at the attempt's newest sample: every
idle GPU is listed in ``idle_gpus``, per trial and per experiment.

Resource use: each attempt's run time (start to end, or to now while it runs) times the
experiment's ``nodes x gpus_per_node`` is its ``gpu_hours`` (``nodes x tasks_per_node x
cpus_per_task``: ``cpu_hours``), summed per trial and per experiment; CPU-only runs have 0
GPU-hours. A trial's ``target_length`` is what its progress counts toward: the searcher's
final ``max_length`` for a ``PAUSED`` or ``STOPPED_EARLY`` trial (its grant, ``max_length``,
was only a rung), else the grant.

Tags and each experiment's and trial's newest note come from one more query per call,
for every experiment listed (:mod:`dlhpc.report._status_lab`); ``tags=`` keeps the
experiments carrying every tag given, in SQL.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from itertools import groupby
from typing import Any, TypeVar

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, defer

from dlhpc.errors import NotFoundError
from dlhpc.protocol.gpu import IDLE_BELOW_PCT, IDLE_WINDOW_S
from dlhpc.report._status_gpu import (
    GpuRows,
    idle_gpus,
    live_idle,
)
from dlhpc.report._status_lab import Lab, lab_of, tagged
from dlhpc.report._status_sql import (
    candidates,
    decision_stats,
    disk_usage,
    ended_hours,
    live_attempt,
    pick_trials,
    trial_counts,
)
from dlhpc.report._status_trials import (
    Ctx,
    Shape,
    TrialRow,
    listed_trial_id,
    listing_columns,
    raw,
    run_hours,
    trial,
    trial_row,
    when,
)
from dlhpc.report.status_types import (
    DecisionStats,
    DiskUse,
    ExperimentStatus,
    Head,
    IdleGpu,
    Status,
    TrialStatus,
)
from dlhpc.store import Attempt, Experiment, Trial
from dlhpc.store.tables import GpuSummary

__all__ = [
    "idle_gpus",
    "iter_status",
    "iter_status_json",
    "pick_trials",
    "status_data",
]

_FULL_ROWS_MAX = 5000  # listed trials fetched by id (IN list) up to this many, else all
_T = TypeVar("_T")
Render = Callable[[TrialRow, list[Any], Ctx], _T]  # a trial from its rows


@dataclass
class _Plan:
    """What a status read lists and what it sums (see :func:`_plan`)."""

    counts: dict[int, dict[str, int]]  # experiment -> trials by state
    shown: dict[int, set[int]] | None  # experiment -> listed trial ids (None: every trial)
    hours: dict[int, dict[int, float]]  # experiment -> trial -> hours of the attempts read
    unlisted_hours: dict[int, float]  # experiment -> its unlisted trials' ended hours
    live: GpuRows  # live attempt id -> per-GPU digests
    idle: dict[int, list[IdleGpu]]  # trial id -> idle GPUs
    # every trial listed and ``hours`` left empty: the listing's renders fill it
    # (Ctx.hours) as they are consumed, and the totals follow the trials
    streamed: bool = False


def _plan(
    session: Session,
    exps: list[Experiment],
    limit: int | None,
    now: datetime,
    idle_rule: tuple[float, float],
    stream_hours: bool = False,
) -> _Plan:
    """Counts, the listed trials (:func:`pick_trials` over :func:`candidates`; every
    trial without a ``limit``), each trial's hours from its attempts (of unlisted trials
    only the live ones: the ended ones' hours are summed in SQL), and the idle GPUs.
    With ``stream_hours``, when every trial is listed the hours are not read here: the
    plan is ``streamed`` (no pass over every attempt before the first trial)."""
    conn = session.connection()  # plain rows: no ORM row processing for 10,000s of rows
    ids = [e.id for e in exps]
    shown: dict[int, set[int]] | None = None
    unlisted: dict[int, float] = {}
    raw_times = (raw(getattr(Attempt, k)) for k in ("started_at", "ended_at", "terminal_seen_at"))
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
            # the candidates hold every trial with a live attempt: an indexed IN, no scan
            maybe = [t.id for rows in trials_of.values() for t in rows]
            attempts = attempts.where(
                Attempt.trial_id.in_(maybe), or_(Attempt.trial_id.in_(listed), live_attempt())
            )
            unlisted = ended_hours(conn, ids, listed)
        else:
            shown = None
    hours: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    live, idle = live_idle(session, ids, *idle_rule)
    if stream_hours and shown is None:
        return _Plan(counts, shown, {e: {} for e in ids}, unlisted, live, idle, streamed=True)
    of_exp: int | None = None  # rows come grouped by experiment, mostly
    per_trial: dict[int, float] = {}
    for exp_id, trial_id, state, started, ended, seen in conn.execute(attempts):
        if exp_id != of_exp:
            of_exp, per_trial = exp_id, hours[exp_id]
        seen_at = when(seen) if ended is None else None  # (run_hours reads it only then)
        per_trial[trial_id] += run_hours(state, when(started), when(ended), seen_at, now)
    return _Plan(counts, shown, hours, unlisted, live, idle)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # the DB's naive UTC


def _head(
    e: Experiment,
    plan: _Plan,
    shape: Shape,
    decisions: DecisionStats | None,
    disk: DiskUse | None,
    lab: Lab,
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
        user=e.user,
        tags=lab.tags.get(("experiment", e.id), ()),
        note=lab.notes.get(("experiment", e.id)),
    )


def _listing(exp_id: int, shown: set[int] | None) -> Any:
    """The experiment's listed trials joined with their attempts and each attempt's GPU
    summaries: one row per attempt and GPU (one per trial without any), by trial and
    attempt, in the order of the indexes it is read by (no sort before the first row)."""
    query = (
        select(*listing_columns())
        .select_from(Trial)
        .outerjoin(Attempt, Attempt.trial_id == Trial.id)
        .outerjoin(GpuSummary, GpuSummary.attempt_id == Attempt.id)
        .where(Trial.experiment_id == exp_id)
        .order_by(Trial.id, Attempt.id)
    )
    if shown is not None and len(shown) <= _FULL_ROWS_MAX:
        query = query.where(Trial.id.in_(shown))
    return query


def _trials(
    session: Session, exp_id: int, keep: set[int] | None, ctx: Ctx, render: Render[_T]
) -> Iterator[_T]:
    """The experiment's listed trials (all without ``keep``), read as they are consumed."""
    if keep is not None and not keep:
        return
    rows = session.connection().execute(_listing(exp_id, keep))
    for tid, trial_rows in groupby(rows, key=listed_trial_id):
        if keep is None or tid in keep:
            block = list(trial_rows)
            yield render(trial_row(block[0]), block, ctx)


def _iter(
    session: Session,
    experiment_id: int | None,
    idle_rule: tuple[float, float],
    limit: int | None,
    render: Render[_T],
    stream_hours: bool = False,
    tags: Sequence[str] = (),
) -> Iterator[tuple[Head, Iterator[_T]]]:
    """:func:`iter_status`, each trial built by ``render``; with ``stream_hours`` (and
    every trial listed) each head is a callable, complete once its trials are consumed."""
    query = tagged(select(Experiment).order_by(Experiment.id.desc()), tags)
    # the searcher's state (megabytes in a long search) is never shown
    query = query.options(defer(Experiment.searcher_state, raiseload=True))
    if experiment_id is not None:
        query = query.where(Experiment.id == experiment_id)
    exps = list(session.scalars(query).all())
    if experiment_id is not None and not exps:
        raise NotFoundError(f"no experiment {experiment_id}")
    if not exps:
        return iter(())
    ids = [e.id for e in exps]
    now = _now()
    plan = _plan(session, exps, limit, now, idle_rule, stream_hours)
    lab = lab_of(session.connection(), ids)
    pieces = []
    for e, stats, disk in zip(
        exps,
        map(decision_stats(session, ids).get, ids),
        map(disk_usage(session, exps).get, ids),
        strict=True,
    ):
        shape = Shape.of(e.config_json)
        hours = plan.hours[e.id] if plan.streamed else None
        ctx = Ctx(plan.live, plan.idle, shape, now, hours, lab)
        keep = None if plan.shown is None else plan.shown[e.id]
        trials = _trials(session, e.id, keep, ctx, render)
        head = partial(_head, e, plan, shape, stats, disk, lab)
        pieces.append(_after(trials, head) if plan.streamed else (head(), trials))
    return iter(pieces)


def _after(
    trials: Iterator[_T], head: Callable[[], ExperimentStatus]
) -> tuple[Callable[[], ExperimentStatus], Iterator[_T]]:
    """``head`` as a callable that answers only after ``trials`` (which sum its totals)
    are exhausted, and ``trials``."""
    done: list[bool] = []

    def consumed() -> Iterator[_T]:
        yield from trials
        done.append(True)

    def after() -> ExperimentStatus:
        if not done:
            raise RuntimeError("an experiment's totals read before its trials were")
        return head()

    return after, consumed()


def iter_status(
    session: Session,
    experiment_id: int | None = None,
    *,
    idle_below_pct: float = IDLE_BELOW_PCT,
    idle_window_s: float = IDLE_WINDOW_S,
    limit: int | None = None,
    tags: Sequence[str] = (),
) -> Iterator[tuple[ExperimentStatus, Iterator[TrialStatus]]]:
    """:func:`status_data` one piece at a time: per experiment (newest first), its
    status with empty ``trials`` and an iterator of its listed trials, read from the DB
    as it is consumed (exhaust it, inside ``session``, before the next experiment). The
    totals are read here, before the first piece: two passes over the attempts, so that
    100,000s of trials are never held at once. Raises
    :class:`~dlhpc.errors.NotFoundError` for an unknown id (here, not when iterated:
    nothing is written before it). ``tags``: only the experiments carrying every one of
    them (an experiment's own tags, not its trials')."""
    idle = (idle_below_pct, idle_window_s)
    return _ready(_iter(session, experiment_id, idle, limit, trial, tags=tags))


def _ready(
    pieces: Iterator[tuple[Head, Iterator[_T]]],
) -> Iterator[tuple[ExperimentStatus, Iterator[_T]]]:
    """``pieces`` read without ``stream_hours``: every head is ready (for the type)."""
    for head, trials in pieces:
        if not isinstance(head, ExperimentStatus):
            raise TypeError("a streamed head where a ready one was asked for")
        yield head, trials


def iter_status_json(
    session: Session,
    experiment_id: int | None = None,
    *,
    idle_below_pct: float = IDLE_BELOW_PCT,
    idle_window_s: float = IDLE_WINDOW_S,
    limit: int | None = None,
    tags: Sequence[str] = (),
) -> Iterator[tuple[Head, Iterator[TrialStatus]]]:
    """:func:`iter_status` for ``status --json``
    (:func:`~dlhpc.report.status_types.write_json`): where every trial is listed, a
    head is a callable instead, whose totals (hours, idle GPUs) are summed from the
    trials as they are read: call it once they are consumed (no pass over every attempt
    before the first trial; ``write_json`` holds the trials' text in a temporary file
    meanwhile). Its values are :func:`iter_status`'s head's (a trial's attempts added
    in an index's order there, by attempt id here, as for the trial's own
    ``gpu_hours``: with three or more a float sum may differ in its last bit)."""
    idle = (idle_below_pct, idle_window_s)
    return _iter(session, experiment_id, idle, limit, trial, stream_hours=True, tags=tags)


def status_data(
    session: Session,
    experiment_id: int | None = None,
    *,
    idle_below_pct: float = IDLE_BELOW_PCT,
    idle_window_s: float = IDLE_WINDOW_S,
    limit: int | None = None,
    tags: Sequence[str] = (),
) -> Status:
    """The experiments, newest first; one experiment when an id is given (raises
    :class:`~dlhpc.errors.NotFoundError` when there is none).

    ``limit``: each experiment's ``trials`` holds at most that many (see
    :func:`pick_trials`); its totals, ``trial_counts`` (by state) and
    ``trials_total`` still cover every trial. ``tags``: as :func:`iter_status`'s."""
    pieces = iter_status(
        session, experiment_id, idle_below_pct=idle_below_pct, idle_window_s=idle_window_s,
        limit=limit, tags=tags,
    )  # fmt: skip
    return Status(tuple(replace(head, trials=tuple(trials)) for head, trials in pieces))
