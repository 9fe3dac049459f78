"""The scheduler backends by name: one :class:`Backend` descriptor per name.

* **Built-ins**: ``slurm`` and ``local``, the ``BACKEND`` of their subpackages.
* **Third parties** register an entry point in the group :data:`GROUP` whose
  name is the backend's and whose object is its :class:`Backend`, in their
  ``pyproject.toml``::

      [project.entry-points."dlhpc.schedulers"]
      pbs = "dlhpc_pbs:BACKEND"

  The installed packages are asked (:mod:`dlhpc._entrypoints`) only when a name
  is not built-in or every backend is weighed (:meth:`BackendTable.names`,
  :meth:`~BackendTable.auto`, :meth:`~BackendTable.job_environment`,
  :meth:`~BackendTable.with_backend`), and an entry point is imported only when
  its backend is needed, so a broken plugin fails only the commands that use it.
  None may take a built-in name, nor may two packages register one name.
* **In-process** backends (the simulator's cluster, tests) are added with
  :meth:`BackendTable.with_backend`, which returns a new table.
* **For tests and benchmarks** that drive the CLI, ``$DLHPC_SCHEDULERS``
  (``name=module:attribute``, comma-separated) adds descriptors that win over
  every other of the same name, built-ins included.

This module and the built-in descriptors use the standard library only (the
in-job worker imports them); a descriptor's callables import the rest.

In a job, :meth:`BackendTable.job_environment` picks the backend whose
:meth:`~dlhpc.scheduler.environment.JobEnvironment.activated` is true, trying
the added and third-party backends first (their tests are their own: a backend
running its jobs inside a Slurm allocation or through the local runner is
still found), then the built-ins, ``slurm`` before ``local`` (a task started
under Slurm is Slurm's). ``site.backend: auto`` is :meth:`BackendTable.auto`:
the available backend with the highest ``auto_priority`` (Slurm where
``sbatch`` is on ``PATH``, else local).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlhpc._entrypoints import installed, load
from dlhpc.errors import DlhpcError
from dlhpc.scheduler.environment import JobEnvironment

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from dlhpc.config import ClusterRules, SiteConfig
    from dlhpc.scheduler.base import BaseScheduler

__all__ = ["GROUP", "Backend", "BackendTable", "Check"]

GROUP = "dlhpc.schedulers"


@dataclass
class Check:
    """One line of ``dlhpc doctor``: status is ok, warn, fail or skip."""

    name: str
    status: str
    detail: str


def _everywhere(_environ: Mapping[str, str]) -> bool:
    return True


@dataclass(frozen=True)
class Backend:
    """A scheduler backend's descriptor.

    ``scheduler(root)``: a new scheduler (``root``: a folder of the state folder
    the backend may keep its own files in); ``environment``: the
    :class:`JobEnvironment` of its jobs, or None when it starts no dlhpc jobs;
    ``available(environ)``: whether it can submit from here (cheap, no
    subprocess); ``doctor(site)``: its ``dlhpc doctor`` lines;
    ``request_check(state_dir)``: why this state folder cannot hold its jobs, or
    None; ``site_rules()``: what the cluster allows (partitions, GPU types,
    accounts, QOS) for the loader's checks, a :class:`dlhpc.config.ClusterRules`;
    ``runs_here``: its jobs run on this machine; ``auto_priority``: rank for
    ``backend: auto`` (None: never chosen automatically).
    """

    name: str
    scheduler: Callable[[Path], BaseScheduler]
    environment: type[JobEnvironment] | None = None
    available: Callable[[Mapping[str, str]], bool] = _everywhere
    doctor: Callable[[SiteConfig], list[Check]] | None = None
    request_check: Callable[[Path], str | None] | None = None
    site_rules: Callable[[], ClusterRules] | None = None
    runs_here: bool = False
    auto_priority: int | None = None

    def doctor_checks(self, site: SiteConfig) -> list[Check]:
        """The backend's own doctor checks for ``site``; none without any."""
        return [] if self.doctor is None else self.doctor(site)

    def cluster_rules(self) -> ClusterRules | None:
        """A new instance of the backend's cluster rules, or None without any."""
        return None if self.site_rules is None else self.site_rules()

    def request_problem(self, state_dir: Path) -> str | None:
        """Why this backend's jobs cannot use ``state_dir``, or None."""
        return None if self.request_check is None else self.request_check(state_dir)


def _builtin() -> dict[str, Backend | EntryPoint]:
    """The built-ins, in the order their job environments are tried."""
    from dlhpc.scheduler import local, slurm  # their descriptors import this module

    return {"slurm": slurm.BACKEND, "local": local.BACKEND}


