"""sbatch job arrays whose tasks submitit runs: one code path for render and submit.

:func:`build_submission` makes the :class:`Submission` of one chunk (a pure function:
no files, no commands); ``render`` shows its ``script`` and :func:`submit_array` writes
exactly that text, hands it to sbatch and places the tasks' pickles. The dry-run
object is the submission.

submitit's part is the job's side. Each task is a public
``submitit.helpers.DelayedSubmission`` of the in-job callable and its trial folder,
pickled where submitit's ``JobPaths`` says (``<array id>_<index>_submitted.pkl``). The
script's command is the in-job entry submitit's ``SlurmExecutor`` writes into every
script (:data:`IN_JOB_MODULE`: a command line, no Python API; the unit tests run it
against the installed submitit): it finds that pickle from ``SLURM_ARRAY_JOB_ID`` and
``SLURM_ARRAY_TASK_ID`` and calls the function. dlhpc writes the script (in the format
``SlurmExecutor`` writes) and runs sbatch itself, because submitit's executor cannot,
through its public API:

* submit a job array of one task (it submits a plain job then): dlhpc always submits
  an array, so every task id is ``<array_job_id>_<index>`` and the in-job worker
  always sees ``SLURM_ARRAY_JOB_ID``/``SLURM_ARRAY_TASK_ID``;
* run sbatch through a caller-given function (timeout, call counting, the launch's
  environment, errors as :class:`~dlhpc.errors.SchedulerError`); here a failed
  submission leaves no pickles or script behind;
* work without ``srun`` on the submitting host, nor show a script without submitting
  it (``render`` works on a laptop; ``submit`` fails there on sbatch, with its message).
"""

from __future__ import annotations

import hashlib
import re
import shlex
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from submitit.core.utils import JobPaths
from submitit.helpers import DelayedSubmission

from dlhpc.errors import SchedulerError
from dlhpc.protocol import REQUEUE_REQUEST_FILE, atomic_write_text
from dlhpc.protocol.layout import ATTEMPTS_DIR
from dlhpc.scheduler.base import JobRequest
from dlhpc.scheduler.slurm.jobsetup import setup_section

__all__ = [
    "IN_JOB_MODULE",
    "Submission",
    "build_submission",
    "submit_array",
    "sbatch_parameters",
    "parse_sbatch_args",
    "trial_list_text",
]

#: submitit's in-job entry: ``python -u -m IN_JOB_MODULE FOLDER`` runs the task's pickle.
IN_JOB_MODULE = "submitit.core._submit"
#: the batch shell's requeue once the step has ended (see :mod:`.requeue`)
REQUEUE_MODULE = "dlhpc.scheduler.slurm.requeue"
# submitit's default: a task requeued after its time limit this many times is not again
_MAX_NUM_TIMEOUT = 3
_JOB_ID_RE = re.compile(r"job (?P<id>[0-9]+)")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARG_RE = re.compile(r"^--(?P<key>[A-Za-z][A-Za-z0-9_-]*)(?:=(?P<value>.*))?$")
# sbatch options dlhpc owns: overriding them would break log paths or arrays.
# --export: jobs get the environment sbatch runs in (the launch's, see JobRequest.submit_env).
_RESERVED = {"array", "output", "error", "open-mode", "wrap", "parsable", "wckey", "export"}
# sbatch_parameters' keys that are not #SBATCH flags
_NOT_FLAGS = {"additional_parameters", "array_parallelism", "setup", "srun_args"}

SbatchRunner = Callable[[Path], str]
"""Runs ``sbatch <script>`` and returns its stdout; raises SchedulerError on failure."""


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
    """The job's parameters for one chunk of ``n_tasks`` run at most ``throttle`` at a
    time (``%throttle``; 0 = no limit), named as submitit's ``SlurmExecutor`` names
    them: ``#SBATCH`` flags (None: not given), ``additional_parameters`` (flags as
    sbatch spells them, winning over the others), ``array_parallelism``, ``setup``
    (the script's lines before the command) and ``srun_args``."""
    res = request.resources
    pre = request.preemption
    additional: dict[str, Any] = {
        # Not "B:": the script runs the worker in an srun step, and B: signals only the
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
        "array_parallelism": throttle or n_tasks,
        "additional_parameters": additional,
    }
    python = shlex.quote(request.python or sys.executable)
    setup = setup_section(request.setup, python) + _setup_lines(request.env)
    if setup:
        params["setup"] = setup
    if res.cpus_per_task > 1:
        # Slurm >= 22.05: srun no longer inherits sbatch's --cpus-per-task.
        params["srun_args"] = [f"--cpus-per-task={res.cpus_per_task}"]
    return params


