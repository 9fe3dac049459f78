"""An exit record is a file the job wrote: the tick takes it as final only when the
scheduler also says the attempt ended, or when the job hangs on after it (heartbeat
stale: then the job is cancelled). A forged exit from a job that still runs leaves
the trial RUNNING, and ``dlhpc kill`` still cancels its job.

The scheduler is a fake at the backend boundary (its poll answers ``state``); the
job's files are written by hand, as a job would.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from dlhpc.config import load_experiment
from dlhpc.orchestrator import kill_trial
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.recovery import HEARTBEAT_STALE
from dlhpc.orchestrator.tick import tick
from dlhpc.protocol import HEARTBEAT_FILE, EventWriter, attempt_dir
from dlhpc.protocol.atomic import atomic_write_text
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.search import SearcherTable
from dlhpc.store import Attempt, Store, Trial
from tests.unit.test_site_limits import YAML, Limited


class _Running(Limited):
    """Polls every job as ``state``."""

    def __init__(self) -> None:
        super().__init__()
        self.state = JobState.RUNNING

    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        return {j: JobStatus(j, self.state) for j in job_ids}


def _launched(tmp_path: Path) -> tuple[Store, SchedulerPool, _Running, int, Path]:
    """One trial submitted as job ``40_0``; its attempt folder, started."""
    (tmp_path / "train.py").write_text("")
    yaml = tmp_path / "exp.yaml"
    yaml.write_text(YAML)
    store = Store(tmp_path / "home")
    backend = _Running()
    pool = SchedulerPool(
        local_root=tmp_path / "local",
        backends=BackendTable([Backend("local", lambda _r: backend)]),
    )
    launch(load_experiment(yaml, site="local", searchers=SearcherTable()), store, pool, record={})
    with store.read() as s:
        (trial,) = s.query(Trial).all()
        tid, run_dir = trial.id, Path(trial.run_dir)
    adir = attempt_dir(run_dir, "40_0.r0")
    EventWriter(adir, "worker-r0").publish([{"type": "start", "time": time.time(), "rank": 0}])
    _beat(adir, time.time())
    return store, pool, backend, tid, adir


def _beat(adir: Path, at: float) -> None:
    """A heartbeat written at ``at``: its age is read from the file's time stamp."""
    atomic_write_text(adir / HEARTBEAT_FILE, json.dumps({"time": at, "pid": 1}))
    os.utime(adir / HEARTBEAT_FILE, (at, at))


def _forge_exit(adir: Path) -> None:
    """What a training script can write into its own attempt folder: a clean exit and
    a best metric, while it goes on running."""
    EventWriter(adir, "user-r0").publish(
        [
            {"type": "metric", "time": time.time(), "step": 1, "metrics": {"loss": -1e9}},
            {"type": "exit", "time": time.time(), "code": 0, "reason": "completed"},
        ]
    )


def _trial(store: Store, tid: int) -> tuple[str, str]:
    with store.read() as s:
        t = s.get(Trial, tid)
        assert t is not None
        first = s.query(Attempt).filter_by(trial_id=tid).order_by(Attempt.id).first()
        assert first is not None
        return t.state, first.state


def test_a_forged_exit_does_not_end_a_running_trial(tmp_path: Path) -> None:
    store, pool, backend, tid, adir = _launched(tmp_path)
    tick(store, pool)
    assert _trial(store, tid) == ("RUNNING", "RUNNING")
    _forge_exit(adir)
    for _ in range(2):
        _beat(adir, time.time())  # its worker still beats: the job trains on
        report = tick(store, pool)
        assert report.errors == []
        assert _trial(store, tid) == ("RUNNING", "RUNNING")
    assert backend.cancelled == []
    assert kill_trial(store, pool, tid) == 1  # still reached by dlhpc kill
    assert backend.cancelled == ["40_0"]


def test_the_exit_is_final_once_the_scheduler_says_the_job_ended(tmp_path: Path) -> None:
    store, pool, backend, tid, adir = _launched(tmp_path)
    _forge_exit(adir)
    tick(store, pool)
    assert _trial(store, tid)[0] == "RUNNING"
    backend.state = JobState.COMPLETED
    tick(store, pool)
    assert _trial(store, tid) == ("COMPLETED", "COMPLETED")
    assert backend.cancelled == []


@pytest.mark.parametrize(
    ("code", "reason", "state"), [(0, "completed", "COMPLETED"), (1, "error", "PENDING")]
)
def test_a_job_that_hangs_after_its_exit_is_cancelled(
    tmp_path: Path, code: int, reason: str, state: str
) -> None:
    """Its worker stopped beating before it wrote the exit: once the heartbeat is
    stale, the exit is final and what is left of the job is cancelled (a crash:
    submitted again)."""
    store, pool, backend, tid, adir = _launched(tmp_path)
    EventWriter(adir, "worker-r0").publish(
        [{"type": "exit", "time": time.time(), "code": code, "reason": reason}]
    )
    _beat(adir, time.time() - HEARTBEAT_STALE.total_seconds() + 30)
    tick(store, pool)
    assert _trial(store, tid) == ("RUNNING", "RUNNING")
    _beat(adir, time.time() - HEARTBEAT_STALE.total_seconds() - 30)
    tick(store, pool)
    assert _trial(store, tid)[0] == state
    assert "40_0" in backend.cancelled
