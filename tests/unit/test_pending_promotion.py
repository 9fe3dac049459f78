"""A promotion decided while the trial's job was still ending (a pending ``promote``
decision) survives whatever ends that job: the trial's next job has the longer grant.

Once the new job is submitted the decision counts as acted on, so a new job with the
old grant would train nothing, pause the trial again, and leave the searcher waiting
for a result at the promoted length that never comes."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from dlhpc.orchestrator.decide import pending_promotions
from dlhpc.orchestrator.held import settle_held
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.submit import submit_pending
from dlhpc.orchestrator.tick import TickReport
from dlhpc.orchestrator.trials import TrialPass, reconcile_trial
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.states import TrialState
from dlhpc.store import Attempt, Decision, Store, Trial, utcnow
from tests.unit.test_site_limits import Limited, site
from tests.unit.test_tick_skip import _Clock

__all__ = ["site"]  # the fixture, imported for its name

FINAL = 9
JOB = "5_0"


def _ending_trial(store: Store, exp_id: int, code: int, reason: str, promoted: bool) -> int:
    """The experiment's first trial, at its grant of 3 steps, its job ending with
    ``code``; promoted to ``FINAL`` meanwhile if ``promoted``. Its id."""
    with store.write() as s:
        t = s.scalars(select(Trial).where(Trial.experiment_id == exp_id).order_by(Trial.id)).first()
        assert t is not None
        t.state, t.max_length, t.steps_completed, t.told_step = "RUNNING", 3, 3, 3
        s.add(
            Attempt(
                trial_id=t.id,
                attempt_key=f"{JOB}.r0",
                job_id=JOB,
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
                    experiment_id=exp_id,
                    trial_id=t.id,
                    kind="promote",
                    length=FINAL,
                    decided_at=utcnow(),
                )
            )
        return t.id


def _reconcile(store: Store, exp_id: int, tid: int) -> None:
    with store.write() as s:
        trial = s.get(Trial, tid)
        assert trial is not None
        p = TrialPass(
            {JOB: JobStatus(JOB, JobState.COMPLETED)},
            _Clock(),
            max_restarts=3,
            final_length=FINAL,
            promotions=pending_promotions(s, exp_id),
        )
        reconcile_trial(s, trial, p)


def _held_and_cancelled(store: Store, pool: SchedulerPool) -> None:
    """Slurm requeued and held the ending job; this backend refuses to release it."""
    held = {"local": {JOB: JobStatus(JOB, JobState.PENDING, reason="launch failed requeued held")}}
    report = TickReport()
    settle_held(store, pool, held, report)
    assert report.held_cancelled == 1, report.errors


@pytest.mark.parametrize(
    ("ended", "promoted", "state", "length"),
    [
        # preempted after its rung result: a new job, to the promoted length
        ("preempted", True, TrialState.PENDING, FINAL),
        ("preempted", False, TrialState.PENDING, 3),  # not promoted: the same grant
        ("completed", True, TrialState.PENDING, FINAL),  # it ended on its own
        ("completed", False, TrialState.PAUSED, None),  # no new job
        ("held", True, TrialState.PENDING, FINAL),  # Slurm held it; cancelled instead
    ],
)
def test_a_pending_promotion_gives_the_next_job_its_length(
    site: tuple[Store, SchedulerPool, Limited, int],
    ended: str,
    promoted: bool,
    state: TrialState,
    length: int | None,
) -> None:
    store, pool, backend, exp_id = site
    code, reason = (0, "completed") if ended == "completed" else (75, "requeue/TERM")
    tid = _ending_trial(store, exp_id, code, reason, promoted)
    if ended == "held":
        _held_and_cancelled(store, pool)
    else:
        _reconcile(store, exp_id, tid)
    with store.read() as s:
        trial = s.get(Trial, tid)
        assert trial is not None
        assert trial.state == state.value
        assert trial.needs_job == (state == TrialState.PENDING)
    submit_pending(store, pool, exp_id)
    specs = {
        spec["trial_id"]: spec
        for spec in (json.loads((d / "trial.json").read_text()) for d in backend.submitted[-1])
    }
    if length is None:
        assert tid not in specs
        return
    assert specs[tid]["max_length"] == length
    with store.read() as s:
        trial = s.get(Trial, tid)
        assert trial is not None and trial.max_length == length
        pending = s.scalars(select(Decision).where(Decision.acted_at.is_(None))).all()
        assert pending == []  # the submission acted on the promotion