def _flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def _script(
    params: Mapping[str, Any], n_tasks: int, trial_list: Path, folder: Path, python: str
) -> str:
    """The sbatch text for ``params`` (see :func:`sbatch_parameters`), in the format
    submitit's ``SlurmExecutor`` writes: sorted ``#SBATCH`` lines, the task's trial
    folder read from ``trial_list`` (:func:`_trial_lines`), the setup, then
    submitit's in-job entry in an srun step; then the requeue asked for by the trial
    (:func:`_requeue_lines`), and the step's exit status as the script's.
    Logs: ``<folder>/%A_%a_<task>_log.*``."""
    layout = JobPaths(folder)  # no job id: the %j and %t placeholders stay
    stdout, stderr = (str(p).replace("%j", "%A_%a") for p in (layout.stdout, layout.stderr))
    flags = {k: v for k, v in params.items() if k not in _NOT_FLAGS and v is not None}
    flags["array"] = f"0-{n_tasks - 1}%{min(n_tasks, params['array_parallelism'])}"
    flags["output"] = stdout.replace("%t", "0")
    flags["error"] = stderr.replace("%t", "0")
    flags["open-mode"] = "append"
    flags.update(params["additional_parameters"])
    lines = ["#!/bin/bash", "", "# Parameters", *(_flag(k, flags[k]) for k in sorted(flags))]
    lines += ["", *_trial_lines(trial_list)]
    if params.get("setup"):
        lines += ["", "# setup", *params["setup"]]
    srun = ["srun", "--unbuffered", "--output", stdout, "--error", stderr]
    command = f"{python} -u -m {IN_JOB_MODULE} {shlex.quote(str(folder))}"
    srun_line = shlex.join([*srun, *params.get("srun_args", ())]) + " " + command
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", srun_line, "_dlhpc_status=$?"]
    lines += [*_requeue_lines(python), 'exit "$_dlhpc_status"', ""]
    return "\n".join(lines)


def trial_list_text(trial_dirs: Sequence[Path]) -> str:
    """The chunk's list of trial folders, one a line in array index order, as the
    script reads it (:func:`_trial_lines`); SchedulerError for a folder whose path
    holds a newline (no line could name it)."""
    bad = [str(d) for d in trial_dirs if "\n" in str(d)]
    if bad:
        raise SchedulerError(f"a trial folder's path holds a newline: {bad[0]!r}")
    return "".join(f"{d}\n" for d in trial_dirs)


def _trial_lines(trial_list: Path) -> list[str]:
    """``_dlhpc_trial``: the task's trial folder, line ``SLURM_ARRAY_TASK_ID`` (from 0)
    of ``trial_list``, read by bash itself (``mapfile``: no command, no eval), so the
    script's length does not grow with the array's (Slurm caps a batch script at 4 MB)."""
    quoted = shlex.quote(str(trial_list))
    return [
        "# dlhpc: this task's trial folder, line SLURM_ARRAY_TASK_ID (from 0) of the chunk's list",
        f'mapfile -t -s "${{SLURM_ARRAY_TASK_ID:-0}}" -n 1 _dlhpc_line < {quoted}',
        '_dlhpc_trial="${_dlhpc_line[0]-}"',
        'if [ -z "$_dlhpc_trial" ]; then',
        f'  echo "dlhpc: no line ${{SLURM_ARRAY_TASK_ID:-0}} in "{quoted} >&2',
        "fi",
    ]


