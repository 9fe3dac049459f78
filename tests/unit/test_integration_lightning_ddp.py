"""The Lightning callback with two DDP ranks (gloo, CPU), ranks given the way dlhpc's
worker gives them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): a TERM that only
one rank receives stops both at the same batch (one all-reduce), only rank 0 writes
the checkpoint, and the next attempt's two ranks resume from it."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from tests.unit._adapters import Trial, require

SCRIPT = """
import time
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from dlhpc.integrations.lightning import DlhpcCallback


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.1)
        loss = self.lin(batch[0]).pow(2).mean()
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
trainer = L.Trainer(
    accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False, callbacks=[DlhpcCallback()],
)
trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 2)), batch_size=4))
print(f"rank {trainer.global_rank}/{trainer.world_size} ended at step {trainer.global_step}")
"""


def test_term_on_one_rank_stops_both_rank0_saves_and_both_resume(tmp_path: Path) -> None:
    require("lightning", "lightning")
    script = tmp_path / "ddp_train.py"
    script.write_text(SCRIPT)
    t = Trial(tmp_path, "lightning", {})
    t.trial_dir.mkdir()
    first = f"ckpt-{8:010d}"  # 64 samples, 2 ranks, batches of 4: 8 steps per epoch
    procs = t.start_ranks(3, [sys.executable, str(script)])
    deadline = time.monotonic() + 240
    while first not in t.checkpoints():
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGTERM)  # rank 1 only
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [75, 75], outs
    # rank 0 stopped at rank 1's word, at the same batch (or, when TERM came during the
    # epoch's end, right after that epoch's checkpoint)
    assert t.checkpoints() == [first]
    assert [e["step"] for e in t.events("checkpoint")] == [8]  # only rank 0 records

    procs = t.start_ranks(3, [sys.executable, str(script)])
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for rank, out in enumerate(outs):
        assert "resumed at epoch 1, step 8" in out and f"rank {rank}/2 ended at step 24" in out
    assert t.checkpoints() == [first, f"ckpt-{16:010d}", f"ckpt-{24:010d}"]
    assert sorted(t.metrics()) == [1, 2, 3]


def test_single_process_trainer_in_a_two_rank_job_is_refused(tmp_path: Path) -> None:
    """The example's Trainer (no devices: one process) started as two ranks would train
    the trial twice, each process as rank 0 writing the same checkpoints: refused."""
    require("lightning", "lightning", "sklearn")
    t = Trial(tmp_path, "lightning", {"hidden": 16})
    procs = t.start_ranks(1, [sys.executable, "train.py"])
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    for out in outs:
        assert "this job runs 2 ranks" in out and "Trainer has 1 process(es)" in out, out
    assert t.checkpoints() == [] and t.metrics() == {}
