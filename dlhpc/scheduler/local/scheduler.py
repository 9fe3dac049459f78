"""LocalScheduler: job arrays mirrored by detached runner processes (no Slurm).

``submit`` writes one batch (see :mod:`dlhpc.scheduler.local.batch` for the
layout) under ``request.folder`` and starts ONE detached runner for it, which
runs the tasks ``python -m <worker_module> TRIAL_DIR`` at most N at a time
(N = ``request.max_concurrent`` or ``site.local_max_parallel`` or the number of
CPUs). ``poll`` only reads files: constant cost, no subprocess. All batches are
indexed under ``root`` (pass the same root every time) so that a job id alone
finds its batch.

A runner that died leaves its RUNNING tasks FAILED (reason ``runner died``) and
its not-started tasks UNKNOWN. Liveness is the runner's flock on
``runner.lock``, so it needs a local file system (the local backend's home).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Collection
from datetime import datetime
from pathlib import Path
from typing import Any

from dlhpc.errors import SchedulerError
from dlhpc.protocol import atomic_write_text
from dlhpc.scheduler.base import BaseScheduler, JobRequest, JobState, JobStatus, SubmittedTask
from dlhpc.scheduler.local.batch import (
    Batch,
    BatchPaths,
    job_id,
    lock_exclusive,
    parse_job_id,
    runner_alive,
)

__all__ = ["LocalScheduler"]

_PLACEHOLDER = "BATCHID"
_RUNNER = "dlhpc.scheduler.local.runner"


def _time(value: Any) -> datetime | None:
    return datetime.fromtimestamp(float(value)) if value is not None else None


def _is_final(record: dict[str, Any] | None) -> bool:
    return record is not None and JobState(record["state"]).is_terminal


class LocalScheduler(BaseScheduler):
    """Local backend; ``root`` holds the batch index, ``worker_module`` is run with
    ``python -m`` per task (tests substitute a stand-in)."""

    name = "local"

    def __init__(self, root: Path, *, worker_module: str = "dlhpc.harness.worker") -> None:
        self.root = root
        self.worker_module = worker_module

    # -- helpers -----------------------------------------------------------------

    def _parallel(self, request: JobRequest) -> int:
        return request.max_concurrent or request.site.local_max_parallel or os.cpu_count() or 1

    def _command(self, request: JobRequest) -> list[str]:
        python = shlex.split(request.python) if request.python else [sys.executable]
        return [*python, "-m", self.worker_module]

    def _describe(self, request: JobRequest, batch: str, spec: Path) -> str:
        n = len(request.trial_dirs)
        lines = [
            f"# dlhpc local batch {request.name!r}: {n} task(s), "
            f"at most {self._parallel(request)} at a time",
            f"# runner: {shlex.join([sys.executable, '-m', _RUNNER, str(spec)])}",
        ]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(request.env.items())]
        command = self._command(request)
        for i, trial in enumerate(request.trial_dirs):
            argv = [f"DLHPC_JOB_ID={job_id(batch, i)}", *command, str(trial)]
            lines.append(shlex.join(argv))
        return "\n".join(lines) + "\n"

    def _new_batch(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            batch = uuid.uuid4().hex[:8]
            try:
                (self.root / f"{batch}.batch").open("x").close()
            except FileExistsError:
                continue
            return batch
        raise SchedulerError(f"cannot allocate a batch id under {self.root}")

    def _paths(self, batch: str) -> BatchPaths | None:
        try:
            text = (self.root / f"{batch}.batch").read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return BatchPaths(Path(text)) if text else None

    # -- the contract ----------------------------------------------------------

    def render(self, request: JobRequest) -> list[str]:
        """The batch description submit writes to ``batch.txt``, with the batch id
        (not known before submit) shown as ``BATCHID``."""
        spec = BatchPaths.of(request.folder, _PLACEHOLDER).spec
        return [self._describe(request, _PLACEHOLDER, spec)]

    def submit(self, request: JobRequest) -> list[SubmittedTask]:
        """Write the batch and start its runner; all tasks are PENDING on return."""
        if not request.trial_dirs:
            return []
        for key in request.env:
            if not key or "=" in key or "\0" in key:
                raise SchedulerError(f"environment variable name {key!r} is invalid")
        batch = self._new_batch()
        paths = BatchPaths.of(request.folder, batch)
        try:
            paths.dir.mkdir(parents=True)
            spec = Batch(
                batch=batch,
                name=request.name,
                trial_dirs=[str(d) for d in request.trial_dirs],
                command=self._command(request),
                env=dict(request.env),
                max_parallel=self._parallel(request),
            )
            atomic_write_text(paths.spec, spec.to_json())
            atomic_write_text(paths.script, self._describe(request, batch, paths.spec))
            self._spawn(paths)
            atomic_write_text(self.root / f"{batch}.batch", str(paths.dir) + "\n")
        except (OSError, SchedulerError) as err:
            (self.root / f"{batch}.batch").unlink(missing_ok=True)
            raise SchedulerError(f"local submit of {request.name!r} failed: {err}") from err
        return [
            SubmittedTask(trial, job_id(batch, i), paths.stdout(i), paths.stderr(i))
            for i, trial in enumerate(request.trial_dirs)
        ]

    def _spawn(self, paths: BatchPaths) -> None:
        """Start the runner holding the batch lock (taken here, inherited by it)."""
        lock_fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            lock_exclusive(lock_fd, block=True)
            with paths.runner_log.open("ab") as log:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        _RUNNER,
                        str(paths.spec),
                        "--lock-fd",
                        str(lock_fd),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(lock_fd,),
                    start_new_session=True,
                )
        finally:
            os.close(lock_fd)  # the runner's copy keeps the lock
        atomic_write_text(paths.pid, f"{proc.pid}\n")

    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        """Read status files; no subprocess. Unknown batches/ids -> UNKNOWN."""
        parsed = {jid: parse_job_id(jid) for jid in dict.fromkeys(job_ids)}
        located: dict[str, BatchPaths | None] = {}
        alive: dict[str, bool] = {}
        out: dict[str, JobStatus] = {}
        for jid, (batch, index) in parsed.items():
            if batch not in located:
                located[batch] = self._paths(batch)
            paths = located[batch]
            if paths is None or not paths.spec.exists():
                out[jid] = JobStatus(jid, JobState.UNKNOWN)
                continue
            if batch not in alive and not _is_final(paths.read_status(index)):
                alive[batch] = runner_alive(paths)
            # read after the liveness check: a runner finishes its tasks before it exits
            record = paths.read_status(index) or {"state": "PENDING"}
            state = JobState(record["state"])
            reason = str(record.get("reason") or "")
            if not state.is_terminal and not alive.get(batch, True):
                state = JobState.FAILED if state is JobState.RUNNING else JobState.UNKNOWN
                reason = "runner died"
            out[jid] = JobStatus(
                job_id=jid,
                state=state,
                raw_state=str(record["state"]),
                node_list="localhost",
                start=_time(record.get("start")),
                end=_time(record.get("end")),
                exit_code=record.get("exit_code"),
                reason=reason,
            )
        return out

    def cancel(self, job_ids: Collection[str]) -> None:
        """Write cancel markers; the runner SIGTERMs the running tasks' process
        groups within a tick (SIGKILL 10 s later) and never starts pending ones."""
        for jid in dict.fromkeys(job_ids):
            batch, index = parse_job_id(jid)
            paths = self._paths(batch)
            if paths is None or not paths.spec.exists():
                continue
            atomic_write_text(paths.cancel(index), "")

    def find_jobs(self, name: str) -> list[str]:
        """Ids of the tasks of every batch submitted under ``name``, read from the
        batch index under ``root`` and each batch's ``batch.json``: batches in the
        order their index was written, tasks in order. A batch whose files cannot be
        read is not found."""
        found: list[tuple[int, str, int]] = []
        for entry in self.root.glob("*.batch") if self.root.is_dir() else []:
            paths = self._paths(entry.stem)
            try:
                spec = Batch.read(paths.spec) if paths is not None else None
                written = entry.stat().st_mtime_ns
            except (OSError, ValueError, TypeError):
                continue
            if spec is not None and spec.name == name:
                found.append((written, entry.stem, len(spec.trial_dirs)))
        return [job_id(batch, i) for _, batch, n in sorted(found) for i in range(n)]

    def log_paths(self, folder: Path, job_id: str) -> list[Path]:
        """``<folder>/local-<batch>/logs/<i>.out`` and ``.err``."""
        batch, index = parse_job_id(job_id)
        paths = BatchPaths.of(folder, batch)
        return [paths.stdout(index), paths.stderr(index)]
