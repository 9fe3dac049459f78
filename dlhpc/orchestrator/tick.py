"""``dlhpc tick``: one idempotent reconciliation pass over all active experiments.

Poll the schedulers (a constant number of queries: one ``poll`` per backend for
all jobs), ingest new event files, derive attempt and trial states, let each
searcher decide, submit what it asked for, close finished experiments, and
apply the checkpoint keep policy (:mod:`dlhpc.orchestrator.checkpoints`).
Each step commits on its own; killing the process at any line loses nothing,
because every step is recomputed from Slurm, the files and the DB on the next
pass, and ingest is keyed per file.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import DateTime, Select, case, func, select
from sqlalchemy.orm import Session

from dlhpc import _perms
from dlhpc._failpoints import failpoint
from dlhpc.errors import DlhpcError, LeaseHeldError, SchedulerError
from dlhpc.orchestrator._reconcile import reconcile_experiment
from dlhpc.orchestrator.adopt import recover_submissions
from dlhpc.orchestrator.checkpoints import gc_pass
from dlhpc.orchestrator.clock import SYSTEM_CLOCK, Clock
from dlhpc.orchestrator.common import SchedulerPool, log_event, submit_pending
from dlhpc.protocol import EVENT_FILE_RE, iter_attempt_dirs, split_attempt_key
from dlhpc.scheduler import JobStatus
from dlhpc.states import LIVE_ATTEMPT_STATES, TERMINAL_TRIAL_STATES, ExperimentState
from dlhpc.store import Attempt, Event, Experiment, IngestedFile, Store, Trial
from dlhpc.store.ingest import SETTLE_WINDOW, ingest_attempts
from dlhpc.store.ingest import settling as settling_trials
from dlhpc.store.summaries import refresh_metrics

__all__ = ["TickReport", "tick"]

# attempt folders per write transaction: a commit costs fsyncs (about 20 ms here, more
# on NFS); a batch holds the write lock for about 0.1 s per 100 folders
_INGEST_BATCH = 256


@dataclass
class TickReport:
    experiments: int = 0
    polled_jobs: int = 0
    ingested_files: int = 0
    metrics: int = 0
    submitted: int = 0
    decisions: int = 0  # searcher promotions and stops acted on
    checkpoint_bytes_freed: int = 0  # by the checkpoint GC (keep policy)
    finished: list[int] = field(default_factory=list)
    scheduler_calls: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    lease_held_elsewhere: bool = False
    errors: list[str] = field(default_factory=list)


def tick(store: Store, pool: SchedulerPool, clock: Clock = SYSTEM_CLOCK) -> TickReport:
    """One pass; a concurrent reconciler makes this one return with ``lease_held_elsewhere``.

    ``clock`` is the real one except in the simulator (``dlhpc simulate``)."""
    report = TickReport()
    t0 = time.monotonic()
    calls_before = pool.calls()
    try:
        with store.hold_lease():
            _tick(store, pool, report, clock)
    except LeaseHeldError:
        report.lease_held_elsewhere = True
    report.scheduler_calls = dict(pool.calls() - calls_before)
    report.duration_s = time.monotonic() - t0
    return report


def _tick(store: Store, pool: SchedulerPool, report: TickReport, clock: Clock) -> None:
    """The pass under the lease: read, poll, ingest, then decide and act per experiment
    (each step commits on its own; see the module docstring)."""
    scan = _scan(store, clock.now())
    report.experiments = len(scan.exp_ids)
    statuses = _poll(pool, scan.jobs, report)
    _note_no_accounting(store, pool, scan.jobs, scan.backend_of)
    failpoint("tick.after_poll")
    todo = _pending_attempt_dirs([*scan.scanned, *scan.settling], scan.done_files)
    _ingest(store, todo, report, clock)
    failpoint("tick.after_ingest")
    # only a scanned live trial's folders can be in todo (a settling trial's are not
    # looked up: it is terminal)
    trial_backend = {t.id: scan.backend_of[t.experiment_id] for t in scan.scanned}
    runs = _requeued_runs(pool, todo, scan.done_files, trial_backend, report)
    for exp_id in scan.exp_ids:
        _experiment_step(store, pool, exp_id, statuses, report, clock, runs)


class _TrialRef(NamedTuple):
    """The columns of a trial the tick's scan needs (no ORM object)."""

    id: int
    experiment_id: int
    run_dir: str


@dataclass(frozen=True)
class _Scan:
    """What the pass reads first (:func:`_scan`), columns only."""

    exp_ids: list[int]  # this user's ACTIVE experiments
    backend_of: dict[int, str]  # their backends, by experiment
    jobs: dict[str, list[str]]  # the live trials' live attempts' jobs, by backend
    scanned: list[_TrialRef]  # live trials whose folders are listed
    settling: list[_TrialRef]  # ended trials still listed (files show late)
    done_files: dict[tuple[int, str], set[str]]  # their ingested files, by attempt


