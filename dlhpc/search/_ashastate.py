"""ASHA's and Hyperband's saved state and their per-bracket bookkeeping.

:class:`ASHAState` is the :class:`~dlhpc.search._rungstate.RungState` part of
:class:`~dlhpc.search._asha.ASHASearcher`: the fingerprint (the config the state
belongs to), the searcher's own keys (results per bracket and rung, best first;
pending stops; finalised brackets; ``spent``; the proposer's keys), and the
checked load.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress
from typing import Any

from dlhpc.config.schema import SearcherConfig
from dlhpc.search._proposers import Proposer
from dlhpc.search._rungs import EXITED, PAUSED, RUNNING, BracketPlan, RankKey
from dlhpc.search._rungstate import (
    RungState,
    TrialTable,
    decode_results,
    encode_ranked,
    rank_order,
    results_dict,
)

__all__ = ["ASHAState"]


class _Bracket:
    """The rungs of one bracket: results, their order, and the paused trials per rung."""

    def __init__(self, plan: BracketPlan) -> None:
        self.lengths = plan.lengths
        self.target = plan.trials
        self.created = 0
        self.running = 0
        self.finalised = False
        rungs = range(len(plan.lengths))
        self.results: list[dict[int, float]] = [{} for _ in rungs]
        self.ranked: list[list[RankKey]] = [[] for _ in rungs]  # all results, best first
        self.waiting: list[list[RankKey]] = [[] for _ in rungs]  # paused at this rung's grant


class ASHAState(RungState):
    """The state methods of the ASHA searchers (a mixin; see the module doc)."""

    config: SearcherConfig
    lengths: tuple[int, ...]
    brackets: tuple[BracketPlan, ...]
    _b: list[_Bracket]
    _stops: list[int]
    _exited: int
    _spent: int
    _stop_once: bool
    _proposer: Proposer

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "lengths": list(self.lengths),
            "brackets": [[p.s, p.trials] for p in self.brackets],
            "stop_once": self._stop_once,
            "smaller_is_better": self.config.smaller_is_better,
            "max_budget": self.config.max_budget,
            "proposer": {"name": self._proposer.name, **self.config.proposer_settings},
        }

    def _state(self) -> dict[str, Any]:
        sib = self.config.smaller_is_better
        return {
            "results": [
                [encode_ranked(keys, r, sib) for keys, r in zip(b.ranked, b.results, strict=True)]
                for b in self._b
            ],
            "stops": list(self._stops),
            "finalised": [b.finalised for b in self._b],
            "spent": self._spent,
            **self._proposer.state(),
        }

    def _load(self, state: dict[str, Any]) -> None:
        """Counters from the trial columns, rankings checked in their stored order
        (no per-trial work in Python but for the paused trials)."""
        self._reset()
        trials, combos = TrialTable.decode(state["trials"])
        planned = sum(p.trials for p in self.brackets)
        if len(trials) > planned or len(state["results"]) != len(self._b):
            raise ValueError("too many trials or wrong number of brackets")
        paused: Counter[tuple[int, int]] = Counter()  # by bracket and grant
        for (i, grant, resolved, status), n in combos.items():
            if not 0 <= i < len(self._b):
                raise ValueError("a trial names a bracket that does not exist")
            b = self._b[i]
            if not 0 <= grant < len(b.lengths) or not 0 <= resolved <= len(b.lengths):
                rid = trials.first(i, grant, resolved, status)
                raise ValueError(f"request {rid}: grant or rung out of range")
            b.created += n
            b.running += n if status == RUNNING else 0
            self._exited += n if status == EXITED else 0
            paused[i, grant] += n if status == PAUSED else 0
        if any(b.created > b.target for b in self._b):
            raise ValueError("a bracket has more trials than planned")
        marks = trials.pause_marks() if paused.total() else []
        for i, (b, rungs) in enumerate(zip(self._b, state["results"], strict=True)):
            if len(rungs) != len(b.lengths):
                raise ValueError("wrong number of rungs")
            for k, data in enumerate(rungs):
                self._load_rung(trials, i, k, data, marks)
                if len(b.waiting[k]) != paused[i, k]:
                    rid = min(self._unresulted(trials, marks, i, k))
                    raise ValueError(f"request {rid}: paused without a result at its grant")
        for b, flag in zip(self._b, state["finalised"], strict=True):
            b.finalised = bool(flag)
        self._trials = trials
        self._spent = int(state["spent"])
        self._proposer.load(state, len(trials))
        self._stops = [int(rid) for rid in state["stops"]]
        if any(not 0 <= rid < len(trials) for rid in self._stops):
            raise ValueError("a pending stop names a request never created")

    def _load_rung(self, trials: TrialTable, i: int, k: int, data: Any, marks: list[int]) -> None:
        """Rung ``k`` of bracket ``i``: its results, ranking, and the paused trials waiting
        (``marks``: :meth:`TrialTable.pause_marks`, empty when none is paused)."""
        b = self._b[i]
        ids, metrics = decode_results(data, len(trials))
        if len(self._b) > 1 and not trials.in_bracket(ids, i):  # one: checked by combos
            raise ValueError(f"a result of bracket {i} names a request of another bracket")
        b.results[k] = results_dict(ids, metrics)
        b.ranked[k] = rank_order(ids, metrics, self.config.smaller_is_better)
        if marks:
            waits = map((k + 1).__eq__, map(marks.__getitem__, ids))
            b.waiting[k] = list(compress(b.ranked[k], waits))

    def _unresulted(self, trials: TrialTable, marks: list[int], i: int, k: int) -> list[int]:
        """The trials paused at rung ``k`` of bracket ``i`` without a result there."""
        return [
            rid
            for rid, mark in enumerate(marks)
            if mark == k + 1 and trials[rid].bracket == i and rid not in self._b[i].results[k]
        ]
