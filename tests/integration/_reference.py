"""Uninterrupted references for the digits example, and where a run's results lie.

A trial that was preempted, requeued or timed out must end with the same weights,
bit for bit, as the same trial trained in one go. :func:`reference_shas` trains
each trial once as a plain process (no Slurm, no dlhpc job, ``step_sleep`` 0) from
a :class:`~dlhpc.protocol.TrialSpec` with the trial's hyperparameters, seed and
``max_length``, and returns the sha256 of its final weights.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dlhpc.protocol import TrialSpec
from tests.integration.conftest import REPO, Cli

__all__ = [
    "DIGITS",
    "PLANNED_EXIT_NOISE",
    "References",
    "final_sha",
    "logs_of",
    "reference_sha",
    "reference_shas",
    "seed_of",
    "start_references",
]

DIGITS = REPO / "templates" / "examples" / "digits"


def _spec_and_env(
    workdir: Path, trial: Mapping[str, Any], epochs: int, seed: int
) -> tuple[Path, dict[str, str]]:
    tdir = workdir / f"ref-{trial['id']}"
    TrialSpec(
        experiment_id=0,
        trial_id=int(trial["id"]),
        hparams={**trial["hparams"], "step_sleep": 0.0},
        max_length=epochs,
        seed=seed,
        experiment_dir=str(workdir),
        code_dir=str(DIGITS),
        entry_script="",
        checkpoint_dir=str(workdir / f"ref-ckpt-{trial['id']}"),
        metric="val_accuracy",
        smaller_is_better=False,
        deterministic=True,
    ).write(tdir / "trial.json")
    env = {**os.environ, "DLHPC_TRIAL_DIR": str(tdir), "DLHPC_ATTEMPT_DIR": str(tdir / "a")}
    env.setdefault("OMP_NUM_THREADS", "1")
    return workdir / f"ref-ckpt-{trial['id']}" / "final_weights.sha256", env


class References:
    """Plain-process reference runs in flight; :meth:`wait` collects their shas."""

    def __init__(self, procs: list[tuple[int, Path, subprocess.Popen[bytes]]]) -> None:
        self.procs = procs

    def wait(self, timeout: float = 300) -> dict[int, str]:
        out: dict[int, str] = {}
        for trial_id, sha_file, proc in self.procs:
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise AssertionError(f"reference run of trial {trial_id} failed:\n{err.decode()}")
            out[trial_id] = sha_file.read_text().strip()
        return out


def start_references(
    workdir: Path,
    trials: Iterable[Mapping[str, Any]],
    epochs: int,
    seeds: Mapping[int, int],
    niceness: int = 0,
) -> References:
    """Start the reference runs of ``trials`` (``{"id", "hparams"}``) side by side,
    ``niceness`` lower in priority (so that they can run beside a test's jobs)."""
    procs: list[tuple[int, Path, subprocess.Popen[bytes]]] = []
    for trial in trials:
        sha_file, env = _spec_and_env(workdir, trial, epochs, seeds[int(trial["id"])])
        proc = subprocess.Popen(
            [sys.executable, "train.py"],
            cwd=DIGITS,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=(lambda: os.nice(niceness)) if niceness else None,
        )
        procs.append((int(trial["id"]), sha_file, proc))
    return References(procs)


def reference_shas(
    workdir: Path, trials: Iterable[Mapping[str, Any]], epochs: int, seeds: Mapping[int, int]
) -> dict[int, str]:
    """Final-weights sha of each trial (``{"id", "hparams"}``) trained without
    interruption; the plain processes run side by side."""
    return start_references(workdir, trials, epochs, seeds).wait()


def reference_sha(workdir: Path, trial: Mapping[str, Any], epochs: int, seed: int) -> str:
    """Final-weights sha of one trial trained without interruption (a plain process)."""
    return reference_shas(workdir, [trial], epochs, {int(trial["id"]): seed})[int(trial["id"])]


def seed_of(cli: Cli, trial_id: int) -> int:
    """The seed dlhpc gave the trial (``trials.seed``)."""
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        (seed,) = con.execute("SELECT seed FROM trials WHERE id = ?", (trial_id,)).fetchone()
    finally:
        con.close()
    return int(seed)


def final_sha(cli: Cli, exp_id: int, trial_id: int) -> str:
    """The sha the trial's script wrote next to its checkpoints when it finished."""
    folder = Path(cli.experiment(exp_id)["run_dir"]).name  # checkpoints: the same name
    path = cli.home / "scratch" / "checkpoints" / folder / f"trial-{trial_id:06d}"
    return (path / "final_weights.sha256").read_text().strip()


def hog_argv(sleep_s: int) -> list[str]:
    """``sbatch`` of a job on the high partition that needs both whole nodes, so it
    preempts (requeues) whatever runs on the debug partition."""
    return [
        "sbatch",
        "--parsable",
        "-p",
        "high",
        "-N2",
        "--exclusive",
        "-t",
        "2",
        "--job-name=chaos-hog",
        "--output=/dev/null",
        "--wrap",
        f"sleep {sleep_s}",
    ]


#: What a planned exit (75: checkpointed for a requeue) must not leave in a job's log.
PLANNED_EXIT_NOISE = ("Traceback", "triggered an exception", "srun: error")


def logs_of(cli: Cli, trial_id: int, key: str | None = None) -> tuple[str, str]:
    """(stdout, stderr) of the trial's attempt ``key`` (None: its latest) as ``dlhpc logs``
    prints them. A job that Slurm requeued under its own id holds all its runs."""
    extra = ["--attempt", key] if key else []
    out = cli("logs", str(trial_id), *extra).stdout
    err = cli("logs", str(trial_id), "--stderr", *extra).stdout
    return out, err
