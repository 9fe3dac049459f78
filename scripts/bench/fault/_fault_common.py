"""Shared parts of ``bench_fault.py``: the repository's paths, median and rounding helpers
that pass None through, a fake trial folder, and the code version a result records."""

from __future__ import annotations

import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
DIGITS = REPO / "templates" / "examples" / "digits"
TRAINER = Path(__file__).resolve().parent / "bench_fault_train.py"
ENTRY = Path(__file__).resolve().parent / "bench_fault_entry.py"
GRACE_TIME_S = 30.0  # the dev cluster's debug partition (PreemptMode=REQUEUE)


def med(xs: list[float]) -> float | None:
    """The median of the values that are not None; None when there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def r(x: float | None, nd: int = 3) -> float | None:
    """``x`` rounded to ``nd`` digits; None stays None."""
    return None if x is None else round(x, nd)


def fake_trial(root: Path, hparams: dict[str, Any], max_length: int, seed: int = 0) -> Path:
    """A trial folder with trial.json, as ``dlhpc launch`` writes it; returns the folder."""
    from dlhpc.protocol import TrialSpec

    trial_dir = root / "trial"
    TrialSpec(
        experiment_id=1,
        trial_id=1,
        hparams=hparams,
        max_length=max_length,
        seed=seed,
        experiment_dir=str(root),
        code_dir=str(root),
        entry_script=str(root / "entry.sh"),
        checkpoint_dir=str(root / "ckpt"),
        metric="train_loss",
        smaller_is_better=True,
    ).write(trial_dir / "trial.json")
    return trial_dir


def _code_version() -> dict[str, Any]:
    """The commit measured, and which dlhpc/ files differed from it (shared working trees);
    ``None`` for both, and why, where git is not on PATH (a dev cluster's chroot)."""
    if shutil.which("git") is None:
        return {"head": None, "dlhpc_changed": None, "why": "git is not on PATH"}

    def git(*a: str) -> str:
        p = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False)
        return p.stdout.strip()

    return {
        "head": git("rev-parse", "--short", "HEAD"),
        "dlhpc_changed": git("status", "--short", "--", "dlhpc").splitlines(),
    }
