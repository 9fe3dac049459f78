"""The job script's requeue at the time limit, once the trial's step has ended.

``python -m dlhpc.scheduler.slurm.requeue ATTEMPT_DIR``, run by the batch script
(:func:`dlhpc.scheduler.slurm.sbatch.build_submission`) after srun returns, when the
attempt folder holds :data:`~dlhpc.protocol.REQUEUE_REQUEST_FILE`: rank 0's worker
writes it when the trial exited with :data:`~dlhpc.protocol.REQUEUE_EXIT_CODE` after
the time-limit signal. The requeue is asked here and not by the worker because
``scontrol requeue`` kills the job's running steps: from inside the step, srun would
report that kill (``srun: error: NODE: task 0: Terminated``) in the trial's log.

A refusal (a site whose jobs may not be requeued by their owner) is printed to the
job's log and published as a warning in the attempt's ``worker-r0`` stream; the job
then ends, and the reconciler, which sees exit 75 and no requeue, submits the trial
again. Standard library and :mod:`dlhpc.protocol` only: it runs in the batch shell.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from dlhpc.errors import DlhpcError
from dlhpc.protocol import REQUEUE_REQUEST_FILE, EventWriter, attempt_key
from dlhpc.scheduler.slurm.environment import SlurmJobEnvironment

__all__ = ["REFUSED_SUFFIX", "requeue_after_step"]

#: appended to a refusal's text: what happens instead
REFUSED_SUFFIX = "; the reconciler submits the trial again instead"


def requeue_after_step(attempt_dir: Path, environ: Mapping[str, str]) -> str:
    """Ask Slurm to requeue the task of ``environ`` whose run is ``attempt_dir``, if it
    holds a requeue request; returns "" when asked (or nothing was requested), else
    the refusal's text, which is also published as a warning in ``attempt_dir``.
    DlhpcError when ``attempt_dir`` is not this run's folder (a request that cannot be
    this task's is never acted on)."""
    if not (attempt_dir / REQUEUE_REQUEST_FILE).is_file():
        return ""
    job = SlurmJobEnvironment(environ)
    expected = attempt_key(job.job_id, job.restart)
    if attempt_dir.name != expected:
        raise DlhpcError(f"requeue: {attempt_dir} is not this run's attempt folder ({expected})")
    error = job.requeue_self()
    if error == "":
        return ""
    message = (error or "scontrol requeue: not in a Slurm job") + REFUSED_SUFFIX
    events = EventWriter(attempt_dir, "worker-r0")  # the worker that asked has exited
    events.add("log", level="warning", message=message)
    events.flush()
    return message


def main(argv: list[str] | None = None) -> int:
    """The batch script's call; prints a refusal to the job's log. Always 0 for a
    refusal (the job's status stays the step's), 1 for a misplaced request."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m dlhpc.scheduler.slurm.requeue ATTEMPT_DIR", file=sys.stderr)
        return 2
    try:
        refused = requeue_after_step(Path(args[0]), os.environ)
    except DlhpcError as err:
        print(f"dlhpc: {err}", file=sys.stderr)
        return 1
    if refused:
        print(f"dlhpc: {refused}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
