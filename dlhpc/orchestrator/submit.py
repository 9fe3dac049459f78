"""The submit step: an experiment's PENDING trials without a job go to its scheduler.

Contract of :func:`submit_pending` (launch calls it once; the tick's act step once per
experiment the decide step queued): one request per call, no more trials than the
scheduler's free slots; the submission row (its unique job name) is committed
before the scheduler is asked and the attempt rows right after, so a crash in
between leaves a SUBMITTING row that :mod:`~dlhpc.orchestrator.adopt` resolves
by name on the next tick. Submitting again submits nothing twice.

:func:`first_attempt` and :func:`mark_promotions_acted` write the rows of a job
once it is known to exist: here, and when adopt finds an orphan's jobs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from dlhpc._failpoints import failpoint
from dlhpc.config.schema import ExperimentConfig
from dlhpc.errors import SchedulerError
from dlhpc.orchestrator.clock import SYSTEM_CLOCK, Clock, not_before, trial_time
from dlhpc.orchestrator.decide import pending_promotion, pending_promotions
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.request import job_request, new_uid
from dlhpc.orchestrator.runfiles import trial_spec, write_trial_specs
from dlhpc.orchestrator.stored import config_of
from dlhpc.protocol import TrialSpec, recorded_slug, trial_dir
from dlhpc.scheduler import BaseScheduler, JobRequest, SubmittedTask
from dlhpc.scheduler.base import SubmitLimitError
from dlhpc.states import JobState, SubmissionState, TrialState
from dlhpc.store import Attempt, Decision, Event, Experiment, Store, Submission, Trial
from dlhpc.store.ingest import new_attempt

__all__ = ["first_attempt", "mark_promotions_acted", "submit_pending"]


def first_attempt(trial_id: int, sub_id: int, job_id: str, log_path: str, now: datetime) -> Attempt:
    """The first attempt of a freshly submitted task (restarts come from the job's files)."""
    key = f"{job_id}.r0"
    return new_attempt(
        trial_id, key, JobState.PENDING.value, now, submission_id=sub_id, log_path=log_path
    )


def _unsubmitted(session: Session, exp_id: int) -> list[Trial]:
    in_flight: set[int] = set()
    for ids in session.scalars(
        select(Submission.trial_ids_json).where(
            Submission.experiment_id == exp_id, Submission.state == SubmissionState.SUBMITTING.value
        )
    ):
        in_flight.update(json.loads(ids))
    trials = session.scalars(
        select(Trial)
        .where(Trial.experiment_id == exp_id, Trial.state == TrialState.PENDING.value)
        .order_by(Trial.id)
    ).all()
    with_attempts = set(
        session.scalars(
            select(Attempt.trial_id).where(Attempt.trial_id.in_([t.id for t in trials]))
        )
    )
    return [
        t for t in trials if (t.needs_job or t.id not in with_attempts) and t.id not in in_flight
    ]


def submit_pending(
    store: Store,
    pool: SchedulerPool,
    exp_id: int,
    clock: Clock = SYSTEM_CLOCK,
    *,
    cfg: ExperimentConfig | None = None,
) -> list[SubmittedTask]:
    """Submit the PENDING trials of the experiment that have no job yet, as one request.

    ``cfg``: the experiment's config when the caller parsed it already (the tick's
    pass: :func:`config_of` of the same row; the config never changes after launch).

    The submission row (with its unique job name) is committed before ``sbatch``
    runs and the attempt rows right after, so a crash in between leaves a
    SUBMITTING row whose jobs a later tick can find by name. A trial with a promotion
    still pending (decided while its job was ending) is submitted with the promoted
    length, and the promotion counts as acted on.

    Site limits: only as many trials as the scheduler's ``submit_slots`` allows
    are submitted (the others wait, with one ``submit.waiting`` event per wait); a
    submission refused for a limit (:class:`SubmitLimitError`) leaves its trials
    PENDING, the row DEFERRED (not FAILED), and raises nothing.
    """
    batch = _record_submission(store, pool, exp_id, clock, cfg)
    if batch is None:
        return []
    write_trial_specs(batch.specs, store.runs_root)
    limited = False
    try:
        tasks = batch.scheduler.submit(batch.request)
        error = ""
    except SchedulerError as err:
        tasks = [t for t in err.submitted if isinstance(t, SubmittedTask)]
        error = str(err)
        limited = isinstance(err, SubmitLimitError)
    failpoint("submit.after_sbatch")
    _record_tasks(store, batch.sub_id, batch.trials, tasks, error, clock.now(), limited)
    if error and not limited:
        raise SchedulerError(error, submitted=tasks)
    return tasks


@dataclass(frozen=True)
class _Batch:
    """A submission recorded as SUBMITTING (committed), and what sending it needs."""

    sub_id: int
    trials: list[Trial]  # in the submission's order (its trial_ids_json)
    request: JobRequest
    specs: list[TrialSpec]  # their trial.json files, not written yet
    scheduler: BaseScheduler


def _record_submission(
    store: Store, pool: SchedulerPool, exp_id: int, clock: Clock, cfg: ExperimentConfig | None
) -> _Batch | None:
    """The first transaction of :func:`submit_pending`: choose the trials to submit (no
    more than the scheduler's ``submit_slots``), build their request and specs, and
    commit their SUBMITTING row. None: nothing to submit now (a ``submit.waiting``
    event may have been committed)."""
    with store.write() as session:
        exp = session.get(Experiment, exp_id)
        if exp is None:
            return None
        cfg = cfg if cfg is not None else config_of(exp)
        trials = _unsubmitted(session, exp_id)
        if not trials:
            return None
        scheduler = pool.get(cfg.backend)
        # readers are not blocked meanwhile: only the commit takes SQLite's exclusive lock
        slots = scheduler.submit_slots(cfg.resources)
        if slots is not None and slots < len(trials):
            _note_waiting(session, exp_id, len(trials) - slots, slots)
            trials = trials[:slots]
            if not trials:
                return None
        _take_pending_promotions(session, exp_id, trials)
        slug = recorded_slug(exp_id, exp.run_dir)  # "" for folders named before slugs
        dirs = [trial_dir(store.runs_root, exp_id, t.id, slug) for t in trials]  # as specs
        request = job_request(cfg, exp_id, Path(exp.run_dir), dirs, new_uid())
        sub = Submission(
            experiment_id=exp_id,
            name=request.name,
            state=SubmissionState.SUBMITTING.value,
            trial_ids_json=json.dumps([t.id for t in trials]),
            folder=str(request.folder),
            created_at=not_before(clock.now(), exp.created_at),
        )
        session.add(sub)
        specs = [
            trial_spec(
                cfg,
                store.runs_root,
                exp_id,
                t.id,
                json.loads(t.hparams_json),
                t.max_length,
                t.seed,
                slug=slug,
            )
            for t in trials
        ]
    return _Batch(sub.id, trials, request, specs, scheduler)


def _take_pending_promotions(session: Session, exp_id: int, trials: list[Trial]) -> None:
    """A trial promoted while its job was ending, whose next job comes for any reason
    (that job's exit, a preemption, a held job cancelled), gets the promoted length:
    this submission marks the promotion acted on (:func:`mark_promotions_acted`), and a
    job with the old grant would train nothing and leave the searcher waiting."""
    pending = pending_promotions(session, exp_id)
    for t in trials:
        promotion = pending_promotion(t, pending)
        if promotion is not None:
            t.max_length = promotion.length


_WAIT_KINDS = ("submit", "submit.waiting", "submit.deferred")


def _note_waiting(session: Session, exp_id: int, waiting: int, slots: int) -> None:
    """One ``submit.waiting`` event per wait: none while the last submit event says so."""
    last = session.scalar(
        select(Event.kind)
        .where(Event.experiment_id == exp_id, Event.kind.in_(_WAIT_KINDS))
        .order_by(Event.id.desc())
        .limit(1)
    )
    if last != "submit.waiting":
        log_event(
            session,
            "submit.waiting",
            f"{waiting} trial(s) wait for a free job slot: the site's MaxSubmitJobs leaves room"
            f" for {slots} more job(s) now; they are submitted as jobs leave the queue",
            exp_id,
        )


def _record_tasks(
    store: Store,
    sub_id: int,
    trials: list[Trial],
    tasks: list[SubmittedTask],
    error: str,
    now: datetime,
    limited: bool = False,
) -> None:
    with store.write() as session:
        sub = session.get(Submission, sub_id)
        assert sub is not None  # committed by the caller before submitting
        if error and not tasks:
            sub.state = (SubmissionState.DEFERRED if limited else SubmissionState.FAILED).value
        else:
            sub.state = SubmissionState.SUBMITTED.value
        sub.error = error
        done = list(zip(trials, tasks, strict=False))  # tasks may be a prefix
        ids_done = [t.id for t, _ in done]
        with_attempts = select(Trial).options(selectinload(Trial.attempts))
        rows = {t.id: t for t in session.scalars(with_attempts.where(Trial.id.in_(ids_done)))}
        for trial, task in done:
            # after the trial and its submission, whichever login node's clock wrote them
            row = rows.get(trial.id)
            at = not_before(now, sub.created_at, trial_time(row, now) if row else None)
            session.add(first_attempt(trial.id, sub_id, task.job_id, str(task.stdout), at))
            if trial.id in rows:
                rows[trial.id].needs_job = False
        mark_promotions_acted(session, [t.id for t, _ in done], now)
        ids = ", ".join(t.job_id for t in tasks[:3]) + (" ..." if len(tasks) > 3 else "")
        if limited:
            log_event(
                session,
                "submit.deferred",
                f"{len(tasks)}/{len(trials)} trials submitted ({ids}); the others wait (PENDING)"
                f" because the site refused more jobs for a limit: {error}",
                sub.experiment_id,
            )
            return
        log_event(
            session,
            "submit" if not error else "submit.error",
            f"{len(tasks)}/{len(trials)} trials submitted ({ids}){': ' + error if error else ''}",
            sub.experiment_id,
        )


def mark_promotions_acted(session: Session, trial_ids: list[int], now: datetime) -> None:
    """A promoted trial's new job is submitted: its promotion decision is acted on."""
    if not trial_ids:
        return
    for d in session.scalars(
        select(Decision).where(
            Decision.trial_id.in_(trial_ids),
            Decision.kind == "promote",
            Decision.acted_at.is_(None),
        )
    ):
        d.acted_at = not_before(now, d.decided_at)
