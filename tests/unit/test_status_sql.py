"""``report._status_sql``: the decision latency read from its expression index (values
as ``statistics.median`` gives them), and status's totals read from the v5 indexes."""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event

from dlhpc.report._status_sql import decision_stats, disk_usage, ended_hours, trial_counts
from dlhpc.report.status_types import DecisionStats, Latency
from dlhpc.store import Decision, Experiment, Store
from tests.unit._db import add_experiment, add_trial

T0 = datetime(2026, 1, 1, 12, 0, 0)


def _decide(store: Store, tmp_path: Path, latencies: list[float | None]) -> int:
    """One experiment and trial with a stop per latency (seconds; None: not acted on),
    plus a promotion acted on without a result time; the experiment's id."""
    with store.write() as s:
        exp = add_experiment(s, tmp_path)
        tid = add_trial(s, exp).id
        for i, lat in enumerate(latencies):
            acted = None if lat is None else T0 + timedelta(seconds=lat)
            s.add(
                Decision(
                    experiment_id=exp.id,
                    trial_id=tid,
                    kind="stop",
                    length=i,
                    result_time=T0,
                    decided_at=T0,
                    acted_at=acted,
                )
            )
        s.add(Decision(experiment_id=exp.id, trial_id=tid, kind="promote", length=9, decided_at=T0))
        s.add(
            Decision(
                experiment_id=exp.id,
                trial_id=tid,
                kind="promote",
                length=9,
                decided_at=T0,
                acted_at=T0,
            )
        )
        return exp.id


def test_latency_median_and_max_as_python_computes_them(tmp_path: Path) -> None:
    for latencies in ([3.5, 1.0, -2.0, 10.25, None], [3.5, 1.0, -2.0, 10.25, 7.0]):
        store = Store(tmp_path / f"home{len(latencies)}{latencies[-1]}")
        eid = _decide(store, tmp_path, latencies)
        timed = [max(0.0, x) for x in latencies if x is not None]
        with store.read() as s:
            stats = decision_stats(s, [eid])
        pending = 1 + sum(x is None for x in latencies)
        median = round(statistics.median(timed), 3)
        latency = Latency(len(timed), median, max(timed))
        assert stats == {eid: DecisionStats(2, len(latencies), pending, latency)}
        store.close()


def test_no_timed_decision_has_no_latency(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    eid = _decide(store, tmp_path, [None])
    with store.read() as s:
        assert decision_stats(s, [eid]) == {eid: DecisionStats(2, 1, 2, None)}


def test_status_totals_read_indexes_not_rows(tmp_path: Path) -> None:
    """Each statement's plan: the latency queries use ``ix_decisions_latency`` (the
    expression must match the index's exactly), and no total sorts its rows."""
    store = Store(tmp_path / "home")
    eid = _decide(store, tmp_path, [1.0, 2.0, 4.0])
    statements: list[tuple[str, Any]] = []
    with store.read() as s:
        conn = s.connection()

        @event.listens_for(conn, "before_cursor_execute")
        def _capture(_c: Any, _cur: Any, stmt: str, params: Any, _ctx: Any, _many: Any) -> None:
            statements.append((stmt, params))

        trial_counts(conn, [eid])
        ended_hours(conn, [eid], [])
        decision_stats(s, [eid])
        disk_usage(s, [s.get_one(Experiment, eid)])
        event.remove(conn, "before_cursor_execute", _capture)
        plans = {
            stmt: " | ".join(
                r[3] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + stmt, params)
            )
            for stmt, params in statements
        }
    latency = [p for st, p in plans.items() if "decisions.result_time IS NOT NULL" in st]
    assert len(latency) == 3 and all("ix_decisions_latency" in p for p in latency), plans
    assert not any("TEMP B-TREE" in p for p in plans.values()), plans
    assert not any(p.startswith("SCAN") for p in plans.values()), plans
