"""Two reconcilers started at the same moment: one submits, one exits quietly.

A round launches an experiment on the real local backend whose trials wait to be
submitted (the state a ``dlhpc launch`` leaves when it is killed after recording
the experiment, before submitting: :func:`launch` runs with ``submit_pending``
replaced by a no-op). Two ``dlhpc tick`` processes are then released together from
a pipe both block on, and the DB and the local backend's batch index say how many
submissions happened.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from dlhpc.config import load_experiment
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.scheduler import JobState, LocalScheduler
from dlhpc.search import SearcherTable
from dlhpc.store import Attempt, Store, Submission
from tests.stress._backend import REPO, write_experiment

# the module (the package exports its function under the same name)
launch_module = importlib.import_module("dlhpc.orchestrator.launch")
_SUBMITTED = re.compile(r"(\d+) submitted")
_HELD = "tick: another reconciler holds the lease; nothing to do"


@dataclass
class Round:
    outputs: list[tuple[int, str, str]]  # (exit code, stdout, stderr) per reconciler
    submissions: int  # submissions rows in the DB
    attempts_per_trial: list[int]
    local_batches: int  # batches the local backend received
    job_ids: list[str]

    @property
    def submitted_counts(self) -> list[int]:
        return [int(m[1]) if (m := _SUBMITTED.search(out)) else 0 for _, out, _ in self.outputs]

    @property
    def lease_held(self) -> int:
        return sum(out.strip() == _HELD for _, out, _ in self.outputs)


def pending_experiment(
    root: Path, trials: int, monkeypatch: pytest.MonkeyPatch, site: str = "local"
) -> Path:
    """A state folder with one experiment on ``site`` whose trials were never submitted."""
    home = root / "home"
    cfg = load_experiment(write_experiment(root, trials), site=site, searchers=SearcherTable())
    cfg = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, dir=root / "c"))
    store = Store(home)
    with monkeypatch.context() as m:
        m.setattr(launch_module, "submit_pending", lambda *_a, **_k: [])
        launch_module.launch(cfg, store, SchedulerPool(local_root=home / "local"), record={})
    store.close()
    return home


def race(
    home: Path, ready: Path, quiet: tuple[bool, bool], site: str = "local"
) -> list[tuple[int, str, str]]:
    """Two ``dlhpc tick`` processes released together; their (exit code, stdout, stderr)."""
    ready.mkdir()
    gate, release = os.pipe()
    env = {
        **os.environ,
        "DLHPC_HOME": str(home),
        "DLHPC_SITE": site,
        "PYTHONPATH": str(REPO),
        "STRESS_READY_DIR": str(ready),
        "STRESS_GATE_FD": str(gate),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.stress._reconciler", "tick", *(["-q"] if q else [])],
            cwd=REPO,
            env=env,
            pass_fds=(gate,),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for q in quiet
    ]
    os.close(gate)
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < len(procs) and time.monotonic() < deadline:
        time.sleep(0.02)  # both imported dlhpc and wait on the pipe
    os.write(release, b"x" * len(procs))
    os.close(release)
    outs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def count(home: Path) -> dict[str, Any]:
    store = Store(home)
    try:
        with store.read() as s:
            subs = s.scalar(select(func.count(Submission.id))) or 0
            per_trial = (
                s.execute(select(func.count(Attempt.id)).group_by(Attempt.trial_id)).scalars().all()
            )
            jobs = s.scalars(select(Attempt.job_id)).all()
    finally:
        store.close()
    batches = len(list((home / "local").glob("*.batch")))
    return {
        "submissions": subs,
        "attempts_per_trial": list(per_trial),
        "local_batches": batches,
        "job_ids": list(jobs),
    }


def wait_for_jobs(home: Path, job_ids: list[str], timeout_s: float = 120) -> None:
    """Let the local jobs (``true``) end, so nothing writes into the folder afterwards."""
    sched = LocalScheduler(home / "local")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = sched.poll(job_ids)
        if all(st.state.is_terminal or st.state == JobState.UNKNOWN for st in states.values()):
            return
        time.sleep(0.2)


def race_round(root: Path, trials: int, quiet: tuple[bool, bool], mp: pytest.MonkeyPatch) -> Round:
    home = pending_experiment(root, trials, mp)
    outputs = race(home, root / "ready", quiet)
    c = count(home)
    wait_for_jobs(home, c["job_ids"])
    return Round(outputs, **c)
