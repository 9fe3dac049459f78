"""Scheduler backends behind one contract (:mod:`dlhpc.scheduler.base`).

One backend is one subpackage (``scheduler/slurm``, ``scheduler/local``, or a
third-party package registered through entry points): see
:mod:`dlhpc.scheduler.plugins`. :func:`make_scheduler` builds one by name.

Importing this package is cheap (the in-job worker imports the backend table):
the names below load their modules on first access.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlhpc.scheduler.base import (
        BaseScheduler,
        JobRequest,
        JobState,
        JobStatus,
        SubmittedTask,
    )
    from dlhpc.scheduler.local.scheduler import LocalScheduler
    from dlhpc.scheduler.plugins import BackendTable
    from dlhpc.scheduler.slurm.scheduler import SlurmScheduler

__all__ = [
    "BaseScheduler",
    "JobRequest",
    "JobState",
    "JobStatus",
    "LocalScheduler",
    "SlurmScheduler",
    "SubmittedTask",
    "make_scheduler",
]

_LAZY = {
    "BaseScheduler": "dlhpc.scheduler.base",
    "JobRequest": "dlhpc.scheduler.base",
    "JobState": "dlhpc.scheduler.base",
    "JobStatus": "dlhpc.scheduler.base",
    "SubmittedTask": "dlhpc.scheduler.base",
    "LocalScheduler": "dlhpc.scheduler.local.scheduler",
    "SlurmScheduler": "dlhpc.scheduler.slurm.scheduler",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_scheduler(
    backend: str, *, local_root: Path, backends: BackendTable | None = None
) -> BaseScheduler:
    """The backend named ``backend`` (from the table ``backends``, default: the
    installed ones); ``local_root`` is where a backend may keep its own files (the
    local backend's batch index: pass the same folder every time). ValueError for
    an unknown name."""
    from dlhpc.scheduler.plugins import BackendTable

    return (backends or BackendTable()).get(backend).scheduler(local_root)
