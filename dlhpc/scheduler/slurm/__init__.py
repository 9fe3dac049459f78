"""The Slurm backend: job arrays via submitit, state via squeue/sacct.

:data:`BACKEND` is its descriptor (:mod:`dlhpc.scheduler.plugins`). Importing
this package is cheap (standard library only): the scheduler
(:mod:`~dlhpc.scheduler.slurm.scheduler`, which imports submitit), the checks
(:mod:`~dlhpc.scheduler.slurm.checks`) and the cluster's rules for the config
checks (:mod:`~dlhpc.scheduler.slurm.site`) load on first use.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlhpc.scheduler.plugins import Backend, Check
from dlhpc.scheduler.slurm.environment import SlurmJobEnvironment

if TYPE_CHECKING:
    from dlhpc.config import SiteConfig
    from dlhpc.scheduler.slurm.scheduler import SlurmScheduler
    from dlhpc.scheduler.slurm.site import SlurmRules

__all__ = ["BACKEND", "DEFAULT_MAX_ARRAY_SIZE", "SlurmScheduler", "sbatch_on_path"]


def sbatch_on_path(environ: Mapping[str, str]) -> bool:
    """Whether ``sbatch`` is on the environment's ``PATH``."""
    return shutil.which("sbatch", path=environ.get("PATH", os.defpath)) is not None


def _scheduler(root: Path) -> SlurmScheduler:
    from dlhpc.scheduler.slurm.scheduler import new_scheduler

    return new_scheduler(root)


def _doctor(site: SiteConfig) -> list[Check]:
    from dlhpc.scheduler.slurm.checks import doctor_checks

    return doctor_checks(site)


def _request_check(state_dir: Path) -> str | None:
    from dlhpc.scheduler.slurm.checks import state_dir_problem

    return state_dir_problem(state_dir)


def _site_rules() -> SlurmRules:
    from dlhpc.scheduler.slurm.site import SlurmRules

    return SlurmRules()


BACKEND = Backend(
    name="slurm",
    scheduler=_scheduler,
    environment=SlurmJobEnvironment,
    available=sbatch_on_path,
    doctor=_doctor,
    request_check=_request_check,
    site_rules=_site_rules,
    auto_priority=10,
)


def __getattr__(name: str) -> Any:
    if name in ("SlurmScheduler", "DEFAULT_MAX_ARRAY_SIZE"):
        from dlhpc.scheduler.slurm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
