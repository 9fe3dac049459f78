"""Building sbatch submissions through submitit.

One code path makes the sbatch text for both ``render`` and ``submit``:
:func:`make_executor` configures an :class:`ArrayExecutor` for one chunk, and
its ``_make_submission_file_text`` is what ``submit`` writes and hands to
sbatch, and what ``render`` returns.

:class:`ArrayExecutor` differs from submitit's ``SlurmExecutor`` in three ways:

* it always submits a job array, also for a single task (submitit submits a
  plain job then), so every task id is ``<array_job_id>_<index>`` and the
  in-job worker always sees ``SLURM_ARRAY_JOB_ID``/``SLURM_ARRAY_TASK_ID``;
* sbatch runs through a caller-given function (timeout, call counting, errors
  as :class:`~dlhpc.errors.SchedulerError`), and a failed submission leaves no
  pickles or script behind;
* it does not require ``srun`` on the submitting host (``render`` works on a
  laptop; ``submit`` fails there on sbatch, with sbatch's message).
"""

from __future__ import annotations

import re
import shlex
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from submitit.core import core, utils
from submitit.slurm.slurm import SlurmExecutor, SlurmJob

from dlhpc.errors import SchedulerError
from dlhpc.scheduler.base import JobRequest
from dlhpc.scheduler.slurm.jobsetup import setup_section

__all__ = ["ArrayExecutor", "make_executor", "sbatch_parameters", "parse_sbatch_args"]

_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARG_RE = re.compile(r"^--(?P<key>[A-Za-z][A-Za-z0-9_-]*)(?:=(?P<value>.*))?$")
# sbatch options dlhpc owns: overriding them would break log paths or arrays.
# --export: jobs get the environment sbatch runs in (the launch's, see JobRequest.submit_env).
_RESERVED = {"array", "output", "error", "open-mode", "wrap", "parsable", "wckey", "export"}

SbatchRunner = Callable[[Path], str]
"""Runs ``sbatch <script>`` and returns its stdout; raises SchedulerError on failure."""


class ArrayExecutor(SlurmExecutor):
    """submitit's SlurmExecutor that always submits one array (see module docs)."""

    def __init__(self, folder: Path, *, python: str | None, run_sbatch: SbatchRunner) -> None:
        super().__init__(folder, python=python)
        self._run_sbatch = run_sbatch

    @classmethod
    def affinity(cls) -> int:
        return 2  # no srun check: sbatch itself reports a missing Slurm

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[core.Job[Any]]:
        n = len(delayed_submissions)
        if self.parameters.get("map_count") != n:
            built = self.parameters.get("map_count")
            raise RuntimeError(f"executor built for {built} tasks, got {n}")
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        timeout_min = self.parameters.get("time", 5)
        pickles: list[Path] = []
        try:
            for delayed in delayed_submissions:
                path = folder / f"{uuid.uuid4().hex}.pkl"
                pickles.append(path)
                delayed.set_timeout(timeout_min, self.max_num_timeout)
                delayed.dump(path)
            array_id = self._submit_command(self._submitit_command_str).job_id
        except BaseException:
            for path in pickles:
                path.unlink(missing_ok=True)
            raise
        tasks = list(range(self._num_tasks()))
        jobs: list[core.Job[Any]] = []
        for index, path in enumerate(pickles):
            job: SlurmJob[Any] = SlurmJob(self.folder, job_id=f"{array_id}_{index}", tasks=tasks)
            job.paths.move_temporary_file(path, "submitted_pickle")
            jobs.append(job)
        return jobs

    def _submit_command(self, command: str) -> core.Job[Any]:
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        uid = uuid.uuid4().hex
        script = folder / f".submission_file_{uid}.sh"
        script.write_text(self._make_submission_file_text(command, uid), encoding="utf-8")
        try:
            output = self._run_sbatch(script)
        except BaseException:
            script.unlink(missing_ok=True)
            raise
        try:
            job_id = self._get_job_id_from_submission_command(output)
        except utils.FailedSubmissionError as err:
            raise SchedulerError(
                f"sbatch gave no job id ({output.strip()!r}); the array may be queued "
                f"(job name {self.parameters.get('job_name')!r})"
            ) from err
        job: core.Job[Any] = SlurmJob(folder=self.folder, job_id=job_id, tasks=[0])
        job.paths.move_temporary_file(script, "submission_file")  # <id>_submission.sh
        return job


