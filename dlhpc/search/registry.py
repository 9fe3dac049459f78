"""Searcher names to classes, and what the rest of dlhpc asks a searcher by name.

The names come from :mod:`dlhpc.config.searchers`: the built-ins in code, then
the entry points of the group ``dlhpc.searchers`` (scanned only for a name that
is not built-in, or when every name is listed). A name resolves to a
:class:`~dlhpc.search.base.BaseSearcher` subclass whose ``kind`` is that name;
an unknown name raises :class:`ValueError` naming the valid ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlhpc.config.model import HParam, SearcherConfig
from dlhpc.config.searchers import (
    DEFAULT_LEARNING_CONCURRENCY,
    default_concurrency,
    searcher_names,
    searcher_rules,
)
from dlhpc.search.base import BaseSearcher

__all__ = [
    "DEFAULT_LEARNING_CONCURRENCY",
    "default_concurrency",
    "expected_trials",
    "make_searcher",
    "rung_plan",
    "searcher_class",
    "searcher_names",
]


def searcher_class(name: str) -> type[BaseSearcher]:
    """The searcher class registered as ``name``.

    Raises :class:`ValueError` for an unknown name (naming the valid ones), or
    when the entry point names something other than a ``BaseSearcher``
    subclass whose ``kind`` is ``name``; the import errors of its module propagate.
    """
    cls: Any = searcher_rules(name)
    if not (isinstance(cls, type) and issubclass(cls, BaseSearcher)):
        raise ValueError(f"searcher {name!r} is not a dlhpc.search.BaseSearcher subclass")
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
