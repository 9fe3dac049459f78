"""In-job stand-ins for the dlhpc worker, pickled by reference (importable on the nodes)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import FrameType


def write_marker(trial_dir: str) -> None:
    """Write ``done.txt`` (the array task's id) into the trial folder."""
    job = f"{os.environ.get('SLURM_ARRAY_JOB_ID')}_{os.environ.get('SLURM_ARRAY_TASK_ID')}"
    (Path(trial_dir) / "done.txt").write_text(job, encoding="utf-8")


def sleep_long(trial_dir: str) -> None:
    """Mark the start, then sleep far beyond any test's patience.

    SIGTERM kills it, as it does the real worker (submitit's own handler ignores
    SIGTERM, which would make every cancel wait out Slurm's KillWait).
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    (Path(trial_dir) / "started.txt").write_text("x", encoding="utf-8")
    time.sleep(600)


def record_signals(trial_dir: str) -> None:
    """Append every USR2/TERM received to ``signals.txt``; run until SIGTERM."""
    out = Path(trial_dir) / "signals.txt"

    def note(signum: int, _frame: FrameType | None) -> None:
        with out.open("a", encoding="utf-8") as f:
            f.write(f"{signal.Signals(signum).name} {time.time():.0f}\n")
        if signum == signal.SIGTERM:
            os._exit(128 + signum)  # be cancelled at once, not after KillWait

    for sig in (signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, note)
    with out.open("a", encoding="utf-8") as f:
        f.write(f"START {time.time():.0f}\n")
    while True:
        time.sleep(1)
