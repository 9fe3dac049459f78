"""The stress tests' scheduler backend and their experiment (see _stress.py).

:class:`StressBackend`, registered as ``stress`` the way the simulator registers
``sim``, hands out job ids at launch and reports every job RUNNING, so that
reconcilers neither resubmit nor end trials: the writers, not a scheduler, decide
what exists on disk. Everything else is dlhpc's own code.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from dlhpc.config import load_experiment
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.protocol import TrialSpec
from dlhpc.scheduler import BaseScheduler, JobRequest, JobState, JobStatus, SubmittedTask
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.search import SearcherTable
from dlhpc.store import Attempt, Store, Trial

REPO = Path(__file__).resolve().parents[2]
LEDGER = "ledger.txt"  # in the trial folder, which the reconciler does not read


class StressBackend(BaseScheduler):
    """Job ids at submission; every job RUNNING, but those in ``ended`` (COMPLETED);
    cancels are counted."""

    name = "stress"

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.ended: set[str] = set()  # job ids a test says ended

    def render(self, request: JobRequest) -> list[str]:
        return [f"# stress array of {len(request.trial_dirs)} task(s)\n"]

    def submit(self, request: JobRequest) -> list[SubmittedTask]:
        array = f"{request.experiment_id}{int(time.time() * 1000) % 10**6:06d}"
        return [
            SubmittedTask(Path(d), f"{array}_{i}", request.folder / f"{array}_{i}.out", None)
            for i, d in enumerate(request.trial_dirs)
        ]

    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        state = {True: JobState.COMPLETED, False: JobState.RUNNING}
        return {j: JobStatus(j, state[j in self.ended]) for j in job_ids}

    def cancel(self, job_ids: Collection[str]) -> None:
        self.cancelled.extend(job_ids)

    def log_paths(self, folder: Path, job_id: str) -> list[Path]:
        return [folder / f"{job_id}.out"]


#: The backend descriptor (``$DLHPC_SCHEDULERS=stress=tests.stress._backend:BACKEND``).
BACKEND = Backend("stress", lambda _root: StressBackend())


def stress_pool(home: Path) -> SchedulerPool:
    return SchedulerPool(local_root=home / "local", backends=BackendTable().with_backend(BACKEND))


def write_experiment(folder: Path, trials: int, backend_hint: str = "") -> Path:
    """A grid experiment of ``trials`` trials whose searcher never ends them."""
    work = folder / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text("print('never run by the stress test')\n")
    yaml = folder / "exp.yaml"
    yaml.write_text(
        f'name: stress{backend_hint}\nworkdir: work\nentrypoint: "true"\n'
        "resources: {cpus_per_task: 1, mem: 100M, time: '00:10:00'}\n"
        f"hyperparameters:\n  i: {{type: int, minval: 0, maxval: {trials - 1}, count: {trials}}}\n"
        "searcher: {name: grid, metric: loss, smaller_is_better: true, max_length: 1000000}\n"
    )
    return yaml


@dataclass(frozen=True)
class TrialRun:
    trial_id: int
    trial_dir: Path
    attempt_dir: Path
    checkpoint_root: Path


def launch_stress(root: Path, trials: int) -> tuple[Path, list[TrialRun]]:
    """The state folder and its trials, launched by the real ``launch`` onto the
    stress backend (the reproducibility record is skipped: it is not under test)."""
    home = root / "home"
    cfg = load_experiment(write_experiment(root, trials), site="local", searchers=SearcherTable())
    cfg = dataclasses.replace(
        cfg,
        backend="stress",  # a backend only this test knows
        checkpoint=dataclasses.replace(cfg.checkpoint, dir=root / "checkpoints"),
    )
    store = Store(home)
    try:
        launch(cfg, store, stress_pool(home), record={})
        with store.read() as s:
            rows = s.execute(
                select(Trial.id, Trial.run_dir, Attempt.attempt_key)
                .join(Attempt, Attempt.trial_id == Trial.id)
                .order_by(Trial.id)
            ).all()
    finally:
        store.close()
    runs = [
        TrialRun(
            t,
            Path(d),
            Path(d) / "attempts" / k,
            Path(TrialSpec.read(Path(d) / "trial.json").checkpoint_dir),
        )
        for t, d, k in rows
    ]
    assert len(runs) == trials, f"launch made {len(runs)} trials, not {trials}"
    return home, runs
