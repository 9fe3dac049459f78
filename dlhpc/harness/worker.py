"""The in-job worker: runs one trial's entrypoint and records the attempt.

Called on the compute node, by submitit (``run_trial``) on Slurm or as
``python -m dlhpc.harness.worker TRIAL_DIR`` by the local backend. It never
opens the database: it publishes ``start`` and ``exit`` records into the
attempt's folder (see :mod:`dlhpc.protocol`), keeps ``heartbeat.json`` fresh,
and runs ``entry.sh`` (site modules, ``environment.setup``, the entrypoint) in
the trial's working folder (links to the read-only code snapshot:
:mod:`dlhpc.harness._workfolder`), with the trial's facts in ``DLHPC_*`` variables.
Hyperparameters reach the script only through ``trial.json``: read by
``dlhpc.init()``, or by the script runner that fills a template entrypoint
(:mod:`dlhpc.integrations.script`, started by entry.sh as ``$DLHPC_PYTHON``).

The job's identity, ranks and nodes come from its backend's job environment
(:class:`~dlhpc.scheduler.environment.JobEnvironment`, found through the
registry), never from a scheduler's variables directly.

Signals. Slurm signals every process of the job (preemption: TERM, then KILL
after the grace time; time limit: USR2 ``lead_time`` seconds before). The
worker forwards what it receives to the entrypoint's process group (so the
local backend's cancel works the same), notes the first signal, and when the
script exits with :data:`~dlhpc.protocol.REQUEUE_EXIT_CODE` after the backend's
time-limit signal (Slurm: USR2), rank 0 writes
:data:`~dlhpc.protocol.REQUEUE_REQUEST_FILE` into its attempt folder: the job script
asks the backend to requeue this task once the step has ended (Slurm: ``scontrol
requeue``, see :mod:`dlhpc.scheduler.slurm.requeue`). After a TERM Slurm requeues
preempted jobs itself; anything else is for the reconciler. After a TERM, rank 0 asks the backend
once whether it is a preemption and says so in its exit record (``preempted``).
A script that died of a signal the worker forwards (exit 128+n) ended by that
signal even when the worker's own copy had not arrived yet (the scheduler signals
each process on its own): the exit record says so, and it is no crash. The
entrypoint starts with those signals at their default action even when the worker
itself was started with them ignored (a wrapper's ``nohup``-like setup would
otherwise make the script deaf to preemption).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from dlhpc.errors import DlhpcError
from dlhpc.harness._workfolder import prepare_work_dir
from dlhpc.harness.distributed import rank_env
from dlhpc.harness.telemetry import start_gpu_sampler
from dlhpc.protocol import (
    ATTEMPT_DIR_VAR,
    HEARTBEAT_FILE,
    HEARTBEAT_INTERVAL_S,
    PROGRESS_FILE,
    REQUEUE_EXIT_CODE,
    REQUEUE_REQUEST_FILE,
    SETUP_DONE_VAR,
    TRIAL_DIR_VAR,
    EventWriter,
    TrialSpec,
    atomic_write_text,
    attempt_key,
    attempts_dir,
    read_small_json,
    trial_file,
    work_dir,
)
from dlhpc.repro.job import attempt_record, deterministic_env
from dlhpc.scheduler.environment import JobEnvironment
from dlhpc.scheduler.plugins import BackendTable

__all__ = ["TrialFailed", "exit_reason", "job_identity", "run_trial"]

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class TrialFailed(DlhpcError):
    """The entrypoint failed: a non-zero exit other than the planned
    :data:`~dlhpc.protocol.REQUEUE_EXIT_CODE` (raised so that Slurm marks the job FAILED)."""


def job_identity(environ: Mapping[str, str]) -> tuple[str, int, int]:
    """(job id, restart count, rank) of this process, from its backend's job environment."""
    job = _job(environ)
    return job.job_id, job.restart, job.rank


def _job(environ: Mapping[str, str]) -> JobEnvironment:
    try:
        return BackendTable().job_environment(environ)
    except DlhpcError as err:
        raise DlhpcError(f"worker: {err}") from None


