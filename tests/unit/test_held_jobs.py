"""Jobs that Slurm holds on its own (``launch failed requeued held``): which squeue lines
are such holds, how ``scontrol release`` is called and read, and what a tick does with
dlhpc's held jobs (released, or cancelled; never counted as a crash).

The tick tests run an in-process backend that reports holds as the Slurm backend does
(``system_held``: every held job of the user's queue, also those not polled)."""

from __future__ import annotations

import subprocess
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from dlhpc.config import load_experiment
from dlhpc.errors import SchedulerError
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.tick import tick
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.scheduler.slurm.parse import is_system_hold, parse_squeue, refused_ids
from dlhpc.scheduler.slurm.scheduler import SlurmScheduler
from dlhpc.search import SearcherTable
from dlhpc.states import TrialState
from dlhpc.store import Attempt, Event, Store, Trial, utcnow
from dlhpc.store.ingest import new_attempt
from tests.unit.test_site_limits import Limited

# --- which squeue lines are holds Slurm set itself -----------------------------------


@pytest.mark.parametrize(
    ("state", "reason", "held"),
    [
        ("PENDING", "launch failed requeued held", True),  # 22.05 to 26.05, after a failed launch
        ("REQUEUE_HOLD", "launch failed requeued held", True),
        ("PENDING", "launch_failed_requeued_held", True),  # as pyslurm writes it
        ("REQUEUE_HOLD", "launch failure limit exceeded requeued held", True),  # 24.11+
        ("PENDING", "user env retrieval failed requeued held", True),  # 26.05
        ("PENDING", "JobHoldMaxRequeue", True),  # 22.05, after too many launch requeues
        ("PENDING", "JobHeldUser", False),  # scontrol hold by the user: left alone
        ("PENDING", "JobHeldAdmin", False),  # an admin's hold: left alone
        ("REQUEUE_HOLD", "job requeued in held state", False),  # scontrol requeuehold
        ("PENDING", "job requeued in special exit state", False),
        ("PENDING", "Priority", False),
        ("PENDING", "Resources", False),
        ("RUNNING", "launch failed requeued held", False),  # not queued: not a hold
        ("COMPLETED", "launch failed requeued held", False),
    ],
)
def test_a_system_hold_is_told_from_a_persons_hold_by_squeues_reason(
    state: str, reason: str, held: bool
) -> None:
    [status] = parse_squeue(f"12_3|{state}|{reason}|||\n").values()
    assert (status.reason, status.system_hold) == (reason, held)
    assert is_system_hold(status.state, reason) is held


def test_refused_ids_are_those_scontrols_errors_name() -> None:
    ids = ["12_3", "12_30", "14"]
    text = (
        "Access/permission denied for job 12_30\n"
        "14: Job/step already completing or completed\n"
        "slurm_suspend error: Access/permission denied\n"
    )
    assert refused_ids(text, ids) == ["12_30", "14"]  # 12_3 is not named (12_30 is)
    assert refused_ids("", ids) == []


def _answer(rc: int, stderr: str = "", stdout: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], rc, stdout, stderr)


def test_release_is_one_scontrol_call_and_returns_what_slurm_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched = SlurmScheduler(fn=lambda _d: None)
    calls: list[list[str]] = []
    answers = [_answer(0), _answer(1, "Access/permission denied for job 5_1\n"), _answer(1, "x")]

    def run(args: list[str], timeout: float, environ: Any = None) -> Any:
        calls.append(args)
        return answers.pop(0)

    monkeypatch.setattr(sched, "_run", run)
    assert sched.release(["5_0", "5_1", "5_0"]) == []
    assert calls == [["scontrol", "release", "5_0", "5_1"]]
    assert sched.release(["5_0", "5_1"]) == ["5_1"]
    with pytest.raises(SchedulerError, match="scontrol release failed"):
        sched.release(["5_0"])  # an error that names no job: nothing known released
    assert sched.release([]) == [] and len(calls) == 3
    with pytest.raises(ValueError, match="not a Slurm job id"):
        sched.release(["5_0; rm"])


