"""The local backend: job arrays mirrored by detached runner processes.

:data:`BACKEND` is its registry descriptor (:mod:`dlhpc.scheduler.registry`);
importing this package is cheap, the scheduler loads on first use.
"""

from __future__ import annotations

from typing import Any

from dlhpc.scheduler.registry import Backend

__all__ = ["BACKEND", "LocalScheduler"]

BACKEND = Backend(
    name="local",
    scheduler="dlhpc.scheduler.local.scheduler:LocalScheduler",
    environment="dlhpc.scheduler.local.environment:LocalJobEnvironment",
    runs_here=True,
    auto_priority=0,
)


def __getattr__(name: str) -> Any:
    if name == "LocalScheduler":
        from dlhpc.scheduler.local.scheduler import LocalScheduler

        return LocalScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
