"""Scheduler backends behind one contract (:mod:`dlhpc.scheduler.base`).

:func:`make_scheduler` picks a backend by name (``"slurm"`` or ``"local"``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dlhpc.scheduler.base import BaseScheduler, JobRequest, JobState, JobStatus, SubmittedTask
from dlhpc.scheduler.local import LocalScheduler
from dlhpc.scheduler.slurm import SlurmScheduler

__all__ = [
    "BACKENDS",
    "BaseScheduler",
    "JobRequest",
    "JobState",
    "JobStatus",
    "LocalScheduler",
    "SlurmScheduler",
    "SubmittedTask",
    "make_scheduler",
]

#: Backend name -> factory taking the local backend's root folder.
BACKENDS: dict[str, Callable[[Path], BaseScheduler]] = {
    "local": lambda root: LocalScheduler(root),
    "slurm": lambda _root: SlurmScheduler(),
}


def make_scheduler(backend: str, *, local_root: Path) -> BaseScheduler:
    """The backend named ``backend``; ``local_root`` is where local batches are indexed
    (pass the same folder every time). ValueError for an unknown name."""
    try:
        factory = BACKENDS[backend]
    except KeyError:
        raise ValueError(
            f"unknown scheduler backend {backend!r}; valid: {', '.join(sorted(BACKENDS))}"
        ) from None
    return factory(local_root)
