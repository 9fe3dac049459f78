"""The scheduler instances of one command: one per backend, built when first asked for.

A command (launch, one tick, kill, ...) passes one :class:`SchedulerPool` down to
every step, so a backend's setup (e.g. Slurm's limits, read once) and its count of
external commands (:meth:`SchedulerPool.calls`, the tick's politeness figure) are
shared by all of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dlhpc.scheduler import BaseScheduler, make_scheduler
from dlhpc.scheduler.plugins import BackendTable

__all__ = ["SchedulerPool"]


@dataclass
class SchedulerPool:
    """One scheduler instance per backend for the life of a command, built from
    ``backends`` (default: the installed backends; the simulator passes one with
    its cluster added through :meth:`BackendTable.with_backend`)."""

    local_root: Path
    backends: BackendTable = field(default_factory=BackendTable)
    _by_name: dict[str, BaseScheduler] = field(default_factory=dict, init=False)

    def get(self, backend: str) -> BaseScheduler:
        if backend not in self._by_name:
            self._by_name[backend] = make_scheduler(
                backend, local_root=self.local_root, backends=self.backends
            )
        return self._by_name[backend]

    def calls(self) -> Counter[str]:
        """External scheduler commands run so far, by command name."""
        total: Counter[str] = Counter()
        for sched in self._by_name.values():
            total.update(getattr(sched, "calls", Counter()))
        return total
