"""The config loaders as the CLI calls them, for tests: ``backend: auto`` answered by the
scheduler registry (Slurm where ``sbatch`` is on the environment's ``PATH``, else local).

Config sits below the schedulers, so it takes that answer as ``auto_backend``;
the CLI passes ``dlhpc.cli._common.auto_backend``, these pass the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dlhpc import config
from dlhpc.config._partitions import PartitionLister
from dlhpc.scheduler.registry import default_registry

__all__ = ["auto_backend", "load_experiment", "load_site"]


def auto_backend(environ: Mapping[str, str]) -> str:
    return default_registry().auto(environ)


def load_experiment(
    path: str | Path,
    site: str | None = None,
    environ: Mapping[str, str] | None = None,
    partitions: PartitionLister | None = None,
) -> config.ExperimentConfig:
    return config.load_experiment(path, site, environ, partitions, auto_backend=auto_backend)


def load_site(
    name_or_path: str | None = None, environ: Mapping[str, str] | None = None
) -> config.SiteConfig:
    return config.load_site(name_or_path, environ, auto_backend=auto_backend)