def _requeue_lines(python: str) -> list[str]:
    """After the step: the requeue the worker asked for at the time limit (its request
    file in this run's attempt folder, named as :func:`dlhpc.protocol.attempt_key`
    names it), asked by :mod:`dlhpc.scheduler.slurm.requeue` once the step has ended, so
    that Slurm's kill of the requeued job meets no running step."""
    attempts = shlex.quote(ATTEMPTS_DIR)
    task = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.r${SLURM_RESTART_COUNT:-0}"'
    return [
        "# dlhpc: the requeue the trial asked for at the time limit, once its step has ended",
        f'_dlhpc_attempt="$_dlhpc_trial"/{attempts}/{task}',
        f'if [ -e "$_dlhpc_attempt"/{shlex.quote(REQUEUE_REQUEST_FILE)} ]; then',
        f'  {python} -m {REQUEUE_MODULE} "$_dlhpc_attempt"',
        "fi",
    ]


@dataclass(frozen=True)
class Submission:
    """One chunk's sbatch array: ``script`` is the text sbatch gets; task ``i`` of the
    array runs the in-job callable on ``trial_dirs[i]``, which the script reads from
    ``trial_list`` (written before sbatch runs: :func:`submit_array`)."""

    name: str
    folder: Path  # absolute: scripts, pickles, logs and the trial list
    script: str
    trial_dirs: tuple[Path, ...]
    time_minutes: int
    trial_list: Path


def build_submission(request: JobRequest, throttle: int) -> Submission:
    """The submission of ``request`` (one chunk: all its trial folders) run at most
    ``throttle`` tasks at a time (0 = no limit); creates no files. The trial list's
    name is its content's hash: the same chunk always names the same list."""
    n_tasks = len(request.trial_dirs)
    if n_tasks < 1:
        raise ValueError("a chunk needs at least one task")
    params = sbatch_parameters(request, n_tasks, throttle)
    folder = Path(request.folder).expanduser().absolute()
    python = shlex.quote(request.python or sys.executable)
    digest = hashlib.sha256(trial_list_text(request.trial_dirs).encode()).hexdigest()[:16]
    trial_list = folder / f"trial-folders-{digest}.txt"
    return Submission(
        name=request.name,
        folder=folder,
        script=_script(params, n_tasks, trial_list, folder, python),
        trial_dirs=tuple(request.trial_dirs),
        time_minutes=request.resources.time_minutes,
        trial_list=trial_list,
    )


def submit_array(
    submission: Submission, fn: Callable[[str], object], run_sbatch: SbatchRunner
) -> list[str]:
    """Submit ``submission`` (its tasks call ``fn(str(trial_dir))``); returns the task
    ids ``<array id>_<index>``. The script ends up as ``<array id>_submission.sh``,
    task ``i``'s pickle as ``<array id>_<i>_submitted.pkl``, both in its folder; on
    any failure neither is left behind. The trial list is written (atomically) before
    sbatch runs; on failure it is removed unless it was there already (the same
    chunk submitted before names the same file)."""
    folder = submission.folder
    folder.mkdir(parents=True, exist_ok=True)
    listed = submission.trial_list.exists()
    uid = uuid.uuid4().hex
    script = folder / f".submission_file_{uid}.sh"
    pickles = [folder / f".{uid}_{i}.pkl" for i in range(len(submission.trial_dirs))]
    try:
        for path, trial in zip(pickles, submission.trial_dirs, strict=True):
            task = DelayedSubmission(fn, str(trial))
            task.set_timeout(submission.time_minutes, _MAX_NUM_TIMEOUT)
            task.dump(path)
        script.write_text(submission.script, encoding="utf-8")
        # before sbatch: a task may start at once
        atomic_write_text(submission.trial_list, trial_list_text(submission.trial_dirs))
        output = run_sbatch(script)
        found = _JOB_ID_RE.search(output)
        if found is None:
            raise SchedulerError(
                f"sbatch gave no job id ({output.strip()!r}); the array may be queued "
                f"(job name {submission.name!r})"
            )
    except BaseException:
        for path in (script, *pickles, *([] if listed else [submission.trial_list])):
            path.unlink(missing_ok=True)
        raise
    array_id = found["id"]
    script.rename(JobPaths(folder, job_id=array_id).submission_file)
    ids = [f"{array_id}_{i}" for i in range(len(pickles))]
    for path, job_id in zip(pickles, ids, strict=True):
        path.rename(JobPaths(folder, job_id=job_id).submitted_pickle)
    return ids
