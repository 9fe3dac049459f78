"""Synchronous successive halving (SHA).

``max_trials`` configurations are created at the first rung ``r_0``
(:func:`~dlhpc.search._rungs.rung_lengths`); each pauses there. When every
member of rung ``k`` has its result there or has exited (for rung 0: once all
``max_trials`` were created), the rung is decided: its results are ranked
(best first by ``smaller_is_better``, NaN last, ties by request id), the top
``max(1, floor(n_k / divisor))`` of its ``n_k`` results survive, every other
member still alive is stopped, and the surviving paused ones are continued
to ``r_{k+1}`` (best first, as slots free up); they are the members of rung
``k+1``. A survivor that has exited is simply not continued; a member that
exits before its result does not count in ``n_k``. This repeats up to the top
rung, whose trials finish at ``max_length``. The search is done when all
trials have exited.

``stop_once``: trials are created with grant ``max_length`` and never pause;
rung ``k`` is decided when all its live members have reported there, and the
losers are stopped while they run (survivors may be past ``r_{k+1}`` by then).

``max_budget`` (:mod:`dlhpc.search._budget`): the search plays the largest
``max_trials`` whose whole plan fits in it (:attr:`SHASearcher.trials`).

Rung results are fixed as in ASHA (:func:`~dlhpc.search._rungs.rung_results`);
reports of trials the searcher does not count as running are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.config.searcher_rules import Report
from dlhpc.search._budget import check_budget, check_budget_settings, sha_trials
from dlhpc.search._columns import decode_ints
from dlhpc.search._rungs import (
    EXITED,
    FINISHED,
    PAUSED,
    RUNNING,
    STOPPING,
    BracketPlan,
    TrialRecord,
    check_adaptive_config,
    check_max_new,
    rank_key,
    rung_results,
    sample_config,
)
from dlhpc.search._rungstate import (
    RungState,
    TrialTable,
    decode_results,
    encode_results,
    results_dict,
)
from dlhpc.search.base import BaseSearcher, Continue, Create, Operation, Stop

__all__ = ["SHASearcher"]


class SHASearcher(RungState, BaseSearcher):
    """Synchronous successive halving (see the module doc); request ids ``0, 1, 2, ...``."""

    kind = "sha"
    _other = "rungs or trials"
    options = frozenset({"min_length", "stop_once", "max_budget"})

    @classmethod
    def check_settings(
        cls, config: SearcherConfig, space: Mapping[str, HParam], report: Report
    ) -> SearcherConfig:
        """``max_budget`` must be at least ``max_length``."""
        check_budget_settings(config, report)
        return config

    @classmethod
    def expected_trials(cls, config: SearcherConfig, space: Mapping[str, HParam]) -> int:
        """:attr:`trials`, without building the searcher."""
        try:
            check_budget(cls.kind, config)
            return sha_trials(config, check_adaptive_config(cls.kind, config))
        except ValueError:
            return config.max_trials

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        super().__init__(space, config)
        if config.mode is not None:
            raise ValueError("sha searcher: 'mode' only applies to hyperband")
        check_budget(self.kind, config)
        self.lengths: tuple[int, ...] = tuple(check_adaptive_config(self.kind, config))
        #: How many trials it creates: ``max_trials``, or fewer to fit ``max_budget``.
        self.trials = sha_trials(config, self.lengths)
        #: One bracket over all rungs (the same shape as ASHA's and Hyperband's ``brackets``).
        n = self.trials
        self.brackets = (BracketPlan(len(self.lengths) - 1, n, self.lengths, n),)
        self._stop_once = config.stop_once
        self._reset()

    def _reset(self) -> None:
        self._trials = TrialTable()
        self._results: list[dict[int, float]] = [{} for _ in self.lengths]
        self._members: list[list[int]] = [[]]  # members[k]: the trials that entered rung k
        self._continues: list[int] = []  # survivors waiting for a slot, best first
        self._stops: list[int] = []
        self._exited = 0
        self._settled = 0  # members[rung][:settled] have a result there or have exited

    @property
    def rung(self) -> int:
        """The rung being played (the first one not decided yet; decisions are made in ask)."""
        return len(self._members) - 1

    @property
    def created(self) -> int:
        """How many trials were created so far (the next request id)."""
        return len(self._trials)

    def rung_table(self) -> list[dict[int, float]]:
        """The results of each rung so far, by request id (copies)."""
        return [dict(r) for r in self._results]

    def rung_members(self) -> list[list[int]]:
        """The trials that entered each rung decided or being played (copies)."""
        return [list(m) for m in self._members]

    def _trial(self, request_id: int) -> TrialRecord:
        if isinstance(request_id, bool) or not 0 <= request_id < len(self._trials):
            raise ValueError(f"sha searcher: request {request_id} was never created")
        return self._trials[request_id]

    def _move(self, t: TrialRecord, status: str) -> None:
        if status == EXITED and t.status != EXITED:
            self._exited += 1
        t.status = status

    def _advance(self) -> None:
        """Decide every rung whose results are all in."""
        top = len(self.lengths) - 1
        while self.rung < top:
            k = self.rung
            if k == 0 and len(self._trials) < self.trials:
                return
            members, results = self._members[k], self._results[k]
            while self._settled < len(members) and (
                members[self._settled] in results
                or self._trials[members[self._settled]].status == EXITED
            ):
                self._settled += 1
            if self._settled < len(members):
                return
            ranked = sorted(
                (rid for rid in members if rid in results),
                key=lambda rid: rank_key(results[rid], rid, self.config.smaller_is_better),
            )
            keep = max(1, len(ranked) // self.config.divisor) if ranked else 0
            survivors = ranked[:keep]
            for rid in ranked[keep:]:
                if self._trials[rid].status in (RUNNING, PAUSED):
                    self._move(self._trials[rid], STOPPING)
                    self._stops.append(rid)
            if not self._stop_once:  # ask() skips those no longer paused
                self._continues.extend(survivors)
            self._members.append(survivors)
            self._settled = 0

    def ask(self, max_new: int) -> list[Operation]:
        check_max_new(max_new)
        self._advance()
        ops: list[Operation] = [Stop(rid) for rid in self._stops]
        self._stops = []
        work = 0
        while work < max_new:
            if self._continues:
                rid = self._continues.pop(0)
                t = self._trials[rid]
                if t.status != PAUSED:
                    continue
                t.grant += 1
                self._move(t, RUNNING)
                ops.append(Continue(rid, self.lengths[t.grant]))
            elif len(self._trials) < self.trials:
                rid = len(self._trials)
                grant = len(self.lengths) - 1 if self._stop_once else 0
                self._trials.append(TrialRecord(0, grant, RUNNING))
                self._members[0].append(rid)
                hparams = sample_config(self.space, self.config.seed, rid)
                ops.append(Create(rid, hparams, self.lengths[grant]))
            else:
                break
            work += 1
        return ops

    def tell(self, request_id: int, length: int, metric: float) -> None:
        t = self._trial(request_id)
        if t.status != RUNNING:
            return
        value = float(metric)
        for k, v in rung_results(self.lengths, t.resolved, t.grant, t.last, length, value):
            self._results[k][request_id] = v
            t.resolved = k + 1
        t.last = (length, value)
        if length >= self.lengths[t.grant]:
            self._move(t, FINISHED if t.grant == len(self.lengths) - 1 else PAUSED)

    def tell_exited(self, request_id: int) -> None:
        t = self._trial(request_id)
        if request_id in self._stops:
            self._stops.remove(request_id)
        self._move(t, EXITED)

    @property
    def done(self) -> bool:
        return len(self._trials) >= self.trials and self._exited == len(self._trials)

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "lengths": list(self.lengths),
            "max_trials": self.trials,
            "stop_once": self._stop_once,
            "smaller_is_better": self.config.smaller_is_better,
            "max_budget": self.config.max_budget,
        }

    def _state(self) -> dict[str, Any]:
        return {
            "results": [encode_results(sorted(r), r) for r in self._results],
            "members": [list(m) for m in self._members],
            "continues": list(self._continues),
            "stops": list(self._stops),
        }

    def _load(self, state: dict[str, Any]) -> None:
        self._reset()
        trials, combos = TrialTable.decode(state["trials"])
        n = len(trials)
        if n > self.trials or len(state["results"]) != len(self.lengths):
            raise ValueError("too many trials or wrong number of rungs")
        if any(not 0 <= grant < len(self.lengths) for _, grant, _, _ in combos):
            raise ValueError("a grant is out of range")
        results = [results_dict(*decode_results(rows, n)) for rows in state["results"]]
        members = [list(decode_ints(m)) for m in state["members"]]
        continues = [int(rid) for rid in state["continues"]]
        stops = [int(rid) for rid in state["stops"]]
        named = [*(min(m) for m in members if m), *(max(m) for m in members if m)]
        if any(not 0 <= rid < n for rid in (*named, *continues, *stops)):
            raise ValueError("state names a request never created")
        if not 1 <= len(members) <= len(self.lengths):
            raise ValueError("wrong number of rungs")
        self._trials, self._results, self._members = trials, results, members
        self._continues, self._stops = continues, stops
        self._exited = sum(n for (*_, status), n in combos.items() if status == EXITED)
