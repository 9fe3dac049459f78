"""The config loaders as the CLI calls them, for tests: with the scheduler backends as
``backends`` (the backend names a site may use; ``backend: auto`` is Slurm where
``sbatch`` is on the environment's ``PATH``, else local) and the searchers as
``searchers`` (the names a file may use, each checking its own settings).

Config sits below the schedulers and the searchers, so it takes both from its caller;
the CLI passes ``dlhpc.cli._common.backends()`` and ``searchers()``, these pass the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dlhpc import config
from dlhpc.config._partitions import PartitionLister
from dlhpc.scheduler.plugins import BackendTable
from dlhpc.search import SearcherTable

__all__ = ["load_experiment", "load_site"]


def load_experiment(
    path: str | Path,
    site: str | None = None,
    environ: Mapping[str, str] | None = None,
    partitions: PartitionLister | None = None,
) -> config.ExperimentConfig:
    return config.load_experiment(
        path, site, environ, partitions, backends=BackendTable(), searchers=SearcherTable()
    )


def load_site(
    name_or_path: str | None = None, environ: Mapping[str, str] | None = None
) -> config.SiteConfig:
    return config.load_site(name_or_path, environ, backends=BackendTable())
