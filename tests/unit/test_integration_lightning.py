"""The Lightning adapter with real Lightning: the example trains as a dlhpc job,
resumes after a preemption and a rung promotion bitwise as one uninterrupted run,
stops on the searcher's word, and keeps Lightning's signal handlers out of training."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from dlhpc.integrations._common import hparams
from dlhpc.protocol import request_stop
from tests.unit._adapters import REPO, Trial, lightning_weights_sha, require

HP = {"lr": 0.01, "hidden": 32, "dropout": 0.2, "batch_size": 64, "step_sleep": 0.0}


def test_preempted_and_promoted_trial_ends_bitwise_as_one_run(tmp_path: Path) -> None:
    require("lightning", "lightning", "sklearn")
    ref = Trial(tmp_path / "ref", "lightning", HP)
    code, out = ref.run(4)
    assert code == 0, out
    assert ref.checkpoints() == [f"ckpt-{23 * e:010d}" for e in (1, 2, 3, 4)]  # 23 batches/epoch
    expected = ref.metrics()
    assert sorted(expected) == [1, 2, 3, 4]
    assert set(expected[4]) == {"train_loss", "val_loss", "val_accuracy"}

    t = Trial(tmp_path / "t", "lightning", HP)
    code, out = t.run(2)  # an ASHA rung of 2 epochs: the fit ends normally
    assert code == 0 and len(t.checkpoints()) == 2, out
    # promoted to 4 epochs, preempted (TERM) in the middle of epoch 3
    code, out = t.run_until(
        4, lambda: (t.trial_dir / "attempts" / "1" / "progress.json").exists(), step_sleep=0.05
    )
    assert code == 75, out
    assert "trains this epoch again" in out and "resumed at epoch 2, step 46" in out
    assert len(t.checkpoints()) == 2  # a plain DataLoader: no mid-epoch checkpoint
    code, out = t.run(4)
    assert code == 0 and "resumed at epoch 2, step 46" in out, out
    assert lightning_weights_sha(t.checkpoint_dir) == lightning_weights_sha(ref.checkpoint_dir)
    assert t.metrics() == expected  # every float the same
    registered = sorted(e["step"] for e in t.events("checkpoint"))
    assert registered == [23, 46, 69, 92]
    assert [e["metric"] for e in t.events("checkpoint") if e["step"] == 92] == [
        expected[4]["val_accuracy"]
    ]


def test_stop_file_ends_the_trial_with_75(tmp_path: Path) -> None:
    require("lightning", "lightning", "sklearn")
    t = Trial(tmp_path, "lightning", HP)

    def stop_after_first_epoch() -> bool:
        if t.checkpoints():
            request_stop(t.trial_dir)  # what the reconciler writes for the searcher
            return True
        return False

    code, out = t.run_until(6, stop_after_first_epoch, sig=0, step_sleep=0.05)  # 0: no signal
    assert code == 75, out
    assert 1 <= len(t.metrics()) < 6


def _probe_trainer(callbacks: list[Any]) -> dict[str, Any]:
    """Fit a 2-batch model once; the handlers of TERM and USR1 seen during training."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    seen: dict[str, Any] = {}

    class Probe(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            seen["TERM"] = signal.getsignal(signal.SIGTERM)
            seen["USR1"] = signal.getsignal(signal.SIGUSR1)
            seen["env"] = type(args[0]._accelerator_connector.cluster_environment).__name__

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.lin(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, Probe()],
    )
    trainer.fit(Tiny(), data)
    return seen


