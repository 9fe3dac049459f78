"""The Lightning example as two DDP ranks under ``srun`` on the dev cluster (CPU, gloo).

One trial (``single`` searcher, 1 node x 2 tasks): each rank records what it saw of
the allocation (Slurm's variables, dlhpc's ``RANK``..., Lightning's cluster
environment and ranks, torch.distributed's); the job is requeued mid-training
(``scontrol requeue``), both ranks stop together and exit for requeue, the next
attempt's two ranks resume from the newest dlhpc checkpoint, and the trial ends with
the same final weights, bit for bit, and the same metrics as an uninterrupted
two-rank run (two local processes, no Slurm); the metrics are in ``dlhpc status --json``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.harness.distributed import master_port
from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration._adapters import attempt_exits, checkpoint_dir, db_metrics, trial_seed
from tests.integration.conftest import Cli
from tests.unit._adapters import EXAMPLES, Trial, lightning_weights_sha, require

pytestmark = pytest.mark.cluster

EPOCHS = 4
# The example's model and data; the Trainer spans the ranks the allocation gives
# (dlhpc's LOCAL_WORLD_SIZE/WORLD_SIZE, which Lightning's SLURMEnvironment checks
# against SLURM_NTASKS_PER_NODE/SLURM_NNODES), and each rank writes what it saw.
DDP_SCRIPT = '''"""The Lightning digits example trained with DDP over the allocation's ranks."""

import json
import os
from pathlib import Path

import lightning as L
import torch
from dlhpc.integrations.lightning import DlhpcCallback, hparams
from train import DigitsData, DigitsModel, parse_args

VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "RANK",
        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class RankMarker(L.Callback):
    """Writes this rank's view of the allocation once the process group is up."""

    def __init__(self, dlhpc_callback):
        self.dlhpc_callback = dlhpc_callback

    def setup(self, trainer, pl_module, stage):
        folder = os.environ.get("RANK_MARKERS")
        if not folder:
            return
        restored = self.dlhpc_callback.restored_from
        cluster = trainer.strategy.cluster_environment
        view = {
            "cluster_env": type(cluster).__name__,
            "main": [cluster.main_address, cluster.main_port],
            "global_rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "local_rank": trainer.local_rank,
            "dist": [torch.distributed.get_rank(), torch.distributed.get_world_size()],
            "backend": torch.distributed.get_backend(),
            "restored_step": None if restored is None else restored.step,
            "env": {k: os.environ.get(k) for k in VARS},
        }
        attempt = f"{os.environ['SLURM_JOB_ID']}.r{os.environ.get('SLURM_RESTART_COUNT', '0')}"
        name = f"{attempt}-rank{trainer.global_rank}.json"
        Path(folder, name).write_text(json.dumps(view))


def main():
    args = hparams(parse_args())
    torch.set_num_threads(1)
    L.seed_everything(args.seed)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    dlhpc_callback = DlhpcCallback()
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=local,
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // local,
        strategy="ddp",
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[dlhpc_callback, RankMarker(dlhpc_callback)],
    )
    trainer.fit(DigitsModel(args.lr, args.hidden, args.dropout, args.step_sleep),
                DigitsData(args.batch_size))
    print(f"rank {trainer.global_rank}/{trainer.world_size} ended at step {trainer.global_step}")


if __name__ == "__main__":
    main()