def test_the_poll_reports_every_held_job_of_the_users_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched = SlurmScheduler(fn=lambda _d: None, queue_path=None)
    queue = (
        "7_0|PENDING|launch failed requeued held|||\n"  # polled
        "7_1|PENDING|JobHeldUser|||\n"  # the user's own hold
        "6_4|PENDING|launch failed requeued held|||\n"  # an attempt dlhpc no longer polls
        "8_0|RUNNING|None|n1|2024-01-01T00:00:00|\n"
    )
    monkeypatch.setattr(sched, "_squeue", lambda: parse_squeue(queue))
    assert sched.system_held() == {}  # before a poll
    polled = sched.poll(["7_0", "7_1", "8_0"])
    assert polled["7_0"].system_hold and polled["7_0"].state is JobState.PENDING
    assert not polled["7_1"].system_hold
    assert sorted(sched.system_held()) == ["6_4", "7_0"]


# --- a tick with held jobs ------------------------------------------------------------

YAML = """\
name: held
entrypoint: python train.py
resources: {cpus_per_task: 1, mem: "1G", time: "01:00:00"}
hyperparameters: {x: {type: categorical, vals: [1, 2, 3, 4]}}
searcher: {name: grid, metric: loss, max_length: 2}
"""


class _Holding(Limited):
    """A backend whose queue holds ``held`` jobs: reported by every poll as Slurm's are
    (also those not asked about); ``release`` refuses the ids in ``refuse_release``."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, str] = {}  # job id -> reason
        self.refuse_release: set[str] = set()
        self.released: list[list[str]] = []
        self.cancels: list[list[str]] = []

    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        return {j: self._status(j) for j in job_ids}

    def _status(self, job_id: str) -> JobStatus:
        reason = self.held.get(job_id, "")
        return JobStatus(job_id, JobState.PENDING, reason=reason, system_hold=bool(reason))

    def system_held(self) -> dict[str, JobStatus]:
        return {j: self._status(j) for j in self.held}

    def release(self, job_ids: Collection[str]) -> list[str]:
        self.released.append(list(job_ids))
        return [j for j in job_ids if j in self.refuse_release]

    def cancel(self, job_ids: Collection[str]) -> None:
        self.cancels.append(list(job_ids))
        for j in job_ids:
            self.held.pop(j, None)


@pytest.fixture
def held_site(tmp_path: Path) -> tuple[Store, SchedulerPool, _Holding, list[int]]:
    """One launched experiment of 4 trials, their jobs 40_0 .. 40_3 queued."""
    (tmp_path / "train.py").write_text("")
    yaml = tmp_path / "exp.yaml"
    yaml.write_text(YAML)
    store = Store(tmp_path / "home")
    backend = _Holding()
    pool = SchedulerPool(
        local_root=tmp_path / "local",
        backends=BackendTable([Backend("local", lambda _r: backend)]),
    )
    launch(load_experiment(yaml, site="local", searchers=SearcherTable()), store, pool, record={})
    with store.read() as s:
        trials = list(s.scalars(select(Trial.id).order_by(Trial.id)))
        assert set(s.scalars(select(Attempt.job_id))) == {f"40_{i}" for i in range(4)}
    return store, pool, backend, trials


def _attempts(store: Store, trial_id: int) -> list[tuple[str, str, str]]:
    with store.read() as s:
        rows = s.execute(
            select(Attempt.attempt_key, Attempt.state, Attempt.cause)
            .where(Attempt.trial_id == trial_id)
            .order_by(Attempt.id)
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]


def _trial(store: Store, trial_id: int) -> tuple[str, bool, int, int]:
    with store.read() as s:
        t = s.get(Trial, trial_id)
        assert t is not None
        return t.state, t.needs_job, t.crashes, t.restarts


def _held_events(store: Store) -> list[str]:
    with store.read() as s:
        return list(s.scalars(select(Event.message).where(Event.kind == "jobs.held")))


def test_a_held_job_its_trial_waits_for_is_released_and_the_others_cancelled(
    held_site: tuple[Store, SchedulerPool, _Holding, list[int]],
) -> None:
    store, pool, backend, (t1, t2, t3, t4) = held_site
    with store.write() as s:  # trial 3 was resubmitted: 40_2 is an attempt it replaced
        s.add(new_attempt(t3, "41_0.r0", "PENDING", utcnow()))
        s.scalars(select(Attempt).where(Attempt.job_id == "40_2")).one().state = "SUPERSEDED"
    reason = "launch failed requeued held"
    backend.held = {"40_0": reason, "40_1": reason, "40_2": reason, "99_0": reason}
    backend.refuse_release = {"40_1"}  # Slurm refuses this release: cancelled, trial resubmitted
    submitted_before = len(backend.submitted)
    report = tick(store, pool)
    assert report.errors == []
    assert backend.released == [["40_0", "40_1"]]  # one release for all
    assert backend.cancels == [["40_1", "40_2"]]  # one cancel; 99_0 is not dlhpc's
    assert (report.released, report.held_cancelled) == (1, 2)
    assert "99_0" in backend.held
    # released: the trial waits for the same job, its attempt's cause says why it ended
    assert _attempts(store, t1) == [("40_0.r0", "PENDING", "held")]
    assert _trial(store, t1)[:3] == (TrialState.PENDING.value, False, 0)
    # refused: cancelled, and submitted again in the same pass, not counted as a crash
    assert _attempts(store, t2)[0] == ("40_1.r0", "CANCELLED", "held")
    assert len(_attempts(store, t2)) == 2 and len(backend.submitted) == submitted_before + 1
    assert _trial(store, t2)[:3] == (TrialState.PENDING.value, False, 0)
    # an attempt its trial no longer waits for: cancelled, nothing else changes
    assert _attempts(store, t3) == [
        ("40_2.r0", "SUPERSEDED", "requeued"),
        ("41_0.r0", "PENDING", ""),
    ]
    assert _attempts(store, t4) == [("40_3.r0", "PENDING", "")]
    [line] = _held_events(store)
    assert line == (
        f"local held 3 job(s) itself ({reason}): released 40_0 (trial {t1});"
        f" cancelled 40_1 (trial {t2}), 40_2 (trial {t3}, not waited for)"
    )
    backend.held.pop("40_0")  # it runs again: nothing more to do
    again = tick(store, pool)
    assert (again.released, again.held_cancelled, again.errors) == (0, 0, [])
    assert backend.released == [["40_0", "40_1"]] and len(_held_events(store)) == 1
    assert _trial(store, t2) == (TrialState.PENDING.value, False, 0, 1)  # a restart, no crash


@pytest.mark.parametrize(
    ("change", "column", "value"),
    [
        ("ended", "state", TrialState.COMPLETED.value),
        ("paused", "state", TrialState.PAUSED.value),
        ("stopping", "stop_requested_at", "now"),
        ("waits for a new job", "needs_job", True),
    ],
)
def test_a_held_job_of_a_trial_that_no_longer_waits_for_it_is_cancelled(
    held_site: tuple[Store, SchedulerPool, _Holding, list[int]],
    change: str,
    column: str,
    value: Any,
) -> None:
    store, pool, backend, (t1, *_) = held_site
    with store.write() as s:
        t = s.get(Trial, t1)
        assert t is not None
        setattr(t, column, utcnow() if value == "now" else value)
        if change == "ended":
            t.ended_at = utcnow()
    backend.held = {"40_0": "launch failed requeued held"}
    report = tick(store, pool)
    assert backend.released == [] and ["40_0"] in backend.cancels, change
    assert (report.released, report.held_cancelled) == (0, 1)
    assert _trial(store, t1)[2] == 0  # no crash counted
    assert "cancelled 40_0" in _held_events(store)[0]


def test_a_failed_release_is_reported_and_tried_again(
    held_site: tuple[Store, SchedulerPool, _Holding, list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, pool, backend, (t1, *_) = held_site
    backend.held = {"40_0": "launch failed requeued held"}

    def down(job_ids: Collection[str]) -> list[str]:
        raise SchedulerError("scontrol release failed (exit 1): Unable to contact slurm controller")

    monkeypatch.setattr(backend, "release", down)
    report = tick(store, pool)
    assert report.errors == [
        "held jobs (limited): SchedulerError: scontrol release failed (exit 1):"
        " Unable to contact slurm controller"
    ]
    assert (report.released, _held_events(store), _attempts(store, t1)[0][2]) == (0, [], "")
    monkeypatch.undo()
    assert tick(store, pool).released == 1
