"""``trial.json``: what a job needs to run one trial. Standard library only."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dlhpc.protocol.atomic import atomic_write_text

__all__ = ["TrialSpec"]


@dataclass(frozen=True)
class TrialSpec:
    """What a job needs to run one trial; stored as ``trial.json``."""

    experiment_id: int
    trial_id: int
    hparams: dict[str, Any]
    max_length: int
    seed: int
    experiment_dir: str
    code_dir: str
    entry_script: str
    checkpoint_dir: str
    metric: str
    smaller_is_better: bool
    env: dict[str, str] = field(default_factory=dict)
    keep_latest: int = 1  # checkpoints of this trial to keep (checkpoint.keep_latest)
    deterministic: bool = False  # reproducibility.deterministic
    deepspeed: dict[str, Any] | None = None  # the resolved `deepspeed.config` mapping
    # declared data inputs (`data:`), fingerprinted at attempt start: [{"path", "hash"}]
    data: list[dict[str, Any]] = field(default_factory=list)
    umask: int | None = None  # the site's permission policy; the worker applies it first

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(asdict(self), indent=2, sort_keys=True))

    @classmethod
    def read(cls, path: Path) -> TrialSpec:
        return cls(**json.loads(path.read_text(encoding="utf-8")))
