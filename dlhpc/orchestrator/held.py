"""dlhpc's jobs that the scheduler holds on its own: released, or cancelled.

Slurm requeues and holds a job whose launch failed (``launch failed requeued held``:
a controller killed before it saved its state recovers a started job as pending; a
node set DOWN requeues the jobs it still lists), and such a job starts only once its
owner releases it. Each tick, first in its act step (:func:`settle_held`), looks at
the held jobs its poll found in this user's queue
(:meth:`~dlhpc.scheduler.BaseScheduler.system_held`, no query of its own):

* the current attempt of a live trial that still waits for that job (not paused, not
  stopping, not waiting for a new job; its experiment ACTIVE) is released, with one
  release per backend for all of them: the job runs again under its id and resumes
  from the trial's checkpoint. The attempt's cause is ``held`` (unless its exit
  record tells another), which does not count toward ``max_restarts``;
* a job the scheduler refuses to release is cancelled, and its trial waits for a new
  job (the resubmission of a restart, not counted either);
* any other held job of dlhpc's (an attempt a newer one replaced, a trial that ended,
  paused or stops) is cancelled;
* a held job that no attempt names is not dlhpc's and is left alone, as are holds a
  person set (the backend does not report those).

One event line per experiment says what was done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from dlhpc import _perms
from dlhpc.errors import DlhpcError
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.scheduler import BaseScheduler, JobStatus
from dlhpc.states import LIVE_ATTEMPT_STATES, ExperimentState, JobState, TrialState
from dlhpc.store import Attempt, Experiment, Store, Trial

__all__ = ["HELD_CAUSE", "HeldJob", "held_jobs", "settle_held"]

#: The cause of an attempt whose job the scheduler held, recorded when it is released
#: or cancelled (an attempt whose exit record tells why it ended keeps that cause).
HELD_CAUSE = "held"
_WAITING = {TrialState.PENDING.value, TrialState.RUNNING.value}


class _Tally(Protocol):
    """What this step adds to the tick's report (``TickReport``)."""

    released: int
    held_cancelled: int
    errors: list[str]


@dataclass(frozen=True)
class HeldJob:
    """A held job of dlhpc's and what the pass does with it."""

    job_id: str
    reason: str  # the scheduler's words for the hold
    attempt_id: int  # the newest attempt of that job
    trial_id: int
    experiment_id: int
    wanted: bool  # its trial waits for it: release it (else cancel it)


def held_jobs(store: Store, held: dict[str, dict[str, JobStatus]]) -> dict[str, list[HeldJob]]:
    """The jobs in ``held`` (by backend, the statuses by job id) that are dlhpc's: an
    attempt of this user's experiment on that backend names them (one read
    transaction, one query per backend). A job of several attempts (the runs of a
    requeued task) is judged by the newest."""
    if not any(held.values()):
        return {}  # most passes: nothing to read
    users = ("", _perms.current_user())
    out: dict[str, list[HeldJob]] = {}
    with store.read() as s:
        for backend, statuses in held.items():
            if not statuses:
                continue
            newest: dict[str, Any] = {}
            for row in _attempts_of(s, backend, sorted(statuses), users):
                newest[row.job_id] = row  # by attempt id: the newest comes last
            out[backend] = [
                HeldJob(jid, statuses[jid].reason, r.id, r.trial_id, r.experiment_id, _wanted(r))
                for jid, r in newest.items()
            ]
    return out


def _attempts_of(s: Session, backend: str, job_ids: list[str], users: tuple[str, ...]) -> list[Any]:
    """The attempts of ``job_ids`` in this user's experiments on ``backend``, oldest
    first, as rows with what :func:`_wanted` reads (``current``: the trial's newest
    attempt)."""
    newer = aliased(Attempt)
    newest_of_trial = (
        select(func.max(newer.id)).where(newer.trial_id == Attempt.trial_id).scalar_subquery()
    )
    query = (
        select(
            Attempt.id,
            Attempt.job_id,
            Attempt.state,
            Attempt.trial_id,
            Trial.experiment_id,
            Trial.state.label("trial_state"),
            Trial.needs_job,
            Trial.stop_requested_at,
            Experiment.state.label("experiment_state"),
            (Attempt.id == newest_of_trial).label("current"),
        )
        .join(Trial, Trial.id == Attempt.trial_id)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .where(
            Attempt.job_id.in_(job_ids),
            Experiment.backend == backend,
            Experiment.user.in_(users),
        )
        .order_by(Attempt.id)
    )
    return list(s.execute(query))