def _scan(store: Store, now: datetime) -> _Scan:
    """One read transaction: this user's ACTIVE experiments (or unrecorded: Slurm would
    submit and scancel as us), their live trials' live jobs (grouped by backend once
    read), the trials whose folders are listed this pass, and the files already
    ingested from them."""
    users = ("", _perms.current_user())
    with store.read() as s:
        exps = s.scalars(
            select(Experiment).where(
                Experiment.state == ExperimentState.ACTIVE.value, Experiment.user.in_(users)
            )
        ).all()
        exp_ids = [e.id for e in exps]
        backend_of = {e.id: e.backend for e in exps}
        live = Trial.experiment_id.in_(exp_ids), Trial.state.not_in(TERMINAL_TRIAL_STATES)
        # (job id, experiment) of the live trials' live attempts: columns, no ORM objects
        live_jobs = s.execute(
            select(Attempt.job_id, Trial.experiment_id)
            .join(Trial, Trial.id == Attempt.trial_id)
            .where(*live, Attempt.state.in_(LIVE_ATTEMPT_STATES))
        ).all()
        # the live trials whose folders are listed: not those quiet (see _quiet_trials)
        scanned = [
            _TrialRef(tid, eid, run_dir)
            for tid, eid, run_dir in s.execute(
                select(Trial.id, Trial.experiment_id, Trial.run_dir)
                .where(*live, Trial.id.not_in(_quiet_trials(exp_ids, now)))
                .order_by(Trial.id)
            )
        ]
        # ended trials keep being listed for a while: shared filesystems show files late
        settling = [_TrialRef(*row) for row in settling_trials(s, now, users)]
        done_files = _ingested_names(s, [t.id for t in (*scanned, *settling)])
    by_backend: dict[str, list[str]] = defaultdict(list)
    for job_id, exp_id in live_jobs:
        by_backend[backend_of[exp_id]].append(job_id)
    return _Scan(exp_ids, backend_of, by_backend, scanned, settling, done_files)


def _poll(
    pool: SchedulerPool, by_backend: dict[str, list[str]], report: TickReport
) -> dict[str, JobStatus]:
    """One ``poll`` per backend for all its live jobs: their states, by job id. A
    failed poll gives no states this pass, never wrong ones (its error: ``report``)."""
    statuses: dict[str, JobStatus] = {}
    for backend, job_ids in by_backend.items():
        report.polled_jobs += len(job_ids)
        try:
            statuses.update(pool.get(backend).poll(job_ids))
        except SchedulerError as err:
            report.errors.append(f"poll {backend}: {err}")  # no states this pass, retry next
    return statuses


def _experiment_step(
    store: Store,
    pool: SchedulerPool,
    exp_id: int,
    statuses: dict[str, JobStatus],
    report: TickReport,
    clock: Clock,
    runs: dict[str, list[str]],
) -> None:
    """Decide and act for one experiment: recover its unrecorded submissions, reconcile
    and decide (:func:`reconcile_experiment`), submit its pending trials, apply the
    checkpoint keep policy. The errors it expects (the scheduler's; a DlhpcError or
    ValueError while deciding) go into ``report`` and the other experiments go on."""
    try:
        recover_submissions(store, pool, exp_id)
    except SchedulerError as err:
        report.errors.append(f"experiment {exp_id}: recovering a submission: {err}")
        return  # never resubmit while the orphan's jobs may exist
    try:
        cfg = reconcile_experiment(store, pool, exp_id, statuses, report, clock, runs)
    except (DlhpcError, ValueError) as err:
        # e.g. its searcher's optional dependency vanished, or its saved state does
        # not load: keep the other experiments moving, and say so every pass
        report.errors.append(f"experiment {exp_id}: {type(err).__name__}: {err}")
        return
    try:
        report.submitted += len(submit_pending(store, pool, exp_id, clock, cfg=cfg))
    except SchedulerError as err:
        report.errors.append(f"experiment {exp_id}: {err}")
    gc_pass(store, exp_id, report)  # the checkpoint keep policy; errors into the report


_NO_ACCOUNTING = "scheduler.no_accounting"


def _note_no_accounting(
    store: Store, pool: SchedulerPool, polled: dict[str, list[str]], backend_of: dict[int, str]
) -> None:
    """Once per experiment, an event saying its backend cannot read ended jobs' states
    (Slurm without accounting): its jobs are then judged by their exit files."""
    blind = {b for b in polled if not pool.get(b).accounting_available}
    exp_ids = [e for e, b in backend_of.items() if b in blind]
    if not exp_ids:
        return
    told = select(Event.experiment_id).where(
        Event.kind == _NO_ACCOUNTING, Event.experiment_id.in_(exp_ids)
    )
    with store.read() as s:  # most passes: every one told already, and no write
        if set(exp_ids) <= set(s.scalars(told)):
            return
    with store.write() as s:
        for exp_id in sorted(set(exp_ids) - set(s.scalars(told))):
            log_event(
                s,
                _NO_ACCOUNTING,
                f"{backend_of[exp_id]}: accounting (sacct) is unavailable; jobs that left the"
                " queue are judged by their exit files (an ended job's exit code and cause are"
                " known only from what its worker wrote)",
                exp_id,
            )


