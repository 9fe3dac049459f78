"""The scheduler backend contract.

A backend turns a batch of prepared trials into jobs (Slurm job arrays, or
local processes) and reports their state. Backends are siblings
(``scheduler/slurm``, ``scheduler/local``) behind :class:`BaseScheduler`.

Contract every backend honours:

* :meth:`BaseScheduler.render` has no side effects and returns the exact
  submission text(s) :meth:`BaseScheduler.submit` would use (``--dry-run``).
* :meth:`BaseScheduler.submit` returns one :class:`SubmittedTask` per trial, in
  request order, or raises :class:`~dlhpc.errors.SchedulerError` having submitted
  nothing for the chunk that failed (chunks before it stay submitted and are
  returned through ``SchedulerError.submitted``).
* :meth:`BaseScheduler.poll` costs a constant number of scheduler queries
  whatever the number of jobs (Slurm: at most one ``squeue`` and one ``sacct``)
  and never hangs (every external command has a timeout).
* :meth:`BaseScheduler.submit` raises :class:`SubmitLimitError` when the
  scheduler refused for a site limit (too many jobs held): the trials wait.
* A job the scheduler holds on its own (Slurm: requeued and held after a failed
  launch) has ``JobStatus.system_hold``; :meth:`BaseScheduler.system_held` lists
  those the last poll saw, :meth:`BaseScheduler.release` releases them (one query).
* Job ids are strings; an array task is ``"<array_job_id>_<index>"``.
* Hyperparameters never reach a shell: a task only receives its trial folder,
  whose ``trial.json`` the job reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from dlhpc.config.schema import PreemptionConfig, Resources, SiteConfig
from dlhpc.errors import SchedulerError
from dlhpc.states import JobState

__all__ = [
    "BaseScheduler",
    "JobRequest",
    "JobState",
    "JobStatus",
    "SubmitLimitError",
    "SubmittedTask",
]


class SubmitLimitError(SchedulerError):
    """The scheduler refused a submission for a site limit (e.g. Slurm's
    ``QOSMaxSubmitJobPerUserLimit``): nothing of the failed chunk was submitted, and
    its trials can be submitted once the user's jobs leave the queue."""


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: JobState
    raw_state: str = ""  # the scheduler's own word, e.g. "OUT_OF_MEMORY"
    node_list: str = ""
    start: datetime | None = None
    end: datetime | None = None
    exit_code: int | None = None
    reason: str = ""  # squeue's pending reason, sacct's reason
    # queued, and held by the scheduler itself (not by the user or an admin): it
    # starts only once released (Slurm: "launch failed requeued held")
    system_hold: bool = False


@dataclass(frozen=True)
class JobRequest:
    """One batch of trials of one experiment to submit together."""

    experiment_id: int
    name: str  # job name; unique per submission so a crashed launch can find its jobs
    folder: Path  # the backend's own folder for scripts and logs (on the shared FS)
    trial_dirs: Sequence[Path]  # one task each, in order
    resources: Resources
    preemption: PreemptionConfig
    site: SiteConfig
    max_concurrent: int = 0  # array throttle (%N); 0 = none
    python: str = ""  # interpreter for the in-job worker; "" = sys.executable
    env: dict[str, str] = field(default_factory=dict)  # exported to the job
    # (label, shell lines) run in the job before the worker's interpreter starts
    # (site modules, environment.setup); a failing line fails the attempt
    setup: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the environment the submission command runs in (the launch's, saved at launch),
    # so that a tick from cron or scrontab submits jobs that run like the launch's;
    # None: this process's environment
    submit_env: Mapping[str, str] | None = None


@dataclass(frozen=True)
class SubmittedTask:
    trial_dir: Path
    job_id: str  # "123_4"
    stdout: Path
    stderr: Path | None


class BaseScheduler(ABC):
    """A place that runs trial jobs. See the module docstring for the contract."""

    name: str = "base"

    @abstractmethod
    def render(self, request: JobRequest) -> list[str]:
        """The submission script text of each chunk, exactly as submitted."""

    @abstractmethod
    def submit(self, request: JobRequest) -> list[SubmittedTask]:
        """Submit the request; one task per trial dir, in order."""

    @abstractmethod
    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        """State of the given jobs; ids the scheduler has forgotten map to UNKNOWN."""

    @abstractmethod
    def cancel(self, job_ids: Collection[str]) -> None:
        """Cancel the given jobs (array tasks); unknown or finished ids are ignored."""

    @abstractmethod
    def log_paths(self, folder: Path, job_id: str) -> list[Path]:
        """stdout/stderr files of a job, given the request's folder."""

    def find_jobs(self, name: str) -> list[str]:
        """Ids of the tasks submitted under job name ``name`` (queued, running or ended),
        in submission order. Used only to adopt the jobs of a launch that crashed
        between submitting and recording them; a backend that cannot tell returns []."""
        return []

    def submit_slots(self, resources: Resources) -> int | None:
        """How many more tasks with these resources (their account and QOS) may be
        submitted now without breaking a site limit; None when nothing limits them.
        Costs at most a constant number of scheduler queries per instance."""
        return None

    def limit_problem(self, resources: Resources) -> str | None:
        """Why every job with these resources would break a site limit (e.g. a time
        above the QOS's MaxWall), or None; checked at launch, before anything is
        recorded."""
        return None

    @property
    def accounting_available(self) -> bool:
        """False once the backend found it cannot read ended jobs' final states (Slurm
        without accounting); the reconciler then decides by the jobs' exit files."""
        return True

    def run_states(self, job_ids: Collection[str]) -> dict[str, list[str]]:
        """The scheduler's own state word for each run of each job that it ran more than
        once under one id (oldest first: run ``k`` is the job's restart ``k``), for the
        cause of an attempt it requeued; {} when it cannot tell. One query."""
        return {}

    def system_held(self) -> dict[str, JobStatus]:
        """This user's queued jobs that the scheduler holds on its own
        (``JobStatus.system_hold``), by id, as the last :meth:`poll` read the queue:
        also those it was not asked about (an attempt dlhpc no longer follows). No
        query; {} before a poll, and from a backend without such holds."""
        return {}

    def release(self, job_ids: Collection[str]) -> list[str]:
        """Release these held jobs (one query for all); the ids the scheduler refused
        to release. A backend without holds releases none: every id comes back."""
        return list(job_ids)

    def max_array_size(self) -> int:
        """Largest array (number of tasks) one submission may hold."""
        return 1_000_000

    def version_record(self) -> dict[str, Any] | None:
        """The scheduler's version for the reproducibility record (its ``slurm`` key,
        named so for older records), or None when there is nothing to record."""
        return None
