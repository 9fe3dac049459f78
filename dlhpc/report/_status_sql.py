"""The SQL side of ``dlhpc status`` (``report.status``): which trials a listing shows,
and the totals summed in SQLite so that a search of 10,000s of trials is never read
row by row (counts by state, the hours of unlisted trials, decisions, checkpoint use).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from statistics import median
from typing import Any

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session

from dlhpc.report._status_gpu import Row
from dlhpc.report.status_model import DecisionStats, DiskUse, Latency
from dlhpc.store import Attempt, Checkpoint, Decision, Experiment, Trial

__all__ = [
    "LIVE_ATTEMPT_STATES",
    "PICK_COLS",
    "TERMINAL_TRIAL_STATES",
    "candidates",
    "decision_stats",
    "disk_usage",
    "ended_hours",
    "live_attempt",
    "pick_trials",
]

PICK_COLS = (Trial.id, Trial.experiment_id, Trial.state, Trial.best_metric)
# orchestrator.trials.LIVE_ATTEMPT_STATES and orchestrator.states' terminal trial states
# (a test holds them equal; that package is not imported here: start-up time)
LIVE_ATTEMPT_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "UNKNOWN"})
TERMINAL_TRIAL_STATES = frozenset({"COMPLETED", "FAILED", "KILLED", "STOPPED_EARLY"})


def live_attempt() -> Any:
    """Attempts whose hours run to now or whose GPUs may be idle (read row by row)."""
    return Attempt.state.in_(LIVE_ATTEMPT_STATES)


def ended_hours(conn: Any, exp_ids: list[int], listed: list[int]) -> dict[int, float]:
    """Per experiment, the hours of the ended attempts of trials not in ``listed``, as
    ``report.status`` counts an attempt's (end: ``ended_at``, else ``terminal_seen_at``)."""
    end = func.coalesce(Attempt.ended_at, Attempt.terminal_seen_at)
    span = func.max(0.0, func.julianday(end) - func.julianday(Attempt.started_at)) * 24.0
    rows = conn.execute(
        select(Trial.experiment_id, func.total(span))
        .join(Trial, Trial.id == Attempt.trial_id)
        .where(
            Trial.experiment_id.in_(exp_ids),
            Trial.id.not_in(listed),
            Attempt.started_at.is_not(None),
            end.is_not(None),
            ~live_attempt(),
        )
        .group_by(Trial.experiment_id)
    )
    return {eid: float(hours) for eid, hours in rows}


def pick_trials(
    trials: list[tuple[int, str, float | None]], smaller_is_better: bool, limit: int | None
) -> set[int]:
    """The ids of the trials ``(id, state, best metric)`` a listing of at most ``limit``
    shows: all when they fit, else the live ones, then the best by the metric, then
    the newest."""
    if limit is None or len(trials) <= limit:
        return {tid for tid, _, _ in trials}
    sign = 1.0 if smaller_is_better else -1.0
    scored = sorted(
        (sign * m, tid) for tid, st, m in trials if m is not None and st in TERMINAL_TRIAL_STATES
    )
    live = [tid for tid, st, _ in trials if st not in TERMINAL_TRIAL_STATES]
    out: set[int] = set()
    for tid in [*live, *(tid for _, tid in scored), *(t[0] for t in reversed(trials))]:
        if len(out) >= limit:
            break
        out.add(tid)
    return out


