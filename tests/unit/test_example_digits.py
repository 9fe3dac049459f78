"""The digits example trains for real and reports through the file protocol."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlhpc.protocol import TrialSpec, read_event_batches

EXAMPLE = Path(__file__).resolve().parents[2] / "templates" / "examples" / "digits"


def _require_torch() -> None:
    """Skip without torch/scikit-learn, unless CI is set: there it is a failure."""
    missing = [m for m in ("torch", "sklearn") if importlib.util.find_spec(m) is None]
    if not missing:
        return
    message = f"digits example needs {', '.join(missing)} (pip install 'dlhpc[torch]')"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DLHPC_")}
    return subprocess.run(
        [sys.executable, "train.py"],
        cwd=EXAMPLE,
        env={**base, "SLURM_CPUS_PER_TASK": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_train_reports_metrics_in_a_fake_trial(tmp_path: Path) -> None:
    _require_torch()
    trial_dir, attempt_dir = tmp_path / "trial", tmp_path / "trial" / "attempts" / "1.r0"
    trial_dir.mkdir()
    TrialSpec(
        experiment_id=1,
        trial_id=1,
        hparams={"lr": 1e-2, "hidden": 64, "dropout": 0.1, "batch_size": 64},
        max_length=2,
        seed=0,
        experiment_dir=str(tmp_path),
        code_dir=str(EXAMPLE),
        entry_script=str(tmp_path / "entry.sh"),
        checkpoint_dir=str(tmp_path / "ckpt"),
        metric="val_accuracy",
        smaller_is_better=False,
    ).write(trial_dir / "trial.json")

    proc = _run({"DLHPC_TRIAL_DIR": str(trial_dir), "DLHPC_ATTEMPT_DIR": str(attempt_dir)})
    assert proc.returncode == 0, proc.stderr

    records = [r for b in read_event_batches(attempt_dir) for r in b.records]
    metrics = [r for r in records if r["type"] == "metric"]
    assert [r["step"] for r in metrics] == [1, 2]
    for r in metrics:
        assert set(r["metrics"]) == {"train_loss", "val_loss", "val_accuracy"}
    assert metrics[1]["metrics"]["val_accuracy"] > 0.5
    assert "final val_accuracy=" in proc.stdout
