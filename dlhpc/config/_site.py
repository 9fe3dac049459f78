"""Site files (``site-configs/*.yaml``): finding, loading and validating them.

A site is named (``dev-cluster`` -> ``dev-cluster.yaml`` on the search path)
or given as a path (the value contains ``/`` or ends in ``.yaml``/``.yml``).
Without one, ``$DLHPC_SITE`` is used, else ``generic`` where ``backend: auto``
means Slurm (``sbatch`` on ``$PATH``) and ``local`` otherwise (a built-in
equivalent when that file is not on the search path). What ``auto`` means is
the scheduler backends' to say, and so are the backend names a site may use:
config sits below the schedulers, so its callers pass their table in as
``backends`` (:class:`Backends`). Errors in a site file name the site file and line.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from dlhpc._perms import member_home
from dlhpc.config import _fields as F
from dlhpc.config._paths import absolute, expand_path, home
from dlhpc.config._permissions import read_permissions
from dlhpc.config._validate import (
    Check,
    Field,
    Invalid,
    Issues,
    boolean,
    choice,
    describe,
    did_you_mean,
    integer,
    read_section,
    string,
    string_list,
)
from dlhpc.config._yaml import read_yaml_file
from dlhpc.config.schema import BackendName, PartitionInfo, SiteConfig
from dlhpc.errors import ConfigError, ConfigIssue

__all__ = [
    "Backends",
    "SiteRef",
    "auto_site_name",
    "builtin_sites",
    "list_sites",
    "load_site",
    "load_site_ref",
    "not_listed",
    "resolve_backend",
    "site_search_path",
]


class Backends(Protocol):
    """The scheduler backends a site may name (the scheduler layer's backend table).

    Without it (``None``), a site's backend name is taken as written (the scheduler
    layer refuses an unknown one) and ``auto`` cannot be resolved (ValueError).
    """

    def names(self) -> list[str]:
        """Every registered backend name."""
        ...

    def knows(self, name: str) -> bool:
        """Whether ``name`` is registered (the installed plugins are read only for a
        name that is not built-in)."""
        ...

    def auto(self, environ: Mapping[str, str]) -> str:
        """The backend ``auto`` means in ``environ``."""
        ...


_SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def builtin_sites() -> Path:
    """The folder of the built-in site files (``local``, ``dev-cluster``, ``generic`` and
    the ``template-*`` sites): the package's ``site-configs``, which a checkout links to
    its top-level ``site-configs/`` and a wheel or sdist carries as package data.

    RuntimeError when dlhpc is imported from somewhere that is not a folder (a zip file).
    """
    folder = resources.files("dlhpc") / "site-configs"
    if not isinstance(folder, Path):
        raise RuntimeError(f"dlhpc must be installed as files to read its sites; found {folder}")
    return folder


_PARTITION_FIELDS = {
    "gpus_per_node": Field(integer(min=0, max=1024), default=0),
    "gpu_type": Field(
        string(pattern=_GPU_TYPE, what="must be a GPU type like a100 (letters, digits, _ . -)"),
        nullable=True,
    ),
    "max_time": Field(F.slurm_time(allow_unlimited=True), nullable=True),
    "preemptible": Field(boolean, default=False),
}


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def site_search_path(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Folders searched for ``NAME.yaml``, first match wins.

    ``$DLHPC_SITE_PATH`` (colon-separated, ``~`` expanded, empty entries
    skipped), then ``~/.config/dlhpc/sites``, then the built-in sites (:func:`builtin_sites`).
    """
    env = _env(environ)
    cwd = Path.cwd()
    out: list[Path] = []
    for entry in env.get("DLHPC_SITE_PATH", "").split(":"):
        if entry.strip():
            try:
                out.append(expand_path(entry, cwd, env))
            except ValueError as exc:
                raise ConfigError([ConfigIssue("$DLHPC_SITE_PATH", None, "", str(exc))]) from None
    with contextlib.suppress(ValueError):  # no home folder known: nothing to search there
        out.append(Path(home(env)) / ".config" / "dlhpc" / "sites")
    out.append(builtin_sites())
    return out


