"""The one place a submission's :class:`~dlhpc.scheduler.JobRequest` is built.

``dlhpc launch --dry-run`` (:func:`dlhpc.orchestrator.launch.plan_launch`) and the
real submission (:func:`dlhpc.orchestrator.submit.submit_pending`) both call
:func:`job_request`, and the backend renders the dry run with the same code that
writes the submitted script, so the dry run is what submit sends. Only the
submission's unique id differs: the real one is drawn at submit time
(:func:`new_uid`), the dry run shows :data:`DRY_RUN_UID` (``dryrun``) in its place.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from dlhpc.config.schema import ExperimentConfig
from dlhpc.orchestrator.runfiles import entry_runs_setup, read_launch_environment, setup_sections
from dlhpc.protocol import jobs_dir
from dlhpc.scheduler import JobRequest

__all__ = ["DRY_RUN_UID", "job_request", "new_uid"]

#: Stands for the submission's unique id in a dry run's job name. Shell-safe like a
#: real id, so that the script quotes the job name the same way.
DRY_RUN_UID = "dryrun"


def new_uid() -> str:
    """A fresh submission id: it makes the job name unique, so that a launch that
    crashed between sbatch and recording its jobs can find them by name."""
    return uuid.uuid4().hex[:8]


def job_request(
    cfg: ExperimentConfig, exp_id: int, exp_dir: Path, trial_dirs: Sequence[Path], uid: str
) -> JobRequest:
    """The request submitting ``trial_dirs`` (one task each, in order) of experiment
    ``exp_id`` (run folder ``exp_dir``): job name ``dlhpc-e<exp_id>-<uid>``, then
    ``-<slug>`` (the name's :attr:`~dlhpc.config.schema.ExperimentConfig.slug`, so that
    ``squeue -o %j`` tells experiments apart; the prefix alone identifies the job), the
    backend's files under ``<exp_dir>/jobs``, the in-job worker run by the site's
    ``python`` (default: this interpreter) after the site modules and
    ``environment.setup``, submitted in the environment saved at launch (when there is
    one: a dry run has none yet). An experiment launched before job scripts ran the
    setup (its ``entry.sh`` runs it unconditionally: :func:`entry_runs_setup`) gets no
    setup section, so that the setup runs once, in ``entry.sh``, as it did then."""
    return JobRequest(
        experiment_id=exp_id,
        name=f"dlhpc-e{exp_id}-{uid}-{cfg.slug}",
        folder=jobs_dir(exp_dir),
        trial_dirs=list(trial_dirs),
        resources=cfg.resources,
        preemption=cfg.preemption,
        site=cfg.site,
        max_concurrent=cfg.searcher.max_concurrent_trials,
        python=cfg.site.python or sys.executable,
        setup=() if entry_runs_setup(exp_dir) else setup_sections(cfg),
        submit_env=read_launch_environment(exp_dir),
    )
