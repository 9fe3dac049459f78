"""Every path and file name of the run and checkpoint folders: the one definition.

Layout under the runs folder (one per store)::

    exp-000007/                  experiment_dir()
      experiment.json            EXPERIMENT_FILE: resolved config (written at launch)
      entry.sh                   ENTRY_SCRIPT: site modules + environment.setup + entrypoint
      launch-env.json            LAUNCH_ENV_FILE: the launch's environment (policy's mode), which
                                 later submissions (cron, scrontab ticks) run sbatch in
      code/                      CODE_DIR: snapshot of the workdir at launch
      jobs/                      JOBS_DIR: the scheduler backend's folder (scripts, logs)
      trials/trial-000042/       trial_dir()
        trial.json               TRIAL_FILE: TrialSpec (hyperparameters never go through a shell)
        stop.json                STOP_FILE: the searcher stopped the trial (request_stop)
        attempts/<attempt_key>/  attempt_dir()
          <stream>-<seq:08d>.jsonl   immutable event batches (dlhpc.protocol.events);
                                 stream SETUP_STREAM: the job script's setup failed
          heartbeat.json         HEARTBEAT_FILE: the worker's liveness, rewritten in place
          progress.json          PROGRESS_FILE: step and last checkpoint step, rewritten

and under the checkpoint folder (``checkpoint.dir``)::

    exp-000007/trial-000042/     checkpoint_trial_dir(): one trial's checkpoints
      ckpt-0000001200/           dlhpc.protocol.checkpoint's folders

``attempt_key`` names one run of a trial by a scheduler: ``<job_id>.r<restart>``
(``job_id`` is ``123_4`` for array task 4 of job 123). Standard library only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dlhpc.protocol.atomic import atomic_write_text

__all__ = [
    "ATTEMPTS_DIR",
    "CODE_DIR",
    "ENTRY_SCRIPT",
    "EXPERIMENT_FILE",
    "HEARTBEAT_FILE",
    "HEARTBEAT_INTERVAL_S",
    "JOBS_DIR",
    "LAUNCH_ENV_FILE",
    "SETUP_DONE_VAR",
    "SETUP_STREAM",
    "PROGRESS_FILE",
    "STOP_FILE",
    "TRIAL_FILE",
    "attempt_dir",
    "attempt_key",
    "split_attempt_key",
    "attempts_dir",
    "checkpoint_experiment_dir",
    "checkpoint_trial_dir",
    "code_dir",
    "entry_script",
    "experiment_dir",
    "experiment_file",
    "jobs_dir",
    "launch_env_file",
    "request_stop",
    "stop_file",
    "stop_requested",
    "trial_dir",
    "trial_file",
]

EXPERIMENT_FILE = "experiment.json"
ENTRY_SCRIPT = "entry.sh"
LAUNCH_ENV_FILE = "launch-env.json"
# the event stream a job script writes when a setup line (module load, activation) fails
# before the worker starts: an ``exit`` record with reason ``setup`` and a ``log`` record
SETUP_STREAM = "setup"
# set to "done" by a job script that ran the site modules and environment.setup before
# the worker started (entry.sh then skips them, the worker leaves PATH as they made it)
SETUP_DONE_VAR = "DLHPC_JOB_SETUP"
CODE_DIR = "code"
JOBS_DIR = "jobs"
TRIALS_DIR = "trials"
TRIAL_FILE = "trial.json"
ATTEMPTS_DIR = "attempts"
HEARTBEAT_FILE = "heartbeat.json"
HEARTBEAT_INTERVAL_S = 15.0  # how often the worker rewrites HEARTBEAT_FILE
PROGRESS_FILE = "progress.json"
# in the trial folder: the searcher stopped the trial; its job should end at the next step
STOP_FILE = "stop.json"


def _exp_name(experiment_id: int) -> str:
    return f"exp-{experiment_id:06d}"


def _trial_name(trial_id: int) -> str:
    return f"trial-{trial_id:06d}"


def experiment_dir(runs_root: Path, experiment_id: int) -> Path:
    """An experiment's run folder under the runs folder."""
    return runs_root / _exp_name(experiment_id)


def trial_dir(runs_root: Path, experiment_id: int, trial_id: int) -> Path:
    """A trial's run folder under the runs folder."""
    return experiment_dir(runs_root, experiment_id) / TRIALS_DIR / _trial_name(trial_id)


def experiment_file(exp_dir: Path) -> Path:
    """The resolved config of the experiment whose run folder is ``exp_dir``."""
    return exp_dir / EXPERIMENT_FILE


def entry_script(exp_dir: Path) -> Path:
    return exp_dir / ENTRY_SCRIPT


def launch_env_file(exp_dir: Path) -> Path:
    """The environment ``dlhpc launch`` ran in, which later submissions use."""
    return exp_dir / LAUNCH_ENV_FILE


def code_dir(exp_dir: Path) -> Path:
    """The experiment's code snapshot, where its jobs run."""
    return exp_dir / CODE_DIR


def jobs_dir(exp_dir: Path) -> Path:
    """The scheduler backend's folder of the experiment (job scripts, logs)."""
    return exp_dir / JOBS_DIR


def trial_file(trial_path: Path) -> Path:
    """The trial's ``TrialSpec``."""
    return trial_path / TRIAL_FILE


def attempt_key(job_id: str, restart: int) -> str:
    """The folder name of one attempt: ``123_4.r0``."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", job_id):
        raise ValueError(f"unsafe job id {job_id!r}")
    return f"{job_id}.r{restart}"


def split_attempt_key(key: str) -> tuple[str, int] | None:
    """:func:`attempt_key`'s inverse: ``("123_4", 1)`` for ``123_4.r1``; None for a
    name that is not an attempt key."""
    job_id, sep, restart = key.rpartition(".r")
    if not sep or not job_id or not restart.isdigit():
        return None
    return job_id, int(restart)


def attempts_dir(trial_path: Path) -> Path:
    """The folder holding every attempt folder of a trial."""
    return trial_path / ATTEMPTS_DIR


def attempt_dir(trial_path: Path, key: str) -> Path:
    """One attempt's folder; ``key`` is an :func:`attempt_key`."""
    return attempts_dir(trial_path) / key


def checkpoint_experiment_dir(checkpoint_root: Path, experiment_id: int) -> Path:
    """Where an experiment's trials checkpoint, under ``checkpoint.dir``."""
    return checkpoint_root / _exp_name(experiment_id)


def checkpoint_trial_dir(checkpoint_root: Path, experiment_id: int, trial_id: int) -> Path:
    """One trial's checkpoint folder under ``checkpoint.dir``."""
    return checkpoint_experiment_dir(checkpoint_root, experiment_id) / _trial_name(trial_id)


def stop_file(trial_path: Path) -> Path:
    """The trial's stop file: present once the searcher stopped the trial."""
    return trial_path / STOP_FILE


def request_stop(trial_path: Path, reason: str = "searcher") -> None:
    """Ask the trial's job to stop at its next step (written by the reconciler)."""
    atomic_write_text(stop_file(trial_path), json.dumps({"reason": reason}) + "\n")


def stop_requested(trial_path: Path) -> bool:
    """Whether the trial was asked to stop (read by the job and by the simulator)."""
    return stop_file(trial_path).exists()
