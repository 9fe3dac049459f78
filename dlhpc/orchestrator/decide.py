"""The searcher's side of a reconciliation pass: tell it results, act on its answer.

Runs inside the experiment's write transaction of the tick's decide step
(:mod:`dlhpc.orchestrator._reconcile`), with the trials already brought up to
date, so the searcher's state, the told positions (``Trial.told_step``) and every
decision commit together: a reconciler killed at any line tells nothing twice and
loses no decision.

Acting on operations:

* ``Create``: a new PENDING trial (submitted by the same pass).
* ``Continue``: a PAUSED trial (or one waiting for a job) gets the longer grant
  and waits for a new job, which resumes it from its checkpoint; a trial whose
  job is still ending gets it when the job has ended (a pending ``promote``
  :class:`~dlhpc.store.Decision`).
* ``Stop``: a PAUSED trial, or one whose job has not started, is
  STOPPED_EARLY at once (a queued job is cancelled); a running one is asked to
  stop through :func:`~dlhpc.protocol.request_stop` (the harness exits at its next
  step) and cancelled if it has not ended within :func:`stop_grace`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session, selectinload

from dlhpc._safepath import is_inside
from dlhpc._threads import map_io
from dlhpc.config.schema import ExperimentConfig
from dlhpc.orchestrator.clock import trial_time
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.new_trials import add_trials
from dlhpc.protocol import request_stop, stop_file
from dlhpc.search import BaseSearcher, Continue, Create, Stop
from dlhpc.states import LIVE_ATTEMPT_STATES, JobState, TrialState
from dlhpc.store import Decision, Experiment, Metric, Trial

__all__ = [
    "STOP_GRACE",
    "STOP_GRACE_ENV",
    "SearchPass",
    "pending_promotion",
    "pending_promotions",
    "running_trials",
    "stop_grace",
]

STOP_GRACE = timedelta(seconds=60)
STOP_GRACE_ENV = "DLHPC_STOP_GRACE_S"
_RUNNING = {TrialState.PENDING.value, TrialState.RUNNING.value}


def stop_grace(environ: Mapping[str, str] | None = None) -> timedelta:
    """How long a running trial the searcher stopped may take to end before its job is
    cancelled: ``$DLHPC_STOP_GRACE_S`` seconds in ``environ`` (default: ``os.environ`` as
    it is at the call), else :data:`STOP_GRACE`."""
    raw = (os.environ if environ is None else environ).get(STOP_GRACE_ENV)
    return STOP_GRACE if raw is None else timedelta(seconds=float(raw))


def _dt(epoch: float | None) -> datetime | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).replace(tzinfo=None)


def running_trials(trials: list[Trial]) -> int:
    """Trials that hold or wait for a job (PAUSED ones hold nothing)."""
    return sum(t.state in _RUNNING for t in trials)


def pending_promotions(s: Session, experiment_id: int) -> dict[int, list[Decision]]:
    """Promotions decided while a trial's job was still running, not applied yet, by
    trial id, oldest first (one query for the experiment; see :func:`pending_promotion`)."""
    out: dict[int, list[Decision]] = {}
    for d in s.scalars(
        select(Decision)
        .where(
            Decision.experiment_id == experiment_id,
            Decision.kind == "promote",
            Decision.acted_at.is_(None),
        )
        .order_by(Decision.id)
    ):
        out.setdefault(d.trial_id, []).append(d)
    return out


def pending_promotion(t: Trial, pending: dict[int, list[Decision]]) -> Decision | None:
    """The newest of ``t``'s pending promotions (:func:`pending_promotions`) to a
    length beyond its grant."""
    longer = [d for d in pending.get(t.id, ()) if d.length > t.max_length]
    return longer[-1] if longer else None


@dataclass
class SearchPass:
    """Tell the searcher what happened to ``was_live`` trials, then act on its ops."""

    s: Session
    exp: Experiment
    cfg: ExperimentConfig
    searcher: BaseSearcher
    now: datetime
    runs_root: Path
    cancels: list[str] = field(default_factory=list)  # job ids to scancel after commit
    stopped_running: list[Trial] = field(default_factory=list)  # need a stop file
    decisions: int = 0

    def tell(self, was_live: list[Trial], settled: Collection[int] = ()) -> None:
        """New metric points in step order, then ``tell_exited`` for trials that ended.

        ``settled``: ids of the live trials left out of ``was_live`` (settled PAUSED
        ones, not loaded: :func:`~dlhpc.orchestrator.trials.settled_paused_ids`): their
        new points, if any, are told too (those trials are loaded then). They are read
        through the experiment's PAUSED trials (an index), not thousands of bound ids:
        a PAUSED trial not in ``was_live`` is a settled one (only the searcher, after
        this, changes a settled trial, and a trial this pass paused is in
        ``was_live``); the ids in ``settled`` are checked all the same."""
        by_id = {t.id: t for t in was_live}
        new_points = select(Metric.trial_id, Metric.step, Metric.value).join(
            Trial, Trial.id == Metric.trial_id
        )
        new_points = new_points.where(
            Metric.name == self.cfg.searcher.metric, Metric.step > Trial.told_step
        )
        rows = list(
            self.s.execute(
                new_points.where(Metric.trial_id.in_(list(by_id))).order_by(
                    Metric.trial_id, Metric.step
                )
            )
        )
        if settled:
            ids = set(settled)
            paused = new_points.where(  # as an IN list: SQLite then walks the trials' index
                Metric.trial_id.in_(
                    select(Trial.id).where(
                        Trial.experiment_id == self.exp.id,
                        Trial.state == TrialState.PAUSED.value,
                    )
                )
            )
            rows += [r for r in self.s.execute(paused) if r[0] in ids and r[0] not in by_id]
            rows.sort(key=lambda r: (r[0], r[1]))  # the order the SQL gives the others
            missing = sorted({tid for tid, _, _ in rows if tid not in by_id})
            if missing:
                by_id.update(
                    {t.id: t for t in self.s.scalars(select(Trial).where(Trial.id.in_(missing)))}
                )
        for trial_id, step, value in rows:
            t = by_id[trial_id]
            self.searcher.tell(t.request_id, step, float("nan") if value is None else value)
            t.told_step = step
        for t in was_live:
            if TrialState(t.state).is_terminal:
                self.searcher.tell_exited(t.request_id)

    def _newest_result(self) -> datetime | None:
        newest = self.s.scalar(
            select(func.max(Metric.time))
            .join(Trial, Trial.id == Metric.trial_id)
            .where(Trial.experiment_id == self.exp.id, Metric.name == self.cfg.searcher.metric)
        )
        return _dt(newest)

    def decide(self, live: list[Trial]) -> list[Trial]:
        """Ask for as much work as there are free slots and act on it; returns new trials.

        ``live``: the trials that were not terminal at the start of the pass (the
        others hold no job); a trial an operation names outside them is loaded."""
        limit = self.cfg.searcher.max_concurrent_trials or 1_000_000
        ops = self.searcher.ask(max(0, limit - running_trials(live)))
        by_rid = {t.request_id: t for t in live}
        named = [op.request_id for op in ops if isinstance(op, Continue | Stop)]
        by_rid.update(self._trials([rid for rid in named if rid not in by_rid]))
        self._load_attempts([by_rid[rid] for rid in named])
        result_time = self._newest_result() if ops else None
        creates = [op for op in ops if isinstance(op, Create)]
        for op in ops:
            if isinstance(op, Continue):
                self._promote(by_rid[op.request_id], op.length, result_time)
            elif isinstance(op, Stop):
                self._stop(by_rid[op.request_id], result_time)
        return add_trials(self.s, self.exp, creates, self.cfg, self.runs_root, self.now)

    def _trials(self, request_ids: list[int]) -> dict[int, Trial]:
        """The experiment's trials with these request ids, with their attempts (one query)."""
        if not request_ids:
            return {}
        rows = self.s.scalars(
            select(Trial)
            .where(Trial.experiment_id == self.exp.id, Trial.request_id.in_(request_ids))
            .options(selectinload(Trial.attempts))
        ).all()
        return {t.request_id: t for t in rows}

    def _load_attempts(self, trials: list[Trial]) -> None:
        """The attempts of those ``trials`` whose attempts are not loaded (the tick skips
        loading them for settled PAUSED trials), in one query, not one per trial."""
        ids = [t.id for t in trials if "attempts" in inspect(t).unloaded]
        if ids:
            self.s.scalars(
                select(Trial).where(Trial.id.in_(ids)).options(selectinload(Trial.attempts))
            ).all()

    def _record(self, t: Trial, kind: str, length: int, result_time: datetime | None) -> Decision:
        d = Decision(
            experiment_id=self.exp.id,
            trial_id=t.id,
            kind=kind,
            length=length,
            result_time=result_time,
            decided_at=self.now,
        )
        self.s.add(d)
        self.decisions += 1
        return d

    def _promote(self, t: Trial, length: int, result_time: datetime | None) -> None:
        self._record(t, "promote", length, result_time)  # acted on when submitted
        if TrialState(t.state).is_terminal:
            return
        current = t.attempts[-1] if t.attempts else None
        # an exit record counts once the scheduler no longer runs the job (recovery)
        job_over = current is None or t.needs_job or current.state not in LIVE_ATTEMPT_STATES
        if t.state == TrialState.PAUSED.value or job_over:
            t.max_length = length
            t.needs_job = True
            t.state = TrialState.PENDING.value
        log_event(self.s, "trial.promoted", f"promoted to length {length}", self.exp.id, t.id)

    def _stop(self, t: Trial, result_time: datetime | None) -> None:
        d = self._record(t, "stop", t.told_step, result_time)
        if TrialState(t.state).is_terminal:
            d.acted_at = self.now
            return
        current = t.attempts[-1] if t.attempts else None
        started = current is not None and (
            current.started_at is not None or current.state == JobState.RUNNING.value
        )
        if t.state == TrialState.RUNNING.value and started and not t.needs_job:
            t.stop_requested_at = self.now
            self.stopped_running.append(t)
        else:  # paused, or its job has not started: nothing to lose
            if current is not None and current.state in LIVE_ATTEMPT_STATES and not t.needs_job:
                self.cancels.append(current.job_id)
                current.state = JobState.CANCELLED.value
            t.state = TrialState.STOPPED_EARLY.value
            t.ended_at = trial_time(t, self.now)
            t.needs_job = False
            self.searcher.tell_exited(t.request_id)
        d.acted_at = self.now
        log_event(self.s, "trial.stop", "stopped early by the searcher", self.exp.id, t.id)


def write_stop_files(trials: list[Trial]) -> None:
    """Ask the jobs of ``trials`` to stop (idempotent; after the decision committed).

    Only inside the runs folder (``<runs>/exp-N/trials/trial-M``): a trial folder a job
    replaced by a symlink to elsewhere gets no stop file (the stop grace then cancels)."""
    stops = [(d, stop_file(d)) for d in (Path(t.run_dir) for t in trials if t.run_dir)]
    # parents[2] of <runs>/exp-N/trials/trial-M is <runs>
    map_io(request_stop, [d for d, p in stops if is_inside(d.parents[2], p) and not p.exists()])
