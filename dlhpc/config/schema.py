"""Typed, validated configuration objects (schema v1).

These are what the rest of dlhpc consumes; they are only ever built by the
loaders in :mod:`dlhpc.config` (which validate every field and report all
problems at once), so code downstream may trust every value here.
Paths are absolute and already expanded (``~``, ``${VAR}``, relative to the
YAML's folder).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dlhpc.config._names import name_slug
from dlhpc.config._permissions import Permissions

SCHEMA_VERSION = 1

HParamType = Literal["const", "int", "double", "log", "categorical"]
BackendName = str  # a scheduler backend the loaders' caller knows (backends=)


@dataclass(frozen=True)
class HParam:
    """One hyperparameter. ``const`` carries ``value``; ranges carry min/max."""

    name: str
    type: HParamType
    value: Any = None  # const only
    minval: float | None = None  # int/double/log (log: exponents, as in Determined)
    maxval: float | None = None
    base: float = 10.0  # log only
    vals: tuple[Any, ...] = ()  # categorical only
    count: int | None = None  # grid points for int/double/log


@dataclass(frozen=True)
class Resources:
    nodes: int = 1
    gpus_per_node: int = 0  # the count N, also of a typed request ``TYPE:N``
    tasks_per_node: int = 1  # default max(1, gpus_per_node), resolved by the loader
    cpus_per_task: int = 1
    mem: str = "4G"
    time: str = "01:00:00"  # Slurm format, as given
    time_minutes: int = 60  # the same, parsed
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    sbatch_args: tuple[str, ...] = ()
    # The GPU type (``a100`` of ``gpus_per_node: a100:2``, else the site partition's
    # ``gpu_type``); None: any GPU. Only set when gpus_per_node > 0.
    gpu_type: str | None = None


@dataclass(frozen=True)
class Environment:
    setup: str = ""  # shell lines run before the entrypoint
    vars: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SearcherConfig:
    name: str = "single"  # a searcher its caller passes to the loader (searchers=)
    metric: str = "val_loss"
    smaller_is_better: bool = True
    max_trials: int = 1
    max_concurrent_trials: int = 0  # 0 = no limit beyond the cluster's
    max_length: int = 1  # resource units (e.g. epochs) a trial may train for
    divisor: int = 3
    max_rungs: int = 5
    seed: int = 0
    mode: str | None = None  # hyperband: aggressive|standard|conservative
    min_length: int | None = None  # sha/asha/hyperband: the first rung's length (sets max_rungs)
    stop_once: bool = False  # sha/asha: never pause; stop weak trials while they run
    # asha/hyperband: what to try (their proposers): "random" or "tpe"; None: their default
    proposer: str | None = None
    proposer_settings: dict[str, Any] = field(default_factory=dict)  # the proposer's, defaults in
    max_budget: int | None = None  # sha/asha/hyperband: total length over all trials; ends it


@dataclass(frozen=True)
class CheckpointConfig:
    """The checkpoint folder and the reconciler's keep policy (Determined's
    save_trial_best / save_trial_latest / save_experiment_best): the union of each
    trial's best ``keep_best`` by the searcher metric, each trial's newest
    ``keep_latest``, and the experiment's best ``keep_experiment_best`` is kept;
    see :mod:`dlhpc.orchestrator.checkpoints`."""

    dir: Path  # absolute; from the site's scratch root when not given
    keep_best: int = 1  # per trial, by the searcher metric (>= 0)
    keep_latest: int = 1  # per trial, by step (>= 1)
    keep_experiment_best: int = 0  # across the experiment, by the searcher metric (>= 0)


@dataclass(frozen=True)
class PreemptionConfig:
    signal: str = "USR2"  # without the SIG prefix
    lead_time_s: int = 120


@dataclass(frozen=True)
class ReproducibilityConfig:
    seed: int = 0
    deterministic: bool = False
    # Not a YAML key: set by ``dlhpc reproduce`` so that its one trial gets the
    # reproduced trial's exact seed instead of one derived from ``seed``.
    trial_seed: int | None = None


@dataclass(frozen=True)
class DataInput:
    """One declared data input (``data:``), fingerprinted at every attempt."""

    path: Path  # absolute, expanded
    hash: bool = False  # also hash the content (reads every byte once per attempt)


@dataclass(frozen=True)
class DeepSpeedConfig:
    config: dict[str, Any] | None = None  # inline mapping, or the loaded file's content
    path: Path | None = None  # where it came from, when a path was given


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    gpus_per_node: int = 0
    gpu_type: str | None = None
    max_time_minutes: int | None = None
    preemptible: bool = False


@dataclass(frozen=True)
class SiteConfig:
    """A cluster description (``site-configs/*.yaml``)."""

    name: str
    source: Path | None  # the file it came from, None for the built-in default
    backend: BackendName = "auto"  # or "auto": resolved by the loader's ``backends``
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    partitions: dict[str, PartitionInfo] = field(default_factory=dict)
    scratch: Path = Path("~/.dlhpc/scratch")  # checkpoint root; expanded by the loader
    state_dir: Path = Path("~/.dlhpc")  # where the DB and run folders live ($DLHPC_HOME wins)
    signal: str = "USR2"
    lead_time_s: int = 120
    modules: tuple[str, ...] = ()  # shell lines (e.g. "module load cuda/12.1") run before setup
    # the in-job worker's interpreter, started after the modules and setup: a path, or a
    # command looked up on PATH after the setup (e.g. "python3" of an activated env);
    # None: the interpreter dlhpc was launched with
    python: str | None = None
    max_array_size: int | None = None  # overrides (lowers) the cluster's MaxArraySize
    env: dict[str, str] = field(default_factory=dict)  # e.g. NCCL_SOCKET_IFNAME
    journal_mode: Literal["delete", "wal"] = "delete"  # WAL only on local disks
    local_max_parallel: int | None = None  # local backend: concurrent tasks (default: CPUs)
    permissions: Permissions = field(default_factory=Permissions)  # who may read what we create
    # How a GPU request is written: ``--gpus-per-node=[TYPE:]N`` or ``--gres=gpu:[TYPE:]N``.
    gpu_request: Literal["gpus-per-node", "gres"] = "gpus-per-node"


@dataclass(frozen=True)
class ScriptConfig:
    """``script:``: how dlhpc's script runner treats a plain script (no dlhpc calls).

    ``enabled``: the entrypoint runs under the runner (a template entrypoint, or a
    ``script:`` section given); ``metrics_pattern``: a regex with named groups
    (``step`` and metric names) matched against each stdout line."""

    enabled: bool = False
    metrics_pattern: str | None = None


@dataclass(frozen=True)
class ExperimentConfig:
    """A fully resolved experiment: the YAML with site defaults applied."""

    name: str
    entrypoint: str
    workdir: Path
    source: Path  # the YAML file
    site: SiteConfig
    description: str = ""
    resources: Resources = field(default_factory=Resources)
    environment: Environment = field(default_factory=Environment)
    hyperparameters: dict[str, HParam] = field(default_factory=dict)
    searcher: SearcherConfig = field(default_factory=SearcherConfig)
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(Path(".")))
    max_restarts: int = 5
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    reproducibility: ReproducibilityConfig = field(default_factory=ReproducibilityConfig)
    deepspeed: DeepSpeedConfig | None = None
    data: tuple[DataInput, ...] = ()  # declared data inputs (``data:``)
    backend: BackendName = "local"  # the site's backend with ``auto`` resolved by the loader
    raw: dict[str, Any] = field(default_factory=dict)  # the YAML mapping as given
    script: ScriptConfig = field(default_factory=ScriptConfig)  # plain scripts (``script:``)

    @property
    def slug(self) -> str:
        """The name as ``[a-z0-9-]`` text (:func:`name_slug`), for file and job names."""
        return name_slug(self.name)
