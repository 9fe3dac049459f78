"""``dlhpc kill``: cancel jobs and mark experiments or trials KILLED."""

from __future__ import annotations

import json
from collections import defaultdict

from dlhpc.errors import NotFoundError
from dlhpc.orchestrator.common import SchedulerPool, config_of, log_event, searcher_of
from dlhpc.orchestrator.states import ExperimentState, TrialState
from dlhpc.store import Experiment, Store, Trial, utcnow

__all__ = ["kill_experiment", "kill_trial"]

_LIVE = {"PENDING", "RUNNING", "REQUEUED", "UNKNOWN"}


def _kill_trials(trials: list[Trial], backend: str, jobs: dict[str, list[str]]) -> None:
    now = utcnow()
    for t in trials:
        if TrialState(t.state).is_terminal:
            continue
        t.state = TrialState.KILLED.value
        t.ended_at = now
        for a in t.attempts:
            if a.state in _LIVE and a.exit_code is None:
                jobs[backend].append(a.job_id)
                a.state = "CANCELLED"


def _cancel(pool: SchedulerPool, jobs: dict[str, list[str]]) -> int:
    for backend, ids in jobs.items():
        if ids:
            pool.get(backend).cancel(ids)
    return sum(len(v) for v in jobs.values())


def kill_experiment(store: Store, pool: SchedulerPool, exp_id: int) -> int:
    """Mark the experiment and its live trials KILLED, then cancel their jobs."""
    jobs: dict[str, list[str]] = defaultdict(list)
    with store.hold_lease():
        with store.write() as s:
            exp = s.get(Experiment, exp_id)
            if exp is None:
                raise NotFoundError(f"no experiment {exp_id}")
            if not ExperimentState(exp.state).is_terminal:
                exp.state = ExperimentState.KILLED.value
                exp.ended_at = utcnow()
            _kill_trials(list(exp.trials), exp.backend, jobs)
            log_event(s, "experiment.killed", "killed by user", exp_id)
        return _cancel(pool, jobs)


def kill_trial(store: Store, pool: SchedulerPool, trial_id: int) -> int:
    """Mark one trial KILLED and cancel its job; the searcher hears it exited next tick."""
    jobs: dict[str, list[str]] = defaultdict(list)
    with store.hold_lease():
        with store.write() as s:
            t = s.get(Trial, trial_id)
            if t is None:
                raise NotFoundError(f"no trial {trial_id}")
            was_live = not TrialState(t.state).is_terminal
            _kill_trials([t], t.experiment.backend, jobs)
            if was_live:
                exp = t.experiment
                searcher = searcher_of(config_of(exp), exp.searcher_state)
                searcher.tell_exited(t.request_id)
                exp.searcher_state = json.dumps(searcher.state_dict())
            log_event(s, "trial.killed", "killed by user", t.experiment_id, trial_id)
        return _cancel(pool, jobs)
