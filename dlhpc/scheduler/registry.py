"""The open registry of scheduler backends: one :class:`Backend` descriptor per name.

How backends register:

* **Built-ins** (``slurm``, ``local``) are listed in code (:data:`BUILTIN`), so a
  stale or editable install without entry-point metadata still has them.
* **Third parties** declare an entry point in group ``dlhpc.schedulers`` whose
  name is the backend name and whose object is a :class:`Backend`, e.g. in
  ``pyproject.toml``::

      [project.entry-points."dlhpc.schedulers"]
      pbs = "dlhpc_pbs:BACKEND"

  The entry points are read only when a name is not built-in, or every backend
  is weighed (:meth:`Registry.names`, :meth:`~Registry.auto`,
  :meth:`~Registry.job_environment`, :meth:`~Registry.with_backend`), so the
  ``dlhpc`` command does not scan the installed packages on every start. An
  entry point is loaded only when its backend is needed (a broken plugin
  fails the commands that use it, naming the entry point). It may not reuse a
  built-in name, nor may two packages register one name (the scan refuses both).
* **In-process** backends (the simulator's cluster, tests) are added with
  :meth:`Registry.with_backend`, which returns a new registry.
* **For tests and benchmarks** that drive the CLI, ``$DLHPC_SCHEDULERS``
  (``name=module:attribute``, comma-separated) adds descriptors that win over
  every other of the same name, built-ins included.

A descriptor's parts are lazy: ``scheduler``, ``environment``, ``doctor`` and
``request_check`` are either the object or a ``"module:attribute"`` reference
imported on first use, so this module and a backend's descriptor module stay
light (standard library only): the in-job worker imports them.

In a job, :meth:`Registry.job_environment` picks the backend whose
:meth:`~dlhpc.scheduler.environment.JobEnvironment.activated` is true, trying
the added and third-party backends first (their tests are their own: a backend
running its jobs inside a Slurm allocation or through the local runner is
still found), then the built-ins, ``slurm`` before ``local`` (a task started
under Slurm is Slurm's). ``site.backend: auto`` is
:meth:`Registry.auto`: the available backend with the highest ``auto_priority``
(Slurm where ``sbatch`` is on ``PATH``, else local).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from dlhpc._plugins import entry_points_by_name, load_reference
from dlhpc.errors import DlhpcError
from dlhpc.scheduler.environment import JobEnvironment

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["BUILTIN", "GROUP", "Backend", "Check", "Registry", "default_registry"]

GROUP = "dlhpc.schedulers"
#: Built-in backends: name -> ``"module:attribute"`` of their descriptor, in
#: the order their job environments are tried.
BUILTIN: Mapping[str, str] = {
    "slurm": "dlhpc.scheduler.slurm:BACKEND",
    "local": "dlhpc.scheduler.local:BACKEND",
}


@dataclass
class Check:
    """One line of ``dlhpc doctor``: status is ok, warn, fail or skip."""

    name: str
    status: str
    detail: str


def _load(ref: str) -> Any:
    try:
        return load_reference(ref)
    except (ImportError, AttributeError) as err:
        raise DlhpcError(f"cannot load {ref}: {err}") from err


def _resolve(value: Any) -> Any:
    return _load(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Backend:
    """A scheduler backend's descriptor.

    ``scheduler``: a factory ``(root: Path) -> BaseScheduler`` (``root``: a folder
    of the state folder the backend may keep its own files in); ``environment``:
    its :class:`JobEnvironment` subclass, or None when it starts no dlhpc jobs;
    ``available(environ)``: whether it can submit from here (cheap, no
    subprocess); ``doctor``: ``(site) -> list[Check]``; ``request_check``:
    ``(state_dir) -> str | None``, why this state folder cannot hold its jobs;
    ``site_rules``: ``() -> ClusterRules`` (:mod:`dlhpc.config._cluster`), what the
    cluster allows (partitions, GPU types, accounts, QOS) for the loader's checks,
    with a ``warnings`` list of the checks it had to skip;
    ``runs_here``: its jobs run on this machine; ``auto_priority``: rank for
    ``backend: auto`` (None: never chosen automatically). Each callable may be
    given as a ``"module:attribute"`` string, imported on first use.
    """

    name: str
    scheduler: str | Callable[[Path], Any]
    environment: str | type[JobEnvironment] | None = None
    available: Callable[[Mapping[str, str]], bool] = field(default=lambda _env: True)
    doctor: str | Callable[[Any], list[Check]] | None = None
    request_check: str | Callable[[Path], str | None] | None = None
    site_rules: str | Callable[[], Any] | None = None
    runs_here: bool = False
    auto_priority: int | None = None

    def make_scheduler(self, root: Path) -> Any:
        """A new scheduler instance (a :class:`~dlhpc.scheduler.base.BaseScheduler`;
        typed loosely so that this module never imports the config layer)."""
        factory: Callable[[Path], Any] = _resolve(self.scheduler)
        return factory(root)

    def environment_class(self) -> type[JobEnvironment] | None:
        cls: type[JobEnvironment] | None = _resolve(self.environment)
        return cls

    def doctor_checks(self, site: Any) -> list[Check]:
        """The backend's own doctor checks for ``site`` (a SiteConfig); none without any."""
        if self.doctor is None:
            return []
        checks: Callable[[Any], list[Check]] = _resolve(self.doctor)
        return checks(site)

    def cluster_rules(self) -> Any:
        """A new instance of the backend's cluster rules, or None without any (typed
        loosely: this module never imports the config layer)."""
        if self.site_rules is None:
            return None
        factory: Callable[[], Any] = _resolve(self.site_rules)
        return factory()

    def request_problem(self, state_dir: Path) -> str | None:
        """Why this backend's jobs cannot use ``state_dir``, or None."""
        if self.request_check is None:
            return None
        check: Callable[[Path], str | None] = _resolve(self.request_check)
        return check(state_dir)


