"""Shared machinery of searchers that run a fixed list of configurations.

Single, grid and random search all decide everything up front: trial ``i``
gets configuration ``i`` (a pure function of the space, the config and
``i``) and trains to ``max_length``; results never change what comes next.
So their state is a counter plus the bookkeeping of results, and a restored
searcher produces the same future asks by construction.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.search._columns import decode_metric, encode_metric
from dlhpc.search.base import BaseSearcher, Create, Operation

__all__ = ["FixedListSearcher"]


class FixedListSearcher(BaseSearcher):
    """``total`` trials, each created once with :meth:`_config` and ``max_length``.

    ``ask(max_new)`` hands out the next ``max_new`` configurations in order
    (request ids ``0, 1, 2, ...``); it does not track concurrency, so the
    caller derives ``max_new`` from ``max_concurrent_trials`` and the trials
    still running. ``tell`` keeps the best metric per trial (by
    ``smaller_is_better``; NaN is ignored). Unknown request ids raise
    :class:`ValueError`.
    """

    default_max_length = 1

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        super().__init__(space, config)
        if config.max_length < 1:
            raise ValueError(f"searcher: max_length must be >= 1, got {config.max_length}")
        self._next = 0
        self._best: dict[int, float] = {}
        self._exited: set[int] = set()

    @property
    @abstractmethod
    def total(self) -> int:
        """How many trials the search creates in all."""

    @abstractmethod
    def _config(self, index: int) -> dict[str, Any]:
        """The hyperparameters of trial ``index`` (``0 <= index < total``)."""

    @property
    def created(self) -> int:
        """How many trials were created so far (the next request id)."""
        return self._next

    @property
    def best_metrics(self) -> dict[int, float]:
        """The best metric told so far for each request id (a copy)."""
        return dict(self._best)

    def ask(self, max_new: int) -> list[Operation]:
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
            raise ValueError(f"ask(): max_new must be an int >= 0, got {max_new!r}")
        stop = min(self._next + max_new, self.total)
        ops: list[Operation] = [
            Create(i, self._config(i), self.config.max_length) for i in range(self._next, stop)
        ]
        self._next = max(self._next, stop)
        return ops

    def _check_created(self, request_id: int) -> None:
        if not 0 <= request_id < self._next:
            raise ValueError(f"{self.kind} searcher: request {request_id} was never created")

    def tell(self, request_id: int, length: int, metric: float) -> None:
        self._check_created(request_id)
        value = float(metric)
        if math.isnan(value):
            return
        old = self._best.get(request_id)
        if old is None or (value < old if self.config.smaller_is_better else value > old):
            self._best[request_id] = value

    def tell_exited(self, request_id: int) -> None:
        self._check_created(request_id)
        self._exited.add(request_id)

    @property
    def done(self) -> bool:
        return self._next >= self.total and len(self._exited) == self._next

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "total": self.total,
            "next": self._next,
            "best": [[rid, encode_metric(m)] for rid, m in sorted(self._best.items())],
            "exited": sorted(self._exited),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(
                f"{self.kind} searcher: cannot load state of kind {state.get('kind')!r}"
            )
        if state.get("total") != self.total:
            raise ValueError(
                f"{self.kind} searcher: state is for {state.get('total')} trials, "
                f"this search has {self.total} (did the search space change?)"
            )
        nxt = int(state["next"])
        if not 0 <= nxt <= self.total:
            raise ValueError(f"{self.kind} searcher: bad counter {nxt} in state")
        best = {int(rid): decode_metric(m) for rid, m in state["best"]}
        exited = {int(rid) for rid in state["exited"]}
        if any(not 0 <= rid < nxt for rid in (*best, *exited)):
            raise ValueError(f"{self.kind} searcher: state names a request never created")
        self._next, self._best, self._exited = nxt, best, exited