def _wanted(row: Any) -> bool:
    """Whether the trial of ``row`` (a row of :func:`_attempts_of`) waits for this job."""
    return bool(
        row.current
        and row.state in LIVE_ATTEMPT_STATES
        and row.trial_state in _WAITING
        and not row.needs_job
        and row.stop_requested_at is None
        and row.experiment_state == ExperimentState.ACTIVE.value
    )


def settle_held(
    store: Store, pool: SchedulerPool, held: dict[str, dict[str, JobStatus]], report: _Tally
) -> None:
    """Release or cancel dlhpc's held jobs among ``held`` (what each backend's poll
    found: see the module docstring), then record it (one write transaction). A
    scheduler's error goes into ``report``; what was done before it is recorded."""
    for backend, jobs in held_jobs(store, held).items():
        released, cancelled = _release_or_cancel(pool.get(backend), jobs, report)
        if released or cancelled:
            _record(store, backend, released, cancelled)
        report.released += len(released)
        report.held_cancelled += len(cancelled)


def _release_or_cancel(
    sched: BaseScheduler, jobs: list[HeldJob], report: _Tally
) -> tuple[list[HeldJob], list[HeldJob]]:
    """One release of the wanted jobs, then one cancel of the others and of those the
    scheduler would not release; (released, cancelled)."""
    released: list[HeldJob] = []
    try:
        wanted = [j.job_id for j in jobs if j.wanted]
        refused = set(sched.release(wanted)) if wanted else set()
        released = [j for j in jobs if j.wanted and j.job_id not in refused]
        cancel = [j for j in jobs if j not in released]
        if cancel:
            sched.cancel([j.job_id for j in cancel])
    except (DlhpcError, ValueError) as err:
        report.errors.append(f"held jobs ({sched.name}): {type(err).__name__}: {err}")
        return released, []
    return released, cancel


def _record(store: Store, backend: str, released: list[HeldJob], cancelled: list[HeldJob]) -> None:
    """The causes, the trials whose job was cancelled instead of released (they wait
    for a new job, as after a restart that does not count), and one event line per
    experiment; one write transaction."""
    with store.write() as s:
        for job in [*released, *cancelled]:
            a = s.get(Attempt, job.attempt_id) if job.wanted else None
            if a is None:
                continue  # not the trial's current attempt: judged already, its cause stands
            if a.exit_code is None and not a.cause:
                a.cause = HELD_CAUSE
            if job in cancelled:
                a.state = JobState.CANCELLED.value
                a.trial.needs_job = True
                a.trial.state = TrialState.PENDING.value
        for exp_id in sorted({j.experiment_id for j in [*released, *cancelled]}):
            log_event(s, "jobs.held", _event_line(backend, exp_id, released, cancelled), exp_id)


def _event_line(
    backend: str, exp_id: int, released: list[HeldJob], cancelled: list[HeldJob]
) -> str:
    """``slurm held 2 job(s) itself (launch failed requeued held): released 7_0 (trial
    3); cancelled 6_1 (trial 2, not waited for)``: the experiment's jobs of this pass."""
    mine = [j for j in [*released, *cancelled] if j.experiment_id == exp_id]
    reasons = ", ".join(sorted({j.reason for j in mine if j.reason}))
    parts = []
    for verb, jobs in (("released", released), ("cancelled", cancelled)):
        named = [
            f"{j.job_id} (trial {j.trial_id}{'' if j.wanted else ', not waited for'})"
            for j in jobs
            if j.experiment_id == exp_id
        ]
        if named:
            parts.append(f"{verb} {', '.join(named)}")
    return f"{backend} held {len(mine)} job(s) itself ({reasons}): {'; '.join(parts)}"
