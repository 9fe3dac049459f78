"""A searcher defined only in the test tree, registered like a third party.

``tpairs`` creates ``max_trials // 2`` trials (random samples) of ``max_length``
and wants an even ``max_trials``; it knows the option ``min_length`` and learns
(so its concurrency is bounded by default). Nothing under ``dlhpc/`` names it: it
is registered as the entry point ``tpairs`` of group ``dlhpc.searchers`` by this
package's ``dlhpc_testplugins-0.1.dist-info/entry_points.txt``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from dlhpc.config import HParam, SearcherConfig
from dlhpc.config.searcher_rules import Report
from dlhpc.search import BaseSearcher, Create, Operation, sample

__all__ = ["PairsSearcher"]


class PairsSearcher(BaseSearcher):
    """Creates ``max_trials // 2`` trials of ``max_length``; wants an even ``max_trials``."""

    kind = "tpairs"
    state_version = 3
    default_max_length = 4
    options = frozenset({"min_length"})
    learns = True

    @classmethod
    def check_settings(
        cls, config: SearcherConfig, space: Mapping[str, HParam], report: Report
    ) -> SearcherConfig:
        if config.max_trials % 2 and report.ok(("searcher", "max_trials")):
            report.add(("searcher", "max_trials"), "must be even for searcher 'tpairs'")
        return config

    @classmethod
    def expected_trials(cls, config: SearcherConfig, space: Mapping[str, HParam]) -> int:
        return config.max_trials // 2

    @classmethod
    def rung_plan(cls, settings: Mapping[str, Any]) -> tuple[int, ...]:
        return (1, int(settings.get("max_length", 4)))

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        super().__init__(space, config)
        self._created = 0
        self._exited: set[int] = set()

    def ask(self, max_new: int) -> list[Operation]:
        count = min(max_new, self.config.max_trials // 2 - self._created)
        ops: list[Operation] = []
        for _ in range(count):
            rng = random.Random(f"{self.config.seed}:{self._created}")
            hparams = {name: sample(hp, rng) for name, hp in sorted(self.space.items())}
            ops.append(Create(self._created, hparams, self.config.max_length))
            self._created += 1
        return ops

    def _known(self, request_id: int) -> None:
        if not 0 <= request_id < self._created:
            raise ValueError(f"tpairs searcher: unknown request id {request_id}")

    def tell(self, request_id: int, length: int, metric: float) -> None:
        self._known(request_id)

    def tell_exited(self, request_id: int) -> None:
        self._known(request_id)
        self._exited.add(request_id)

    @property
    def done(self) -> bool:
        return len(self._exited) == self.config.max_trials // 2

    def state_dict(self) -> dict[str, Any]:
        exited = sorted(self._exited)
        return {
            "kind": self.kind,
            "version": self.state_version,
            "created": self._created,
            "exited": exited,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind or state.get("version") != self.state_version:
            raise ValueError("tpairs searcher: not a tpairs state")
        self._created, self._exited = int(state["created"]), set(state["exited"])
