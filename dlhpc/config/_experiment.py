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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlhpc.config import _fields as F
from dlhpc.config._adapters import check_adapters
from dlhpc.config._cluster import ClusterRules, RulesFactory, check_cluster
from dlhpc.config._data import read_data
from dlhpc.config._deepspeed import read_deepspeed
from dlhpc.config._hparams import read_hyperparameters, read_searcher
from dlhpc.config._names import experiment_name
from dlhpc.config._partitions import PartitionLister, PartitionsOnly
from dlhpc.config._paths import absolute
from dlhpc.config._resources import MAX_COUNT, read_preemption, read_resources
from dlhpc.config._script import read_script
from dlhpc.config._site import Backends, SiteRef, load_site, load_site_ref, resolve_backend
from dlhpc.config._validate import (
    Field,
    Invalid,
    Issues,
    Section,
    boolean,
    integer,
    read_section,
    string,
)
from dlhpc.config._yaml import parse_yaml_text, read_text
from dlhpc.config.schema import (
    CheckpointConfig,
    DataInput,
    DeepSpeedConfig,
    Environment,
    ExperimentConfig,
    HParam,
    PreemptionConfig,
    ReproducibilityConfig,
    Resources,
    ScriptConfig,
    SearcherConfig,
    SiteConfig,
)
from dlhpc.config.searcher_rules import Searchers
from dlhpc.errors import ConfigError, ConfigIssue

__all__ = ["load_experiment"]


def _passthrough(value: Any) -> Any:
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
    "max_restarts": Field(integer(min=0, cap=MAX_COUNT), default=5),
    "preemption": Field(_passthrough),
    "reproducibility": Field(_passthrough),
    "deepspeed": Field(_passthrough),
    "data": Field(_passthrough),
    "script": Field(_passthrough),
}
_ENVIRONMENT = {"setup": Field(string(), default=""), "vars": Field(F.env_vars, default={})}
_REPRODUCIBILITY = {
    "seed": Field(integer(min=0, max=2**32 - 1), nullable=True),
    "deterministic": Field(boolean, default=False),
}


@dataclass(frozen=True)
class _Placement:
    """Where the experiment runs, as far as it could be resolved."""

    loaded: SiteConfig | None  # the site; None when it did not load
    site: SiteConfig  # the site, or a stand-in named "unknown" when it did not load
    resources: Resources
    backend: str | None  # None without a site
    issues: list[ConfigIssue]  # the problems of the site's files and of the cluster check


@dataclass(frozen=True)
class _Sections:
    """The experiment's other sections, read (their problems are in the ``Issues``)."""

    environment: Section
    space: dict[str, HParam]
    searcher: SearcherConfig
    script: ScriptConfig
    checkpoint: Section
    preemption: PreemptionConfig
    reproducibility: Section
    deepspeed: DeepSpeedConfig | None
    data: tuple[DataInput, ...]