def _requeued_runs(
    pool: SchedulerPool,
    todo: list[tuple[int, Path]],
    done: dict[tuple[int, str], set[str]],
    backend_of_trial: dict[int, str],
    report: TickReport,
) -> dict[str, list[str]]:
    """The scheduler's record of every run of the jobs it restarted under the same id
    (a new attempt folder ``<job>.r<k>``, k >= 1, this pass): one query per backend,
    only on such passes. It names the cause of the attempt the restart replaced
    (Slurm 24.11 requeues a preempted task whatever its exit)."""
    by_backend: dict[str, set[str]] = defaultdict(set)
    for trial_id, adir in todo:
        parts = split_attempt_key(adir.name)
        new = (trial_id, adir.name) not in done
        if parts is not None and parts[1] >= 1 and new and trial_id in backend_of_trial:
            by_backend[backend_of_trial[trial_id]].add(parts[0])
    runs: dict[str, list[str]] = {}
    for backend, jobs in by_backend.items():
        try:
            runs.update(pool.get(backend).run_states(sorted(jobs)))
        except (SchedulerError, ValueError) as err:
            report.errors.append(f"run states {backend}: {err}")
    return runs


def _ingested_names(s: Session, trial_ids: list[int]) -> dict[tuple[int, str], set[str]]:
    rows = s.execute(
        select(Attempt.trial_id, Attempt.attempt_key, IngestedFile.name)
        .join(IngestedFile, IngestedFile.attempt_id == Attempt.id)
        .where(Attempt.trial_id.in_(trial_ids))
    ).all()
    out: dict[tuple[int, str], set[str]] = defaultdict(set)
    for trial_id, key, name in rows:
        out[(trial_id, key)].add(name)
    return out


def _quiet_trials(exp_ids: list[int], now: datetime) -> Select[int]:
    """The live trials of ``exp_ids`` whose folders need no listing, as one SQL
    aggregate: every attempt ended (no live job) before the settle window (e.g. a
    PAUSED trial, or one waiting for a new job). An attempt without an end time
    (neither ``ended_at`` nor ``terminal_seen_at``), and a trial without attempts,
    are listed. An attempt's end is the later of the two times it has."""
    open_ = Attempt.state.in_(LIVE_ATTEMPT_STATES) | (
        Attempt.ended_at.is_(None) & Attempt.terminal_seen_at.is_(None)
    )
    # SQLite's two-argument max() is a scalar: the later of the two (the one set, if one)
    end = func.max(
        func.coalesce(Attempt.ended_at, Attempt.terminal_seen_at),
        func.coalesce(Attempt.terminal_seen_at, Attempt.ended_at),
        type_=DateTime,
    )
    return (
        select(Attempt.trial_id)
        .join(Trial, Trial.id == Attempt.trial_id)
        .where(Trial.experiment_id.in_(exp_ids), Trial.state.not_in(TERMINAL_TRIAL_STATES))
        .group_by(Attempt.trial_id)
        .having(
            func.sum(case((open_, 1), else_=0)) == 0,
            func.max(end, type_=DateTime) < now - SETTLE_WINDOW,
        )
    )


def _pending_attempt_dirs(
    trials: list[_TrialRef], done: dict[tuple[int, str], set[str]]
) -> list[tuple[int, Path]]:
    """(trial id, attempt folder) pairs that hold event files not ingested yet."""
    todo = []
    for t in trials:
        if not t.run_dir:
            continue
        for adir in iter_attempt_dirs(Path(t.run_dir)):
            names = {n for n in os.listdir(adir) if EVENT_FILE_RE.match(n)}  # no Path each
            if names - done.get((t.id, adir.name), set()):
                todo.append((t.id, adir))
    return todo


def _ingest(store: Store, todo: list[tuple[int, Path]], report: TickReport, clock: Clock) -> None:
    """Ingest in batches: one transaction per batch (a commit costs fsyncs on NFS).
    The trials' metric summaries are refreshed per batch in three grouped queries.
    (The curve archives are the reports' to rewrite: ``report._load``.)"""
    for i in range(0, len(todo), _INGEST_BATCH):
        with store.write() as s:
            chunk = todo[i : i + _INGEST_BATCH]
            trials = {
                t.id: t
                for t in s.scalars(
                    select(Trial).where(Trial.id.in_(sorted({tid for tid, _ in chunk})))
                )
            }
            folders = [(trials[tid], adir) for tid, adir in chunk if tid in trials]
            results = ingest_attempts(s, folders, clock.now())
            for result in results:
                report.ingested_files += result.files
                report.metrics += result.metrics
            refresh_metrics(s, list({t.id: t for t, _ in folders}.values()))
        failpoint("tick.after_ingest_batch")