def _overrides(environ: Mapping[str, str]) -> dict[str, Backend | EntryPoint]:
    """``$DLHPC_SCHEDULERS``, each ``name=module:attribute`` as an entry point."""
    items = [i.strip() for i in environ.get("DLHPC_SCHEDULERS", "").split(",") if i.strip()]
    if not items:
        return {}
    from importlib.metadata import EntryPoint

    out: dict[str, Backend | EntryPoint] = {}
    for item in items:
        name, sep, ref = item.partition("=")
        if not sep or ":" not in ref:
            raise DlhpcError(f"DLHPC_SCHEDULERS: {item!r} is not name=module:attribute")
        out[name] = EntryPoint(name, ref, GROUP)
    return out


class BackendTable:
    """Backends by name: built-ins, entry points, overrides and in-process additions.

    Immutable from outside: :meth:`with_backend` returns a new table.
    ``backends`` given: exactly those. None: the built-ins, the installed entry
    points (read on first need, see the module docstring) and the
    ``$DLHPC_SCHEDULERS`` overrides (read, and checked, now).
    """

    def __init__(self, backends: Iterable[Backend] | None = None) -> None:
        self._overrides: dict[str, Backend | EntryPoint] = {}
        self._scanned = backends is not None
        if backends is None:
            self._overrides = _overrides(os.environ)
            self._refs = {**_builtin(), **self._overrides}
        else:
            self._refs = {b.name: b for b in backends}
        self._loaded: dict[str, Backend] = {}

    def _all(self) -> dict[str, Backend | EntryPoint]:
        """Every backend: the built-ins, the entry points by name, the overrides."""
        if not self._scanned:
            builtin = _builtin()
            try:
                found = installed(GROUP, "backend", builtin)
            except ValueError as err:  # a built-in name taken, or one name twice
                raise DlhpcError(str(err)) from err
            self._refs = {**builtin, **found, **self._overrides}
            self._scanned = True
        return self._refs

    def names(self) -> list[str]:
        """Every backend name, built-ins first (no plugin is imported)."""
        return list(self._all())

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a backend; the entry points are read only for a name
        that is neither built-in nor an override."""
        return name in self._refs or name in self._all()

    def get(self, name: str) -> Backend:
        """The backend ``name``; ValueError naming the valid ones for an unknown name."""
        if name not in self._loaded:
            ref = self._refs[name] if name in self._refs else self._all().get(name)
            if ref is None:
                raise ValueError(
                    f"unknown scheduler backend {name!r}; valid: {', '.join(sorted(self._refs))}"
                )
            self._loaded[name] = ref if isinstance(ref, Backend) else _load(name, ref)
        return self._loaded[name]

    def with_backend(self, backend: Backend) -> BackendTable:
        """This table plus ``backend`` (replacing none: a taken name is an error)."""
        refs = self._all()
        if backend.name in refs:
            raise ValueError(f"scheduler backend {backend.name!r} is already registered")
        table = BackendTable(())
        table._refs = {**refs, backend.name: backend}
        return table

    def auto(self, environ: Mapping[str, str]) -> str:
        """The backend ``auto`` means here: the available one of highest ``auto_priority``."""
        best: tuple[int, str] | None = None
        for name in self._all():
            backend = self.get(name)
            if backend.auto_priority is None or not backend.available(environ):
                continue
            if best is None or backend.auto_priority > best[0]:
                best = (backend.auto_priority, name)
        if best is None:
            raise DlhpcError(f"no scheduler backend is available (known: {', '.join(self._refs)})")
        return best[1]

    def job_environment(self, environ: Mapping[str, str]) -> JobEnvironment:
        """This job's environment: the first backend whose class is activated by
        ``environ`` (others before the built-ins, see the module docstring);
        DlhpcError when none is."""
        markers: list[str] = []
        refs = self._all()
        builtins = [n for n in _builtin() if n in refs]
        for name in [n for n in refs if n not in builtins] + builtins:
            cls = self.get(name).environment
            if cls is None:
                continue
            if cls.activated(environ):
                return cls(environ)
            markers.append(cls.marker or f"a {name} job")
        raise DlhpcError(f"no {' or '.join(markers)}; not started by a scheduler")


def _load(name: str, ep: EntryPoint) -> Backend:
    """The descriptor entry point ``ep`` names, checked (DlhpcError naming it)."""
    try:
        obj: Any = load(ep, "backend")
    except ValueError as err:
        raise DlhpcError(str(err)) from err
    if not isinstance(obj, Backend):
        raise DlhpcError(f"backend {name!r}: {ep.value} is not a dlhpc Backend descriptor")
    if obj.name != name:
        raise DlhpcError(f"backend {ep.value} is named {obj.name!r}, not {name!r}")
    return obj
