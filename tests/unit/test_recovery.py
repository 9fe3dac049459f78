"""The restart rules (orchestrator.recovery.judge) as a table."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from dlhpc.orchestrator.decide import STOP_GRACE, STOP_GRACE_ENV, stop_grace
from dlhpc.orchestrator.recovery import HEARTBEAT_STALE, HEARTBEAT_STALE_ENV, heartbeat_stale, judge
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.states import TrialState
from dlhpc.store import Attempt

NOW = datetime(2026, 1, 1, 12, 0, 0)
LONG_AGO = NOW - timedelta(minutes=10)


def _attempt(
    code: int | None = None, reason: str = "", gone: datetime | None = None, started: bool = True
) -> Attempt:
    return Attempt(
        trial_id=1,
        attempt_key="5_0.r0",
        job_id="5_0",
        state="RUNNING",
        exit_code=code,
        exit_reason=reason,
        terminal_seen_at=gone,
        started_at=NOW if started else None,
        created_at=NOW,
    )


def _st(state: JobState) -> JobStatus:
    return JobStatus("5_0", state)


R = JobState.RUNNING
P = JobState.PENDING


@pytest.mark.parametrize(
    ("attempt", "status", "hb", "state", "cause", "resubmit", "counted", "cancel"),
    [
        (None, None, None, TrialState.PENDING, "", False, False, False),
        (_attempt(started=False), _st(P), None, TrialState.PENDING, "", False, False, False),
        (_attempt(), _st(R), timedelta(seconds=5), TrialState.RUNNING, "", False, False, False),
        (
            _attempt(0, "completed"),
            _st(JobState.COMPLETED),
            None,
            TrialState.COMPLETED,
            "completed",
            False,
            False,
            False,
        ),
        # an exit record while the scheduler still runs the job is not final (a job
        # can write one and train on): RUNNING, nothing cancelled, nothing resubmitted
        (_attempt(0, "completed"), _st(R), None, TrialState.RUNNING, "", False, False, False),
        (
            _attempt(1, "error"),
            _st(R),
            timedelta(seconds=5),
            TrialState.RUNNING,
            "",
            False,
            False,
            False,
        ),
        # ... until its heartbeat (stopped before the exit is written) is stale: final,
        # and what is left of the job is cancelled
        (
            _attempt(0, "completed"),
            _st(R),
            HEARTBEAT_STALE + timedelta(seconds=1),
            TrialState.COMPLETED,
            "completed",
            False,
            False,
            True,
        ),
        (
            _attempt(1, "error"),
            _st(R),
            HEARTBEAT_STALE + timedelta(seconds=1),
            TrialState.PENDING,
            "crash",
            True,
            True,
            True,
        ),
        # checkpointed at a time-limit signal; Slurm requeues the same task: wait
        (
            _attempt(75, "requeue/USR2"),
            _st(P),
            None,
            TrialState.PENDING,
            "timeout",
            False,
            False,
            False,
        ),
        # ... but the job is gone (e.g. scancel --signal): submit again, not counted
        (
            _attempt(75, "requeue/USR2", LONG_AGO),
            _st(JobState.CANCELLED),
            None,
            TrialState.PENDING,
            "timeout",
            True,
            False,
            False,
        ),
        # preempted (TERM), killed before checkpointing: not the trial's fault (the
        # worker's exit ends the job FAILED before Slurm requeues it; CANCELLED would
        # be a scancel, see test_scancel_is_cancelled_not_preempted)
        (
            _attempt(143, "signal/TERM", LONG_AGO),
            _st(JobState.FAILED),
            None,
            TrialState.PENDING,
            "preempted",
            True,
            False,
            False,
        ),
        # a crash of the user's code counts
        (
            _attempt(1, "error"),
            _st(JobState.FAILED),
            None,
            TrialState.PENDING,
            "crash",
            True,
            True,
            False,
        ),
        # node died: running in Slurm, heartbeat stale -> cancel and resubmit, not counted
        (
            _attempt(),
            _st(R),
            HEARTBEAT_STALE + timedelta(seconds=1),
            TrialState.PENDING,
            "lost",
            True,
            False,
            True,
        ),
        # gone from Slurm without an exit record, within the grace: wait for the files
        (
            _attempt(gone=NOW - timedelta(seconds=5)),
            _st(JobState.NODE_FAIL),
            None,
            TrialState.RUNNING,
            "",
            False,
            False,
            False,
        ),
        (
            _attempt(gone=LONG_AGO),
            _st(JobState.NODE_FAIL),
            None,
            TrialState.PENDING,
            "node_fail",
            True,
            False,
            False,
        ),
        # the worker itself died (kill -9 of the job): not the script's fault
        (
            _attempt(gone=LONG_AGO),
            _st(JobState.FAILED),
            None,
            TrialState.PENDING,
            "lost",
            True,
            False,
            False,
        ),
        (
            _attempt(gone=LONG_AGO),
            _st(JobState.UNKNOWN),
            None,
            TrialState.PENDING,
            "lost",
            True,
            False,
            False,
        ),
    ],
)
def test_judge(
    attempt: Attempt | None,
    status: JobStatus | None,
    hb: timedelta | None,
    state: TrialState,
    cause: str,
    resubmit: bool,
    counted: bool,
    cancel: bool,
) -> None:
    v = judge(attempt, status, hb, NOW)
    assert (v.state, v.cause, v.resubmit, v.counted, v.cancel_job) == (
        state,
        cause,
        resubmit,
        counted,
        cancel,
    )


def test_scancel_is_cancelled_not_preempted() -> None:
    """scancel sends TERM as preemption does; Slurm's CANCELLED tells them apart."""
    a = _attempt(75, "requeue/TERM", gone=LONG_AGO)
    assert judge(a, _st(JobState.CANCELLED), None, NOW).cause == "cancelled"
    assert judge(a, _st(JobState.FAILED), None, NOW).cause == "preempted"


