"""A plain argparse script (zero dlhpc lines) under ASHA on the real dev Slurm cluster.

templates/examples/argparse: the entrypoint template fills each trial's values as
arguments, metrics come from stdout through the declared pattern, the script's own
checkpoints are registered and passed back as ``--resume``. Weak trials end
STOPPED_EARLY; a promoted trial is requeued (``scontrol requeue``: TERM, forwarded to
the script) while it trains, resumes from its checkpoint, and its weights after every
epoch equal those of the same script run in one go by hand (no dlhpc at all).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.protocol.checkpoint import list_checkpoints
from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration._reference import seed_of
from tests.integration.conftest import REPO, Cli

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "templates" / "examples" / "argparse"
EPOCHS = 4
SEARCHER = (
    "searcher: {name: asha, metric: val_accuracy, smaller_is_better: false, max_trials: 4,"
    f" max_length: {EPOCHS}, divisor: 2, max_rungs: 2, max_concurrent_trials: 4, seed: 3}}\n"
)
_SHA = re.compile(r"^epoch (\d+) weights sha256 ([0-9a-f]{64})$", re.M)


def _experiment(tmp_path: Path) -> Path:
    """The example with a slower step (so the requeue lands mid-training) and 4 trials."""
    d = tmp_path / "argparse"
    d.mkdir()
    shutil.copy(EXAMPLE / "train.py", d / "train.py")
    text = (EXAMPLE / "asha.yaml").read_text()
    head, tail = text[: text.index("searcher:")], text[text.index("# The script prints") :]
    head = head.replace("--resume {checkpoint}", "--resume {checkpoint} --step-sleep {step_sleep}")
    # 23 steps of 0.3 s: an epoch takes about 7 s, the window for the requeue
    head = head.replace("vals: [32, 64, 128]}\n", "vals: [64]}\n  step_sleep: 0.3\n")
    (d / "exp.yaml").write_text(head + SEARCHER + tail)
    return d / "exp.yaml"


def _requeue_a_promoted_trial(
    cli: Cli, exp_id: int, timeout: float = 400
) -> tuple[dict[str, Any], Path]:
    """Wait for a promoted trial to print epoch 3 (read from its job log: no tick latency)
    and for the runner to register epoch 3's file (published in the trial's checkpoint
    folder), then requeue it mid-epoch 4. Returns the trial and its job's log (the
    requeued task logs to the same file)."""
    (jobs,) = cli.home.glob(f"runs/exp-{exp_id:06d}*/jobs")  # exp-<id>-<slug>
    deadline = time.monotonic() + timeout
    victim: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        if victim is None:
            cli("tick", "-q")
            exp = cli.experiment(exp_id)
            assert exp["state"] not in TERMINAL, json.dumps(exp, indent=1)
            running = [
                t for t in exp["trials"] if t["state"] == "RUNNING" and t["target_length"] == EPOCHS
            ]
            victim = running[0] if running else None
        if victim is not None:
            job = victim["slurm_job_ids"][-1]
            log = jobs / f"{job}_0_log.out"
            trial_ckpts = cli.home.glob(
                f"scratch/checkpoints/exp-{exp_id:06d}*/trial-{victim['id']:06d}"
            )
            printed = log.exists() and "epoch 3 weights" in log.read_text()
            if printed and any(c.step == 3 for d in trial_ckpts for c in list_checkpoints(d)):
                subprocess.run(["scontrol", "requeue", job], env=cli.env, check=True)
                return victim, log
        time.sleep(0.2)
    raise AssertionError(json.dumps(cli.experiment(exp_id), indent=1))


def _start_reference(tmp_path: Path, hparams: dict[str, Any], seed: int) -> subprocess.Popen[str]:
    """The example run in one go by hand (no dlhpc), started now beside the trial's jobs
    (at their priority: a niced one starves on a loaded machine): :func:`_reference_shas`
    reads its result."""
    argv = [sys.executable, str(EXAMPLE / "train.py"), "--epochs", str(EPOCHS)]
    argv += ["--seed", str(seed), "--ckpt-dir", str(tmp_path / "ref-ckpt")]
    for name in ("lr", "hidden", "dropout", "batch_size"):
        argv += [f"--{name.replace('_', '-')}", str(hparams[name])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as in the job (cpus_per_task: 1)
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _reference_shas(proc: subprocess.Popen[str]) -> dict[int, str]:
    """The example's weights after each epoch, from :func:`_start_reference`'s run."""
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return {int(n): sha for n, sha in _SHA.findall(out)}


def test_plain_argparse_script_under_asha_is_stopped_promoted_requeued_and_resumed_exactly(
    cli: Cli, tmp_path: Path
) -> None:
    exp_id = cli.json("launch", str(_experiment(tmp_path)))["experiment_id"]
    victim, promoted_log = _requeue_a_promoted_trial(cli, exp_id)
    ref_run = _start_reference(tmp_path, victim["hparams"], seed_of(cli, victim["id"]))
    exp = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL, timeout=500)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    states = sorted(t["state"] for t in exp["trials"])
    assert "STOPPED_EARLY" in states and "COMPLETED" in states, states
    for t in exp["trials"]:  # metrics from the stdout pattern, in status --json
        assert t["best_metric"] is not None and 0.0 <= t["latest_metric"] <= 1.0, t
        assert t["steps_completed"] >= 2, t
    page = tmp_path / "page.html"  # and on the report page
    cli("report", str(exp_id), "-o", str(page))
    assert "val_accuracy" in page.read_text()
    (t,) = [t for t in exp["trials"] if t["id"] == victim["id"]]
    assert t["state"] == "COMPLETED" and t["steps_completed"] == EPOCHS, t
    causes = [a["cause"] for a in t["attempts"]]
    # other jobs on the shared dev cluster may preempt any attempt too: more causes then
    assert "paused" in causes and "requeued" in causes and causes[-1] == "completed", causes
    assert t["crashes"] == 0, t

    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        paths = con.execute(
            "SELECT log_path FROM attempts WHERE trial_id = ? ORDER BY id", (t["id"],)
        ).fetchall()
        ckpts = con.execute(
            "SELECT step FROM checkpoints WHERE trial_id = ? ORDER BY step", (t["id"],)
        ).fetchall()
    finally:
        con.close()
    # a requeued array task logs to the same file (its attempt row has no log path of its own)
    logs = [Path(p).read_text() for p in dict.fromkeys(p for (p,) in paths if p)]
    assert str(promoted_log) in {p for (p,) in paths}, paths
    promoted = promoted_log.read_text()  # promoted (resumed at 2), requeued, resumed at 3
    assert promoted.index("resumed at epoch 2") < promoted.index("resumed at epoch 3"), promoted
    assert {s for (s,) in ckpts} >= {2, 3}, ckpts  # the script's files, registered
    # every epoch's weights, across all attempts, equal the uninterrupted run's
    assert t["hparams"] == victim["hparams"], (t, victim)  # what the reference ran with
    ref = _reference_shas(ref_run)
    seen = [(int(n), sha) for log in logs for n, sha in _SHA.findall(log)]
    assert {n for n, _ in seen} == set(range(1, EPOCHS + 1)), seen
    for n, sha in seen:
        assert sha == ref[n], f"epoch {n}: {sha} != {ref[n]} (uninterrupted)"