def test_lightning_slurm_requeue_and_sigterm_handlers_are_put_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require("lightning", "lightning")
    from dlhpc.integrations.lightning import DlhpcCallback

    for name, value in {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "dlhpc-test",
        "SLURM_JOB_ID": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DLHPC_TRIAL_DIR", raising=False)

    def dlhpc_handler(signum: int, frame: FrameType | None) -> None:  # stands in for dlhpc's
        pass

    # as in a dlhpc job: TERM is dlhpc's, USR1 has its default (Lightning only
    # takes USR1 when nothing else has it)
    old = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, dlhpc_handler),
        signal.SIGUSR1: signal.signal(signal.SIGUSR1, signal.SIG_DFL),
    }
    try:
        plain = _probe_trainer([])
        assert plain["env"] == "SLURMEnvironment"  # Lightning's auto-requeue is on
        assert plain["TERM"] is not dlhpc_handler and plain["USR1"] is not signal.SIG_DFL
        adapted = _probe_trainer([DlhpcCallback()])
        assert adapted["TERM"] is dlhpc_handler and adapted["USR1"] is signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is dlhpc_handler  # and after fit
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def test_hparams_fill_namespace_and_dict_from_the_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = argparse.Namespace(lr=0.1, batch_size=32, seed=0, epochs=3)
    monkeypatch.delenv("DLHPC_TRIAL_DIR", raising=False)
    assert vars(hparams(ns)) == vars(ns) and hparams(ns) is not ns  # outside a job
    t = Trial(tmp_path, "lightning", {"lr": 0.5, "batch-size": 128, "extra": "x"}, seed=11)
    t.trial_dir.mkdir()
    t._spec(4)
    monkeypatch.setenv("DLHPC_TRIAL_DIR", str(t.trial_dir))
    got = hparams(ns)
    assert vars(got) == {"lr": 0.5, "batch_size": 128, "seed": 11, "epochs": 3, "extra": "x"}
    assert ns.lr == 0.1  # the defaults are not changed
    assert hparams({"lr": 1.0}) == {"lr": 0.5, "batch_size": 128, "extra": "x"}


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("dlhpc.integrations.lightning", "lightning"),
        ("dlhpc.integrations.transformers", "transformers"),
    ],
)
def test_missing_framework_names_the_extra(module: str, extra: str) -> None:
    hide = {"lightning": "lightning", "transformers": "transformers"}[extra]
    code = f"import sys; sys.modules[{hide!r}] = None; import {module}"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    assert "MissingExtraError" in proc.stderr
    assert f"pip install 'dlhpc[{extra}]'" in proc.stderr, proc.stderr


def added_lines(example: str) -> int:
    """Lines ``train.py`` adds to ``train_plain.py`` (``diff``'s ``>`` lines)."""
    folder = REPO / "templates" / "examples" / example
    proc = subprocess.run(
        ["diff", str(folder / "train_plain.py"), str(folder / "train.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr  # 1: they differ
    return sum(line.startswith(">") for line in proc.stdout.splitlines())


def test_example_adds_at_most_three_lines_as_its_readme_says() -> None:
    added = added_lines("lightning")
    assert added <= 3
    readme = (REPO / "templates" / "examples" / "lightning" / "README.md").read_text()
    assert f"**Lines you add: {added}**" in readme


def test_steps_unit_caps_global_step_reports_at_validation_and_saves_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``unit="steps"``: the grant is ``max_steps`` (it ends mid-epoch), metrics are
    reported at each validation with step = global_step, the end is checkpointed, and
    a second fit with a larger grant resumes from it."""
    require("lightning", "lightning")
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import dlhpc
    from dlhpc.integrations.lightning import DlhpcCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.lin(batch[0]).pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self.lin(batch[0]).pow(2).mean())

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(grant: int) -> tuple[int, DlhpcCallback]:
        t._spec(grant)
        callback = DlhpcCallback(unit="steps", ctx=dlhpc.init())
        trainer = L.Trainer(
            max_epochs=100,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            val_check_interval=2,
            num_sanity_val_steps=0,
            callbacks=[callback],
        )
        data = DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2)  # 4 batches/epoch
        trainer.fit(Tiny(), data, DataLoader(TensorDataset(torch.ones(2, 2))))
        return int(trainer.global_step), callback

    t = Trial(tmp_path, "lightning", {})
    t.trial_dir.mkdir()
    monkeypatch.setenv("DLHPC_TRIAL_DIR", str(t.trial_dir))
    monkeypatch.setenv("DLHPC_ATTEMPT_DIR", str(t.trial_dir / "attempts" / "0"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        assert fit(5)[0] == 5  # mid-epoch 2
        assert t.checkpoints() == [f"ckpt-{s:010d}" for s in (4, 5)]  # epoch end, grant end
        assert sorted(t.metrics()) == [2, 4]  # validations at steps 2 and 4
        monkeypatch.setenv("DLHPC_ATTEMPT_DIR", str(t.trial_dir / "attempts" / "1"))
        steps, callback = fit(9)
        assert steps == 9 and callback.restored_from is not None
        assert callback.restored_from.step == 5
        assert sorted(t.metrics()) == [2, 4, 6, 8]
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
