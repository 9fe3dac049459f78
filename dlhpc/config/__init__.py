"""Experiment and site configuration: loading, validation, resolution (schema v1).

Public API:

* :func:`load_experiment` -- an experiment YAML -> :class:`ExperimentConfig`
  (site defaults applied, paths expanded, ``backend`` resolved);
* :func:`load_site` / :func:`site_search_path` / :func:`list_sites` /
  :func:`builtin_sites` -- site files;
* :class:`ClusterRules` -- what a backend tells the loader about its cluster;
* :func:`name_slug` -- an experiment name as ``[a-z0-9-]`` text;
* :func:`parse_slurm_time` / :func:`parse_duration_s` -- Slurm time limits and
  short durations (raise :class:`ValueError`).

config sits below the searchers and the scheduler backends and never imports
them: the loaders' callers pass them in (``searchers=``, ``backends=``).
:mod:`dlhpc.config.searcher_rules` says what the loader asks of a searcher.

Loading has no side effects and raises only :class:`~dlhpc.errors.ConfigError`
(exit code 2), which lists every problem as ``file:line: field: message``.
"""

from dlhpc.config._cluster import ClusterRules, association_problems
from dlhpc.config._experiment import load_experiment
from dlhpc.config._names import MAX_NAME_LENGTH, name_slug
from dlhpc.config._permissions import PRIVATE_UMASK, Permissions
from dlhpc.config._site import builtin_sites, list_sites, load_site, site_search_path
from dlhpc.config._units import parse_duration_s, parse_slurm_time
from dlhpc.config.schema import (
    SCHEMA_VERSION,
    CheckpointConfig,
    DataInput,
    DeepSpeedConfig,
    Environment,
    ExperimentConfig,
    HParam,
    PartitionInfo,
    PreemptionConfig,
    ReproducibilityConfig,
    Resources,
    SearcherConfig,
    SiteConfig,
)
from dlhpc.config.searcher_rules import Searchers

__all__ = [
    "MAX_NAME_LENGTH",
    "PRIVATE_UMASK",
    "SCHEMA_VERSION",
    "CheckpointConfig",
    "ClusterRules",
    "DataInput",
    "DeepSpeedConfig",
    "Environment",
    "ExperimentConfig",
    "HParam",
    "PartitionInfo",
    "Permissions",
    "PreemptionConfig",
    "ReproducibilityConfig",
    "Resources",
    "SearcherConfig",
    "Searchers",
    "SiteConfig",
    "association_problems",
    "builtin_sites",
    "list_sites",
    "load_experiment",
    "load_site",
    "name_slug",
    "parse_duration_s",
    "parse_slurm_time",
    "site_search_path",
]
