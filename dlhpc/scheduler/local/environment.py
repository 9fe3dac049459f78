"""The local backend's job view of itself: :class:`LocalJobEnvironment`.

The local runner (:mod:`dlhpc.scheduler.local.runner`) starts each task with
``DLHPC_JOB_ID=local-<batch>_<index>`` (and ``DLHPC_RESTART`` for a rerun); one
process per task, on this host. No third-party imports.

The runner also passes :data:`GROUP_FILE_VAR`, where the worker's call to
:meth:`LocalJobEnvironment.adopt_process_group` writes the entrypoint's process
group: the runner's KILL after its grace goes to that group as well as the task's
own (the entrypoint runs in a session of its own, which the task's group does not
reach).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from dlhpc.errors import DlhpcError
from dlhpc.protocol import atomic_write_text
from dlhpc.scheduler.environment import JobEnvironment, int_var

__all__ = ["GROUP_FILE_VAR", "LocalJobEnvironment", "read_group_file"]

GROUP_FILE_VAR = "DLHPC_LOCAL_GROUP_FILE"


class LocalJobEnvironment(JobEnvironment):
    """A task of a local batch. Signals: cancel sends TERM to the task's process
    group (KILL 10 s later, to the entrypoint's group too); nothing requeues a
    local task."""

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

    def adopt_process_group(self, pgid: int) -> None:
        path = self.environ.get(GROUP_FILE_VAR)
        if not path:
            return
        with contextlib.suppress(OSError):  # then only the task's own group is killed
            atomic_write_text(Path(path), str(pgid))


def read_group_file(path: Path) -> int | None:
    """The process group a task's worker adopted (see :data:`GROUP_FILE_VAR`), or None."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 1 else None
