"""dlhpc's searchers through their ask/tell API on the peers' event simulation.

:func:`run_ask_tell` drives a :class:`~dlhpc.search.BaseSearcher` on ``workers`` GPUs
and a virtual clock, as the orchestrator and the simulated cluster of ``dlhpc
simulate`` drive it, without a store, files or a tick: each trial's job trains epoch
after epoch (the curve's seconds each) from its last checkpoint up to its grant, then
exits (the trial pauses, or completes at ``max_length``).

The searcher decides at *decision times*. With ``tick_s > 0`` they are the tick grid
``0, tick_s, 2 tick_s, ...`` (a grid point where nothing happened is skipped, as
``dlhpc simulate`` skips idle ticks), and what a decision does is what one ``tick``
does: tell every new metric point in (trial, step) order, ``tell_exited`` for the
trials whose job ended for good, ``ask(free slots)``, then act: a Create or a
Continue of a paused trial starts its job at once (no queue wait, no start-up); a
Continue of a running trial takes effect when its job reaches its old grant (it
restarts at the next decision); a Stop of a running trial ends its job
:data:`~dlhpc.simulate.STOP_NOTICE_S` later (an epoch ending by then counts), of a
paused one at once. So the decisions are the product's
(``tests/unit/test_lcbench_driver.py`` checks it against ``dlhpc simulate``). With
``tick_s == 0`` the searcher decides whenever epochs end, as the peers do
(:func:`_lcbench_peers.run_workers`), and a Stop ends the job at once.

The :class:`Digest` records every decision: (time, kind, request id, length).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from _lcbench_measures import Trace

from dlhpc.search import BaseSearcher, Continue, Create, Stop
from dlhpc.simulate import STOP_NOTICE_S

#: One decision: (virtual seconds, "create" | "promote" | "stop", request id, length).
Decision = tuple[float, str, int, int]


class CurveLike(Protocol):
    """A configuration's curve: ``values[k-1]`` and ``seconds[k-1]`` of epoch ``k``."""

    @property
    def values(self) -> tuple[float, ...]: ...

    @property
    def seconds(self) -> tuple[float, ...]: ...


@dataclass
class _Trial:
    rid: int
    order: int  # creation order (the store's trial id order)
    curve: CurveLike
    grant: int  # the searcher's current grant
    epoch: int = 0  # epochs checkpointed
    told: int = 0  # last length told
    running: bool = False  # its job runs
    job_grant: int = 0  # the grant its job trains to
    epoch_end: float = math.inf  # when its job's epoch in progress ends
    stop_at: float = math.inf
    stopping: bool = False
    exited: bool = False  # terminal (completed or stopped); tell_exited pending or done
    version: int = 0


@dataclass
class Digest:
    """Every decision of a run, in order (see the module doc); the created trials'
    hyperparameters by request id."""

    decisions: list[Decision] = field(default_factory=list)
    hparams: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, now: float, kind: str, rid: int, length: int) -> None:
        self.decisions.append((round(now, 6), kind, rid, length))


