"""DeepSpeed across the allocation on the dev cluster: 2 nodes x 2 tasks, ZeRO-2 on CPU/gloo.

The deepspeed-lm example runs as 4 ranks; every rank sees world size 4 and the
first node as the rendezvous host; a high-priority job preempts it mid-run;
all ranks checkpoint together, the job is requeued, resumes from the
manifest-committed sharded checkpoint and ends bitwise where an uninterrupted
run (4 local processes on this host, same seed) ends: same final weights
(sha256), train_loss and val_loss.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.protocol import TrialSpec
from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration.conftest import REPO, Cli

pytestmark = pytest.mark.cluster

DSLM = REPO / "templates" / "examples" / "deepspeed-lm"
STEPS = 60


def _experiment(tmp_path: Path) -> Path:
    exp = tmp_path / "dslm.yaml"
    exp.write_text(
        f"name: ds-preempt\nentrypoint: python train.py\nworkdir: {DSLM}\n"
        "resources: {nodes: 2, tasks_per_node: 2, cpus_per_task: 1, mem: 4G, time: '00:10:00'}\n"
        f"deepspeed: {{config: {DSLM / 'ds_config.json'}}}\n"
        "hyperparameters: {layers: 2, d_model: 64, heads: 4, context: 32,"
        " log_every: 10, eval_every: 30, ckpt_every: 20, step_sleep: 0.15}\n"
        "searcher: {name: single, metric: val_loss, smaller_is_better: true,"
        f" max_length: {STEPS}}}\n"
        "reproducibility: {seed: 7, deterministic: true}\nmax_restarts: 3\n"
    )
    return exp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_reference(tmp_path: Path, spec: TrialSpec) -> tuple[list[subprocess.Popen[str]], Path]:
    """The same trial, uninterrupted, as 4 local processes (no Slurm, no sleep)."""
    tdir, ckpt = tmp_path / "ref-trial", tmp_path / "ref-ckpt"
    ref = dataclasses.replace(
        spec,
        hparams={**spec.hparams, "step_sleep": 0.0},
        checkpoint_dir=str(ckpt),
        experiment_dir=str(tmp_path),
        code_dir=str(DSLM),
    )
    tdir.mkdir()
    ref.write(tdir / "trial.json")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    base |= {"DLHPC_TRIAL_DIR": str(tdir), "DLHPC_ATTEMPT_DIR": str(tdir / "attempt")}
    base |= {"OMP_NUM_THREADS": "1", "SLURM_CPUS_PER_TASK": "1", "MASTER_ADDR": "127.0.0.1"}
    base |= {"MASTER_PORT": str(_free_port()), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, "train.py"],
            cwd=DSLM,
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r % 2)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(4)
    ]
    return procs, ckpt


def _finish_reference(procs: list[subprocess.Popen[str]], ckpt: Path) -> dict[str, Any]:
    for p in procs:
        _, err = p.communicate(timeout=400)
        assert p.returncode == 0, err[-3000:]
    return json.loads((ckpt / "final.json").read_text())  # type: ignore[no-any-return]


def _wait_for_checkpoint(cli: Cli, exp_id: int, ckpt_dir: Path, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not any(ckpt_dir.glob("ckpt-*/MANIFEST.json")):
        assert time.monotonic() < deadline, json.dumps(cli.experiment(exp_id), indent=1)
        time.sleep(0.5)


def _preempt(cli: Cli) -> str:
    """A high-priority job needing both whole nodes: Slurm requeues what runs there."""
    return subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-N2", "--exclusive", "-t", "2"]
        + ["--job-name=ds-hog", "--output=/dev/null", "--wrap", "sleep 5"],
        env=cli.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.mark.smoke
def test_two_nodes_by_two_tasks_preempted_and_resumed_end_bitwise_equal(
    cli: Cli, tmp_path: Path
) -> None:
    started = time.monotonic()
    exp_id = cli.json("launch", str(_experiment(tmp_path)))["experiment_id"]
    trial = cli.experiment(exp_id)["trials"][0]
    tdir = Path(cli.experiment(exp_id)["run_dir"]) / "trials" / f"trial-{trial['id']:06d}"
    spec = TrialSpec.read(tdir / "trial.json")
    assert spec.deepspeed is not None and spec.deepspeed["zero_optimization"]["stage"] == 2
    ckpt_dir = Path(spec.checkpoint_dir)

    procs, ref_ckpt = _start_reference(tmp_path, spec)  # meanwhile, the uninterrupted run
    _wait_for_checkpoint(cli, exp_id, ckpt_dir)  # step 20 of 60 is published: mid-run
    hog = _preempt(cli)
    try:
        exp = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL, timeout=400)
    finally:
        subprocess.run(["scancel", hog], env=cli.env, check=False)
    reference = _finish_reference(procs, ref_ckpt)
    elapsed = time.monotonic() - started

    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    t = exp["trials"][0]
    causes = [a["cause"] for a in t["attempts"]]
    assert "preempted" in causes and t["crashes"] == 0, causes

    con = sqlite3.connect(cli.home / "dlhpc.db")
    logs = [m for (m,) in con.execute("SELECT message FROM events WHERE kind = 'log.info'")]
    metrics = con.execute("SELECT step, name, value FROM metrics ORDER BY step, name").fetchall()
    con.close()
    # every attempt: 4 ranks, each seeing world size 4; rendezvous on node1 (first host)
    views = [json.loads(m.removeprefix("ranks: ")) for m in logs if m.startswith("ranks: ")]
    assert 2 <= len(views) <= len(t["attempts"]), logs
    for ranks in views:
        assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
        assert {(r["world"], r["env_world"]) for r in ranks} == {(4, 4)}
        assert sorted(r["local_rank"] for r in ranks) == [0, 0, 1, 1]
        assert len({r["master"] for r in ranks}) == 1
        assert ranks[0]["master"].startswith(socket.gethostbyname("node1") + ":")
    # resumed mid-run from the harness's checkpoint, not from scratch
    restored = [
        int(m[1]) for m in (re.search(r"restored ckpt-\S+ .*step (\d+)", x) for x in logs) if m
    ]
    assert restored and max(restored) >= 20 and all(0 < s <= STEPS for s in restored), logs
    # same end as the uninterrupted run, bitwise (CPU, gloo, deterministic)
    final = json.loads((ckpt_dir / "final.json").read_text())
    assert final == reference, (final, reference)
    got = {(s, n): v for s, n, v in metrics}
    assert got[(STEPS, "val_loss")] == reference["val_loss"]
    assert got[(STEPS, "train_loss")] == reference["train_loss"]
    assert sorted(got) == sorted(
        [(s, "train_loss") for s in range(10, STEPS + 1, 10)] + [(30, "val_loss"), (60, "val_loss")]
    )
    print(f"deepspeed cluster test: {elapsed:.0f}s, attempts {causes}, restored at {restored}")
