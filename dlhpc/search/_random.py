"""Random search: ``max_trials`` independent samples of the space."""

from __future__ import annotations

import random
from typing import Any

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.search._fixed import FixedListSearcher
from dlhpc.search._space import sample

__all__ = ["RandomSearcher"]


class RandomSearcher(FixedListSearcher):
    """``max_trials`` trials of length ``max_length``, each sampled with :func:`sample`.

    Trial ``i`` draws from its own generator seeded with ``(seed, i)``, in
    sorted hyperparameter name order, so its values depend only on the seed,
    the space and ``i``: a restored searcher (or one asked in other batch
    sizes) yields the same trials without persisting generator state.
    """

    kind = "random"

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        super().__init__(space, config)
        if config.max_trials < 1:
            raise ValueError(f"random search: max_trials must be >= 1, got {config.max_trials}")
        self._names = sorted(space)

    @property
    def total(self) -> int:
        return self.config.max_trials

    def _config(self, index: int) -> dict[str, Any]:
        # A str seed goes through SHA-512: stable across runs and Python versions,
        # and (seed, index) pairs never collide the way seed * K + index could.
        rng = random.Random(f"dlhpc.random:{self.config.seed}:{index}")
        return {name: sample(self.space[name], rng) for name in self._names}
