"""A promotion decided while the trial's job was still ending (a pending ``promote``
decision) survives whatever ends that job: the trial's next job has the longer grant.

Once the new job is submitted the decision counts as acted on, so a new job with the
old grant would train nothing, pause the trial again, and leave the searcher waiting
for a result at the promoted length that never comes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlhpc.orchestrator.decide import pending_promotions
from dlhpc.orchestrator.trials import TrialPass, reconcile_trial
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.states import TrialState
from dlhpc.store import Attempt, Decision, Store, Trial, utcnow
from tests.unit._db import add_experiment, add_trial
from tests.unit.test_tick_skip import _Clock

FINAL = 9


@pytest.mark.parametrize(
    ("code", "reason", "promoted", "state", "length"),
    [
        # preempted after its rung result: a new job, to the promoted length
        (75, "requeue/TERM", True, TrialState.PENDING, FINAL),
        (75, "requeue/TERM", False, TrialState.PENDING, 3),  # not promoted: the same grant
        (0, "completed", True, TrialState.PENDING, FINAL),  # it ended on its own
        (0, "completed", False, TrialState.PAUSED, 3),
    ],
)
def test_a_pending_promotion_gives_the_next_job_its_length(
    tmp_path: Path, code: int, reason: str, promoted: bool, state: TrialState, length: int
) -> None:
    store = Store(tmp_path / "home")
    with store.write() as s:
        exp = add_experiment(s, tmp_path / "runs")
        t = add_trial(s, exp, max_length=3, steps_completed=3, told_step=3)
        s.add(
            Attempt(
                trial_id=t.id,
                attempt_key="5_0.r0",
                job_id="5_0",
                created_at=utcnow(),
                started_at=utcnow(),
                state=JobState.RUNNING.value,
                exit_code=code,
                exit_reason=reason,
            )
        )
        if promoted:
            s.add(
                Decision(
                    experiment_id=exp.id,
                    trial_id=t.id,
                    kind="promote",
                    length=FINAL,
                    decided_at=utcnow(),
                )
            )
        exp_id, tid = exp.id, t.id
    with store.write() as s:
        trial = s.get(Trial, tid)
        assert trial is not None
        p = TrialPass(
            {"5_0": JobStatus("5_0", JobState.COMPLETED)},
            _Clock(),
            max_restarts=3,
            final_length=FINAL,
            promotions=pending_promotions(s, exp_id),
        )
        reconcile_trial(s, trial, p)
        assert (trial.state, trial.max_length) == (state.value, length)
        assert trial.needs_job == (state == TrialState.PENDING)
