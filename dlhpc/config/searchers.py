"""Where searchers are found, and the settings rules config asks of them.

config sits below :mod:`dlhpc.search` and never imports it. It finds a searcher
by name the way a third-party package registers one: as an *entry point*
(``module:attribute``) in the group :data:`GROUP` (``dlhpc.searchers``). The
built-in searchers are the entry points of :data:`BUILTIN`, written here in
that same form; a package adds one with, in its ``pyproject.toml``::

    [project.entry-points."dlhpc.searchers"]
    pbt = "mypkg.pbt:PBTSearcher"

The entry point is imported only when its name is asked for. The installed
packages' entry points are scanned only for a name that is not built-in or
when every name is listed (:func:`searcher_names`), so the ``dlhpc`` command
does not pay for the scan on every start. A built-in name cannot be replaced.

What a searcher object must offer config is :class:`SearcherRules` (every
:class:`dlhpc.search.BaseSearcher` subclass does; see :mod:`dlhpc.search.base`
for the whole contract). The experiment loader applies the rules while it reads
the ``searcher`` section, so a searcher's own problems are reported with the
others, as ``file:line: field: message``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, cast

from dlhpc._plugins import entry_point_names, load_entry_point
from dlhpc.config.model import HParam, SearcherConfig

__all__ = [
    "BUILTIN",
    "DEFAULT_LEARNING_CONCURRENCY",
    "GROUP",
    "Report",
    "SearcherRules",
    "default_concurrency",
    "is_searcher_name",
    "searcher_names",
    "searcher_rules",
    "searchers_knowing",
]

GROUP = "dlhpc.searchers"

# The built-in searchers, in the order every listing shows them; each names the module
# that defines it, so a new built-in is its module plus one line here.
BUILTIN: Mapping[str, str] = {
    "single": "dlhpc.search._single:SingleSearcher",
    "grid": "dlhpc.search._grid:GridSearcher",
    "random": "dlhpc.search._random:RandomSearcher",
    "bayes": "dlhpc.search._bayes:BayesSearcher",
    "sha": "dlhpc.search._sha:SHASearcher",
    "asha": "dlhpc.search._asha:ASHASearcher",
    "hyperband": "dlhpc.search._hyperband:HyperbandSearcher",
}

# Searchers that learn from results would throw that away by running every trial
# at once; as Determined does, they get a bound unless one is set.
DEFAULT_LEARNING_CONCURRENCY = 16


class Report(Protocol):
    """Where a searcher's settings rules report problems (the loader's issue list).

    ``path`` is a key path in the experiment file, e.g. ``("searcher", "mode")``
    or ``("hyperparameters", "lr")``; the loader adds its line.
    """

    def add(self, path: tuple[str | int, ...], message: str) -> None:
        """Report ``message`` about the value at ``path``."""

    def ok(self, *paths: tuple[str | int, ...]) -> bool:
        """True when no problem was reported at, above or below any of ``paths``."""


class SearcherRules(Protocol):
    """The settings rules of one searcher (class attributes and a classmethod).

    * ``kind``: its name in experiment files;
    * ``default_max_length``: ``max_length`` when the file gives none (None: required);
    * ``options``: the optional keys it knows among ``mode``, ``min_length``,
      ``stop_once``, ``proposer`` and ``max_budget`` (a key it does not know is
      refused by the loader, naming the searchers that know it);
    * ``learns``: it learns from results, so its trials are bounded by
      :data:`DEFAULT_LEARNING_CONCURRENCY` unless ``max_concurrent_trials`` is set;
    * ``check_settings(config, space, report)``: its own rules; reports problems
      to ``report`` and returns ``config`` with its own defaults filled in.
    """

    kind: str
    default_max_length: int | None
    options: frozenset[str]
    learns: bool

    def check_settings(
        self, config: SearcherConfig, space: Mapping[str, HParam], report: Report
    ) -> SearcherConfig:
        """``config`` with this searcher's defaults; problems go to ``report``."""


def is_searcher_name(name: str) -> bool:
    """True when ``name`` is a built-in searcher or an installed entry point of :data:`GROUP`."""
    return name in BUILTIN or name in entry_point_names(GROUP)


def searcher_names() -> tuple[str, ...]:
    """Every searcher name: the built-ins in their order, then the installed ones, sorted."""
    extra = sorted(n for n in entry_point_names(GROUP) if n not in BUILTIN)
    return (*BUILTIN, *extra)


def searcher_rules(name: str) -> SearcherRules:
    """The searcher object (normally a class) registered as ``name``.

    Raises :class:`ValueError` naming the valid searchers for an unknown name, or
    when what the entry point names lacks the :class:`SearcherRules` attributes or
    its ``kind`` is not ``name``; the import errors of its module propagate.
    """
    if not is_searcher_name(name):
        raise ValueError(
            f"unknown searcher {name!r} (known: {', '.join(sorted(searcher_names()))})"
        )
    obj = load_entry_point(GROUP, name, BUILTIN.get(name))
    missing = [
        a
        for a in ("kind", "default_max_length", "options", "learns", "check_settings")
        if not hasattr(obj, a)
    ]
    if missing:
        raise ValueError(
            f"searcher {name!r} ({GROUP} entry point) lacks {', '.join(missing)}; "
            "derive it from dlhpc.search.BaseSearcher"
        )
    if obj.kind != name:
        raise ValueError(f"searcher {name!r} is registered for a class of kind {obj.kind!r}")
    return cast(SearcherRules, obj)


def searchers_knowing(option: str) -> list[str]:
    """The searchers whose ``options`` include ``option``, in :func:`searcher_names` order.

    Lists every searcher, so it scans the entry points; one that fails to load
    is left out (asking for it by name reports why).
    """
    out = []
    for name in searcher_names():
        try:
            rules = searcher_rules(name)
        except (ImportError, ValueError):
            continue
        if option in rules.options:
            out.append(name)
    return out


def default_concurrency(rules: SearcherRules) -> int:
    """``max_concurrent_trials`` when the file gives none (0: no bound)."""
    return DEFAULT_LEARNING_CONCURRENCY if rules.learns else 0
