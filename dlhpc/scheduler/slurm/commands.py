"""Running Slurm's commands for :class:`~dlhpc.scheduler.slurm.scheduler.SlurmScheduler`:
counted, with a timeout, in a given environment, and ``sacct`` (the job records and
their runs) with its one-way switch off when accounting is unavailable.

A failing ``sacct`` (accounting off, slurmdbd down) is not an error: the instance
stops calling it, logs one warning and says so in
:attr:`SlurmCommands.accounting_available`; its callers then decide from squeue and
the jobs' own exit files.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
from collections.abc import Collection, Mapping

from dlhpc.errors import SchedulerError
from dlhpc.scheduler.base import JobStatus
from dlhpc.scheduler.slurm.parse import (
    SACCT_FORMAT,
    SACCT_RUNS_FORMAT,
    TASK_ID_RE,
    base_id,
    parse_sacct,
    parse_sacct_runs,
)

__all__ = ["SlurmCommands", "failed", "one_line", "run"]

log = logging.getLogger(__name__)


def one_line(text: str, limit: int = 500) -> str:
    """``text``'s whitespace collapsed, cut to ``limit`` characters (for error messages)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def failed(name: str, proc: subprocess.CompletedProcess[str], detail: str | None = None) -> str:
    """``<name> failed (exit N): <one line of stderr, else stdout, else detail>``."""
    text = (proc.stderr or proc.stdout) if detail is None else detail
    return f"{name} failed (exit {proc.returncode}): {one_line(text)}"


def run(
    args: list[str], timeout: float, environ: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command in ``environ`` (default: this process's) with no stdin and
    Slurm's standard time format; SchedulerError when it cannot run or times out. A
    non-zero exit is returned, not raised: callers judge it."""
    env = dict(os.environ if environ is None else environ, SLURM_TIME_FORMAT="standard")
    try:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise SchedulerError(f"{args[0]} timed out after {timeout:g} s") from err
    except OSError as err:
        raise SchedulerError(f"cannot run {args[0]}: {err.strerror or err}") from err


class SlurmCommands:
    """The command runner a Slurm scheduler is built on (``calls`` counts commands by
    name; every command has ``command_timeout_s`` unless its caller gives another)."""

    def __init__(self, command_timeout_s: float = 30.0) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self._timeout = command_timeout_s
        self._accounting = True

    def _run(
        self, args: list[str], timeout: float, environ: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (counted) in ``environ`` (default: this process's);
        SchedulerError when it cannot run or times out.

        A non-zero exit is returned, not raised: callers judge it.
        """
        self.calls[args[0]] += 1
        return run(args, timeout, environ)

    def _checked(
        self, args: list[str], timeout: float, environ: Mapping[str, str] | None = None
    ) -> str:
        proc = self._run(args, timeout, environ)
        if proc.returncode != 0:
            raise SchedulerError(failed(args[0], proc))
        return proc.stdout

    def _sacct(self, ids: list[str]) -> dict[str, JobStatus]:
        """One sacct for the arrays of ``ids``; {} (and no more sacct) once it fails."""
        jobs = ",".join(sorted({base_id(j) for j in ids}, key=int))
        out = self._sacct_run([f"--jobs={jobs}", f"--format={SACCT_FORMAT}"])
        return {} if out is None else parse_sacct(out)

    def _sacct_run(self, args: list[str]) -> str | None:
        """``sacct -X --noheader --parsable2 ARGS``'s output; None (and no more sacct
        from this instance, one warning) once it fails or while accounting is off."""
        if not self._accounting:
            return None
        try:
            proc = self._run(["sacct", "-X", "--noheader", "--parsable2", *args], self._timeout)
            if proc.returncode != 0:
                raise SchedulerError(failed("sacct", proc))
        except SchedulerError as err:
            self._accounting = False
            log.warning(
                "Slurm accounting unavailable (%s): finished jobs are reported from squeue or as "
                "UNKNOWN, and sacct is not called again by this scheduler",
                err,
            )
            return None
        return proc.stdout

    @property
    def accounting_available(self) -> bool:
        """False once sacct failed; this instance then no longer calls it."""
        return self._accounting

    def run_states(self, job_ids: Collection[str]) -> dict[str, list[str]]:
        """Every run of each job as ``sacct -D`` lists it (one sacct); {} without
        accounting. Slurm 24.11 requeues a preempted task under the same id, and only
        this record tells ``PREEMPTED`` from another requeue."""
        ids = [j for j in dict.fromkeys(job_ids) if TASK_ID_RE.match(j)]
        if not ids:
            return {}
        jobs = ",".join(sorted({base_id(j) for j in ids}, key=int))
        out = self._sacct_run(["-D", f"--jobs={jobs}", f"--format={SACCT_RUNS_FORMAT}"])
        runs = parse_sacct_runs(out or "")
        return {j: runs[j] for j in ids if j in runs}
