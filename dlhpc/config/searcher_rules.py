"""What the experiment loader asks of searchers, which it knows only through its caller.

config sits below the searchers and never imports them: the caller of
:func:`~dlhpc.config.load_experiment` passes them in as ``searchers``
(:class:`Searchers`; the CLI passes the searcher table of the search layer).
The loader checks the fields every searcher shares, then looks the named searcher
up there and applies its :class:`SearcherRules` with its own issue list as the
:class:`Report`, so a searcher's problems are reported with the others, as
``file:line: field: message``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from dlhpc.config.schema import HParam, SearcherConfig

__all__ = [
    "DEFAULT_LEARNING_CONCURRENCY",
    "Report",
    "SearcherRules",
    "Searchers",
    "default_concurrency",
]

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


class Searchers(Protocol):
    """The searchers an experiment may name, as the loader's caller knows them."""

    def names(self) -> tuple[str, ...]:
        """Every searcher name, in the order messages list them.

        Raises :class:`ValueError` when the installed ones cannot be listed."""

    def rules(self, name: str) -> SearcherRules | None:
        """The searcher ``name``; None when no searcher has that name.

        Raises :class:`ValueError` when it has one that cannot be loaded."""


def default_concurrency(rules: SearcherRules) -> int:
    """``max_concurrent_trials`` when the file gives none (0: no bound)."""
    return DEFAULT_LEARNING_CONCURRENCY if rules.learns else 0
