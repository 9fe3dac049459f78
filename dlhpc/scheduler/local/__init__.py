"""The local backend: job arrays mirrored by detached runner processes.

:data:`BACKEND` is its descriptor (:mod:`dlhpc.scheduler.plugins`); importing
this package is cheap, the scheduler loads on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlhpc.scheduler.local.environment import LocalJobEnvironment
from dlhpc.scheduler.plugins import Backend

if TYPE_CHECKING:
    from dlhpc.scheduler.local.scheduler import LocalScheduler

__all__ = ["BACKEND", "LocalScheduler"]


def _scheduler(root: Path) -> LocalScheduler:
    from dlhpc.scheduler.local.scheduler import LocalScheduler

    return LocalScheduler(root)


BACKEND = Backend(
    name="local",
    scheduler=_scheduler,
    environment=LocalJobEnvironment,
    runs_here=True,
    auto_priority=0,
)


def __getattr__(name: str) -> Any:
    if name == "LocalScheduler":
        from dlhpc.scheduler.local.scheduler import LocalScheduler

        return LocalScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
