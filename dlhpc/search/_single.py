"""Single search: one trial with every hyperparameter at its default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.search._fixed import FixedListSearcher
from dlhpc.search._space import default_value

__all__ = ["SingleSearcher"]


class SingleSearcher(FixedListSearcher):
    """One trial of length ``max_length``; values from :func:`default_value`
    (``const`` value, first categorical value, midpoint of a range)."""

    kind = "single"

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        super().__init__(space, config)
        self._hparams = {name: default_value(space[name]) for name in sorted(space)}

    @classmethod
    def expected_trials(cls, config: SearcherConfig, space: Mapping[str, HParam]) -> int:
        return 1

    @property
    def total(self) -> int:
        return 1

    def _config(self, index: int) -> dict[str, Any]:
        return dict(self._hparams)