def parse_sbatch_args(args: Sequence[str]) -> dict[str, Any]:
    """``("--mail-type=END", "--exclusive")`` -> ``{"mail-type": "END", "exclusive": True}``.

    Raises SchedulerError for a token that is not ``--key[=value]`` or that
    names an option dlhpc sets itself (array, output, error, ...).
    """
    out: dict[str, Any] = {}
    for token in args:
        m = _ARG_RE.match(token)
        if m is None:
            raise SchedulerError(f"sbatch_args: {token!r} is not of the form --key=value or --flag")
        key = m["key"].replace("_", "-")
        if key in _RESERVED:
            raise SchedulerError(f"sbatch_args: --{key} is set by dlhpc and may not be given")
        out[key] = True if m["value"] is None else m["value"]
    return out


def _setup_lines(env: dict[str, str]) -> list[str]:
    lines = []
    for key in sorted(env):
        if not _ENV_KEY_RE.match(key):
            raise SchedulerError(f"environment variable name {key!r} is not a shell identifier")
        lines.append(f"export {key}={shlex.quote(env[key])}")
    return lines


def _gpu_request(request: JobRequest) -> dict[str, Any]:
    """``--gpus-per-node=[TYPE:]N`` or, where the site says ``gpu_request: gres``,
    ``--gres=gpu:[TYPE:]N`` (merged with a non-GPU ``--gres`` of sbatch_args)."""
    res = request.resources
    if not res.gpus_per_node:
        return {}
    spec = f"{res.gpu_type}:{res.gpus_per_node}" if res.gpu_type else str(res.gpus_per_node)
    if request.site.gpu_request != "gres":
        return {"gpus_per_node": spec}
    other = parse_sbatch_args(res.sbatch_args).get("gres")
    return {"gres": f"gpu:{spec}" + (f",{other}" if isinstance(other, str) else "")}


def sbatch_parameters(request: JobRequest, n_tasks: int, throttle: int) -> dict[str, Any]:
    """submitit ``update_parameters`` keywords for one chunk of ``n_tasks`` run at
    most ``throttle`` at a time (``%throttle``; 0 = no limit)."""
    res = request.resources
    pre = request.preemption
    additional: dict[str, Any] = {
        # Not "B:": submitit runs the worker in an srun step, and B: signals only the
        # batch shell, which has no trap and dies of it (job FAILED, worker SIGTERMed).
        # Without B:, Slurm signals the job steps, i.e. the worker. Measured on the dev
        # cluster (Slurm 22.05), see tests/integration/test_scheduler_cluster.py.
        "signal": f"{pre.signal}@{pre.lead_time_s}",
        "requeue": True,
        # explicit, whatever the site's default: the job's environment is the one sbatch
        # runs in, which dlhpc sets to the launch's (JobRequest.submit_env)
        "export": "ALL",
    }
    additional.update(parse_sbatch_args(res.sbatch_args))
    if res.gpus_per_node and request.site.gpu_request == "gres":
        additional.pop("gres", None)  # merged into the GPU request
    params: dict[str, Any] = {
        "job_name": request.name,
        "partition": res.partition,
        "account": res.account,
        "qos": res.qos,
        "constraint": res.constraint,
        "nodes": res.nodes,
        "ntasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
        **_gpu_request(request),
        "mem": res.mem,
        "time": res.time_minutes,
        "wckey": None,
        "stderr_to_stdout": False,
        "array_parallelism": throttle or n_tasks,
        "additional_parameters": additional,
    }
    python = shlex.quote(request.python or sys.executable)
    setup = setup_section(request.setup, request.trial_dirs, python) + _setup_lines(request.env)
    if setup:
        params["setup"] = setup
    if res.cpus_per_task > 1:
        # Slurm >= 22.05: srun no longer inherits sbatch's --cpus-per-task.
        params["srun_args"] = [f"--cpus-per-task={res.cpus_per_task}"]
    return params


def make_executor(
    request: JobRequest, n_tasks: int, throttle: int, run_sbatch: SbatchRunner
) -> ArrayExecutor:
    """The executor for one chunk of ``n_tasks``; creates no files."""
    if n_tasks < 1:
        raise ValueError("a chunk needs at least one task")
    # submitit pastes ``python`` into the script's command line as it is (it quotes
    # only its own default, sys.executable): quote ours, or a path with spaces or
    # ``$(...)`` in it would be split or run by the job's shell.
    python = shlex.quote(request.python) if request.python else None
    executor = ArrayExecutor(request.folder, python=python, run_sbatch=run_sbatch)
    executor.update_parameters(**sbatch_parameters(request, n_tasks, throttle))
    executor.parameters["map_count"] = n_tasks
    return executor
