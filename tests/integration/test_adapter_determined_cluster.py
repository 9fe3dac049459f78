"""Determined Core API scripts, unmodified, on the real dev Slurm cluster.

Determined's own Core API tutorial (``tests/data/determined-core-api-tutorial``, v0.38.1):
stages 0-4, the scripts unchanged, each config through ``dlhpc convert determined`` with
only ``resources.slots_per_trial`` fitted to the cluster, launched together and ticked
together. Stage 4 runs its own launcher once per node (two nodes of two slots), which
starts a worker per slot through ``determined.launch.wrap_rank``.

The example's (``templates/examples/determined-core``) Determined config is
translated by ``dlhpc convert determined``; the converted ASHA search runs the script
through the stand-in ``determined`` package: weak trials pause at their rung and are
stopped, promoted ones resume from the checkpoint they published through
``core_context.checkpoint.store_path``, a higher-priority job preempts the running
trials (``preempt.should_preempt()`` turns true, the script checkpoints and returns, the
stand-in exits for requeue) and they resume from ``info.latest_checkpoint``. Every
preempted trial's newest checkpoint holds bitwise the weights of the same trial trained
without interruption, and the metrics are in ``dlhpc status --json``.
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
TUTORIAL = REPO / "tests" / "data" / "determined-core-api-tutorial"
STAGES = ("0_start", "1_metrics", "2_checkpoints", "3_hpsearch", "4_distributed")
MAX_LENGTH = 40  # batches; rungs of 20 and 40
RUNG = MAX_LENGTH // 2
EVERY = 2  # batches between checkpoints (and preemption checks)


def _determined_config(tmp_path: Path) -> Path:
    """The example's Determined config, smaller: 6 trials all at once (two waves: rung 1,
    then the promoted half), rungs of 20 and 40 batches, a checkpoint every 2, 0.75 s per
    batch: the preemption must land while trials train (13.5 s from the first checkpoint
    to the rung, on a loaded machine where Slurm may take seconds to preempt), and the
    script must see ``should_preempt()`` (1.5 s between checks) well within the
    harness's poll grace, so that it checkpoints and returns."""
    work = tmp_path / "det"
    work.mkdir()
    shutil.copy(EXAMPLE / "train.py", work / "train.py")
    text = (EXAMPLE / "determined.yaml").read_text()
    for old, new in (
        ("batches: 80", f"batches: {MAX_LENGTH}"),
        ("checkpoint_every: 10", f"checkpoint_every: {EVERY}"),
        ("max_trials: 8", "max_trials: 6"),
        ("max_concurrent_trials: 4", "max_concurrent_trials: 6"),
        ("max_rungs: 3", "max_rungs: 2"),
        ("step_sleep: 0.02", "step_sleep: 0.75"),
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
            if any(EVERY <= c.step < RUNG for c in list_checkpoints(trial)):
                return
        time.sleep(0.2)
    raise AssertionError(json.dumps(cli.experiment(exp_id), indent=1))


def _preempt_all(cli: Cli, timeout: float = 240) -> None:
    """Preempt every running trial: a high-priority job that needs both whole nodes
    starts only once Slurm has requeued all of them; it is cancelled as soon as it
    runs (the preemption is over then; holding the nodes longer proves nothing)."""
    argv = hog_argv(60)
    hog = subprocess.run(argv, env=cli.env, capture_output=True, text=True, check=True)
    job = hog.stdout.strip()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T"], env=cli.env, capture_output=True, text=True
            )
            if out.returncode == 0 and out.stdout.strip() not in ("", "PENDING"):
                return  # RUNNING (or COMPLETING, ...): the trials are off the nodes
            time.sleep(0.2)
        raise AssertionError(f"the preempting job {job} did not start in {timeout:g}s")
    finally:
        subprocess.run(["scancel", job], env=cli.env, check=False)


def _log(out_path: str) -> str:
    """An attempt's stdout and stderr (the script logs to stderr), as far as written."""
    out = Path(out_path)
    err = out.with_name(out.name.replace(".out", ".err"))
    return "".join(p.read_text(errors="replace") for p in (out, err) if p.exists())