def _child_env(spec: TrialSpec, trial_dir: Path, attempt_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    try:
        cpus = _job(env).cpus_per_task
    except DlhpcError:  # not in a scheduler's job (a direct call): no CPU count given
        cpus = None
    env.update(spec.env)
    # `python` in the entrypoint means the interpreter that has dlhpc, unless the
    # user's environment.setup activates another environment: it runs later (entry.sh),
    # or it ran before this worker (a job script that put this folder first before it).
    if env.get(SETUP_DONE_VAR) != "done":
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", cpus or "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["DLHPC_PYTHON"] = sys.executable  # entry.sh's script runner (a template entrypoint)
    env[TRIAL_DIR_VAR] = str(trial_dir)
    env[ATTEMPT_DIR_VAR] = str(attempt_dir)
    env["DLHPC_EXPERIMENT_ID"] = str(spec.experiment_id)
    env["DLHPC_TRIAL_ID"] = str(spec.trial_id)
    # torch.distributed's RANK, WORLD_SIZE, ..., MASTER_PORT for this task. They
    # replace inherited values (sbatch exports the submitter's environment, which may
    # hold stale ones); the experiment's or site's env (spec.env) wins over them.
    try:
        ranks = rank_env(env)
    except DlhpcError as err:
        print(f"dlhpc worker: {err}; rank variables not set", file=sys.stderr, flush=True)
        ranks = {}
    env.update({k: v for k, v in ranks.items() if k not in spec.env})
    if spec.deterministic:  # before the interpreter starts; the experiment's env wins
        env.update({k: v for k, v in deterministic_env(spec.seed).items() if k not in spec.env})
    return env


class _Heartbeat(threading.Thread):
    """Rewrites ``heartbeat.json`` every interval until stopped (liveness for the reconciler)."""

    def __init__(self, path: Path, interval: float) -> None:
        super().__init__(name="dlhpc-heartbeat", daemon=True)
        self.path = path
        self.interval = interval
        self.stopped = threading.Event()

    def beat(self) -> None:
        # a full or flaky filesystem must not kill the training; staleness shows it
        with contextlib.suppress(OSError):
            atomic_write_text(self.path, json.dumps({"time": time.time(), "pid": os.getpid()}))

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.beat()


def exit_reason(code: int, received: list[str]) -> tuple[str, str | None]:
    """``(reason, signal)`` of the exit record for the entrypoint's exit ``code``
    (signals as 128+n) given the signals the worker received (names, in order):
    ``completed`` (0), ``requeue`` (:data:`REQUEUE_EXIT_CODE`), ``signal`` (the worker
    received one, or the script died of one the worker forwards), else ``error``."""
    first = received[0] if received else None
    if first is None and code > 128:
        with contextlib.suppress(ValueError):
            sig = signal.Signals(code - 128)
            if sig in _FORWARDED:
                first = sig.name.removeprefix("SIG")
    if code == 0:
        return "completed", first
    if code == REQUEUE_EXIT_CODE:
        return "requeue", first
    return ("signal" if first is not None else "error"), first


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to ``proc``'s process group while it runs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)


def _run_child(
    entry_script: str, cwd: str, env: dict[str, str], job: JobEnvironment
) -> tuple[int, list[str]]:
    """Run ``bash entry_script`` in its own session (its group named to ``job``'s
    backend), forwarding the worker's signals to its process group; returns its exit
    code (negative: killed by a signal) and the names of the signals the worker
    received, in order."""
    # The handlers go in before the child starts: exec resets caught signals to their
    # default, so the entrypoint can be signalled even where this worker was started
    # with them ignored (a signal ignored at exec stays ignored, and bash cannot trap it).
    received: list[str] = []
    child: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []  # arrived before the child existed

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name.removeprefix("SIG"))
        if child:
            _signal_group(child[0], signum)
        else:
            pending.append(signum)

    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        # Its own process group, so that forwarding reaches the training process and
        # not just the shell running entry.sh.
        proc = subprocess.Popen(["bash", entry_script], cwd=cwd, env=env, start_new_session=True)
        child.append(proc)  # from here on the handler forwards by itself
        job.adopt_process_group(proc.pid)
        for signum in pending:
            _signal_group(proc, signum)
        return proc.wait(), received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _record_start(
    events: EventWriter, job: JobEnvironment, spec: TrialSpec, child_env: dict[str, str]
) -> None:
    """Flush this rank's ``start`` record, and on each node's local rank 0 its ``env``
    record (the data fingerprint once, on rank 0)."""
    events.add(
        "start",
        host=socket.gethostname(),
        pid=os.getpid(),
        job_id=job.job_id,
        restart=job.restart,
        rank=job.rank,
        nodes=job.node_list or socket.gethostname(),
    )
    if job.local_rank == 0:
        record = attempt_record(
            child_env,
            rank=job.rank,
            data=spec.data if job.rank == 0 else [],
            declared=list(spec.env),
            nodes=job.node_list,
            scheduler_vars=job.record_vars,
        )
        events.add("env", rank=job.rank, record=record)
    events.flush()


