"""Asynchronous successive halving (ASHA; Li et al., MLSys 2020).

Each free slot (``ask(max_new)``) goes, in order, to:

1. a promotion: rungs are scanned from the second-highest down to the first;
   a paused trial whose result at rung ``k`` is among the top
   ``floor(n_k / divisor)`` of the ``n_k`` results rung ``k`` has so far is
   continued to rung ``k+1`` (``Continue(rid, r_{k+1})``), best first;
2. a new trial (``Create(rid, hparams, r_0)``) while fewer than
   ``max_trials`` were created.

A trial told at a length ``>= `` its grant is paused; at ``max_length`` it is
finished (the driver then calls ``tell_exited``). Results rank best first by
``smaller_is_better``, NaN last, ties by request id; every result counts in
``n_k``, but only paused trials are promoted (a trial that exited is never
promoted, and one that exits before its grant has no result there). A rung
result is fixed by :func:`~dlhpc.search._rungs.rung_results`; reports past
the grant count only for the rungs up to the grant. Reports of trials the
searcher does not count as running (paused, finished, stopped, exited) are
ignored. Once every trial is created, none runs and none can be promoted,
each paused trial is stopped (once); the search is done when all have exited.

``stop_once`` (Determined's variant): trials are created with grant
``max_length`` and never pause. A report that gives a trial its result at
rung ``k < R-1`` decides at once: with ``n_k >= divisor`` results in rung
``k`` (this one included), a trial outside the top ``floor(n_k / divisor)``
is stopped (the ``Stop`` comes with the next ask); with fewer it keeps
running. There is no Continue in this mode.

:class:`ASHASearcher` runs any number of such brackets side by side (one for
ASHA); :class:`~dlhpc.search._hyperband.HyperbandSearcher` plans several.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.config.searcher_rules import Report
from dlhpc.search._ashastate import ASHAState, _Bracket
from dlhpc.search._budget import check_budget, check_budget_settings, unused
from dlhpc.search._proposers import check_proposer, make_proposer
from dlhpc.search._rungs import (
    EXITED,
    FINISHED,
    PAUSED,
    RUNNING,
    STOPPING,
    BracketPlan,
    RankKey,
    TrialRecord,
    check_adaptive_config,
    check_max_new,
    rank_key,
    rung_results,
)
from dlhpc.search._rungstate import TrialTable
from dlhpc.search.base import BaseSearcher, Continue, Create, Operation, Stop

__all__ = ["ASHASearcher"]


class ASHASearcher(ASHAState, BaseSearcher):
    """ASHA over the rungs of :func:`~dlhpc.search._rungs.rung_lengths` (see the module doc).

    Request ids are ``0, 1, 2, ...`` in creation order; the proposer
    (:mod:`dlhpc.search._proposers`) gives each its hyperparameters (the default
    ``tpe``: a model of the rung results; with ``random``, trial ``i`` has those of
    random search's trial ``i`` for the same seed). ``max_budget``
    (:mod:`dlhpc.search._budget`) caps what it grants.
    """

    kind = "asha"
    options = frozenset({"min_length", "stop_once", "proposer", "max_budget"})
    _other = "rungs or brackets"

    @classmethod
    def check_settings(
        cls, config: SearcherConfig, space: Mapping[str, HParam], report: Report
    ) -> SearcherConfig:
        """The proposer's name and settings (defaults filled in), ``max_budget >= max_length``."""
        check_budget_settings(config, report)
        return check_proposer(config, report)

    @classmethod
    def expected_trials(cls, config: SearcherConfig, space: Mapping[str, HParam]) -> int:
        """``max_trials``; with ``max_budget``, at most the budget over the first rung."""
        if config.max_budget is None:
            return config.max_trials
        try:
            first = check_adaptive_config(cls.kind, config)[0]
        except ValueError:
            return config.max_trials
        return min(config.max_trials, config.max_budget // first)

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        super().__init__(space, config)
        self._check_mode(config)
        check_budget(self.kind, config)
        self.lengths: tuple[int, ...] = tuple(check_adaptive_config(self.kind, config))
        self.brackets: tuple[BracketPlan, ...] = tuple(self._plan(list(self.lengths)))
        self._stop_once = config.stop_once
        self._proposer = make_proposer(space, config)
        self._reset()

    # --- hooks for Hyperband ----------------------------------------------------

    def _check_mode(self, config: SearcherConfig) -> None:
        if config.mode is not None:
            raise ValueError(f"{self.kind} searcher: 'mode' only applies to hyperband")

    def _plan(self, lengths: list[int]) -> list[BracketPlan]:
        n = self.config.max_trials
        return [BracketPlan(len(lengths) - 1, n, tuple(lengths), n)]

    # --- bookkeeping ------------------------------------------------------------

    def _reset(self) -> None:
        self._b = [_Bracket(plan) for plan in self.brackets]
        self._trials = TrialTable()
        self._stops: list[int] = []
        self._exited = 0
        self._spent = 0  # granted, less what exited trials did not reach
        self._proposer.reset()

    @property
    def total(self) -> int:
        """How many trials the search creates in all (``max_trials``)."""
        return sum(b.trials for b in self.brackets)

    @property
    def created(self) -> int:
        """How many trials were created so far (the next request id)."""
        return len(self._trials)

    @property
    def spent(self) -> int:
        """The length granted so far, less what exited trials did not reach."""
        return self._spent

    def _fits(self, cost: int) -> bool:
        return self.config.max_budget is None or self._spent + cost <= self.config.max_budget

    def _can_create(self, b: _Bracket) -> bool:
        first = b.lengths[-1 if self._stop_once else 0]
        return b.created < b.target and not b.finalised and self._fits(first)

    def rung_table(self, bracket: int = 0) -> list[dict[int, float]]:
        """The results of each rung of ``bracket`` so far, by request id (copies)."""
        return [dict(r) for r in self._b[bracket].results]

    def _trial(self, request_id: int) -> TrialRecord:
        if isinstance(request_id, bool) or not 0 <= request_id < len(self._trials):
            raise ValueError(f"{self.kind} searcher: request {request_id} was never created")
        return self._trials[request_id]

    def _key(self, b: _Bracket, k: int, rid: int) -> RankKey:
        return rank_key(b.results[k][rid], rid, self.config.smaller_is_better)

    def _move(self, rid: int, t: TrialRecord, status: str) -> None:
        b = self._b[t.bracket]
        if t.status == RUNNING:
            b.running -= 1
        elif t.status == PAUSED:
            waiting = b.waiting[t.grant]
            del waiting[bisect.bisect_left(waiting, self._key(b, t.grant, rid))]
        if status == RUNNING:
            b.running += 1
        elif status == PAUSED:
            bisect.insort(b.waiting[t.grant], self._key(b, t.grant, rid))
        elif status == EXITED:
            self._exited += 1
        t.status = status

    def _record(self, b: _Bracket, k: int, rid: int, value: float) -> None:
        b.results[k][rid] = value
        bisect.insort(b.ranked[k], self._key(b, k, rid))

    def _keeps(self, b: _Bracket, k: int, rid: int) -> bool:
        """stop_once: whether a trial just given its rung-``k`` result keeps running."""
        n = len(b.ranked[k])
        if n < self.config.divisor:
            return True
        return bisect.bisect_left(b.ranked[k], self._key(b, k, rid)) < n // self.config.divisor

    def _promotable(self, b: _Bracket) -> tuple[int, int] | None:
        """``(rung, request id)`` of the next promotion in ``b``, or None."""
        for k in range(len(b.lengths) - 2, -1, -1):
            if b.waiting[k] and self._fits(b.lengths[k + 1] - b.lengths[k]):
                best = b.waiting[k][0]
                top = len(b.ranked[k]) // self.config.divisor
                if bisect.bisect_left(b.ranked[k], best) < top:
                    return k, best[2]
        return self._promotable_to_finish(b)

    def _promotable_to_finish(self, b: _Bracket) -> tuple[int, int] | None:
        """A bracket whose rule promotes nobody to the top rung (e.g. 6 trials, divisor
        3: rungs of 6, 2, 0) would end with no trial trained to ``max_length``, so no
        final model. Once nothing else can happen in it, the best paused trial of the
        highest rung that has one is promoted, until a trial reaches the top."""
        if self._can_create(b) or b.running or b.ranked[-1]:
            return None
        for k in range(len(b.lengths) - 2, -1, -1):
            if b.waiting[k] and self._fits(b.lengths[k + 1] - b.lengths[k]):
                return k, b.waiting[k][0][2]
        return None

    # --- protocol ---------------------------------------------------------------

    def ask(self, max_new: int) -> list[Operation]:
        check_max_new(max_new)
        work: list[Operation] = []
        while len(work) < max_new:
            op = self._promote() or self._create()
            if op is None:
                break
            work.append(op)
        stops: list[Operation] = [Stop(rid) for rid in self._stops]
        self._stops = []
        for b in self._b:
            stops.extend(self._finalise(b))
        return stops + work

    def _promote(self) -> Continue | None:
        for b in self._b:
            found = self._promotable(b)
            if found is not None:
                rung, rid = found
                t = self._trials[rid]
                self._move(rid, t, RUNNING)
                t.grant = rung + 1
                self._spent += b.lengths[t.grant] - b.lengths[rung]
                return Continue(rid, b.lengths[t.grant])
        return None

    def _create(self) -> Create | None:
        open_ = [i for i, b in enumerate(self._b) if self._can_create(b)]
        if not open_:
            return None
        i = self._pick(open_)
        b = self._b[i]
        rid = len(self._trials)
        grant = len(b.lengths) - 1 if self._stop_once else 0
        hparams = self._proposer.propose(rid, self._pooled())
        self._trials.append(TrialRecord(i, grant, RUNNING))
        b.created += 1
        b.running += 1
        self._spent += b.lengths[grant]
        return Create(rid, hparams, b.lengths[grant])

    def _unused(self, t: TrialRecord) -> int:
        """The part of its grant a trial did not reach (0 once paused or finished)."""
        b = self._b[t.bracket]
        before = b.lengths[t.grant - 1] if t.grant and not self._stop_once else 0
        return unused(b.lengths[t.grant], before, t.last)

    def _pick(self, open_: list[int]) -> int:
        """The bracket of the next new trial among ``open_`` (indices, not empty): the
        one with the most creations left, ties to the more aggressive (one for ASHA)."""
        return min(open_, key=lambda i: (self._b[i].created - self._b[i].target, i))

    def _pooled(self) -> dict[int, list[dict[int, float]]]:
        """Rung length -> the results of every bracket at that length (not copies)."""
        out: dict[int, list[dict[int, float]]] = {}
        for b in self._b:
            for length, results in zip(b.lengths, b.results, strict=True):
                out.setdefault(length, []).append(results)
        return out

    def _finalise(self, b: _Bracket) -> list[Operation]:
        """Stop the paused trials of a bracket that can do nothing more (once)."""
        if b.finalised or self._can_create(b) or b.running or self._promotable(b):
            return []
        b.finalised = True
        paused = sorted(key[2] for waiting in b.waiting for key in waiting)
        for rid in paused:
            self._move(rid, self._trials[rid], STOPPING)
        return [Stop(rid) for rid in paused]

    def tell(self, request_id: int, length: int, metric: float) -> None:
        t = self._trial(request_id)
        if t.status != RUNNING:
            return
        value = float(metric)
        b = self._b[t.bracket]
        top = len(b.lengths) - 1
        pauses = length >= b.lengths[t.grant]
        stop = False
        for k, v in rung_results(b.lengths, t.resolved, t.grant, t.last, length, value):
            self._record(b, k, request_id, v)
            t.resolved = k + 1
            if self._stop_once and not pauses and k < top and not self._keeps(b, k, request_id):
                stop = True
                break
        t.last = (length, value)
        if pauses:
            self._move(request_id, t, FINISHED if t.grant == top else PAUSED)
        elif stop:
            self._move(request_id, t, STOPPING)
            self._stops.append(request_id)

    def tell_exited(self, request_id: int) -> None:
        t = self._trial(request_id)
        if t.status == EXITED:
            return
        if request_id in self._stops:
            self._stops.remove(request_id)
        self._spent -= self._unused(t)  # give back what it did not reach
        self._move(request_id, t, EXITED)

    @property
    def done(self) -> bool:
        """Every trial exited and no bracket can create one (all created, or the budget spent)."""
        return self._exited == len(self._trials) and not any(map(self._can_create, self._b))
