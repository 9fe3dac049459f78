"""The Slurm backend: job arrays via submitit, state via squeue/sacct.

:data:`BACKEND` is its registry descriptor (:mod:`dlhpc.scheduler.registry`).
Importing this package is cheap (standard library only): the scheduler
(:mod:`~dlhpc.scheduler.slurm.scheduler`, which imports submitit), the job
environment (:mod:`~dlhpc.scheduler.slurm.environment`) and the checks
(:mod:`~dlhpc.scheduler.slurm.checks`) and the cluster's rules for the config
checks (:mod:`~dlhpc.scheduler.slurm.site`) load on first use.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

from dlhpc.scheduler.registry import Backend

__all__ = ["BACKEND", "DEFAULT_MAX_ARRAY_SIZE", "SlurmScheduler", "sbatch_on_path"]


def sbatch_on_path(environ: Mapping[str, str]) -> bool:
    """Whether ``sbatch`` is on the environment's ``PATH``."""
    return shutil.which("sbatch", path=environ.get("PATH", os.defpath)) is not None


BACKEND = Backend(
    name="slurm",
    scheduler="dlhpc.scheduler.slurm.scheduler:new_scheduler",
    environment="dlhpc.scheduler.slurm.environment:SlurmJobEnvironment",
    available=sbatch_on_path,
    doctor="dlhpc.scheduler.slurm.checks:doctor_checks",
    request_check="dlhpc.scheduler.slurm.checks:state_dir_problem",
    site_rules="dlhpc.scheduler.slurm.site:SlurmRules",
    auto_priority=10,
)


def __getattr__(name: str) -> Any:
    if name in ("SlurmScheduler", "DEFAULT_MAX_ARRAY_SIZE"):
        from dlhpc.scheduler.slurm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