#: What a registry holds per name: a ``"module:attribute"`` reference, an
#: installed entry point, or the descriptor itself.
_Ref = Union[str, "EntryPoint", Backend]


def _entry_points() -> dict[str, EntryPoint]:
    try:
        found = entry_points_by_name(GROUP)
    except ValueError as err:  # one name, two packages
        raise DlhpcError(str(err)) from err
    for ep in found.values():
        if ep.name in BUILTIN:
            raise DlhpcError(
                f"entry point {ep.name} = {ep.value} (group {GROUP}) reuses the built-in "
                f"backend name {ep.name!r}; rename it"
            )
    return found


def _env_overrides(environ: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in environ.get("DLHPC_SCHEDULERS", "").split(","):
        if item.strip():
            name, sep, ref = item.strip().partition("=")
            if not sep or ":" not in ref:
                raise DlhpcError(f"DLHPC_SCHEDULERS: {item!r} is not name=module:attribute")
            out[name] = ref
    return out


class Registry:
    """Backends by name: built-ins, entry points and in-process additions.

    Immutable from outside: :meth:`with_backend` returns a new registry.
    ``refs`` given: exactly those backends. None: the built-ins, the installed
    entry points (scanned on first need, see the module docstring) and the
    ``$DLHPC_SCHEDULERS`` overrides (read, and checked, now).
    """

    def __init__(self, refs: Mapping[str, _Ref] | None = None) -> None:
        self._overrides: dict[str, _Ref] = {}
        self._scanned = refs is not None
        if refs is None:
            self._overrides = dict(_env_overrides(os.environ))
            refs = {**BUILTIN, **self._overrides}
        self._refs: dict[str, _Ref] = dict(refs)
        self._loaded: dict[str, Backend] = {}

    def _all(self) -> dict[str, _Ref]:
        """Every backend: the built-ins, the entry points by name, the overrides."""
        if not self._scanned:
            found: dict[str, _Ref] = dict(BUILTIN)
            found.update(_entry_points())
            found.update(self._overrides)
            self._refs, self._scanned = found, True
        return self._refs

    def names(self) -> list[str]:
        """Every backend name, built-ins first (no plugin is imported)."""
        return list(self._all())

    def get(self, name: str) -> Backend:
        """The backend ``name``; ValueError naming the valid ones for an unknown name."""
        if name not in self._loaded:
            ref = self._refs[name] if name in self._refs else self._all().get(name)
            if ref is None:
                raise ValueError(
                    f"unknown scheduler backend {name!r}; valid: {', '.join(sorted(self._refs))}"
                )
            backend = self._load_ref(name, ref)
            if backend.name != name:
                raise DlhpcError(f"backend {ref!r} is named {backend.name!r}, not {name!r}")
            self._loaded[name] = backend
        return self._loaded[name]

    @staticmethod
    def _load_ref(name: str, ref: _Ref) -> Backend:
        if isinstance(ref, Backend):
            return ref
        if isinstance(ref, str):
            obj = _load(ref)
        else:
            try:
                obj = ref.load()
            except Exception as err:  # any plugin failure: name the entry point
                raise DlhpcError(f"cannot load backend {name!r} ({ref.value}): {err}") from err
        if not isinstance(obj, Backend):
            raise DlhpcError(f"backend {name!r}: {ref!r} is not a dlhpc Backend descriptor")
        return obj

    def with_backend(self, backend: Backend) -> Registry:
        """This registry plus ``backend`` (replacing none: a taken name is an error)."""
        if backend.name in self._all():
            raise ValueError(f"scheduler backend {backend.name!r} is already registered")
        return Registry({**self._refs, backend.name: backend})

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
        builtins = [n for n in BUILTIN if n in refs]
        for name in [n for n in refs if n not in builtins] + builtins:
            cls = self.get(name).environment_class()
            if cls is None:
                continue
            if cls.activated(environ):
                return cls(environ)
            markers.append(cls.marker or f"a {name} job")
        raise DlhpcError(f"no {' or '.join(markers)}; not started by a scheduler")


def default_registry() -> Registry:
    """The built-ins, the installed entry points (read anew by each registry, when
    first needed) and the ``$DLHPC_SCHEDULERS`` overrides."""
    return Registry()
