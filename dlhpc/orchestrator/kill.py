"""``dlhpc kill``: cancel jobs and mark experiments or trials KILLED."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.orm import Session

from dlhpc.errors import NotFoundError
from dlhpc.orchestrator.clock import experiment_end, store_clock, trial_time
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.stored import config_of, searcher_of, state_json
from dlhpc.states import LIVE_ATTEMPT_STATES, ExperimentState, JobState, TrialState
from dlhpc.store import Experiment, Store, Trial

__all__ = ["kill_experiment", "kill_trial"]

# marks the rows of one kill in the open write session and returns (backend, trials to
# end, the experiment it ends or None)
_Mark = Callable[[Session], tuple[str, list[Trial], Experiment | None]]


def _kill(store: Store, pool: SchedulerPool, mark: _Mark) -> int:
    """Under the lease: ``mark`` the rows, mark the trials it names and their live
    attempts KILLED / CANCELLED (and the experiment it ends, after them), commit,
    then cancel those jobs. Returns how many."""
    with store.hold_lease():
        now = store_clock(store).now()
        with store.write() as s:
            backend, trials, ending = mark(s)
            ids = _kill_trials(trials, now)
            if ending is not None:
                ending.ended_at = experiment_end(s, ending, now)
        if ids:
            pool.get(backend).cancel(ids)
        return len(ids)


def _kill_trials(trials: list[Trial], now: datetime) -> list[str]:
    jobs: list[str] = []
    for t in trials:
        if TrialState(t.state).is_terminal:
            continue
        t.state = TrialState.KILLED.value
        t.ended_at = trial_time(t, now)
        for a in t.attempts:
            if a.state in LIVE_ATTEMPT_STATES:  # an exit record alone ends no job
                jobs.append(a.job_id)
                a.state = JobState.CANCELLED.value
    return jobs


def kill_experiment(store: Store, pool: SchedulerPool, exp_id: int) -> int:
    """Mark the experiment and its live trials KILLED, then cancel their jobs."""

    def mark(s: Session) -> tuple[str, list[Trial], Experiment | None]:
        exp = s.get(Experiment, exp_id)
        if exp is None:
            raise NotFoundError(f"no experiment {exp_id}")
        ending = not ExperimentState(exp.state).is_terminal
        if ending:
            exp.state = ExperimentState.KILLED.value
        log_event(s, "experiment.killed", "killed by user", exp_id)
        return exp.backend, list(exp.trials), exp if ending else None

    return _kill(store, pool, mark)


def kill_trial(store: Store, pool: SchedulerPool, trial_id: int) -> int:
    """Mark one trial KILLED and cancel its job; the searcher hears it exited next tick."""

    def mark(s: Session) -> tuple[str, list[Trial], Experiment | None]:
        t = s.get(Trial, trial_id)
        if t is None:
            raise NotFoundError(f"no trial {trial_id}")
        exp = t.experiment
        if not TrialState(t.state).is_terminal:
            searcher = searcher_of(config_of(exp), exp.searcher_state)
            searcher.tell_exited(t.request_id)
            exp.searcher_state = state_json(searcher)
        log_event(s, "trial.killed", "killed by user", t.experiment_id, trial_id)
        return exp.backend, [t], None

    return _kill(store, pool, mark)
