"""An adapter example's ASHA search on the dev cluster, one running trial requeued.

Shared by the Lightning and Hugging Face Trainer cluster tests: launch a copy of the
example, wait until a promoted trial is mid-rung, ``scontrol requeue`` its task (Slurm
stops it with TERM and queues it again), tick to the end, and hand back what the
test compares with an uninterrupted reference run (``tests/unit/_adapters.Trial``).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlhpc.protocol import checkpoint_trial_dir, recorded_slug
from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration.conftest import Cli
from tests.unit._adapters import EXAMPLES, Trial

__all__ = [
    "asha_with_one_requeue",
    "attempt_exits",
    "checkpoint_dir",
    "db_metrics",
    "job_logs",
    "trial_seed",
]


def _yaml(
    tmp_path: Path,
    example: str,
    hparams: str,
    searcher: str,
    prepare: Callable[[Path], None] | None = None,
) -> Path:
    work = tmp_path / example
    work.mkdir()
    shutil.copy(EXAMPLES / example / "train.py", work / "train.py")
    if prepare is not None:
        prepare(work)
    exp = work / "exp.yaml"
    exp.write_text(
        f"name: {example}-e2e\nentrypoint: python train.py\n"
        "resources: {cpus_per_task: 1, mem: 2G, time: '00:15:00'}\n"
        f"hyperparameters:\n{hparams}"
        f"searcher: {searcher}\n"
        "reproducibility: {seed: 5, deterministic: true}\n"
        "max_restarts: 2\n"
    )
    return exp


def asha_with_one_requeue(
    cli: Cli,
    tmp_path: Path,
    example: str,
    hparams: str,
    searcher: str,
    ready_at: int,
    timeout: float = 900,
    on_requeue: Callable[[dict[str, Any]], None] | None = None,
    each_tick: Callable[[], None] | None = None,
    prepare: Callable[[Path], None] | None = None,
) -> tuple[dict[str, Any], int]:
    """Run the search; requeue the first trial seen RUNNING with ``steps_completed``
    in ``[ready_at, ready_at + 2)`` (a promoted trial in its second rung), then call
    ``on_requeue`` with that trial's status (e.g. to start its uninterrupted reference
    run while the search goes on). ``each_tick`` is called after every tick (which
    ticks every experiment: one launched beside this search runs on); ``prepare`` may
    change the workdir (the example's ``train.py`` copied in) before the launch.
    Returns the final status and the requeued trial's id."""
    exp_yaml = _yaml(tmp_path, example, hparams, searcher, prepare)
    exp_id = cli.json("launch", str(exp_yaml))["experiment_id"]
    victim: int | None = None
    deadline = time.monotonic() + timeout
    while True:
        cli("tick", "-q")
        if each_tick is not None:
            each_tick()
        exp = cli.experiment(exp_id)
        if exp["state"] in TERMINAL:
            break
        if victim is None:
            for t in exp["trials"]:
                if t["state"] == "RUNNING" and ready_at <= t["steps_completed"] < ready_at + 2:
                    job = t["slurm_job_ids"][-1]
                    subprocess.run(["scontrol", "requeue", job], env=cli.env, check=True)
                    victim = int(t["id"])
                    if on_requeue is not None:
                        on_requeue(t)
                    break
        assert time.monotonic() < deadline, json.dumps(exp, indent=1)
        time.sleep(1)
    assert victim is not None, "no trial was caught mid-rung: " + json.dumps(exp, indent=1)
    return exp, victim


class ReferenceOnRequeue:
    """An ``on_requeue`` for :func:`asha_with_one_requeue`: starts the requeued trial's
    uninterrupted reference run (its hyperparameters without ``step_sleep``, its seed,
    ``length`` units) beside the search; :attr:`runs` holds it and its process."""

    def __init__(self, cli: Cli, folder: Path, example: str, length: int) -> None:
        self.cli, self.folder, self.example, self.length = cli, folder, example, length
        self.runs: list[tuple[Trial, subprocess.Popen[str]]] = []

    def __call__(self, trial: dict[str, Any]) -> None:
        ref = Trial(self.folder, self.example, {**trial["hparams"], "step_sleep": 0.0})
        ref.seed = trial_seed(self.cli, int(trial["id"]))
        self.runs.append((ref, ref.start(self.length)))


def trial_seed(cli: Cli, trial_id: int) -> int:
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        (seed,) = con.execute("SELECT seed FROM trials WHERE id = ?", (trial_id,)).fetchone()
    finally:
        con.close()
    return int(seed)


def attempt_exits(cli: Cli, trial_id: int) -> list[tuple[str, int | None]]:
    """(cause, exit code) of each of the trial's attempts, oldest first."""
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        rows = con.execute(
            "SELECT cause, exit_code FROM attempts WHERE trial_id = ? ORDER BY id", (trial_id,)
        ).fetchall()
    finally:
        con.close()
    return [(str(cause), code) for cause, code in rows]


def db_metrics(cli: Cli, trial_id: int) -> dict[int, dict[str, float]]:
    """The trial's metrics as dlhpc ingested them, by step."""
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        rows = con.execute(
            "SELECT step, name, value FROM metrics WHERE trial_id = ?", (trial_id,)
        ).fetchall()
    finally:
        con.close()
    out: dict[int, dict[str, float]] = {}
    for step, name, value in rows:
        out.setdefault(int(step), {})[name] = value
    return out


def checkpoint_dir(cli: Cli, exp_id: int, trial_id: int) -> Path:
    """The trial's checkpoint folder, named as dlhpc names it (``exp-<id>-<slug>``)."""
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        (run_dir,) = con.execute(
            "SELECT run_dir FROM experiments WHERE id = ?", (exp_id,)
        ).fetchone()
    finally:
        con.close()
    root = cli.home / "scratch" / "checkpoints"
    return checkpoint_trial_dir(root, exp_id, trial_id, recorded_slug(exp_id, run_dir))


def job_logs(cli: Cli, exp_id: int, tail: int = 3000) -> str:
    """The last ``tail`` characters of each of the experiment's job logs (stderr), for
    a failure message: what a crashed attempt printed."""
    out = []
    for err in sorted(cli.home.glob(f"runs/exp-{exp_id:06d}-*/jobs/*.err")):
        out.append(f"== {err.name}\n{err.read_text(errors='replace')[-tail:]}")
    return "\n".join(out)
