"""The searchers by name: the built-ins, then the installed packages' searchers.

A searcher is a :class:`~dlhpc.search.base.BaseSearcher` subclass whose ``kind``
is its name. The built-ins are :data:`BUILTIN`; a package adds one as an entry
point of the group :data:`GROUP`, in its ``pyproject.toml``::

    [project.entry-points."dlhpc.searchers"]
    pbt = "mypkg.pbt:PBTSearcher"

The installed packages are asked (:mod:`dlhpc._entrypoints`) only for a name
that is not built-in or when every name is listed, and an entry point is
imported only when its name is asked for. A built-in name cannot be taken.
:class:`SearcherTable` is how the experiment loader, below this layer, is
handed the searchers (:class:`dlhpc.config.Searchers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlhpc._entrypoints import installed, load
from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.search._asha import ASHASearcher
from dlhpc.search._bayes import BayesSearcher
from dlhpc.search._grid import GridSearcher
from dlhpc.search._hyperband import HyperbandSearcher
from dlhpc.search._random import RandomSearcher
from dlhpc.search._sha import SHASearcher
from dlhpc.search._single import SingleSearcher
from dlhpc.search.base import BaseSearcher

__all__ = [
    "BUILTIN",
    "GROUP",
    "SearcherTable",
    "expected_trials",
    "find_searcher",
    "make_searcher",
    "rung_plan",
    "searcher_class",
    "searcher_names",
]

GROUP = "dlhpc.searchers"

#: The built-in searchers, in the order every listing shows them.
BUILTIN: Mapping[str, type[BaseSearcher]] = {
    cls.kind: cls
    for cls in (
        SingleSearcher,
        GridSearcher,
        RandomSearcher,
        BayesSearcher,
        SHASearcher,
        ASHASearcher,
        HyperbandSearcher,
    )
}


def searcher_names() -> tuple[str, ...]:
    """Every searcher name: the built-ins in their order, then the installed ones, sorted.
    ValueError when an installed one takes a built-in name or two take one name."""
    return (*BUILTIN, *installed(GROUP, "searcher", BUILTIN))


def find_searcher(name: str) -> type[BaseSearcher] | None:
    """The searcher class named ``name``; None when there is none.

    Raises :class:`ValueError` when the entry point cannot be imported or names
    something other than a ``BaseSearcher`` subclass whose ``kind`` is ``name``.
    """
    if name in BUILTIN:
        return BUILTIN[name]
    ep = installed(GROUP, "searcher", BUILTIN).get(name)
    if ep is None:
        return None
    obj: Any = load(ep, "searcher")
    if not (isinstance(obj, type) and issubclass(obj, BaseSearcher)):
        raise ValueError(
            f"searcher {name!r} ({GROUP} entry point {ep.value}) is not a "
            "dlhpc.search.BaseSearcher subclass"
        )
    if obj.kind != name:
        raise ValueError(f"searcher {name!r} is registered for a class of kind {obj.kind!r}")
    return obj


def searcher_class(name: str) -> type[BaseSearcher]:
    """The searcher class named ``name``; as :func:`find_searcher`, and
    :class:`ValueError` naming the valid ones for an unknown name."""
    cls = find_searcher(name)
    if cls is None:
        raise ValueError(
            f"unknown searcher {name!r} (known: {', '.join(sorted(searcher_names()))})"
        )
    return cls


def make_searcher(space: dict[str, HParam], config: SearcherConfig) -> BaseSearcher:
    """A fresh searcher for ``config.name`` over ``space``.

    Raises :class:`ValueError` for an unknown name or a space the searcher refuses,
    :class:`~dlhpc.errors.UsageError` when its optional dependency is missing
    (``bayes``: scikit-optimize).
    """
    return searcher_class(config.name)(space, config)


def expected_trials(config: SearcherConfig, space: Mapping[str, HParam]) -> int:
    """Trials the search creates in all, without building the searcher."""
    return searcher_class(config.name).expected_trials(config, space)


def rung_plan(settings: Mapping[str, Any]) -> tuple[int, ...]:
    """The rung lengths of a stored ``searcher`` section (``()``: no rungs, an
    unknown searcher, or settings that do not tell)."""
    try:
        cls = searcher_class(str(settings.get("name")))
    except ValueError:
        return ()
    return cls.rung_plan(settings)


class SearcherTable:
    """The searchers as the experiment loader asks for them (:class:`dlhpc.config.Searchers`)."""

    def names(self) -> tuple[str, ...]:
        """Every searcher name (:func:`searcher_names`)."""
        return searcher_names()

    def rules(self, name: str) -> type[BaseSearcher] | None:
        """The searcher class ``name`` (:func:`find_searcher`)."""
        return find_searcher(name)