def _reference_weights(
    tmp_path: Path, runs: list[tuple[dict[str, Any], int, int]]
) -> dict[int, Any]:
    """The model of each ``(trial, seed, batches)`` after ``batches`` batches trained in
    one go: plain processes, side by side. Returns the states by trial id."""
    import torch

    procs: dict[int, tuple[Path, subprocess.Popen[str]]] = {}
    for trial, seed, batches in runs:
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
        proc = subprocess.Popen(
            cmd,
            cwd=ref / "code",
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs[int(trial["id"])] = (ref, proc)
    states: dict[int, Any] = {}
    for tid, (ref, proc) in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        ckpt, _ = latest_verified(ref / "ckpt")
        assert ckpt is not None
        states[tid] = torch.load(ckpt.path / "state.pt", weights_only=True)
    return states


def test_a_core_api_script_under_converted_asha_with_preemption(cli: Cli, tmp_path: Path) -> None:
    import torch

    det_yaml = _determined_config(tmp_path)
    out = tmp_path / "det" / "asha.yaml"
    cli("convert", "determined", str(det_yaml), "--slot-type", "cpu", "-o", str(out))
    assert out.read_text().startswith("# Converted by `dlhpc convert determined`")
    exp_id = cli.json("launch", str(out))["experiment_id"]
    _wait_for_training(cli, exp_id)
    _preempt_all(cli)
    exp = cli.tick_until(exp_id, lambda e: e["state"] != "ACTIVE", timeout=600)
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
    # the script saw should_preempt(), checkpointed and returned: not ended by the watchdog
    assert any("stopped (TERM): exiting for requeue" in text for text in logs), logs
    assert not any("did not poll" in text for text in logs), logs

    by_id = {t["id"]: t for t in trials}
    gots: dict[int, Any] = {}
    for tid in preempted:
        ckpt, _ = latest_verified(_ckpt_root(cli, exp_id, tid))
        assert ckpt is not None
        gots[tid] = torch.load(ckpt.path / "state.pt", weights_only=True)
    runs = [(by_id[tid], seed_of(cli, tid), got["batches"]) for tid, got in gots.items()]
    wants = _reference_weights(tmp_path, runs)
    assert set(wants) == set(gots) == set(preempted)
    for tid, got in gots.items():  # bitwise the weights of an uninterrupted run
        want = wants[tid]
        assert got["batches"] == want["batches"]
        for name, tensor in want["model"].items():
            assert torch.equal(tensor, got["model"][name]), (tid, name)


def test_determineds_core_api_tutorial_runs_unchanged(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "tutorial"
    shutil.copytree(TUTORIAL, work)
    stage4 = work / "4_distributed.yaml"  # 8 slots -> 2 nodes of 2 (the dev cluster's CPUs)
    stage4.write_text(stage4.read_text().replace("slots_per_trial: 8", "slots_per_trial: 4"))
    ids = {}
    for stage in STAGES:
        out = tmp_path / f"{stage}.dlhpc.yaml"
        cli("convert", "determined", str(work / f"{stage}.yaml"), "--slot-type", "cpu",
            "--slots-per-node", "2", "-o", str(out))  # fmt: skip
        ids[stage] = cli.json("launch", str(out))["experiment_id"]
    last = ids["3_hpsearch"]  # the longest: ten trials, all at once
    cli.tick_until(last, lambda e: e["state"] != "ACTIVE", timeout=600)
    exps = {stage: cli.tick_until(i, lambda e: e["state"] != "ACTIVE") for stage, i in ids.items()}
    for stage, exp in exps.items():
        assert exp["state"] == "COMPLETED", (stage, json.dumps(exp, indent=1))
        assert all(t["crashes"] == 0 for t in exp["trials"]), (stage, exp["trials"])
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        last_x = dict(  # each trial's newest validation x
            con.execute(
                "SELECT trial_id, value FROM metrics m WHERE name = 'x' AND step ="
                " (SELECT MAX(step) FROM metrics WHERE trial_id = m.trial_id AND name = 'x')"
            ).fetchall()
        )
        logs = dict(con.execute("SELECT trial_id, log_path FROM attempts").fetchall())
    finally:
        con.close()
    (start,) = exps["0_start"]["trials"]
    assert start["state"] == "COMPLETED"
    for stage in ("1_metrics", "2_checkpoints"):  # x counts the 100 batches
        (trial,) = exps[stage]["trials"]
        assert last_x[trial["id"]] == 100 and trial["steps_completed"] == 100, trial
    search = exps["3_hpsearch"]["trials"]
    assert len(search) == 10 and any(t["state"] == "COMPLETED" for t in search), search
    for t in search:  # x grows by increment_by per batch
        assert last_x[t["id"]] == t["hparams"]["increment_by"] * t["steps_completed"], t
    (dist,) = exps["4_distributed"]["trials"]  # each batch adds the 4 workers' increment_by
    assert dist["steps_completed"] == 100, dist
    assert last_x[dist["id"]] == 100 * 4 * dist["hparams"]["increment_by"], dist
    node_logs = [_log(logs[dist["id"]].replace("_0_log.", f"_{n}_log.")) for n in (0, 1)]
    for node, text in enumerate(node_logs):  # each node's launcher started its 2 workers
        for rank in (2 * node, 2 * node + 1):
            assert f"[rank={rank}] INFO" in text, (node, text[-3000:])
