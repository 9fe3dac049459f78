"""Searcher names to classes."""

from __future__ import annotations

from collections.abc import Callable

from dlhpc.config.model import HParam, SearcherConfig
from dlhpc.search._asha import ASHASearcher
from dlhpc.search._bayes import BayesSearcher
from dlhpc.search._grid import GridSearcher
from dlhpc.search._hyperband import HyperbandSearcher
from dlhpc.search._random import RandomSearcher
from dlhpc.search._sha import SHASearcher
from dlhpc.search._single import SingleSearcher
from dlhpc.search.base import BaseSearcher

__all__ = ["make_searcher"]

SearcherFactory = Callable[[dict[str, HParam], SearcherConfig], BaseSearcher]

_REGISTRY: dict[str, SearcherFactory] = {
    "single": SingleSearcher,
    "grid": GridSearcher,
    "random": RandomSearcher,
    "bayes": BayesSearcher,
    "sha": SHASearcher,
    "asha": ASHASearcher,
    "hyperband": HyperbandSearcher,
}


def make_searcher(space: dict[str, HParam], config: SearcherConfig) -> BaseSearcher:
    """A fresh searcher for ``config.name`` over ``space``.

    Raises :class:`ValueError` for an unknown name or a space the searcher refuses,
    :class:`~dlhpc.errors.UsageError` when its optional dependency is missing
    (``bayes``: scikit-optimize).
    """
    factory = _REGISTRY.get(config.name)
    if factory is not None:
        return factory(space, config)
    known = ", ".join(sorted(_REGISTRY))
    raise ValueError(f"unknown searcher {config.name!r} (known: {known})")
