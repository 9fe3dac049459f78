"""Grid search: every point of the cartesian product of the grid values."""

from __future__ import annotations

import math
from typing import Any

from dlhpc.config.model import HParam, SearcherConfig
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
