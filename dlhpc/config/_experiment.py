"""Loading an experiment file (schema v1) into an :class:`ExperimentConfig`.

Contract of :func:`load_experiment`: reads the YAML and the site (and a
DeepSpeed config file when one is named), writes nothing, and either returns
a fully resolved config or raises :class:`~dlhpc.errors.ConfigError` holding
every problem found, experiment problems first (in file order), then the
site's. Errors name the file as the caller gave it.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlhpc.config import _fields as F
from dlhpc.config._adapters import check_adapters
from dlhpc.config._cluster import ClusterRules, RulesFactory, check_cluster
from dlhpc.config._data import read_data
from dlhpc.config._deepspeed import read_deepspeed
from dlhpc.config._gpus import gpu_count, gpu_option, resolve_gpu_type
from dlhpc.config._hparams import read_hyperparameters, read_searcher
from dlhpc.config._names import experiment_name
from dlhpc.config._partitions import PartitionLister, PartitionsOnly
from dlhpc.config._paths import absolute
from dlhpc.config._script import read_script
from dlhpc.config._site import (
    Backends,
    SiteRef,
    load_site,
    load_site_ref,
    not_listed,
    resolve_backend,
)
from dlhpc.config._units import format_minutes
from dlhpc.config._validate import (
    Field,
    Invalid,
    Issues,
    boolean,
    describe,
    integer,
    read_section,
    string,
    string_list,
)
from dlhpc.config._yaml import parse_yaml_text, read_text
from dlhpc.config.model import (
    CheckpointConfig,
    Environment,
    ExperimentConfig,
    PreemptionConfig,
    ReproducibilityConfig,
    Resources,
    SiteConfig,
)
from dlhpc.errors import ConfigError, ConfigIssue

__all__ = ["load_experiment"]

_MAX_COUNT = 100_000  # nodes, CPUs, restarts, kept checkpoints: more is a typo
_MEM = re.compile(r"[0-9]{1,12}[KMGT]?")
_MEM_UNIT_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}
_MAX_MEM_MB = 10**12  # far above any node; what Slurm's --mem parser takes
_SBATCH_ARG = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(=.*)?", re.DOTALL)
# Options dlhpc writes itself (long name -> short letter).
_OWNED = {
    "array": "a",
    "output": "o",
    "error": "e",
    "job-name": "J",
    "signal": "",
    "open-mode": "",
    "requeue": "",
    "no-requeue": "",
}
_OWNED_SHORT = {short: long for long, short in _OWNED.items() if short}


def _passthrough(value: Any) -> Any:
    return value


def _mem(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_MEM_MB:
        return str(value)
    if isinstance(value, str) and _MEM.fullmatch(value):
        digits, unit = (value[:-1], value[-1]) if value[-1] in _MEM_UNIT_MB else (value, "M")
        if int(digits) * _MEM_UNIT_MB[unit] < _MAX_MEM_MB:
            return value
        raise Invalid(f"must be under 10^12 megabytes, got {describe(value)}")
    raise Invalid(
        f"must be megabytes (an integer) or like '4G' (digits + K/M/G/T), got {describe(value)}"
    )


def _sbatch_arg(value: Any) -> str:
    if (
        not isinstance(value, str)
        or not _SBATCH_ARG.fullmatch(value)
        or any(c in value for c in "\n\r\0")
    ):
        raise Invalid(
            "must be one sbatch option token like '--key=value' or '--flag' "
            f"(write '--partition=gpu', not '-p gpu'), got {describe(value)}"
        )
    option = value.split("=", 1)[0]
    gpu = gpu_option(value)
    if gpu is not None:
        raise Invalid(
            f"{gpu} requests GPUs, which resources.gpus_per_node already does (2, or a typed "
            "a100:2); remove it"
        )
    if option.startswith("--"):
        given = option[2:]
        for long in _OWNED:
            if long.startswith(given):
                what = f"--{long}" if long == given else f"--{given} (short for --{long})"
                raise Invalid(f"{what} is set by dlhpc itself; remove it")
    elif option[1] in _OWNED_SHORT:
        raise Invalid(
            f"-{option[1]} (--{_OWNED_SHORT[option[1]]}) is set by dlhpc itself; remove it"
        )
    return value


_TOP = {
    "name": Field(experiment_name, required=True),
    "description": Field(string(), default=""),
    "entrypoint": Field(string(nonempty=True), required=True),
    "workdir": Field(_passthrough, nullable=True),
    "site": Field(string(nonempty=True, single_line=True), nullable=True),
    "resources": Field(_passthrough),
    "environment": Field(_passthrough),
    "hyperparameters": Field(_passthrough),
    "searcher": Field(_passthrough),
    "checkpoint": Field(_passthrough),
    "max_restarts": Field(integer(min=0, cap=_MAX_COUNT), default=5),
    "preemption": Field(_passthrough),
    "reproducibility": Field(_passthrough),
    "deepspeed": Field(_passthrough),
    "data": Field(_passthrough),
    "script": Field(_passthrough),
}
_RESOURCES = {
    "nodes": Field(integer(min=1, cap=_MAX_COUNT), default=1),
    "gpus_per_node": Field(gpu_count, default=(None, 0)),
    "tasks_per_node": Field(integer(min=1, cap=_MAX_COUNT), nullable=True),
    "cpus_per_task": Field(integer(min=1, cap=_MAX_COUNT), default=1),
    "mem": Field(_mem, default="4G"),
    "time": Field(F.slurm_time(allow_unlimited=False), default=("01:00:00", 60)),
    "partition": Field(F.TOKEN, nullable=True),
    "account": Field(F.TOKEN, nullable=True),
    "qos": Field(F.TOKEN, nullable=True),
    "constraint": Field(F.TOKEN, nullable=True),
    "sbatch_args": Field(string_list(_sbatch_arg), default=()),
}
_ENVIRONMENT = {"setup": Field(string(), default=""), "vars": Field(F.env_vars, default={})}
_PREEMPTION = {
    "signal": Field(F.signal, nullable=True),
    "lead_time": Field(F.lead_time, nullable=True),
}
_REPRODUCIBILITY = {
    "seed": Field(integer(min=0, max=2**32 - 1), nullable=True),
    "deterministic": Field(boolean, default=False),
}


def load_experiment(
    path: str | Path,
    site: str | None = None,
    environ: Mapping[str, str] | None = None,
    partitions: PartitionLister | None = None,
    backends: Backends | None = None,
    cluster: RulesFactory | None = None,
) -> ExperimentConfig:
    """Load, validate and resolve the experiment file ``path``.

    The site is ``site`` (a name or path), else the file's ``site:`` key (a
    path relative to the file's folder), else ``$DLHPC_SITE``, else auto.
    ``environ`` (default ``os.environ``) is used for ``~``, ``${VAR}``,
    ``$DLHPC_*`` and by ``backends`` (the scheduler registry: the backend names a
    site may use, and what ``backend: auto`` means there; needed for ``auto``).
    ``cluster``: the backend's :class:`ClusterRules` (for the resolved backend
    name): the partition, GPU type, account and QOS are checked against the
    cluster (see :mod:`dlhpc.config._cluster`); its errors propagate.
    ``partitions`` (without ``cluster``): the Slurm cluster's partition names only,
    asked (once) only when the backend is Slurm and a partition is set.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    label = str(path)
    cwd = Path.cwd()
    source = absolute(Path(path), cwd)
    doc = parse_yaml_text(read_text(Path(path), label), label)
    base = source.parent
    issues = Issues(label, doc.lines)
    top = read_section(issues, doc.data, (), _TOP)
    site_cfg, site_issues = _site(issues, site, top["site"], base, env, backends)
    site_ok = site_cfg is not None
    cfg_site = site_cfg if site_cfg is not None else SiteConfig("unknown", None)

    resources = _resources(issues, top["resources"], cfg_site, site_ok)
    backend = resolve_backend(site_cfg.backend, env, backends) if site_cfg else None
    rules = _rules(backend, cluster, partitions) if site_ok and backend is not None else None
    if rules is not None:
        given = top["resources"] if isinstance(top["resources"], dict) else {}
        site_issues += check_cluster(issues, cfg_site, resources, given, rules)
    e = read_section(issues, top["environment"], ("environment",), _ENVIRONMENT)
    space = read_hyperparameters(issues, top["hyperparameters"])
    searcher = read_searcher(issues, top["searcher"], space)
    script = read_script(
        issues, top["entrypoint"], top["script"], "script" in top.given, space, searcher.metric
    )
    path_check = F.path(base, env)
    ckpt_fields = {
        "dir": Field(path_check, nullable=True),
        "keep_best": Field(integer(min=0, cap=_MAX_COUNT), default=1),
        "keep_latest": Field(integer(min=1, cap=_MAX_COUNT), default=1),
        "keep_experiment_best": Field(integer(min=0, cap=_MAX_COUNT), default=0),
    }
    c = read_section(issues, top["checkpoint"], ("checkpoint",), ckpt_fields)
    preemption = _preemption(issues, top["preemption"], cfg_site, site_ok, resources)
    r = read_section(issues, top["reproducibility"], ("reproducibility",), _REPRODUCIBILITY)
    deepspeed = read_deepspeed(issues, top["deepspeed"], base, env)
    data = read_data(issues, top["data"], base, env)
    workdir = base
    if top["workdir"] is not None:
        try:
            workdir = path_check(top["workdir"])
            if not workdir.is_dir():
                issues.add(("workdir",), f"must be an existing directory, got {workdir}")
        except Invalid as exc:
            issues.add(("workdir",), str(exc))
        except OSError as exc:
            issues.add(("workdir",), f"cannot access {workdir}: {exc.strerror}")
    if isinstance(top["entrypoint"], str) and issues.ok(("workdir",)):
        site_issues += check_adapters(top["entrypoint"], workdir, cfg_site.python)

    # The experiment's problems in file order, then those of other files
    # (a DeepSpeed config, the site) as they came.
    problems = sorted(
        issues.issues + site_issues,
        key=lambda i: (i.file != label, i.line is not None, i.line or 0),
    )
    if problems or site_cfg is None or backend is None:
        raise ConfigError(problems)
    return ExperimentConfig(
        name=top["name"],
        entrypoint=top["entrypoint"],
        workdir=workdir,
        source=source,
        site=site_cfg,
        description=top["description"],
        resources=resources,
        environment=Environment(setup=e["setup"], vars=e["vars"]),
        hyperparameters=space,
        searcher=searcher,
        checkpoint=CheckpointConfig(
            dir=c["dir"] if c["dir"] is not None else site_cfg.scratch / "checkpoints",
            keep_best=c["keep_best"],
            keep_latest=c["keep_latest"],
            keep_experiment_best=c["keep_experiment_best"],
        ),
        max_restarts=top["max_restarts"],
        preemption=preemption,
        reproducibility=ReproducibilityConfig(
            seed=r["seed"] if r["seed"] is not None else searcher.seed,
            deterministic=r["deterministic"],
        ),
        deepspeed=deepspeed,
        data=data,
        backend=backend,
        raw=copy.deepcopy(doc.data),
        script=script,
    )


