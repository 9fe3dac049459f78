"""The local backend's job view of itself: :class:`LocalJobEnvironment`.

The local runner (:mod:`dlhpc.scheduler.local.runner`) starts each task with
``DLHPC_JOB_ID=local-<batch>_<index>`` (and ``DLHPC_RESTART`` for a rerun); one
process per task, on this host. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from dlhpc.errors import DlhpcError
from dlhpc.scheduler.environment import JobEnvironment, int_var

__all__ = ["LocalJobEnvironment"]


class LocalJobEnvironment(JobEnvironment):
    """A task of a local batch. Signals: cancel sends TERM to the task's process
    group (KILL 10 s later); nothing requeues a local task."""

    name = "local"
    marker = "DLHPC_JOB_ID"
    record_vars: ClassVar[frozenset[str]] = frozenset({"DLHPC_JOB_ID", "DLHPC_RESTART"})
    volatile_vars: ClassVar[frozenset[str]] = frozenset({"DLHPC_JOB_ID", "DLHPC_RESTART"})

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("DLHPC_JOB_ID"))

    @property
    def job_id(self) -> str:
        if not self.environ.get("DLHPC_JOB_ID"):
            raise DlhpcError("local: no DLHPC_JOB_ID; not started by the local runner")
        return self.environ["DLHPC_JOB_ID"]

    @property
    def restart(self) -> int:
        return int_var(self.environ, "DLHPC_RESTART", default=0)