def test_superseded_attempt_keeps_its_time_limit_cause() -> None:
    """An attempt Slurm requeued after the time-limit signal is a timeout."""
    from dlhpc.orchestrator.recovery import superseded_cause

    assert superseded_cause(_attempt(75, "requeue/USR2")) == "timeout"
    assert superseded_cause(_attempt(75, "requeue/TERM")) == "requeued"
    assert superseded_cause(_attempt()) == "requeued"


def test_cause_uses_the_state_recorded_once_the_job_is_no_longer_polled() -> None:
    """After Slurm's final state the attempt is not polled again: judge reads it
    from the attempt (as _apply_status recorded it)."""
    a = _attempt(75, "requeue/TERM", gone=LONG_AGO)
    a.state = "CANCELLED"
    assert judge(a, None, None, NOW).cause == "cancelled"
    b = _attempt(gone=LONG_AGO)
    b.state = "NODE_FAIL"
    assert judge(b, None, None, NOW).cause == "node_fail"
    b.state = "UNKNOWN"
    assert judge(b, None, None, NOW).cause == "lost"


def test_preempted_job_that_ended_failed_is_resubmitted_at_once() -> None:
    """A job that checkpointed and exited at the preemption TERM ends FAILED and
    Slurm does not requeue it: no grace. A PREEMPTED or CANCELLED end still waits,
    since Slurm's own requeue may follow it."""
    just_now = NOW - timedelta(seconds=1)
    for state in (JobState.FAILED, JobState.COMPLETED):
        v = judge(_attempt(75, "requeue/TERM", gone=just_now), _st(state), None, NOW)
        assert v.resubmit and not v.counted and v.cause == "preempted"
    for state in (JobState.PREEMPTED, JobState.CANCELLED, JobState.UNKNOWN):
        v = judge(_attempt(75, "requeue/TERM", gone=just_now), _st(state), None, NOW)
        assert not v.resubmit, state
    live = judge(_attempt(75, "requeue/USR2", gone=None), _st(P), None, NOW)
    assert not live.resubmit  # self-requeued at the time limit: Slurm runs it again


def test_an_attempt_key_splits_back_into_job_and_restart() -> None:
    from dlhpc.protocol import attempt_key, split_attempt_key

    assert split_attempt_key(attempt_key("123_4", 2)) == ("123_4", 2)
    assert split_attempt_key("local-ab12.r0") == ("local-ab12", 0)
    for name in ("123_4", ".r1", "123_4.rx", "123_4.r"):
        assert split_attempt_key(name) is None, name


def test_a_heartbeat_older_than_stale_is_lost_and_one_as_old_is_not() -> None:
    stale = timedelta(seconds=40)
    running = _st(JobState.RUNNING)
    assert judge(_attempt(), running, stale, NOW, stale).state is TrialState.RUNNING
    lost = judge(_attempt(), running, stale + timedelta(seconds=1), NOW, stale)
    assert (lost.cause, lost.resubmit, lost.cancel_job) == ("lost", True, True)


def test_the_graces_follow_the_environment_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """$DLHPC_HEARTBEAT_STALE_S and $DLHPC_STOP_GRACE_S as they are when a pass asks,
    not when the module was imported (a process may run passes under different ones)."""
    assert heartbeat_stale({}) == HEARTBEAT_STALE and stop_grace({}) == STOP_GRACE
    assert heartbeat_stale({HEARTBEAT_STALE_ENV: "40"}) == timedelta(seconds=40)
    assert stop_grace({STOP_GRACE_ENV: "2.5"}) == timedelta(seconds=2.5)
    monkeypatch.setenv(HEARTBEAT_STALE_ENV, "7")
    monkeypatch.setenv(STOP_GRACE_ENV, "8")
    assert (heartbeat_stale(), stop_grace()) == (timedelta(seconds=7), timedelta(seconds=8))
    monkeypatch.delenv(HEARTBEAT_STALE_ENV)
    monkeypatch.delenv(STOP_GRACE_ENV)
    assert (heartbeat_stale(), stop_grace()) == (HEARTBEAT_STALE, STOP_GRACE)
