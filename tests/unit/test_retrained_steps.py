"""Steps lost to a restart below the checkpoint (``reconcile_trial``): an attempt whose
progress file says where its training started (``start_step``, from
``TrialContext.training_started``) makes every step of the previous attempt past that
start count as lost, as a script that cannot resume trains them again."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dlhpc.orchestrator.trials import TrialPass, reconcile_trial
from dlhpc.protocol import PROGRESS_FILE, attempt_dir
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.store import Attempt, Store, Trial, utcnow
from tests.unit._db import add_experiment, add_trial
from tests.unit.test_tick_skip import _Clock


def _progress(run_dir: Path, key: str, **body: Any) -> None:
    folder = attempt_dir(run_dir, key)
    folder.mkdir(parents=True)
    (folder / PROGRESS_FILE).write_text(json.dumps(body))


@pytest.mark.parametrize(
    ("previous", "start", "lost"),
    [
        ({"step": 24, "checkpoint_step": 24}, 0, 24),  # bare train(): all of it again
        ({"step": 24, "checkpoint_step": 24}, 24, 0),  # resumed from its checkpoint
        ({"step": 30, "checkpoint_step": 24}, 24, 6),  # killed 6 steps past it, resumed
        ({"step": 30, "checkpoint_step": 24}, 0, 30),
        ({"step": 24, "checkpoint_step": 24}, None, 0),  # the script does not say
    ],
)
def test_a_start_below_the_previous_attempts_step_counts_the_rest_as_lost(
    tmp_path: Path, previous: dict[str, int], start: int | None, lost: int
) -> None:
    run_dir = tmp_path / "trial"
    store = Store(tmp_path / "home")
    with store.write() as s:
        t = add_trial(s, add_experiment(s, tmp_path / "runs"), run_dir=str(run_dir))
        first = Attempt(
            trial_id=t.id,
            attempt_key="5.r0",
            job_id="5",
            created_at=utcnow() - timedelta(minutes=5),
            state=JobState.COMPLETED.value,
            exit_code=75,
            cause="requeued",
            lost_steps=previous["step"] - previous["checkpoint_step"],  # its exit record's
        )
        current = Attempt(
            trial_id=t.id,
            attempt_key="5.r1",
            job_id="5",
            created_at=utcnow(),
            state=JobState.RUNNING.value,
        )
        s.add_all([first, current])
        tid = t.id
    _progress(run_dir, "5.r0", **previous)
    _progress(run_dir, "5.r1", step=3, checkpoint_step=None, start_step=start)
    with store.write() as s:
        trial = s.get(Trial, tid)
        assert trial is not None
        statuses = {"5": JobStatus("5", JobState.RUNNING)}
        reconcile_trial(s, trial, TrialPass(statuses, _Clock(), max_restarts=3, final_length=3))
        assert [a.lost_steps for a in trial.attempts] == [lost, None]
        assert trial.state == "RUNNING" and trial.restarts == 1
