"""A minimal TrialSpec for tests whose trial lives in ``tmp_path``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlhpc.protocol import TrialSpec


def make_spec(tmp_path: Path, **overrides: Any) -> TrialSpec:
    """Trial 1 of experiment 1, code and experiment folder ``tmp_path``, checkpoints in
    ``tmp_path/ckpt``, metric ``m`` (smaller is better); keywords replace any field."""
    fields: dict[str, Any] = {
        "experiment_id": 1,
        "trial_id": 1,
        "hparams": {},
        "max_length": 1,
        "seed": 0,
        "experiment_dir": str(tmp_path),
        "code_dir": str(tmp_path),
        "entry_script": "",
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "metric": "m",
        "smaller_is_better": True,
    }
    fields.update(overrides)
    return TrialSpec(**fields)
