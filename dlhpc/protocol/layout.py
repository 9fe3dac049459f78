"""Every path and file name of the run and checkpoint folders: the one definition.

Layout under the runs folder (one per store)::

    exp-000007-<slug>/           experiment_dir(): experiment_dir_name() is the one rule
                                 (``exp-000007/`` for experiments launched before slugs)
      experiment.json            EXPERIMENT_FILE: resolved config (written at launch)
      entry.sh                   ENTRY_SCRIPT: site modules + environment.setup + entrypoint
      launch-env.json            LAUNCH_ENV_FILE: the launch's environment (policy's mode), which
                                 later submissions (cron, scrontab ticks) run sbatch in
      code/                      CODE_DIR: snapshot of the workdir at launch (read-only)
      jobs/                      JOBS_DIR: the scheduler backend's folder (scripts, logs)
      trials/trial-000042/       trial_dir()
        trial.json               TRIAL_FILE: TrialSpec (hyperparameters never go through a shell)
        stop.json                STOP_FILE: the searcher stopped the trial (request_stop)
        work/                    WORK_DIR: the trial's working folder (its jobs' cwd), with
                                 links to code/'s top-level entries; what it writes lands here
        attempts/<attempt_key>/  attempt_dir()
          <stream>-<seq:08d>.jsonl   immutable event batches (dlhpc.protocol.events);
                                 stream SETUP_STREAM: the job script's setup failed
          heartbeat.json         HEARTBEAT_FILE: the worker's liveness, rewritten in place
          progress.json          PROGRESS_FILE: step, last checkpoint step and the step
                                 training started from (if told), rewritten
          requeue.json           REQUEUE_REQUEST_FILE: rank 0 exited for a requeue at the
                                 time limit; the job script asks the scheduler once the step ends

and under the checkpoint folder (``checkpoint.dir``)::

    exp-000007-<slug>/trial-000042/  checkpoint_trial_dir(): one trial's checkpoints
                                 (the run folder's name: ``exp-000007/`` for older ones)
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
    "REQUEUE_REQUEST_FILE",
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
    "experiment_dir_name",
    "experiment_file",
    "jobs_dir",
    "launch_env_file",
    "recorded_slug",
    "request_stop",
    "stop_file",
    "stop_requested",
    "trial_dir",
    "trial_file",
    "WORK_DIR",
    "work_dir",
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
# the trial and attempt folders of a job's process, set by the worker (dlhpc.init() reads them)
TRIAL_DIR_VAR = "DLHPC_TRIAL_DIR"
ATTEMPT_DIR_VAR = "DLHPC_ATTEMPT_DIR"
CODE_DIR = "code"
WORK_DIR = "work"
JOBS_DIR = "jobs"
TRIALS_DIR = "trials"
TRIAL_FILE = "trial.json"
ATTEMPTS_DIR = "attempts"
HEARTBEAT_FILE = "heartbeat.json"
HEARTBEAT_INTERVAL_S = 15.0  # how often the worker rewrites HEARTBEAT_FILE
PROGRESS_FILE = "progress.json"
# in the attempt folder: the worker's request that the job script requeue this task
REQUEUE_REQUEST_FILE = "requeue.json"
# in the trial folder: the searcher stopped the trial; its job should end at the next step
STOP_FILE = "stop.json"


# the longest slug a folder name keeps (a name's slug has up to 64 characters)
FOLDER_SLUG_MAX = 40
_FOLDER_SLUG = re.compile(r"[a-z0-9][a-z0-9-]*")


def experiment_dir_name(experiment_id: int, slug: str = "") -> str:
    """The one rule naming an experiment's run and checkpoint folders:
    ``exp-000007-<slug>``, the slug cut to :data:`FOLDER_SLUG_MAX` characters (and
    trailing ``-`` dropped); ``exp-000007`` for an empty slug (and for experiments
    launched before folders had slugs). ``slug`` is ``[a-z0-9-]`` text starting with a
    letter or digit (:func:`dlhpc.config.name_slug`'s output); ValueError otherwise."""
    if slug and not _FOLDER_SLUG.fullmatch(slug):
        raise ValueError(f"unsafe folder slug {slug!r}")
    cut = slug[:FOLDER_SLUG_MAX].rstrip("-")
    return f"exp-{experiment_id:06d}-{cut}" if cut else f"exp-{experiment_id:06d}"


def recorded_slug(experiment_id: int, run_dir: str | Path) -> str:
    """The slug in the name of the run folder recorded for an experiment (the
    experiments table's ``run_dir``), to pass to the functions here: ``"foo"`` for
    ``.../exp-000007-foo``; ``""`` for the name of experiments launched before folders
    had slugs (``exp-000007``) or any name that :func:`experiment_dir_name` does not
    make for this id (nothing else from the database reaches a path)."""
    prefix = f"exp-{experiment_id:06d}-"
    name = Path(run_dir).name if run_dir else ""
    slug = name[len(prefix) :] if name.startswith(prefix) else ""
    if slug and _FOLDER_SLUG.fullmatch(slug) and len(slug) <= FOLDER_SLUG_MAX:
        return slug if not slug.endswith("-") else ""
    return ""


def _trial_name(trial_id: int) -> str:
    return f"trial-{trial_id:06d}"


def experiment_dir(runs_root: Path, experiment_id: int, slug: str = "") -> Path:
    """An experiment's run folder under the runs folder (``slug``: the experiment's,
    or :func:`recorded_slug` for one already launched)."""
    return runs_root / experiment_dir_name(experiment_id, slug)


def trial_dir(runs_root: Path, experiment_id: int, trial_id: int, slug: str = "") -> Path:
    """A trial's run folder under the runs folder."""
    return experiment_dir(runs_root, experiment_id, slug) / TRIALS_DIR / _trial_name(trial_id)


def experiment_file(exp_dir: Path) -> Path:
    """The resolved config of the experiment whose run folder is ``exp_dir``."""
    return exp_dir / EXPERIMENT_FILE


def entry_script(exp_dir: Path) -> Path:
    return exp_dir / ENTRY_SCRIPT


def launch_env_file(exp_dir: Path) -> Path:
    """The environment ``dlhpc launch`` ran in, which later submissions use."""
    return exp_dir / LAUNCH_ENV_FILE


def code_dir(exp_dir: Path) -> Path:
    """The experiment's code snapshot (read-only; its trials run in :func:`work_dir`)."""
    return exp_dir / CODE_DIR


def jobs_dir(exp_dir: Path) -> Path:
    """The scheduler backend's folder of the experiment (job scripts, logs)."""
    return exp_dir / JOBS_DIR


def trial_file(trial_path: Path) -> Path:
    """The trial's ``TrialSpec``."""
    return trial_path / TRIAL_FILE


def work_dir(trial_path: Path) -> Path:
    """The trial's working folder: its jobs' current folder, every attempt's."""
    return trial_path / WORK_DIR


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


def checkpoint_experiment_dir(checkpoint_root: Path, experiment_id: int, slug: str = "") -> Path:
    """Where an experiment's trials checkpoint, under ``checkpoint.dir``: the same name
    as its run folder."""
    return checkpoint_root / experiment_dir_name(experiment_id, slug)


def checkpoint_trial_dir(
    checkpoint_root: Path, experiment_id: int, trial_id: int, slug: str = ""
) -> Path:
    """One trial's checkpoint folder under ``checkpoint.dir``."""
    return checkpoint_experiment_dir(checkpoint_root, experiment_id, slug) / _trial_name(trial_id)


def stop_file(trial_path: Path) -> Path:
    """The trial's stop file: present once the searcher stopped the trial."""
    return trial_path / STOP_FILE


def request_stop(trial_path: Path, reason: str = "searcher") -> None:
    """Ask the trial's job to stop at its next step (written by the reconciler)."""
    atomic_write_text(stop_file(trial_path), json.dumps({"reason": reason}) + "\n")


def stop_requested(trial_path: Path) -> bool:
    """Whether the trial was asked to stop (read by the job and by the simulator)."""
    return stop_file(trial_path).exists()