class _Run:
    """The state of one :func:`run_ask_tell` run."""

    def __init__(
        self,
        searcher: BaseSearcher,
        curve_of: Callable[[Mapping[str, Any]], CurveLike],
        workers: int,
        trace: Trace,
        tick_s: float,
        scale: float,
    ) -> None:
        self.searcher, self.curve_of, self.workers = searcher, curve_of, workers
        self.trace, self.tick_s, self.scale = trace, tick_s, scale
        self.max_length = searcher.config.max_length
        self.trials: dict[int, _Trial] = {}
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, rid, version)
        self.seq = 0
        self.now = 0.0
        self.jobs = 0
        self.points: list[tuple[int, int, int, float]] = []  # (order, step, rid, value)
        self.ended: list[_Trial] = []  # jobs over for good, not told yet
        self.restart: list[_Trial] = []  # paused at an old grant with a longer one pending
        self.digest = Digest()
        self.starts = 0

    # -- jobs ------------------------------------------------------------------

    def _push(self, t: _Trial) -> None:
        t.epoch_end = self.now + t.curve.seconds[t.epoch] * self.scale
        heapq.heappush(self.events, (min(t.epoch_end, t.stop_at), self.seq, t.rid, t.version))
        self.seq += 1

    def start(self, t: _Trial) -> None:
        if self.jobs >= self.workers:
            raise RuntimeError(f"more jobs than {self.workers} GPUs")
        t.running, t.job_grant, t.version = True, t.grant, t.version + 1
        self.jobs += 1
        self.starts += 1
        if t.epoch >= t.job_grant:
            self.finish(t)  # nothing to train (a grant it already had)
        else:
            self._push(t)

    def finish(self, t: _Trial) -> None:
        t.running, t.version = False, t.version + 1
        self.jobs -= 1
        if t.stopping or t.epoch >= self.max_length:
            t.exited = True
            self.ended.append(t)
        elif t.grant > t.job_grant:
            self.restart.append(t)

    def step(self, t: _Trial) -> None:
        """The job of ``t`` has its next event now: an epoch ends, or the stop."""
        end = self.now  # the event's time
        if t.epoch_end <= min(end, t.stop_at):
            t.epoch += 1
            value = t.curve.values[t.epoch - 1]
            self.trace.add(end, t.curve.seconds[t.epoch - 1] * self.scale, value)
            self.points.append((t.order, t.epoch, t.rid, value))
            if t.epoch >= t.job_grant:
                self.finish(t)
            else:
                self._push(t)
        else:
            self.finish(t)

    def advance_to(self, until: float) -> None:
        """Every event at or before ``until``, in time order."""
        while self.events and self.events[0][0] <= until and not self.trace.full:
            at, _, rid, version = heapq.heappop(self.events)
            t = self.trials[rid]
            if version != t.version or not t.running:
                continue
            self.now = at
            self.step(t)
        self.now = max(self.now, until)

    # -- decisions -------------------------------------------------------------

    def decide(self) -> bool:
        """One decision at ``self.now`` (module doc); True when anything was told or done."""
        busy = bool(self.points or self.ended)
        for _, step, rid, value in sorted(self.points):
            self.searcher.tell(rid, step, value)
            self.trials[rid].told = step
        self.points.clear()
        for t in sorted(self.ended, key=lambda t: t.order):
            self.searcher.tell_exited(t.rid)
        self.ended.clear()
        waiting, self.restart = self.restart, []
        ops = self.searcher.ask(max(0, self.workers - self.jobs - len(waiting)))
        new: list[_Trial] = []
        for op in ops:
            if isinstance(op, Create):
                t = _Trial(op.request_id, len(self.trials), self.curve_of(op.hparams), op.length)
                self.trials[t.rid] = t
                self.digest.add(self.now, "create", t.rid, op.length)
                self.digest.hparams[t.rid] = dict(op.hparams)
                new.append(t)
            elif isinstance(op, Continue):
                self._promote(self.trials[op.request_id], op.length, new)
            elif isinstance(op, Stop):
                self._stop(self.trials[op.request_id], waiting)
        for t in waiting + new:
            self.start(t)
        return busy or bool(ops)

    def _promote(self, t: _Trial, length: int, new: list[_Trial]) -> None:
        self.digest.add(self.now, "promote", t.rid, length)
        if t.exited:
            return
        t.grant = max(t.grant, length)
        if not t.running and t not in new:
            new.append(t)  # paused: resumes from its checkpoint now

    def _stop(self, t: _Trial, waiting: list[_Trial]) -> None:
        self.digest.add(self.now, "stop", t.rid, t.told)
        if t.exited:
            return
        if t.running:
            t.stopping = True
            t.stop_at = self.now + (STOP_NOTICE_S if self.tick_s > 0 else 0.0)
            heapq.heappush(self.events, (t.stop_at, self.seq, t.rid, t.version))
            self.seq += 1
        else:  # paused (or waiting to restart): nothing to lose
            if t in waiting:
                waiting.remove(t)
            t.exited = True
            self.searcher.tell_exited(t.rid)

    def next_time(self, busy: bool) -> float | None:
        """The next decision time (None: nothing will ever happen again)."""
        due = self.events[0][0] if self.events else None
        if self.tick_s <= 0:
            return due
        if busy:
            return self.now + self.tick_s
        if due is None:
            return None
        return self.now + max(1, math.ceil((due - self.now) / self.tick_s)) * self.tick_s


@dataclass
class AskTellResult:
    """One :func:`run_ask_tell` run: its epochs, decisions and how it ended."""

    trace: Trace
    digest: Digest
    end: str  # "budget", "searcher done before the budget" or "stalled"
    starts: int  # jobs started (a resumed trial again)
    told: dict[int, int]  # the last length told, by request id


def run_ask_tell(
    searcher: BaseSearcher,
    curve_of: Callable[[Mapping[str, Any]], CurveLike],
    workers: int,
    budget: int,
    tick_s: float = 60.0,
    scale: float = 1.0,
) -> AskTellResult:
    """Drive ``searcher`` on ``workers`` GPUs until ``budget`` epochs are trained, the
    searcher is done, or nothing is left to happen (module doc). ``curve_of`` gives a
    configuration's curve (epoch seconds are multiplied by ``scale``)."""
    trace = Trace(budget)
    run = _Run(searcher, curve_of, workers, trace, tick_s, scale)
    end = "stalled"
    while True:
        if trace.full:
            end = "budget"
            break
        busy = run.decide()
        if searcher.done and run.jobs == 0:
            end = "searcher done before the budget"
            break
        nxt = run.next_time(busy)
        if nxt is None:
            break
        run.advance_to(nxt)
    told = {rid: t.told for rid, t in run.trials.items()}
    return AskTellResult(trace, run.digest, end, run.starts, told)
