"""What a running job learns about itself from its backend: :class:`JobEnvironment`.

Each backend subpackage defines one subclass (``scheduler/slurm/environment.py``,
``scheduler/local/environment.py``), the way submitit's ``JobEnvironment`` plugins
do: the variable names of one scheduler live in one class, and the in-job code
(:mod:`dlhpc.harness.worker`, :mod:`dlhpc.harness.distributed`,
:mod:`dlhpc.harness.context`, :mod:`dlhpc.harness.telemetry`) asks the class.
The job finds its class through :meth:`dlhpc.scheduler.plugins.BackendTable.job_environment`
(the first registered backend whose :meth:`JobEnvironment.activated` is true).

Standard library only (plus :mod:`dlhpc.errors`): imported inside every job,
before any training code, and below the config layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from dlhpc.errors import DlhpcError

__all__ = ["JobEnvironment", "TaskLayout", "int_var"]


def int_var(environ: Mapping[str, str], *names: str, default: int) -> int:
    """The first of ``names`` that holds a non-negative integer, else ``default``."""
    for name in names:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return default


@dataclass(frozen=True)
class TaskLayout:
    """Where this process sits among the parallel tasks of its job step."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    master_host: str | None  # the host of rank 0; None: this host
    job: str  # the id that seeds the rendezvous port (the same for every task)


class JobEnvironment:
    """A job's view of its scheduler, read from ``environ`` (the job's environment).

    Subclasses set the class attributes and override the properties whose
    variables they know; the defaults describe one process on this host.
    ``job_id`` raises :class:`~dlhpc.errors.DlhpcError` when the process was not
    started by the backend.
    """

    #: The backend's registry name.
    name: ClassVar[str] = "base"
    #: Variables worth keeping in the attempt's reproducibility record.
    record_vars: ClassVar[frozenset[str]] = frozenset()
    #: Of those, the ones that differ between any two attempts by construction
    #: (job ids, node lists): kept in the record, not compared by ``dlhpc diff``.
    volatile_vars: ClassVar[frozenset[str]] = frozenset()
    #: The variable that marks a job of this backend (named when none is found).
    marker: ClassVar[str] = ""
    #: The signal name (``USR2``) that warns of the time limit: the entrypoint
    #: checkpoints and exits with the requeue code; the requeue itself
    #: (:meth:`requeue_self`) is asked for once the job's step has ended.
    time_limit_signal: ClassVar[str | None] = None

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        """Whether ``environ`` is a job of this backend."""
        return False

    @property
    def job_id(self) -> str:
        """The job id as the backend's ``poll`` knows it (``"<array>_<index>"`` for a task)."""
        raise DlhpcError(f"{self.name}: not started by this scheduler")

    @property
    def restart(self) -> int:
        """How many times this job was requeued before this run (0 the first time)."""
        return 0

    @property
    def rank(self) -> int:
        """Global rank of this process among the job's tasks."""
        return 0

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node."""
        return 0

    @property
    def world_size(self) -> int:
        """Number of tasks of the job."""
        return 1

    @property
    def node_id(self) -> int:
        """Index of this node among the job's nodes."""
        return 0

    @property
    def node_list(self) -> str | None:
        """The job's nodes in the backend's notation, or None when it does not say."""
        return None

    @property
    def cpus_per_task(self) -> str | None:
        """CPUs allotted to each task (a default for ``OMP_NUM_THREADS``), or None."""
        return None

    def task_layout(self) -> TaskLayout | None:
        """This task's place among the step's tasks, or None outside a launched task
        (then torch.distributed runs one process). ValueError when the backend's
        variables are malformed."""
        return None

    def preempted(self) -> bool | None:
        """Whether the scheduler is preempting this job now (asked once, by the worker,
        after a TERM); None when the backend cannot tell or the question failed."""
        return None

    def requeue_self(self) -> str | None:
        """Ask the scheduler to run this job again; "" on success, the error text (naming
        what was tried) on failure, None when the backend cannot requeue it."""
        return None

    def adopt_process_group(self, pgid: int) -> None:
        """Called by the worker with the process group it started the entrypoint in (a
        session of its own), so that the backend's hard kill reaches it too. The
        default does nothing: a scheduler that kills every process of the job (Slurm,
        through its cgroup) needs nothing. Must not raise for an I/O failure."""