def _rules(
    backend: str, cluster: RulesFactory | None, partitions: PartitionLister | None
) -> ClusterRules | None:
    if cluster is not None:
        return cluster(backend)
    if partitions is not None and backend == "slurm":
        return PartitionsOnly(partitions)
    return None


def _site(
    issues: Issues,
    arg: str | None,
    key: str | None,
    base: Path,
    env: Mapping[str, str],
    backends: Backends | None,
) -> tuple[SiteConfig | None, list[ConfigIssue]]:
    """The site (argument > ``site:`` key > ``$DLHPC_SITE`` > auto) and its problems."""
    try:
        if arg is not None:
            return load_site_ref(arg, SiteRef("site"), Path.cwd(), env, backends), []
        if key is not None:
            ref = SiteRef(issues.file, issues.line(("site",)), "site")
            try:
                return load_site_ref(key, ref, base, env, backends), []
            except ConfigError as exc:  # an unreadable site file: point at the key
                if any(i.file != key or i.line is not None for i in exc.issues):
                    raise
                return None, [ref.error(f"{key}: {i.message}").issues[0] for i in exc.issues]
        if not issues.ok(("site",)):
            return None, []  # the key's problem is already reported
        return load_site(None, env, backends), []
    except ConfigError as exc:
        return None, exc.issues


