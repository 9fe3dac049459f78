"""Grid search: every point of the cartesian product of the grid values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.config.searcher_rules import Report
from dlhpc.search._fixed import FixedListSearcher
from dlhpc.search._space import grid_points

__all__ = ["MAX_GRID_SIZE", "GridSearcher"]

#: Largest grid a search may have; a bigger one is almost surely a config mistake.
MAX_GRID_SIZE = 100_000


class GridSearcher(FixedListSearcher):
    """One trial of length ``max_length`` per grid point.

    Points are in :func:`itertools.product` order over the hyperparameters in
    sorted name order (the last name varies fastest). As in Determined,
    ``max_trials`` does not cap the grid. A grid of more than
    :data:`MAX_GRID_SIZE` points, or a range without ``count``, raises
    :class:`ValueError`.
    """

    kind = "grid"

    @classmethod
    def check_settings(
        cls, config: SearcherConfig, space: Mapping[str, HParam], report: Report
    ) -> SearcherConfig:
        """Every range needs ``count``; the grid has at most :data:`MAX_GRID_SIZE` points."""
        for hp in space.values():
            if hp.type in ("int", "double", "log") and hp.count is None:
                report.add(
                    ("hyperparameters", hp.name),
                    "searcher 'grid' needs 'count' (the number of grid points) here",
                )
        size = _grid_size(space)
        if size > MAX_GRID_SIZE and report.ok(("hyperparameters",)):
            shown = f"{size:,}" if size < 10**15 else "over 10^15"
            report.add(
                ("searcher", "name"),
                f"grid search allows at most {MAX_GRID_SIZE:,} points, this grid has {shown} "
                "(lower the counts or use searcher 'random')",
            )
        return config

    @classmethod
    def expected_trials(cls, config: SearcherConfig, space: Mapping[str, HParam]) -> int:
        return math.prod(len(grid_points(hp)) for hp in space.values())

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        super().__init__(space, config)
        self._names = sorted(space)
        for name in self._names:
            count = space[name].count
            if space[name].type in ("int", "double", "log") and (count or 0) > MAX_GRID_SIZE:
                raise ValueError(self._too_big(f"hyperparameter {name!r} alone has {count}"))
        self._axes = [grid_points(space[name]) for name in self._names]
        self._total = math.prod(len(axis) for axis in self._axes)
        if self._total > MAX_GRID_SIZE:
            raise ValueError(self._too_big(f"it has {self._total}"))

    @staticmethod
    def _too_big(detail: str) -> str:
        return f"grid search: at most {MAX_GRID_SIZE:,} points allowed, {detail}"

    @property
    def total(self) -> int:
        return self._total

    def _config(self, index: int) -> dict[str, Any]:
        # Mixed-radix decoding of index: the grid is never materialised.
        values: list[Any] = []
        for axis in reversed(self._axes):
            index, digit = divmod(index, len(axis))
            values.append(axis[digit])
        return dict(zip(self._names, reversed(values), strict=True))


def _grid_size(space: Mapping[str, HParam]) -> int:
    """Points of the grid over ``space`` (as :func:`grid_points` builds it), without
    building it: a range without ``count`` counts as one point."""
    size = 1
    for hp in space.values():
        if hp.type == "categorical":
            size *= len(hp.vals or ())
        elif hp.type == "int" and hp.count is not None:
            size *= min(hp.count, int(hp.maxval or 0) - int(hp.minval or 0) + 1)
        elif hp.type in ("double", "log"):
            size *= hp.count or 1
    return size
