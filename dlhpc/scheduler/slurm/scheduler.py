"""SlurmScheduler: job arrays (tasks run by submitit); state through squeue and sacct.

Kindness to slurmctld, as a contract:

* ``submit``: one ``sbatch --array`` per chunk of at most
  :meth:`SlurmScheduler.chunk_size` tasks (``MaxArraySize`` from one
  ``scontrol show config`` per instance, lowered by ``site.max_array_size``).
  Every chunk is an array, also of one task. ``max_concurrent`` limits the
  whole request: the chunks' ``%N`` throttles add up to it.
* ``poll``: at most one ``squeue`` (all of the user's jobs, ``--array
  --states=all``; or one pyslurm call where a version-matched pyslurm imports,
  see :mod:`dlhpc.scheduler.slurm._pyslurm`) and at most one ``sacct`` (only
  for ids squeue does not show as live) per call, whatever the number of ids.
* ``cancel``: one ``scancel`` with all ids; ``release``: one ``scontrol release``
  with all ids (the jobs Slurm held itself, which ``poll``'s squeue found).
* every command has a timeout; ``calls`` counts them by name.

For an id squeue shows as ended, sacct's record wins if it is final too (it has
the exit code), else squeue's (accounting lags the controller by seconds).
When ``sacct`` fails or times out (accounting off, slurmdbd down) the ids it
was asked about come back from squeue's view if it still has them, else
UNKNOWN (the reconciler then decides by the job's own exit files); the instance
stops calling sacct, logs one warning and says so in :attr:`accounting_available`.

Commands run (counted, with timeouts) and ``sacct``'s one-way switch live in
:mod:`dlhpc.scheduler.slurm.commands`. Site limits
(:mod:`dlhpc.scheduler.slurm.limits`): ``submit_slots`` reads the user's associations
and QOSes once per instance (two ``sacctmgr``) and counts
the user's queued and running tasks from the last ``squeue`` of ``poll`` (one
more ``squeue`` only when this instance has not polled); an sbatch refused for
a limit raises :class:`~dlhpc.scheduler.base.SubmitLimitError`.
"""

from __future__ import annotations

import getpass
import importlib
import logging
import re
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

from submitit.core.utils import JobPaths

from dlhpc.config.schema import Resources
from dlhpc.errors import SchedulerError
from dlhpc.scheduler.base import (
    BaseScheduler,
    JobRequest,
    JobState,
    JobStatus,
    SubmitLimitError,
    SubmittedTask,
)
from dlhpc.scheduler.slurm import checks
from dlhpc.scheduler.slurm._pyslurm import PollPath, poll_path, queue_via_pyslurm
from dlhpc.scheduler.slurm.commands import SlurmCommands, failed, one_line
from dlhpc.scheduler.slurm.limits import Limits, is_limit_refusal, read_limits
from dlhpc.scheduler.slurm.parse import (
    SQUEUE_FORMAT,
    TASK_ID_RE,
    parse_max_array_size,
    parse_squeue,
    refused_ids,
)
from dlhpc.scheduler.slurm.sbatch import build_submission, submit_array

__all__ = ["SlurmScheduler", "DEFAULT_MAX_ARRAY_SIZE", "new_scheduler"]

log = logging.getLogger(__name__)

#: Slurm's default MaxArraySize, used (with a warning) when scontrol cannot tell.
DEFAULT_MAX_ARRAY_SIZE = 1001
_WORKER = "dlhpc.harness.worker:run_trial"
_SCANCEL_BENIGN = (
    "already completing or completed",
    "Invalid job id specified",
    "already finished",
)