def candidates(
    conn: Any, exps: Sequence[Experiment], limit: int | None
) -> tuple[dict[int, list[Row]], dict[int, dict[str, int]]]:
    """Per experiment, the trials (``PICK_COLS`` rows by id) :func:`pick_trials` may
    list, and the trial count by state. With a ``limit``, the candidates are those
    a pick over every trial could list (the live ones, the ``limit`` best ended, the
    ``limit`` newest) plus those with a live attempt (whose hours run to now): a long
    search's 10,000s of other trials are counted in SQL, never read."""
    ids = [e.id for e in exps]
    trials_of: dict[int, list[Row]] = defaultdict(list)
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    if limit is None:
        for t in conn.execute(
            select(*PICK_COLS).where(Trial.experiment_id.in_(ids)).order_by(Trial.id)
        ):
            trials_of[t.experiment_id].append(t)
            by_state = counts[t.experiment_id]
            by_state[t.state] = by_state.get(t.state, 0) + 1
        return trials_of, counts
    for exp_id, state, n in conn.execute(
        select(Trial.experiment_id, Trial.state, func.count())
        .where(Trial.experiment_id.in_(ids))
        .group_by(Trial.experiment_id, Trial.state)
    ):
        counts[exp_id][state] = n
    # one pass of SQLite's window functions over the experiments' trials
    ended = and_(Trial.state.in_(TERMINAL_TRIAL_STATES), Trial.best_metric.is_not(None))
    signed = case((Experiment.smaller_is_better, Trial.best_metric), else_=-Trial.best_metric)
    ranked = (
        select(
            *PICK_COLS,
            ended.label("ended"),
            func.row_number()
            .over(partition_by=Trial.experiment_id, order_by=Trial.id.desc())
            .label("newest"),
            func.row_number()
            .over(partition_by=(Trial.experiment_id, ended), order_by=(signed, Trial.id))
            .label("best"),
        )
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .where(Trial.experiment_id.in_(ids))
        .subquery()
    )
    with_live_attempt = select(Attempt.trial_id).where(live_attempt())
    query = select(*(ranked.c[c.key] for c in PICK_COLS)).where(
        or_(
            ranked.c.newest <= limit,
            and_(ranked.c.ended, ranked.c.best <= limit),
            ranked.c.state.not_in(TERMINAL_TRIAL_STATES),
            ranked.c.id.in_(with_live_attempt),
        )
    )
    for t in conn.execute(query.order_by(ranked.c.id)):
        trials_of[t.experiment_id].append(t)
    return trials_of, counts


def decision_stats(session: Session, exp_ids: list[int]) -> dict[int, DecisionStats]:
    """Per experiment: promotions and stops acted on, and their latency (from the
    newest result the searcher had seen to the decision acted on), in seconds.
    Counted and subtracted in SQL: a long search has a decision per trial."""
    counts: dict[int, list[int]] = {}  # [promotions, stops, pending]
    for exp_id, kind, n, pending in session.execute(
        select(
            Decision.experiment_id,
            Decision.kind,
            func.count(),
            func.count() - func.count(Decision.acted_at),
        )
        .where(Decision.experiment_id.in_(exp_ids))
        .group_by(Decision.experiment_id, Decision.kind)
    ):
        c = counts.setdefault(exp_id, [0, 0, 0])
        c[0 if kind == "promote" else 1] += n
        c[2] += pending
    seconds = (func.julianday(Decision.acted_at) - func.julianday(Decision.result_time)) * 86400.0
    lat: dict[int, list[float]] = defaultdict(list)
    for exp_id, value in session.execute(
        select(Decision.experiment_id, func.max(0.0, seconds)).where(
            Decision.experiment_id.in_(exp_ids),
            Decision.acted_at.is_not(None),
            Decision.result_time.is_not(None),
        )
    ):
        lat[exp_id].append(value)
    out: dict[int, DecisionStats] = {}
    for exp_id, (promotions, stops, pending) in counts.items():
        values = sorted(lat.get(exp_id, []))
        latency = (
            Latency(len(values), round(median(values), 3), round(values[-1], 3)) if values else None
        )
        out[exp_id] = DecisionStats(promotions, stops, pending, latency)
    return out


def disk_usage(session: Session, exps: list[Experiment]) -> dict[int, DiskUse]:
    """Per experiment, from the checkpoint rows (no disk scan): ACTIVE checkpoints and
    their bytes (manifest sizes), those the GC deleted and the bytes it freed, and the
    experiment's checkpoint folder (``checkpoint.dir/exp-<id>``)."""
    rows = session.execute(
        select(Trial.experiment_id, Checkpoint.state, func.count(), func.sum(Checkpoint.size_bytes))
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .where(Trial.experiment_id.in_([e.id for e in exps]))
        .group_by(Trial.experiment_id, Checkpoint.state)
    ).all()
    sums: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # as DiskUse's first four
    for exp_id, state, n, size in rows:
        at = 0 if state == "ACTIVE" else 2
        sums[exp_id][at] += n
        sums[exp_id][at + 1] += int(size or 0)
    out: dict[int, DiskUse] = {}
    for e in exps:
        try:
            ck_dir = (json.loads(e.config_json or "{}").get("checkpoint") or {}).get("dir")
        except (ValueError, AttributeError):
            ck_dir = None
        root = f"{ck_dir}/exp-{e.id:06d}" if ck_dir else None
        n, size, deleted, freed = sums[e.id]
        out[e.id] = DiskUse(n, size, deleted, freed, root)
    return out