def _record_exit(
    events: EventWriter, job: JobEnvironment, attempt_dir: Path, code: int, received: list[str]
) -> tuple[str, str | None]:
    """Flush the ``exit`` record of entrypoint exit ``code``; returns its
    ``(reason, first signal)`` (see :func:`exit_reason`)."""
    reason, first = exit_reason(code, received)
    progress = read_small_json(attempt_dir / PROGRESS_FILE) or {}
    extra = {}
    if job.rank == 0 and first == "TERM":  # asked while this step still runs (the job too)
        preempted = job.preempted()
        if preempted is not None:
            extra["preempted"] = preempted
    events.add(
        "exit",
        code=code,
        reason=reason,
        signal=first,
        step=progress.get("step"),
        checkpoint_step=progress.get("checkpoint_step"),
        **extra,
    )
    events.flush()
    return reason, first


def run_entrypoint(trial_dir: Path) -> int:
    """Run the trial once; returns the entrypoint's exit code (signals as 128+n)."""
    return _run_once(trial_dir)[0]


def _run_once(trial_dir: Path) -> tuple[int, str | None]:
    """Run the trial once; returns the entrypoint's exit code (signals as 128+n) and the
    signal that ended it, as its exit record says (:func:`exit_reason`)."""
    spec = TrialSpec.read(trial_file(trial_dir))
    if spec.umask is not None:  # the site's policy, before this job creates anything
        os.umask(spec.umask)
    job = _job(os.environ)
    job_id, restart, rank = job.job_id, job.restart, job.rank
    attempt_dir = attempts_dir(trial_dir) / attempt_key(job_id, restart)
    events = EventWriter(attempt_dir, f"worker-r{rank}")
    child_env = _child_env(spec, trial_dir, attempt_dir)
    cwd = prepare_work_dir(Path(spec.code_dir), work_dir(trial_dir))
    _record_start(events, job, spec, child_env)
    heartbeat = _Heartbeat(attempt_dir / HEARTBEAT_FILE, HEARTBEAT_INTERVAL_S)
    if rank == 0:
        heartbeat.beat()
        heartbeat.start()
    # GPU telemetry: one sampler per node (a no-op with one info line without NVML)
    on_node_rank0 = job.local_rank == 0
    sampler = start_gpu_sampler(attempt_dir, os.environ, job.node_id) if on_node_rank0 else None
    try:
        code, received = _run_child(spec.entry_script, str(cwd), child_env, job)
    finally:
        heartbeat.stopped.set()
        if sampler is not None:
            sampler.stop()
    if code < 0:
        code = 128 - code
    reason, first = _record_exit(events, job, attempt_dir, code, received)
    if rank == 0 and reason == "requeue" and first and first == job.time_limit_signal:
        # asked by the job script once this step has ended: a requeue asked from inside
        # the step kills it, and srun reports that kill in the trial's log
        request = {"time": time.time(), "job_id": job_id, "restart": restart}
        atomic_write_text(attempt_dir / REQUEUE_REQUEST_FILE, json.dumps(request))
    return code, first


def run_trial(trial_dir: str) -> None:
    """submitit entry point: run the trial; raise TrialFailed on a non-zero exit other
    than :data:`REQUEUE_EXIT_CODE`, unless TERM's default action ended the entrypoint.
    Those return quietly: no traceback in the job's log, no failed task. The planned exit
    checkpointed for a requeue or stopped at the searcher's request; a script dead of
    TERM was ended by the scheduler (a preemption or cancellation that came before it
    could checkpoint: during its imports, say). Its exit record says what happened, and
    neither a scheduler's requeue nor the reconciler's verdict depends on the task's exit
    status."""
    code, first = _run_once(Path(trial_dir))
    ended_by_term = code == 128 + signal.SIGTERM and first == "TERM"
    if code not in (0, REQUEUE_EXIT_CODE) and not ended_by_term:
        raise TrialFailed(f"entrypoint exited with code {code}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m dlhpc.harness.worker TRIAL_DIR", file=sys.stderr)
        return 2
    try:
        return run_entrypoint(Path(args[0]))
    except DlhpcError as err:
        print(f"dlhpc worker: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