'''


def _experiment(tmp_path: Path, markers: Path) -> Path:
    work = tmp_path / "lightning-ddp"
    work.mkdir()
    shutil.copy(EXAMPLES / "lightning" / "train.py", work / "train.py")
    (work / "train_ddp.py").write_text(DDP_SCRIPT)
    exp = work / "exp.yaml"
    exp.write_text(
        "name: lightning-ddp\nentrypoint: python train_ddp.py\n"
        "resources: {nodes: 1, tasks_per_node: 2, cpus_per_task: 1, mem: 2G, time: '00:10:00'}\n"
        "hyperparameters: {lr: 0.02, hidden: 32, dropout: 0.1, batch_size: 64, step_sleep: 0.3}\n"
        "searcher: {name: single, metric: val_accuracy, smaller_is_better: false,"
        f" max_length: {EPOCHS}}}\n"
        f"environment: {{vars: {{RANK_MARKERS: '{markers}'}}}}\n"
        "reproducibility: {seed: 5, deterministic: true}\nmax_restarts: 2\n"
    )
    return exp


def _run_with_one_requeue(cli: Cli, exp_id: int, timeout: float = 600) -> dict[str, Any]:
    """Tick to the end; requeue the job once the trial has reported 1 or 2 epochs."""
    requeued = False
    deadline = time.monotonic() + timeout
    while True:
        cli("tick", "-q")
        exp = cli.experiment(exp_id)
        if exp["state"] in TERMINAL:
            assert requeued, "never caught mid-training: " + json.dumps(exp, indent=1)
            return exp
        (t,) = exp["trials"]
        if not requeued and t["state"] == "RUNNING" and 1 <= t["steps_completed"] < EPOCHS - 1:
            job = t["slurm_job_ids"][-1]
            subprocess.run(["scontrol", "requeue", job], env=cli.env, check=True)
            requeued = True
        assert time.monotonic() < deadline, json.dumps(exp, indent=1)
        time.sleep(1)


def _reference(tmp_path: Path, hparams: dict[str, Any], seed: int) -> Trial:
    """The same trial, uninterrupted: two local ranks (gloo), no Slurm, no sleep."""
    ref = Trial(tmp_path / "ref", "lightning", {**hparams, "step_sleep": 0.0}, seed=seed)
    script = tmp_path / "lightning-ddp" / "train_ddp.py"
    procs = ref.start_ranks(EPOCHS, [sys.executable, str(script)])
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return ref


def _rank_views(markers: Path) -> dict[str, list[dict[str, Any]]]:
    """Each attempt's (``<job>.r<restart>``) rank views, by rank."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(markers.glob("*-rank*.json")):
        attempt = path.name.rsplit("-rank", 1)[0]
        out.setdefault(attempt, []).append(json.loads(path.read_text()))
    return out


def test_lightning_two_ranks_requeued_resume_bitwise(cli: Cli, tmp_path: Path) -> None:
    require("lightning", "lightning", "sklearn")
    markers = tmp_path / "markers"
    markers.mkdir()
    exp_id = cli.json("launch", str(_experiment(tmp_path, markers)))["experiment_id"]
    exp = _run_with_one_requeue(cli, exp_id)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    (t,) = exp["trials"]
    assert t["state"] == "COMPLETED" and t["steps_completed"] == EPOCHS and t["crashes"] == 0
    causes = [a["cause"] for a in t["attempts"]]
    assert "requeued" in causes and causes[-1] == "completed", causes
    # both ranks saw TERM (or the other's word), saved where needed, exited for requeue
    assert ("requeued", 75) in attempt_exits(cli, t["id"]), attempt_exits(cli, t["id"])
    # Lightning's own Slurm auto-requeue (SIGUSR1, hpc_ckpt_*.ckpt) never acted
    assert not list(tmp_path.rglob("hpc_ckpt_*")), list(tmp_path.rglob("hpc_ckpt_*"))

    # 1. every attempt: two ranks, each with the allocation's rank and world size
    views = _rank_views(markers)
    assert len(views) == len(t["attempts"]) >= 2, views
    for attempt, ranks in views.items():
        assert [r["global_rank"] for r in ranks] == [0, 1], (attempt, ranks)
        for r in ranks:
            env, rank = r["env"], r["global_rank"]
            assert r["cluster_env"] == "SLURMEnvironment", r
            assert (r["world_size"], r["local_rank"], r["backend"]) == (2, rank, "gloo"), r
            assert r["dist"] == [rank, 2], r
            assert (env["SLURM_PROCID"], env["SLURM_NTASKS"]) == (str(rank), "2"), r
            torch_vars = [env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")]
            assert torch_vars == [str(rank), "2", str(rank)], r
            # Lightning's rendezvous is dlhpc's: MASTER_ADDR, and the job's MASTER_PORT
            job = attempt.split(".r")[0]
            assert env["MASTER_PORT"] == str(master_port(job, {})), r
            assert r["main"] == [env["MASTER_ADDR"], int(env["MASTER_PORT"])], r
        assert len({(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in ranks}) == 1
    # 2. the first attempt started fresh; in each later one both ranks resumed from
    # the same dlhpc checkpoint, taken mid-training (an epoch end before the requeue)
    first, *later = views.values()
    assert {r["restored_step"] for r in first} == {None}, first
    for ranks in later:
        (restored,) = {r["restored_step"] for r in ranks}
        assert restored is not None and restored > 0, later

    # 3. same end as the uninterrupted two-rank run: weights and metrics, bitwise
    ref = _reference(tmp_path, t["hparams"], trial_seed(cli, t["id"]))
    got = lightning_weights_sha(checkpoint_dir(cli, exp_id, t["id"]))
    assert got == lightning_weights_sha(ref.checkpoint_dir), "final weights differ"
    metrics = db_metrics(cli, t["id"])
    assert metrics == ref.metrics(), "metrics differ from the uninterrupted run"
    assert sorted(metrics) == list(range(1, EPOCHS + 1))
    assert set(metrics[EPOCHS]) == {"train_loss", "val_loss", "val_accuracy"}
    # in dlhpc status --json: the searcher metric (rank 0's val_accuracy), best and latest
    assert t["best_metric"] == max(m["val_accuracy"] for m in metrics.values())
    assert t["latest_metric"] == metrics[EPOCHS]["val_accuracy"]