def load_experiment(
    path: str | Path,
    site: str | None = None,
    environ: Mapping[str, str] | None = None,
    partitions: PartitionLister | None = None,
    backends: Backends | None = None,
    cluster: RulesFactory | None = None,
    *,
    searchers: Searchers,
) -> ExperimentConfig:
    """Load, validate and resolve the experiment file ``path``.

    The site is ``site`` (a name or path), else the file's ``site:`` key (a
    path relative to the file's folder), else ``$DLHPC_SITE``, else auto.
    ``environ`` (default ``os.environ``) is used for ``~``, ``${VAR}``,
    ``$DLHPC_*`` and by ``backends`` (the scheduler backends: the backend names a
    site may use, and what ``backend: auto`` means there; needed for ``auto``).
    ``searchers``: the searchers the file may name; the named one checks its own
    settings (:mod:`dlhpc.config.searcher_rules`).
    ``cluster``: the backend's :class:`ClusterRules` (for the resolved backend
    name): the partition, GPU type, account and QOS are checked against the
    cluster (see :mod:`dlhpc.config._cluster`); its errors propagate.
    ``partitions`` (without ``cluster``): the Slurm cluster's partition names only,
    asked (once) only when the backend is Slurm and a partition is set.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    label = str(path)
    source = absolute(Path(path), Path.cwd())
    doc = parse_yaml_text(read_text(Path(path), label), label)
    base = source.parent
    issues = Issues(label, doc.lines)
    top = read_section(issues, doc.data, (), _TOP)
    where = _placement(issues, top, site, base, env, backends, partitions, cluster)
    path_check = F.path(base, env)
    sections = _sections(issues, top, where, base, env, path_check, searchers)
    workdir = _workdir(issues, top["workdir"], base, path_check)
    other = list(where.issues)
    if isinstance(top["entrypoint"], str) and issues.ok(("workdir",)):
        other += check_adapters(top["entrypoint"], workdir, where.site.python)

    # The experiment's problems in file order, then those of other files
    # (a DeepSpeed config, the site) as they came.
    problems = sorted(
        issues.issues + other,
        key=lambda i: (i.file != label, i.line is not None, i.line or 0),
    )
    if problems or where.loaded is None or where.backend is None:
        raise ConfigError(problems)
    return _config(
        top, sections, where.resources, where.loaded, where.backend, workdir, source, doc.data
    )


def _placement(
    issues: Issues,
    top: Section,
    arg: str | None,
    base: Path,
    env: Mapping[str, str],
    backends: Backends | None,
    partitions: PartitionLister | None,
    cluster: RulesFactory | None,
) -> _Placement:
    """Load the site (see :func:`_site`), read ``resources:`` against it, resolve the
    backend and, with a site and a backend, check the resources against the cluster
    (see :func:`_rules`)."""
    loaded, site_issues = _site(issues, arg, top["site"], base, env, backends)
    site_ok = loaded is not None
    site = loaded if loaded is not None else SiteConfig("unknown", None)
    resources = read_resources(issues, top["resources"], site, site_ok)
    backend = resolve_backend(loaded.backend, env, backends) if loaded else None
    rules = _rules(backend, cluster, partitions) if site_ok and backend is not None else None
    if rules is not None:
        given = top["resources"] if isinstance(top["resources"], dict) else {}
        site_issues += check_cluster(issues, site, resources, given, rules)
    return _Placement(loaded, site, resources, backend, site_issues)


def _sections(
    issues: Issues,
    top: Section,
    where: _Placement,
    base: Path,
    env: Mapping[str, str],
    path_check: Callable[[Any], Path],
    searchers: Searchers,
) -> _Sections:
    """Read the sections after ``resources:``, in this order (an issue's place among
    those without a line is the order they were found)."""
    e = read_section(issues, top["environment"], ("environment",), _ENVIRONMENT)
    space = read_hyperparameters(issues, top["hyperparameters"])
    searcher = read_searcher(issues, top["searcher"], space, searchers)
    script = read_script(
        issues, top["entrypoint"], top["script"], "script" in top.given, space, searcher.metric
    )
    ckpt_fields = {
        "dir": Field(path_check, nullable=True),
        "keep_best": Field(integer(min=0, cap=MAX_COUNT), default=1),
        "keep_latest": Field(integer(min=1, cap=MAX_COUNT), default=1),
        "keep_experiment_best": Field(integer(min=0, cap=MAX_COUNT), default=0),
    }
    c = read_section(issues, top["checkpoint"], ("checkpoint",), ckpt_fields)
    site_ok = where.loaded is not None
    preemption = read_preemption(issues, top["preemption"], where.site, site_ok, where.resources)
    r = read_section(issues, top["reproducibility"], ("reproducibility",), _REPRODUCIBILITY)
    deepspeed = read_deepspeed(issues, top["deepspeed"], base, env)
    data = read_data(issues, top["data"], base, env)
    return _Sections(e, space, searcher, script, c, preemption, r, deepspeed, data)


def _workdir(issues: Issues, value: Any, base: Path, path_check: Callable[[Any], Path]) -> Path:
    """The ``workdir:`` key (an existing folder), else the file's folder ``base``; a
    problem is reported at the key, and the path is then returned as far as it got."""
    workdir = base
    if value is not None:
        try:
            workdir = path_check(value)
            if not workdir.is_dir():
                issues.add(("workdir",), f"must be an existing directory, got {workdir}")
        except Invalid as exc:
            issues.add(("workdir",), str(exc))
        except OSError as exc:
            issues.add(("workdir",), f"cannot access {workdir}: {exc.strerror}")
    return workdir


def _config(
    top: Section,
    s: _Sections,
    resources: Resources,
    site: SiteConfig,
    backend: str,
    workdir: Path,
    source: Path,
    raw: Any,
) -> ExperimentConfig:
    """The resolved config of a file without problems (``raw``: its parsed YAML)."""
    c, r = s.checkpoint, s.reproducibility
    return ExperimentConfig(
        name=top["name"],
        entrypoint=top["entrypoint"],
        workdir=workdir,
        source=source,
        site=site,
        description=top["description"],
        resources=resources,
        environment=Environment(setup=s.environment["setup"], vars=s.environment["vars"]),
        hyperparameters=s.space,
        searcher=s.searcher,
        checkpoint=CheckpointConfig(
            dir=c["dir"] if c["dir"] is not None else site.scratch / "checkpoints",
            keep_best=c["keep_best"],
            keep_latest=c["keep_latest"],
            keep_experiment_best=c["keep_experiment_best"],
        ),
        max_restarts=top["max_restarts"],
        preemption=s.preemption,
        reproducibility=ReproducibilityConfig(
            seed=r["seed"] if r["seed"] is not None else s.searcher.seed,
            deterministic=r["deterministic"],
        ),
        deepspeed=s.deepspeed,
        data=s.data,
        backend=backend,
        raw=copy.deepcopy(raw),
        script=s.script,
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