def _resources(issues: Issues, value: Any, site: SiteConfig, site_ok: bool) -> Resources:
    path = ("resources",)
    s = read_section(issues, value, path, _RESOURCES)
    partition = s["partition"] if s["partition"] is not None else site.partition
    time_text, minutes = s["time"]
    given_type, gpus = s["gpus_per_node"]
    if site_ok and site.partitions and partition is not None and issues.ok((*path, "partition")):
        for part in partition.split(","):
            info = site.partitions.get(part)
            if info is None:
                issues.add((*path, "partition"), not_listed(part, site.partitions, site.name))
                continue
            if gpus > info.gpus_per_node and issues.ok((*path, "gpus_per_node")):
                issues.add(
                    (*path, "gpus_per_node"),
                    f"partition {part!r} has {info.gpus_per_node} GPU(s) per node, got {gpus}",
                )
            if given_type and info.gpu_type and given_type != info.gpu_type:
                issues.add(
                    (*path, "gpus_per_node"),
                    f"partition {part!r} has GPUs of type {info.gpu_type!r} (site "
                    f"{site.name!r}), got {given_type!r}",
                )
            limit = info.max_time_minutes
            if limit is not None and minutes > limit and issues.ok((*path, "time")):
                issues.add(
                    (*path, "time"),
                    f"exceeds partition {part!r}'s max_time {format_minutes(limit)}, "
                    f"got {describe(time_text)} ({format_minutes(minutes)})",
                )
    tasks = s["tasks_per_node"]
    return Resources(
        nodes=s["nodes"],
        gpus_per_node=gpus,
        tasks_per_node=tasks if tasks is not None else max(1, gpus),
        cpus_per_task=s["cpus_per_task"],
        mem=s["mem"],
        time=time_text,
        time_minutes=minutes,
        partition=partition,
        account=s["account"] if s["account"] is not None else site.account,
        qos=s["qos"] if s["qos"] is not None else site.qos,
        constraint=s["constraint"],
        sbatch_args=s["sbatch_args"],
        gpu_type=resolve_gpu_type(site, partition, given_type, gpus),
    )


def _preemption(
    issues: Issues, value: Any, site: SiteConfig, site_ok: bool, resources: Resources
) -> PreemptionConfig:
    path = ("preemption",)
    s = read_section(issues, value, path, _PREEMPTION)
    lead = s["lead_time"] if s["lead_time"] is not None else site.lead_time_s
    walltime = resources.time_minutes * 60
    checkable = site_ok or "lead_time" in s.given
    if lead >= walltime and checkable and issues.ok((*path, "lead_time"), ("resources", "time")):
        if "lead_time" in s.given:
            issues.add(
                (*path, "lead_time"),
                f"must be shorter than resources.time ({walltime}s), got {lead}s",
            )
        else:
            issues.add(
                ("resources", "time"),
                f"must be longer than the site's preemption "
                f"lead_time ({lead}s), got {resources.time_minutes * 60}s",
            )
    return PreemptionConfig(
        signal=s["signal"] if s["signal"] is not None else site.signal, lead_time_s=lead
    )
