"""Searcher names to classes."""

from __future__ import annotations

from collections.abc import Callable

from dlhpc.config.model import HParam, SearcherConfig
from dlhpc.search._grid import GridSearcher
from dlhpc.search._random import RandomSearcher
from dlhpc.search._single import SingleSearcher
from dlhpc.search.base import BaseSearcher

__all__ = ["make_searcher"]

SearcherFactory = Callable[[dict[str, HParam], SearcherConfig], BaseSearcher]

_REGISTRY: dict[str, SearcherFactory] = {
    "single": SingleSearcher,
    "grid": GridSearcher,
    "random": RandomSearcher,
}

# Accepted by the config schema but without an implementation yet.
_PLANNED = ("bayes", "sha", "asha", "hyperband")


def make_searcher(space: dict[str, HParam], config: SearcherConfig) -> BaseSearcher:
    """A fresh searcher for ``config.name`` over ``space``.

    Raises :class:`NotImplementedError` for a planned searcher not written yet,
    :class:`ValueError` for an unknown name or a space the searcher refuses.
    """
    factory = _REGISTRY.get(config.name)
    if factory is not None:
        return factory(space, config)
    if config.name in _PLANNED:
        raise NotImplementedError(f"searcher {config.name!r} is not implemented yet")
    known = ", ".join(sorted(_REGISTRY))
    raise ValueError(f"unknown searcher {config.name!r} (known: {known})")
