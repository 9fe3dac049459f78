"""A Determined Core API script, unmodified, on the real dev Slurm cluster.

The example's Determined config is translated by ``dlhpc convert determined``; the
converted ASHA search runs the script through the stand-in ``determined`` package:
weak trials pause at their rung and are stopped, promoted ones resume from the
checkpoint they published through ``core_context.checkpoint.store_path``, a
higher-priority job preempts the running trials (``preempt.should_preempt()`` turns
true, the script checkpoints and returns, the stand-in exits for requeue) and they
resume from ``info.latest_checkpoint``. Every preempted trial's newest checkpoint
holds bitwise the weights of the same trial trained without interruption, and the
metrics are in ``dlhpc status --json``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.protocol import TrialSpec
from dlhpc.protocol.checkpoint import latest_verified, list_checkpoints
from tests.integration._reference import hog_argv, seed_of
from tests.integration.conftest import REPO, Cli

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "templates" / "examples" / "determined-core"
MAX_LENGTH = 40  # batches; rungs of 20 and 40
RUNG = MAX_LENGTH // 2


def _determined_config(tmp_path: Path) -> Path:
    """The example's Determined config, smaller: 6 trials, rungs of 20 and 40 batches,
    a checkpoint every 5, 1.5 s per batch (the preemption must land while trials train,
    on a loaded machine where Slurm may take seconds to preempt)."""
    work = tmp_path / "det"
    work.mkdir()
    shutil.copy(EXAMPLE / "train.py", work / "train.py")
    text = (EXAMPLE / "determined.yaml").read_text()
    for old, new in (
        ("batches: 80", f"batches: {MAX_LENGTH}"),
        ("checkpoint_every: 10", "checkpoint_every: 5"),
        ("max_trials: 8", "max_trials: 6"),
        ("max_rungs: 3", "max_rungs: 2"),
        ("step_sleep: 0.02", "step_sleep: 1.5"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    (work / "determined.yaml").write_text(text)
    return work / "determined.yaml"


def _exp_ckpts(cli: Cli, exp_id: int) -> Path | None:
    """The experiment's checkpoint folder (``exp-<id>`` or ``exp-<id>-<slug>``), once made."""
    found = sorted((cli.home / "scratch" / "checkpoints").glob(f"exp-{exp_id:06d}*"))
    return found[0] if found else None


def _ckpt_root(cli: Cli, exp_id: int, trial_id: int) -> Path:
    root = _exp_ckpts(cli, exp_id)
    assert root is not None
    return root / f"trial-{trial_id:06d}"


def _wait_for_training(cli: Cli, exp_id: int, timeout: float = 240) -> None:
    """Wait until a trial of the first wave (submitted by the launch) has published a
    checkpoint and is still short of its grant: it trains for many seconds more. Reads
    the checkpoint folders (fast) rather than ticking (seconds per pass under load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        root = _exp_ckpts(cli, exp_id)
        for trial in root.glob("trial-*") if root is not None else []:
            if any(5 <= c.step < RUNG for c in list_checkpoints(trial)):
                return
        time.sleep(0.2)
    raise AssertionError(json.dumps(cli.experiment(exp_id), indent=1))


def _log(out_path: str) -> str:
    """An attempt's stdout and stderr (the script logs to stderr), as far as written."""
    out = Path(out_path)
    err = out.with_name(out.name.replace(".out", ".err"))
    return "".join(p.read_text(errors="replace") for p in (out, err) if p.exists())


def _reference_weights(tmp_path: Path, trial: dict[str, Any], seed: int, batches: int) -> Any:
    """The model after ``batches`` batches trained in one go (a plain process)."""
    import torch

    ref = tmp_path / f"ref-{trial['id']}"
    (ref / "code").mkdir(parents=True)
    shutil.copy(EXAMPLE / "train.py", ref / "code" / "train.py")
    TrialSpec(
        experiment_id=0,
        trial_id=int(trial["id"]),
        hparams={**trial["hparams"], "step_sleep": 0.0},
        max_length=batches,
        seed=seed,
        experiment_dir=str(ref),
        code_dir=str(ref / "code"),
        entry_script="",
        checkpoint_dir=str(ref / "ckpt"),
        metric="val_loss",
        smaller_is_better=True,
    ).write(ref / "trial.json")
    env = {**os.environ, "DLHPC_TRIAL_DIR": str(ref), "DLHPC_ATTEMPT_DIR": str(ref / "a")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "dlhpc.integrations.determined", sys.executable, "train.py"]
    proc = subprocess.run(cmd, cwd=ref / "code", env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ckpt, _ = latest_verified(ref / "ckpt")
    assert ckpt is not None
    return torch.load(ckpt.path / "state.pt", weights_only=True)


def test_a_core_api_script_under_converted_asha_with_preemption(cli: Cli, tmp_path: Path) -> None:
    import torch

    det_yaml = _determined_config(tmp_path)
    out = tmp_path / "det" / "asha.yaml"
    cli("convert", "determined", str(det_yaml), "--slot-type", "cpu", "-o", str(out))
    assert out.read_text().startswith("# Converted by `dlhpc convert determined`")
    exp_id = cli.json("launch", str(out))["experiment_id"]
    _wait_for_training(cli, exp_id)
    hog = subprocess.run(
        hog_argv(15), env=cli.env, capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        exp = cli.tick_until(exp_id, lambda e: e["state"] != "ACTIVE", timeout=600)
    finally:
        subprocess.run(["scancel", hog], env=cli.env, check=False)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    trials = exp["trials"]
    states = [t["state"] for t in trials]
    assert len(trials) == 6 and "STOPPED_EARLY" in states and "COMPLETED" in states, states
    for t in trials:  # metrics reached dlhpc: the searcher's and the training ones
        assert t["best_metric"] is not None and t["steps_completed"] >= RUNG, t
        assert t["crashes"] == 0, t
    promoted = [t for t in trials if t["state"] == "COMPLETED"]  # the top half of rung 1
    assert len(promoted) == 3 and all(t["steps_completed"] == MAX_LENGTH for t in promoted)
    stopped = [t for t in trials if t["state"] == "STOPPED_EARLY"]
    assert all(t["steps_completed"] == RUNG for t in stopped), stopped

    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        names = {r[0] for r in con.execute("SELECT DISTINCT name FROM metrics")}
        attempts = con.execute(
            "SELECT trial_id, cause, log_path FROM attempts ORDER BY id"
        ).fetchall()
    finally:
        con.close()
    assert names == {"val_loss", "train_loss"}, names
    page = tmp_path / "page.html"  # the report page has the curves and the other metrics
    cli("report", str(exp_id), "-o", str(page))
    assert "Other metrics recorded: train_loss" in page.read_text()
    preempted = sorted({tid for tid, cause, _ in attempts if cause == "preempted"})
    assert preempted, attempts
    logs = [_log(log) for tid, _, log in attempts if tid in preempted and log]
    assert any("resumed at batch" in text for text in logs), logs  # from latest_checkpoint

    by_id = {t["id"]: t for t in trials}
    for tid in preempted:  # bitwise the weights of an uninterrupted run
        ckpt, _ = latest_verified(_ckpt_root(cli, exp_id, tid))
        assert ckpt is not None
        got = torch.load(ckpt.path / "state.pt", weights_only=True)
        want = _reference_weights(tmp_path, by_id[tid], seed_of(cli, tid), got["batches"])
        assert got["batches"] == want["batches"]
        for name, tensor in want["model"].items():
            assert torch.equal(tensor, got["model"][name]), (tid, name)
