"""The tick's decide step for one experiment (:mod:`dlhpc.orchestrator.tick`).

One write transaction brings the experiment's live trials up to date
(:func:`~dlhpc.orchestrator.trials.reconcile_trial`), tells its searcher the
results and records its answer (:class:`~dlhpc.orchestrator.decide.SearchPass`),
saves the searcher's state and closes the experiment when it is done. It touches
no job and no file: what must reach them (stop files, jobs to cancel) is returned
as a :class:`Decided`, for the tick's act step to carry out after that commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, selectinload

from dlhpc.config.schema import ExperimentConfig
from dlhpc.orchestrator.clock import Clock, experiment_end
from dlhpc.orchestrator.decide import SearchPass, pending_promotions
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.stored import config_of, searcher_of, state_json
from dlhpc.orchestrator.trials import TrialPass, reconcile_trial, settled_paused_ids
from dlhpc.scheduler import JobStatus
from dlhpc.search import BaseSearcher
from dlhpc.states import TERMINAL_TRIAL_STATES, ExperimentState, SubmissionState, TrialState
from dlhpc.store import Experiment, Store, Submission, Trial

__all__ = ["Decided", "reconcile_experiment"]

_MAX_FAILED_SUBMISSIONS = 3


class _Tally(Protocol):
    """What this step adds to the tick's report (``TickReport``)."""

    decisions: int
    finished: list[int]
    errors: list[str]


@dataclass(frozen=True)
class Decided:
    """What an experiment's decide step committed and leaves to the act step."""

    exp_id: int
    cfg: ExperimentConfig  # the experiment's config, as parsed for the pass
    backend: str
    stopping: list[Trial]  # running trials asked to stop: their stop files
    cancels: list[str]  # job ids to cancel: resubmitted (zombies), stopped early, or stuck


@dataclass(frozen=True)
class _Reconciled:
    """The experiment's trials once :func:`_reconcile_trials` has run."""

    settled: set[int]  # settled PAUSED trials: not loaded, nothing about them changes
    was_live: list[Trial]  # the other trials not terminal at the start, reconciled
    trials: TrialPass  # what the pass collected: jobs to cancel, trials to stop


def reconcile_experiment(
    store: Store,
    exp_id: int,
    statuses: dict[str, JobStatus],
    report: _Tally,
    clock: Clock,
    runs: dict[str, list[str]],
) -> Decided | None:
    """Reconcile the experiment's live trials and let its searcher decide, in one
    commit; returns what the act step must do (None: the experiment is not ACTIVE,
    nothing to do).
    Only the trials not terminal yet and not settled are loaded (with their
    attempts), and those an operation of the searcher names."""
    now = clock.now()
    with store.write() as s:
        exp = s.get(Experiment, exp_id)
        if exp is None or exp.state != ExperimentState.ACTIVE.value:
            return None
        cfg = config_of(exp)
        searcher = searcher_of(cfg, exp.searcher_state)
        rec = _reconcile_trials(s, exp_id, cfg, statuses, clock, runs)
        search = SearchPass(s, exp, cfg, searcher, now, store.runs_root)
        search.tell(rec.was_live, sorted(rec.settled))
        search.decide(rec.was_live)
        report.decisions += search.decisions
        report.errors.extend(rec.trials.warnings)
        exp.searcher_state = state_json(searcher)
        stopping = [*rec.trials.stopping, *search.stopped_running]
        cancels = [*rec.trials.cancels, *search.cancels]
        _close_if_done(s, exp, searcher, rec, report, now)
        return Decided(exp_id, cfg, exp.backend, stopping, cancels)


def _reconcile_trials(
    s: Session,
    exp_id: int,
    cfg: ExperimentConfig,
    statuses: dict[str, JobStatus],
    clock: Clock,
    runs: dict[str, list[str]],
) -> _Reconciled:
    """Bring the experiment's live trials up to date in ``s``'s transaction (one
    :class:`TrialPass` for all of them, their attempts loaded in one query)."""
    # a settled PAUSED trial: reconciling it changes nothing, so it is not loaded
    settled_q = settled_paused_ids(exp_id, cfg.searcher.max_length)
    settled = set(s.scalars(settled_q))
    was_live = _live_trials(s, exp_id, settled_q)
    _load_attempts(s, [t.id for t in was_live])
    tp = TrialPass(
        statuses,
        clock,
        cfg.max_restarts,
        cfg.searcher.max_length,
        promotions=pending_promotions(s, exp_id),
        runs=runs,
    )
    for t in was_live:
        reconcile_trial(s, t, tp)
    return _Reconciled(settled, was_live, tp)


def _close_if_done(
    s: Session,
    exp: Experiment,
    searcher: BaseSearcher,
    rec: _Reconciled,
    report: _Tally,
    now: datetime,
) -> None:
    """Close the experiment in ``s``'s transaction: FAILED once its submissions failed
    :data:`_MAX_FAILED_SUBMISSIONS` times; else, once every trial has ended and the
    searcher is done, COMPLETED (FAILED if no trial completed)."""
    failed_subs = s.scalars(
        select(Submission.id).where(
            Submission.experiment_id == exp.id, Submission.state == SubmissionState.FAILED.value
        )
    ).all()
    # trials terminal at the start of the pass stay so: only the live ones can differ
    all_exited = not rec.settled and all(TrialState(t.state).is_terminal for t in rec.was_live)
    if len(failed_subs) >= _MAX_FAILED_SUBMISSIONS:
        _finish(s, exp, ExperimentState.FAILED, "submission failed repeatedly", now)
        report.finished.append(exp.id)
    elif all_exited and searcher.done:
        completed = select(Trial.id).where(
            Trial.experiment_id == exp.id, Trial.state == TrialState.COMPLETED.value
        )
        ok = s.scalar(completed.limit(1)) is not None
        _finish(s, exp, ExperimentState.COMPLETED if ok else ExperimentState.FAILED, "", now)
        report.finished.append(exp.id)


def _live_trials(s: Session, exp_id: int, settled: Select[int]) -> list[Trial]:
    """The experiment's trials not terminal yet and not ``settled`` (a query of ids:
    :func:`~dlhpc.orchestrator.trials.settled_paused_ids`), by id, without their attempts."""
    return list(
        s.scalars(
            select(Trial)
            .where(
                Trial.experiment_id == exp_id,
                Trial.state.not_in(TERMINAL_TRIAL_STATES),
                Trial.id.not_in(settled),
            )
            .order_by(Trial.id)
        )
    )


def _load_attempts(s: Session, trial_ids: list[int]) -> None:
    """Load these trials' attempts into the session (one ``selectinload`` query: the
    trials are in the identity map already). The others' load lazily if touched."""
    if trial_ids:
        s.scalars(
            select(Trial).where(Trial.id.in_(trial_ids)).options(selectinload(Trial.attempts))
        ).all()


def _finish(s: Session, exp: Experiment, state: ExperimentState, why: str, now: datetime) -> None:
    """End the experiment in ``state``, with its event (``why``, or the state's name)."""
    exp.state = state.value
    exp.ended_at = experiment_end(s, exp, now)
    log_event(s, f"experiment.{state.value.lower()}", why or state.value, exp.id)
