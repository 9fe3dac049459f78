"""Adopt the jobs of a submission that a crashed launch or tick left SUBMITTING.

The submission row (with its unique job name) is committed before ``sbatch`` and
its attempt rows after (:func:`~dlhpc.orchestrator.submit.submit_pending`), so a
process killed in between leaves a SUBMITTING row. Its jobs are found by name
(:meth:`~dlhpc.scheduler.base.BaseScheduler.find_jobs`) and by their own files:
the tick's ingest has already recorded an attempt for every task that started
(its worker wrote ``attempts/<job id>.r<n>/`` in the trial's folder).

Matching tasks to trials does not rely on every task being found: task ``i`` of
the ``k``-th array of the submission is its trial ``k * size + i`` (``size``:
the scheduler's array size, as submit split the request). Without Slurm
accounting, ``squeue`` shows only jobs queued, running or ended less than
``MinJobAge`` ago; a task that ended before that and never started (cancelled
while queued) is found by nothing, so its trial is submitted again, which is
safe (it never ran). When the arrays cannot be told apart (a whole array of
never-started tasks vanished), the tasks no trial can be proven to own are
cancelled and their trials submitted again: never two runs of one trial.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from sqlalchemy import select

from dlhpc.orchestrator.clock import SYSTEM_CLOCK, Clock
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.stored import config_of
from dlhpc.orchestrator.submit import first_attempt, mark_promotions_acted
from dlhpc.states import SubmissionState
from dlhpc.store import Attempt, Experiment, Store, Submission, Trial

__all__ = ["match_tasks", "recover_submissions"]


def _split(job_id: str) -> tuple[str, int] | None:
    base, sep, index = job_id.rpartition("_")
    return (base, int(index)) if sep and base and index.isdigit() else None


def match_tasks(
    trial_ids: Sequence[int], found: Sequence[str], owned: dict[int, str], size: int
) -> tuple[dict[int, str], list[str]]:
    """(trial -> task id, unmatched task ids) for one submission.

    ``found``: its tasks the scheduler still shows, in submission order; ``owned``:
    trial -> task id already proven by the task's own files; ``size``: tasks per
    array. Arrays are ranked by their id among all that are known; when their
    number is not the expected one, only ``owned`` is trusted.
    """
    known = [*owned.values(), *found]
    parts = {j: _split(j) for j in known}
    if any(p is None for p in parts.values()):  # not array tasks: submission order
        return dict(zip(trial_ids, found, strict=False)), list(found[len(trial_ids) :])
    bases = sorted({p[0] for p in parts.values() if p}, key=lambda b: (len(b), b))
    matched = dict(owned)
    if len(bases) != math.ceil(len(trial_ids) / max(1, size)):
        return matched, [j for j in found if j not in matched.values()]
    rank = {b: k for k, b in enumerate(bases)}
    unmatched = []
    for job_id in found:
        base, index = parts[job_id] or ("", 0)
        pos = rank[base] * size + index
        if pos < len(trial_ids) and matched.get(trial_ids[pos], job_id) == job_id:
            matched[trial_ids[pos]] = job_id
        else:
            unmatched.append(job_id)
    return matched, unmatched


def _owned(store: Store, trial_ids: list[int]) -> dict[int, str]:
    """Trial -> the task id its files name (attempts the ingest recorded) that no
    submission claims: the orphan's, since every other task's first attempt was
    recorded with its submission."""
    with store.read() as s:
        rows = s.execute(
            select(Attempt.trial_id, Attempt.job_id, Attempt.submission_id)
            .where(Attempt.trial_id.in_(trial_ids))
            .order_by(Attempt.id)
        ).all()
    claimed = {(t, j) for t, j, sub in rows if sub is not None}
    out: dict[int, str] = {}
    for trial_id, job_id, _ in rows:
        if (trial_id, job_id) not in claimed:
            out.setdefault(trial_id, job_id)
    return out


def recover_submissions(
    store: Store, pool: SchedulerPool, exp_id: int, clock: Clock = SYSTEM_CLOCK
) -> int:
    """Adopt the jobs of submissions a crashed launch or tick left SUBMITTING (their
    attempts recorded at ``clock``'s now).

    Runs under the lease, and whoever submits holds the lease until the attempts
    are recorded, so any SUBMITTING row seen here is orphaned. When no job of it
    exists the row is marked FAILED and its trials are submitted again. Returns
    the number of adopted jobs.
    """
    with store.read() as session:
        exp = session.get(Experiment, exp_id)
        orphans = session.scalars(
            select(Submission).where(
                Submission.experiment_id == exp_id,
                Submission.state == SubmissionState.SUBMITTING.value,
            )
        ).all()
        if exp is None or not orphans:
            return 0
        backend, cfg = exp.backend, config_of(exp)
    scheduler = pool.get(backend)
    size = scheduler.max_array_size()
    if cfg.site.max_array_size is not None:
        size = min(size, cfg.site.max_array_size)
    adopted = 0
    for sub in orphans:
        trial_ids = json.loads(sub.trial_ids_json)
        found = scheduler.find_jobs(sub.name)
        owned = _owned(store, trial_ids)
        matched, unmatched = match_tasks(trial_ids, found, owned, size)
        if unmatched:
            scheduler.cancel(unmatched)  # no trial provably owns them: never run twice
        n = len(found)
        adopted += _adopt(store, pool, backend, sub.id, exp_id, matched, n, unmatched, clock.now())
    return adopted


def _adopt(
    store: Store,
    pool: SchedulerPool,
    backend: str,
    sub_id: int,
    exp_id: int,
    matched: dict[int, str],
    n_found: int,
    unmatched: list[str],
    now: datetime,
) -> int:
    adopted = 0
    with store.write() as session:
        row = session.get(Submission, sub_id)
        if row is None or row.state != SubmissionState.SUBMITTING.value:
            return 0
        trial_ids = json.loads(row.trial_ids_json)
        for trial_id, job_id in matched.items():
            attempts = session.scalars(
                select(Attempt).where(Attempt.trial_id == trial_id, Attempt.job_id == job_id)
            ).all()
            logs = pool.get(backend).log_paths(Path(row.folder), job_id)
            log_path = str(logs[0]) if logs else ""
            for attempt in attempts:  # its files were ingested already: claim its runs
                attempt.submission_id = attempt.submission_id or row.id
                attempt.log_path = attempt.log_path or log_path
            if not attempts:
                session.add(first_attempt(trial_id, row.id, job_id, log_path, now))
                adopted += 1
            trial = session.get(Trial, trial_id)
            if trial is not None:
                trial.needs_job = False
            mark_promotions_acted(session, [trial_id], now)
        row.state = (SubmissionState.SUBMITTED if matched else SubmissionState.FAILED).value
        row.error = (
            "" if matched else "orphaned by a crash before its jobs were recorded; none found"
        )
        extra = f"; {len(unmatched)} unmatched job(s) cancelled" if unmatched else ""
        log_event(
            session,
            "submit.recovered" if matched else "submit.orphaned",
            f"{row.name}: {n_found} job(s) found, {len(matched)} of {len(trial_ids)} trial(s)"
            f" matched{extra}",
            exp_id,
        )
    return adopted
