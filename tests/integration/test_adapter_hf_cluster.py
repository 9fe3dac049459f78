"""The Hugging Face Trainer example under ASHA on the dev cluster: weak trials stopped at
their rung, the promoted one requeued mid-rung (its Trainer saves where TERM found it)
and resumed, ending with bitwise the weights and evaluation metrics of an uninterrupted
run (the logged training loss of the cut window excepted: see the example's README);
metrics in ``dlhpc status --json``.

Beside the search, one trial of the example with a bare ``trainer.train()`` is requeued
too: its Trainer cannot resume and trains again from step 0, which ``dlhpc status``
counts as lost steps, with the warning in the trial's events."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration._adapters import (
    ReferenceOnRequeue,
    asha_with_one_requeue,
    attempt_exits,
    checkpoint_dir,
    db_metrics,
    job_logs,
    trial_seed,
)
from tests.integration.conftest import Cli
from tests.unit._adapters import require
from tests.unit.test_integration_transformers import (
    _deterministic,
    _weights_sha,
    bare_train_example,
)

pytestmark = pytest.mark.cluster

HPARAMS = (
    "  lr: {type: log, minval: -3.5, maxval: -2}\n"
    "  hidden: 16\n  batch_size: 32\n  step_sleep: 0.2\n"  # ~3.2 s of sleep per epoch
)
# 4 trials train 2 epochs; the best one is promoted to 6 and requeued during epochs 4-5
SEARCHER = (
    "{name: asha, metric: eval_accuracy, smaller_is_better: false, max_trials: 4,"
    " max_length: 6, divisor: 3, max_rungs: 2, max_concurrent_trials: 4, seed: 2}"
)


class RequeueBare:
    """An ``each_tick``: launches one trial of the example with a bare ``trainer.train()``
    (3 epochs) and requeues it once, when it has reported an epoch and still runs."""

    def __init__(self, cli: Cli, tmp_path: Path) -> None:
        work = bare_train_example(tmp_path / "bare")
        (work / "exp.yaml").write_text(
            "name: hf-bare\nentrypoint: python train.py\n"
            "resources: {cpus_per_task: 1, mem: 2G, time: '00:15:00'}\n"
            "hyperparameters: {lr: 0.003, hidden: 16, batch_size: 32, step_sleep: 0.3}\n"
            "searcher: {name: single, metric: eval_accuracy, smaller_is_better: false,"
            " max_length: 3}\n"
            "reproducibility: {seed: 5, deterministic: true}\nmax_restarts: 2\n"
        )
        self.cli = cli
        self.exp_id = int(cli.json("launch", str(work / "exp.yaml"))["experiment_id"])
        self.requeued = False

    def __call__(self) -> None:
        if self.requeued:
            return
        for t in self.cli.experiment(self.exp_id)["trials"]:
            if t["state"] == "RUNNING" and 1 <= t["steps_completed"] < 3:
                job = t["slurm_job_ids"][-1]
                subprocess.run(["scontrol", "requeue", job], env=self.cli.env, check=True)
                self.requeued = True


def _first_attempts_checkpoint(cli: Cli, trial_id: int) -> int:
    """The newest checkpoint step the trial's first attempt published."""
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        (step,) = con.execute(
            "SELECT max(step) FROM checkpoints WHERE attempt_id ="
            " (SELECT min(id) FROM attempts WHERE trial_id = ?)",
            (trial_id,),
        ).fetchone()
        warnings = con.execute(
            "SELECT message FROM events WHERE trial_id = ? AND kind = 'log.warning'", (trial_id,)
        ).fetchall()
    finally:
        con.close()
    line = "trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)"
    assert [m for (m,) in warnings if line in m and f"(step {step})" in m], warnings
    return int(step)


def _check_bare(cli: Cli, bare: RequeueBare) -> None:
    """The bare ``train()`` trial: requeued once, trained again from step 0 to its end;
    ``dlhpc status`` counts the first attempt's checkpointed steps as lost."""
    assert bare.requeued, "the bare train() trial was not caught mid-run"
    exp = cli.tick_until(bare.exp_id, lambda e: e["state"] in TERMINAL)
    (t,) = exp["trials"]
    attempts: list[dict[str, Any]] = t["attempts"]
    assert t["state"] == "COMPLETED" and t["steps_completed"] == 3, json.dumps(t, indent=1)
    assert [a["cause"] for a in attempts] == ["requeued", "completed"], attempts
    step = _first_attempts_checkpoint(cli, int(t["id"]))
    assert step >= 16 and attempts[0]["lost_steps"] == step, (step, attempts)
    table = cli("status", str(bare.exp_id), COLUMNS="300").stdout
    assert f"requeued x1; {step} steps lost" in table, table


def test_hf_trainer_asha_requeued_trial_resumes_bitwise(cli: Cli, tmp_path: Path) -> None:
    require("transformers", "transformers", "accelerate", "tokenizers")
    bare = RequeueBare(cli, tmp_path)  # runs beside the search, on the same ticks
    reference = ReferenceOnRequeue(cli, tmp_path / "ref", "hf-trainer", 6)  # started on the requeue
    exp, victim = asha_with_one_requeue(
        cli, tmp_path, "hf-trainer", HPARAMS, SEARCHER, 3, on_requeue=reference, each_tick=bare
    )
    _check_bare(cli, bare)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    states = sorted(t["state"] for t in exp["trials"])
    assert states == ["COMPLETED"] + ["STOPPED_EARLY"] * 3, states
    (t,) = [t for t in exp["trials"] if t["id"] == victim]
    assert t["state"] == "COMPLETED" and t["steps_completed"] == 6
    causes = [a["cause"] for a in t["attempts"]]
    assert "requeued" in causes and causes[-1] == "completed", causes
    assert t["crashes"] == 0, job_logs(cli, exp["id"])  # what the crashed attempt said
    # the adapter saw TERM, saved where needed and exited for requeue itself
    assert ("requeued", 75) in attempt_exits(cli, victim), attempt_exits(cli, victim)
    assert 0.0 < t["best_metric"] <= 1.0  # eval_accuracy, reported by the callback
    page = tmp_path / "page.html"  # the report page has the curves and the other metrics
    cli("report", str(exp["id"]), "-o", str(page))
    assert "Other metrics recorded:" in page.read_text() and "eval_loss" in page.read_text()

    ((ref, proc),) = reference.runs  # the uninterrupted run, with the victim's hparams and seed
    assert ref.hparams == {**t["hparams"], "step_sleep": 0.0}, (ref.hparams, t)
    assert ref.seed == trial_seed(cli, victim)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    got = _weights_sha(checkpoint_dir(cli, exp["id"], victim))
    assert got == _weights_sha(ref.checkpoint_dir), "final weights differ"
    metrics = db_metrics(cli, victim)
    assert _deterministic(metrics) == _deterministic(ref.metrics())
    assert {"eval_accuracy", "eval_loss", "loss"} <= set(metrics[6])