def list_sites(environ: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Site names on the search path -> their file (the first of each name)."""
    found: dict[str, Path] = {}
    for folder in site_search_path(environ):
        try:
            files = sorted(folder.glob("*.yaml"))
        except OSError:
            continue  # unreadable folder: nothing found there
        for file in files:
            found.setdefault(file.stem, file)
    return found


def auto_site_name(environ: Mapping[str, str] | None, backends: Backends | None) -> str:
    """The site used when none is named: ``generic`` where ``auto`` means Slurm, else
    the backend's name (``local``)."""
    backend = resolve_backend("auto", environ, backends)
    return "generic" if backend == "slurm" else backend


def resolve_backend(
    backend: BackendName, environ: Mapping[str, str] | None, backends: Backends | None
) -> BackendName:
    """``backend``, with ``auto`` answered by ``backends`` for the environment;
    ValueError for ``auto`` without ``backends`` (a caller's mistake)."""
    if backend != "auto":
        return backend
    if backends is None:
        raise ValueError("backend 'auto' needs the scheduler backends (backends=)")
    return backends.auto(_env(environ))


class SiteRef:
    """Where a site choice came from, for error messages: file, line and field."""

    def __init__(self, file: str, line: int | None = None, field: str = "") -> None:
        self.file, self.line, self.field = file, line, field

    def error(self, message: str) -> ConfigError:
        return ConfigError([ConfigIssue(self.file, self.line, self.field, message)])


def load_site(
    name_or_path: str | None = None,
    environ: Mapping[str, str] | None = None,
    backends: Backends | None = None,
) -> SiteConfig:
    """Load a site by name or path; ``None``: ``$DLHPC_SITE``, else auto (see module doc;
    ``backends`` checks the site's backend name and answers ``auto``)."""
    env = _env(environ)
    if name_or_path is not None:
        return load_site_ref(name_or_path, SiteRef("site"), Path.cwd(), env, backends)
    if env.get("DLHPC_SITE"):
        return load_site_ref(env["DLHPC_SITE"], SiteRef("$DLHPC_SITE"), Path.cwd(), env, backends)
    name = auto_site_name(env, backends)
    file = list_sites(env).get(name)
    if file is None:  # a built-in equivalent of the shipped file
        backend = "slurm" if name == "generic" else name
        return _finish(SiteConfig(name, None, backend=backend), env)
    return load_site_file(file, str(file), env, backends)


def load_site_ref(
    spec: str,
    ref: SiteRef,
    base: Path,
    environ: Mapping[str, str],
    backends: Backends | None = None,
) -> SiteConfig:
    """Load the site ``spec`` (a name or a path relative to ``base``) chosen at ``ref``."""
    if spec.endswith((".yaml", ".yml")) or "/" in spec:
        try:
            file = expand_path(spec, base, environ)
        except ValueError as exc:
            raise ref.error(str(exc)) from None
        return load_site_file(file, spec, environ, backends)
    sites = list_sites(environ)
    if not _SITE_NAME.fullmatch(spec) or spec not in sites:
        names = ", ".join(sorted(sites)) or "none"
        where = ", ".join(str(p) for p in site_search_path(environ))
        raise ref.error(
            f"unknown site {describe(spec)}; {did_you_mean(spec, sites)}"
            f"(available: {names}; searched {where})"
        )
    return load_site_file(sites[spec], str(sites[spec]), environ, backends)


def _backend(backends: Backends) -> Check:
    """``auto`` or a name ``backends`` knows; the valid names are listed only for an
    unknown one (listing them reads every installed plugin)."""

    def check(value: Any) -> str:
        if isinstance(value, str) and (value == "auto" or backends.knows(value)):
            return value
        return str(choice("auto", *backends.names())(value))  # raises, naming them

    return check


def load_site_file(
    file: Path, label: str, environ: Mapping[str, str], backends: Backends | None = None
) -> SiteConfig:
    """Load and validate one site file; ``label`` names it in errors. Its backend must
    be ``auto`` or one of ``backends``' names (any name without ``backends``)."""
    doc = read_yaml_file(file, label)
    base = absolute(file, Path.cwd()).parent
    issues = Issues(label, doc.lines)
    path = F.path(base, environ)
    fields = {
        "name": Field(string(pattern=_SITE_NAME, what="must be a site name"), default=file.stem),
        "backend": Field(F.TOKEN if backends is None else _backend(backends), default="auto"),
        "partition": Field(F.TOKEN, nullable=True),
        "account": Field(F.TOKEN, nullable=True),
        "qos": Field(F.TOKEN, nullable=True),
        "partitions": Field(_partitions_check(issues), default={}),
        "scratch": Field(path, nullable=True),
        "state_dir": Field(path, nullable=True),
        "signal": Field(F.signal, default="USR2"),
        "lead_time": Field(F.lead_time, default=120),
        "modules": Field(string_list(string(single_line=True)), default=()),
        "python": Field(string(single_line=True), nullable=True),
        "max_array_size": Field(integer(min=1, max=10_000_000), nullable=True),
        "env": Field(F.env_vars, default={}),
        "journal_mode": Field(choice("delete", "wal"), default="delete"),
        "gpu_request": Field(choice("gpus-per-node", "gres"), default="gpus-per-node"),
        "local_max_parallel": Field(integer(min=1, max=100_000), nullable=True),
        "permissions": Field(lambda value: value, nullable=True),  # read_permissions checks
    }
    s = read_section(issues, doc.data, (), fields)
    permissions = read_permissions(issues, s["permissions"])
    partitions: dict[str, PartitionInfo] = s["partitions"]
    if partitions and s["partition"] is not None and issues.ok(("partition",), ("partitions",)):
        for part in s["partition"].split(","):
            if part not in partitions:
                issues.add(("partition",), not_listed(part, partitions, s["name"]))
    if issues.issues:
        raise ConfigError(sorted(issues.issues, key=lambda i: (i.line is not None, i.line or 0)))
    site = SiteConfig(
        name=s["name"],
        source=absolute(file, Path.cwd()),
        backend=s["backend"],
        partition=s["partition"],
        account=s["account"],
        qos=s["qos"],
        partitions=partitions,
        signal=s["signal"],
        lead_time_s=s["lead_time"],
        modules=s["modules"],
        python=s["python"],
        max_array_size=s["max_array_size"],
        env=s["env"],
        journal_mode=s["journal_mode"],
        local_max_parallel=s["local_max_parallel"],
        permissions=permissions,
        gpu_request=s["gpu_request"],
    )
    return _finish(site, environ, scratch=s["scratch"], state_dir=s["state_dir"])


def not_listed(part: str, partitions: Mapping[str, Any], site: str) -> str:
    """Message for a partition the site does not list."""
    return (
        f"partition {part!r} is not listed by site {site!r}; "
        f"{did_you_mean(part, partitions)}(valid: {', '.join(sorted(partitions))})"
    )


def _partitions_check(issues: Issues) -> Check:
    def check(value: Any) -> dict[str, PartitionInfo]:
        if not isinstance(value, dict):
            raise Invalid(f"must be a mapping of partition name: settings, got {describe(value)}")
        out: dict[str, PartitionInfo] = {}
        for name, spec in value.items():
            here = ("partitions", name)
            if not _SITE_NAME.fullmatch(name):
                issues.add(here, f"not a valid partition name: {describe(name)}")
                continue
            p = read_section(issues, spec, here, _PARTITION_FIELDS)
            max_time = p["max_time"][1] if p["max_time"] is not None else None
            out[name] = PartitionInfo(
                name, p["gpus_per_node"], p["gpu_type"], max_time, p["preemptible"]
            )
        return out

    return check


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # honours cgroup/cpuset limits (Linux)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _finish(
    site: SiteConfig,
    environ: Mapping[str, str],
    *,
    scratch: Path | None = None,
    state_dir: Path | None = None,
) -> SiteConfig:
    """``site`` with the defaults that depend on the environment filled in.

    ``state_dir``: ``$DLHPC_HOME`` when set, else the file's, else ``~/.dlhpc``;
    ``scratch``: the file's, else ``<state_dir>/scratch`` (group mode: the member's
    ``<state_dir>/users/<user>/scratch``, as experiment ids are each member's own);
    ``local_max_parallel``: the usable CPUs when not given.
    """
    try:
        if environ.get("DLHPC_HOME"):
            state_dir = expand_path(environ["DLHPC_HOME"], Path.cwd(), environ)
        elif state_dir is None:
            state_dir = Path(home(environ)) / ".dlhpc"
    except ValueError as exc:
        label = str(site.source) if site.source else site.name
        field = "$DLHPC_HOME" if environ.get("DLHPC_HOME") else "state_dir"
        raise ConfigError([ConfigIssue(label, None, field, str(exc))]) from None
    return replace(
        site,
        state_dir=state_dir,
        scratch=scratch or member_home(state_dir, site.permissions) / "scratch",
        local_max_parallel=site.local_max_parallel or _cpus(),
    )
