"""The SQL side of ``dlhpc status`` (``report.status``): which trials a listing shows,
and the totals summed in SQLite so that a search of 10,000s of trials is never read
row by row (counts by state, the hours of unlisted trials, decisions, checkpoint use).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Integer, and_, func, select, text, union
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from dlhpc.protocol import checkpoint_experiment_dir, recorded_slug
from dlhpc.report._status_gpu import Row
from dlhpc.report.status_types import DecisionStats, DiskUse, Latency
from dlhpc.states import LIVE_ATTEMPT_STATES, TERMINAL_TRIAL_STATES, CheckpointState
from dlhpc.store import Attempt, Checkpoint, Decision, Experiment, Trial
from dlhpc.store.tables import DECISION_LATENCY_S

__all__ = [
    "PICK_COLS",
    "candidates",
    "decision_stats",
    "disk_usage",
    "ended_hours",
    "live_attempt",
    "pick_trials",
    "trial_counts",
]

PICK_COLS = (Trial.id, Trial.experiment_id, Trial.state, Trial.best_metric)


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


def trial_counts(conn: Any, exp_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per experiment, its trials counted by state (in SQL)."""
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for exp_id, state, n in conn.execute(
        select(Trial.experiment_id, Trial.state, func.count())
        .where(Trial.experiment_id.in_(exp_ids))
        .group_by(Trial.experiment_id, Trial.state)
    ):
        counts[exp_id][state] = n
    return counts


def candidates(conn: Any, exps: Sequence[Experiment], limit: int) -> dict[int, list[Row]]:
    """Per experiment, the trials (``PICK_COLS`` rows by id) :func:`pick_trials` may
    list at most ``limit`` of: those a pick over every trial could list (the live ones,
    the ``limit`` best ended, the ``limit`` newest) plus those with a live attempt
    (whose hours run to now). A long search's 10,000s of other trials are never read:
    one query per experiment, each sorting only its top ``limit``."""
    trials_of: dict[int, list[Row]] = defaultdict(list)
    with_live_attempt = select(Attempt.trial_id).where(live_attempt())
    for e in exps:  # a few LIMIT queries per experiment (SQLite sorts the top n only)
        of_exp = Trial.experiment_id == e.id
        ended = and_(of_exp, Trial.state.in_(TERMINAL_TRIAL_STATES), Trial.best_metric.is_not(None))
        # best first, ties by id; ``best_metric DESC``, not ``-best_metric``: an index order
        signed = Trial.best_metric if e.smaller_is_better else Trial.best_metric.desc()
        newest = select(Trial.id).where(of_exp).order_by(Trial.id.desc()).limit(limit)
        best = select(Trial.id).where(ended).order_by(signed, Trial.id).limit(limit)
        # a UNION of the ids, then their rows: not an OR tested on every trial's row
        ids = union(
            select(newest.subquery().c.id),
            select(best.subquery().c.id),
            select(Trial.id).where(of_exp, Trial.state.not_in(TERMINAL_TRIAL_STATES)),
            with_live_attempt,
        )
        query = select(*PICK_COLS).where(of_exp, Trial.id.in_(ids))
        trials_of[e.id].extend(conn.execute(query.order_by(Trial.id)))
    return trials_of


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
    out: dict[int, DecisionStats] = {}
    for exp_id, (promotions, stops, pending) in counts.items():
        out[exp_id] = DecisionStats(promotions, stops, pending, _latency(session, exp_id))
    return out


def _latency_sql() -> tuple[str, str]:
    """The latency expression as SQL text, and the FROM clause that pins the index."""
    expr = DECISION_LATENCY_S.compile(
        dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}
    )
    return str(expr), "decisions INDEXED BY ix_decisions_latency"


_LATENCY, _LATENCY_FROM = _latency_sql()
# INDEXED BY, not the planner's choice: on a small table SQLite may take the
# experiment_id index instead, depending on the order the indexes were created in
# (and a missing index is an error here, not a slow scan)
_TIMED = (
    f"FROM {_LATENCY_FROM} WHERE decisions.experiment_id = :e"
    " AND decisions.acted_at IS NOT NULL AND decisions.result_time IS NOT NULL"
)
_LATENCY_COUNT = text(f"SELECT count(*) {_TIMED}")
_LATENCY_MAX = text(f"SELECT {_LATENCY} {_TIMED} ORDER BY {_LATENCY} DESC LIMIT 1")
_LATENCY_MIDDLE = text(f"SELECT {_LATENCY} {_TIMED} ORDER BY {_LATENCY} LIMIT :n OFFSET :o")


def _latency(session: Session, exp_id: int) -> Latency | None:
    """The experiment's decision latencies: count, median and max, in SQL (a median
    from the one or two middle rows, as :func:`statistics.median`), each read from
    ``ix_decisions_latency`` alone."""
    n = session.scalar(_LATENCY_COUNT, {"e": exp_id})
    if not n:
        return None
    top = session.execute(_LATENCY_MAX, {"e": exp_id}).scalar_one()
    middle = session.scalars(
        _LATENCY_MIDDLE, {"e": exp_id, "n": 2 - n % 2, "o": (n - 1) // 2}
    ).all()
    return Latency(n, round(sum(middle) / len(middle), 3), round(top, 3))


def disk_usage(session: Session, exps: list[Experiment]) -> dict[int, DiskUse]:
    """Per experiment, from the checkpoint rows (no disk scan): ACTIVE checkpoints and
    their bytes (manifest sizes), those the GC deleted and the bytes it freed, and the
    experiment's checkpoint folder (``checkpoint.dir/<its run folder's name>``)."""
    active = Checkpoint.state == CheckpointState.ACTIVE.value  # 1 or 0
    rows = session.execute(  # one group per experiment, in index order: no sort
        select(
            Trial.experiment_id,
            func.sum(active, type_=Integer),
            func.sum(Checkpoint.size_bytes * active, type_=Integer),
            func.count(),
            func.sum(Checkpoint.size_bytes),
        )
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .where(Trial.experiment_id.in_([e.id for e in exps]))
        .group_by(Trial.experiment_id)
    ).all()
    sums: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # as DiskUse's first four
    for exp_id, active_n, active_size, n, size in rows:
        kept, kept_size = int(active_n or 0), int(active_size or 0)
        sums[exp_id] = [kept, kept_size, n - kept, int(size or 0) - kept_size]
    out: dict[int, DiskUse] = {}
    for e in exps:
        try:
            ck_dir = (json.loads(e.config_json or "{}").get("checkpoint") or {}).get("dir")
        except (ValueError, AttributeError):
            ck_dir = None
        slug = recorded_slug(e.id, e.run_dir)
        root = str(checkpoint_experiment_dir(Path(str(ck_dir)), e.id, slug)) if ck_dir else None
        n, size, deleted, freed = sums[e.id]
        out[e.id] = DiskUse(n, size, deleted, freed, root)
    return out