class SlurmScheduler(SlurmCommands, BaseScheduler):
    """Slurm backend. ``fn`` is the in-job callable (default: the dlhpc worker's
    ``run_trial``, imported at submit time); it gets the trial folder as a str."""

    name = "slurm"

    def __init__(
        self,
        *,
        fn: Callable[[str], None] | None = None,
        command_timeout_s: float = 30.0,
        submit_timeout_s: float = 120.0,
        queue_path: PollPath | None = None,
    ) -> None:
        super().__init__(command_timeout_s)
        self._queue_path = queue_path
        self._fn = fn
        self._submit_timeout = submit_timeout_s
        self._cluster_max_array: int | None = None
        self._limits: Limits | None = None
        self._limits_read = False
        self._held: int | None = None  # the user's queued+running tasks at the last squeue
        self._system_held: dict[str, JobStatus] = {}  # of the last squeue: system_held()

    def _sbatch(self, script: Path) -> str:
        return self._checked(["sbatch", str(script)], self._submit_timeout)

    def _sbatch_in(self, request: JobRequest) -> Callable[[Path], str]:
        """sbatch run in the request's environment (the launch's; the job gets it, as
        ``--export=ALL``), else in this process's."""
        if request.submit_env is None:
            return self._sbatch
        environ = request.submit_env
        return lambda script: self._checked(["sbatch", str(script)], self._submit_timeout, environ)

    def partitions(self) -> list[str]:
        """The cluster's partition names, hidden ones included (one ``sinfo``)."""
        out = self._checked(["sinfo", "--all", "--noheader", "--format=%R"], self._timeout)
        return sorted({line.strip() for line in out.splitlines() if line.strip()})

    # -- sizes ---------------------------------------------------------------

    def max_array_size(self) -> int:
        """The cluster's MaxArraySize (one ``scontrol show config`` per instance)."""
        if self._cluster_max_array is None:
            try:
                size = parse_max_array_size(
                    self._checked(["scontrol", "show", "config"], self._timeout)
                )
            except SchedulerError as err:
                log.warning(
                    "cannot read MaxArraySize (%s); assuming Slurm's default %d",
                    err,
                    DEFAULT_MAX_ARRAY_SIZE,
                )
                size = DEFAULT_MAX_ARRAY_SIZE
            if size is None:
                log.warning(
                    "scontrol show config has no MaxArraySize; assuming %d", DEFAULT_MAX_ARRAY_SIZE
                )
                size = DEFAULT_MAX_ARRAY_SIZE
            if size < 1:
                raise SchedulerError(f"MaxArraySize is {size}: this cluster has no job arrays")
            self._cluster_max_array = size
        return self._cluster_max_array

    def chunk_size(self, request: JobRequest) -> int:
        """Tasks per sbatch: MaxArraySize, lowered by ``site.max_array_size``."""
        size = self.max_array_size()
        if request.site.max_array_size is not None:
            size = min(size, request.site.max_array_size)
        if size < 1:
            raise SchedulerError(f"site max_array_size is {request.site.max_array_size}")
        return size

    def _chunks(self, request: JobRequest) -> list[tuple[list[Path], int]]:
        """(trial dirs, %throttle) per sbatch. ``max_concurrent`` bounds the whole
        request, so it is shared out among the chunks (at least 1 each)."""
        dirs = list(request.trial_dirs)
        size = self.chunk_size(request)
        chunks = [dirs[i : i + size] for i in range(0, len(dirs), size)]
        limit, k = request.max_concurrent, len(chunks)
        if not limit:
            return [(c, 0) for c in chunks]
        if k > limit:
            log.warning(
                "%s: %d arrays cannot run at most %d tasks at a time; each runs 1 at a time",
                request.name,
                k,
                limit,
            )
        return [(c, max(1, limit // k + (1 if i < limit % k else 0))) for i, c in enumerate(chunks)]

    # -- the contract --------------------------------------------------------

    def render(self, request: JobRequest) -> list[str]:
        """The sbatch script of each chunk, as submit writes it; no files, no sbatch."""
        return [
            build_submission(replace(request, trial_dirs=chunk), throttle).script
            for chunk, throttle in self._chunks(request)
        ]

    def _callable(self) -> Callable[[str], None]:
        if self._fn is not None:
            return self._fn
        module, _, attr = _WORKER.partition(":")
        try:
            fn: Callable[[str], None] = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise SchedulerError(f"cannot import the in-job worker {_WORKER}: {err}") from err
        return fn

    def submit(self, request: JobRequest) -> list[SubmittedTask]:
        """One array per chunk; on failure, SchedulerError.submitted has earlier chunks."""
        fn = self._callable()
        submitted: list[SubmittedTask] = []
        for n, (chunk, throttle) in enumerate(self._chunks(request)):
            try:
                submission = build_submission(replace(request, trial_dirs=chunk), throttle)
                job_ids = submit_array(submission, fn, self._sbatch_in(request))
            except Exception as err:
                kind = SubmitLimitError if is_limit_refusal(str(err)) else SchedulerError
                raise kind(
                    f"submitting chunk {n + 1} ({len(chunk)} tasks) of {request.name!r} failed: "
                    f"{one_line(str(err))}",
                    submitted=submitted,
                ) from err
            if self._held is not None:
                self._held += len(job_ids)
            for trial, job_id in zip(chunk, job_ids, strict=True):
                out, err_path = self.log_paths(request.folder, job_id)
                submitted.append(SubmittedTask(trial, job_id, out, err_path))
        return submitted

    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        """States of ``job_ids`` (``123_4`` or ``123``): one squeue, at most one sacct."""
        ids = self._checked_ids(job_ids)
        if not ids:
            return {}
        queue = self._queue()
        result: dict[str, JobStatus] = {}
        rest: list[str] = []
        for jid in ids:
            status = queue.get(jid)
            if status is not None and not status.state.is_terminal:
                result[jid] = status
            else:
                rest.append(jid)
        accounted = self._sacct(rest) if rest else {}
        for jid in rest:
            acct, seen = accounted.get(jid), queue.get(jid)
            if seen is not None and (acct is None or not acct.state.is_terminal):
                result[jid] = seen  # the controller knows it ended; accounting lags
            else:
                result[jid] = acct or JobStatus(jid, JobState.UNKNOWN)
        return result

    @property
    def queue_path(self) -> PollPath:
        """How the queue is read: pyslurm where a matching one imports, else squeue
        (chosen once per process, see :mod:`dlhpc.scheduler.slurm._pyslurm`)."""
        if self._queue_path is None:
            self._queue_path = poll_path()
        return self._queue_path

    def _queue(self) -> dict[str, JobStatus]:
        """The user's jobs as squeue shows them: one squeue, or one pyslurm call."""
        path = self.queue_path
        if path.module is not None:
            self.calls["pyslurm"] += 1
            queue = queue_via_pyslurm(path.module, getpass.getuser())
        else:
            queue = self._squeue()
        self._held = sum(not st.state.is_terminal for st in queue.values())
        self._system_held = {jid: st for jid, st in queue.items() if st.system_hold}
        return queue

    def system_held(self) -> dict[str, JobStatus]:
        """The user's tasks that Slurm requeued and held itself (``system_hold``: e.g.
        ``launch failed requeued held``), as the last squeue of :meth:`poll` showed them."""
        return dict(self._system_held)

    def release(self, job_ids: Collection[str]) -> list[str]:
        """One ``scontrol release`` for all ids; the ids Slurm refused (it names each
        in an error line). SchedulerError when it fails without naming any (the
        controller unreachable)."""
        ids = self._checked_ids(job_ids)
        if not ids:
            return []
        proc = self._run(["scontrol", "release", *ids], self._timeout)
        if proc.returncode == 0:
            return []
        refused = refused_ids(proc.stderr or proc.stdout, ids)
        if not refused:
            raise SchedulerError(failed("scontrol release", proc))
        log.warning("scontrol release refused %s: %s", ", ".join(refused), one_line(proc.stderr))
        return refused

    def _squeue(self) -> dict[str, JobStatus]:
        return parse_squeue(
            self._checked(
                [
                    "squeue",
                    "--noheader",
                    "--array",
                    "--states=all",
                    f"--user={getpass.getuser()}",
                    f"--format={SQUEUE_FORMAT}",
                ],
                self._timeout,
            )
        )

    def limits(self) -> Limits | None:
        """The user's associations and the QOS table (two ``sacctmgr``, once per
        instance); None, with one warning, when sacctmgr cannot tell (no slurmdbd)."""
        if not self._limits_read:
            self._limits_read = True
            try:
                self._limits = read_limits(
                    lambda args: self._checked(args, self._timeout), getpass.getuser()
                )
            except SchedulerError as err:
                log.warning("cannot read the site's limits (%s): submitting without them", err)
        return self._limits

    def limit_problem(self, resources: Resources) -> str | None:
        """The requested time against MaxWall (see :meth:`limits`)."""
        limits = self.limits()
        if limits is None:
            return None
        return limits.wall_problem(resources.account, resources.qos, resources.time_minutes)

    def submit_slots(self, resources: Resources) -> int | None:
        """MaxSubmitJobs (association or QOS, the smallest that may bind) less the
        user's tasks held now: those of the last squeue plus those submitted since."""
        limits = self.limits()
        cap = limits.max_submit(resources.account, resources.qos) if limits else None
        if cap is None:
            return None
        if self._held is None:
            self._queue()  # not polled by this instance yet: one squeue
        return max(0, cap - (self._held or 0))

    def cancel(self, job_ids: Collection[str]) -> None:
        """One scancel for all ids; ids Slurm no longer knows or that ended are ignored."""
        ids = self._checked_ids(job_ids)
        if not ids:
            return
        proc = self._run(["scancel", *ids], self._timeout)
        if proc.returncode == 0:
            return
        errors = [
            line
            for line in (proc.stderr or proc.stdout).splitlines()
            if line.strip() and not any(b in line for b in _SCANCEL_BENIGN)
        ]
        if errors:
            raise SchedulerError(failed("scancel", proc, " ".join(errors)))

    @staticmethod
    def _checked_ids(job_ids: Collection[str]) -> list[str]:
        """The ids once each, in order; ValueError for one that is not a Slurm job id."""
        ids = list(dict.fromkeys(job_ids))
        for jid in ids:
            if not TASK_ID_RE.match(jid):
                raise ValueError(f"not a Slurm job id: {jid!r}")
        return ids

    def find_jobs(self, name: str) -> list[str]:
        """One squeue (and, when accounting works, one sacct) by job name. Without
        accounting, only the jobs squeue still shows (queued, running, or ended less
        than ``MinJobAge`` ago): the caller finds the others by their files."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"unsafe job name {name!r}")
        out = self._checked(
            ["squeue", "--noheader", "--array", "--states=all", f"--name={name}", "--format=%i"],
            self._timeout,
        )
        found = {j for j in out.split() if TASK_ID_RE.match(j)}
        ended = self._sacct_run([f"--name={name}", "--format=JobID", "--starttime=now-7days"])
        found |= {j for j in (ended or "").split() if TASK_ID_RE.match(j)}

        def order(job_id: str) -> tuple[int, int]:
            m = TASK_ID_RE.match(job_id)
            assert m is not None  # filtered above
            return int(m["base"]), int(m["index"] or 0)

        return sorted(found, key=order)

    def version_record(self) -> dict[str, Any] | None:
        """``sinfo --version`` (see :func:`dlhpc.scheduler.slurm.checks.version_record`)."""
        return checks.version_record()

    def log_paths(self, folder: Path, job_id: str) -> list[Path]:
        """submitit's ``<id>_0_log.out`` and ``<id>_0_log.err`` in ``folder``."""
        paths = JobPaths(folder, job_id=job_id, task_id=0)
        return [paths.stdout, paths.stderr]


def new_scheduler(_root: Path) -> SlurmScheduler:
    """The registry's factory: Slurm keeps no files of its own under the state folder."""
    return SlurmScheduler()
