"""The tick's scan and tell skip rules, on a real SQLite store:

* ``_scan.quiet_trials`` (one SQL aggregate) names exactly the live trials whose
  folders need no listing: every attempt ended before the settle window. A trial it
  names wrongly would have files that are never ingested (a lost result).
* ``SearchPass.tell`` tells the new points of the settled PAUSED trials the pass did
  not load (``settled``): leaving them out would drop a result the searcher acts on.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dlhpc.orchestrator._scan import quiet_trials
from dlhpc.orchestrator.decide import SearchPass
from dlhpc.scheduler import JobState
from dlhpc.store import Attempt, Metric, Store, Trial
from dlhpc.store.ingest import SETTLE_WINDOW
from tests.unit._db import add_experiment, add_trial

NOW = datetime(2026, 1, 1, 12, 0, 0)
OLD = NOW - SETTLE_WINDOW - timedelta(seconds=1)
RECENT = NOW - SETTLE_WINDOW + timedelta(seconds=1)
ENDED = JobState.COMPLETED.value

# name: (trial state, [(attempt state, ended_at, terminal_seen_at)], quiet)
CASES: dict[str, tuple[str, list[tuple[str, datetime | None, datetime | None]], bool]] = {
    "ended long ago": ("PAUSED", [(ENDED, OLD, OLD)], True),
    "seen only, long ago": ("PENDING", [(ENDED, None, OLD)], True),
    "ended only, long ago": ("PAUSED", [(ENDED, OLD, None)], True),
    "two attempts, both old": ("PAUSED", [(ENDED, OLD, OLD), (ENDED, OLD, OLD)], True),
    "no attempt": ("PENDING", [], False),
    "live attempt": ("RUNNING", [(JobState.RUNNING.value, None, None)], False),
    "live attempt with old times": ("RUNNING", [(JobState.PENDING.value, OLD, OLD)], False),
    "ended lately": ("PAUSED", [(ENDED, RECENT, RECENT)], False),
    "seen lately": ("PAUSED", [(ENDED, OLD, RECENT)], False),
    "ended lately, seen long ago": ("PAUSED", [(ENDED, RECENT, OLD)], False),
    "no end time": ("PAUSED", [(ENDED, None, None)], False),
    "an old and a recent one": ("PAUSED", [(ENDED, OLD, OLD), (ENDED, RECENT, RECENT)], False),
    "an old one, one without times": ("PAUSED", [(ENDED, OLD, OLD), (ENDED, None, None)], False),
    "terminal (not live)": ("COMPLETED", [(ENDED, OLD, OLD)], False),
}


def _attempt(trial_id: int, r: int, state: str, ended: Any, seen: Any) -> Attempt:
    return Attempt(
        trial_id=trial_id,
        attempt_key=f"{trial_id}_0.r{r}",
        job_id=f"{trial_id}_{r}",
        state=state,
        created_at=OLD - timedelta(hours=1),
        ended_at=ended,
        terminal_seen_at=seen,
    )


def test_quiet_trials_are_exactly_those_ended_before_the_settle_window(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    try:
        ids: dict[str, int] = {}
        with store.write() as s:
            exp = add_experiment(s, tmp_path / "runs")
            other = add_experiment(s, tmp_path / "runs2")
            for rid, (name, (state, attempts, _)) in enumerate(CASES.items()):
                t = add_trial(s, exp, request_id=rid, state=state)
                for r, (a_state, ended, seen) in enumerate(attempts):
                    s.add(_attempt(t.id, r, a_state, ended, seen))
                ids[name] = t.id
            # another experiment's quiet trial: not asked about
            t = add_trial(s, other, state="PAUSED")
            s.add(_attempt(t.id, 0, ENDED, OLD, OLD))
            exp_id = exp.id
        with store.read() as s:
            quiet = set(s.scalars(quiet_trials([exp_id], NOW)))
        assert quiet == {ids[name] for name, (_, _, q) in CASES.items() if q}
    finally:
        store.close()


class _Searcher:
    """Records what it is told (the searcher boundary; the pass needs only these)."""

    def __init__(self) -> None:
        self.told: list[tuple[int, int, float]] = []
        self.exited: list[int] = []

    def tell(self, request_id: int, step: int, value: float) -> None:
        self.told.append((request_id, step, value))

    def tell_exited(self, request_id: int) -> None:
        self.exited.append(request_id)


class _Cfg:
    class searcher:  # noqa: N801 - the attribute the pass reads: cfg.searcher.metric
        metric = "loss"


@pytest.mark.parametrize("pass_settled", [True, False])
def test_tell_tells_the_new_points_of_settled_trials_not_loaded(
    tmp_path: Path, pass_settled: bool
) -> None:
    store = Store(tmp_path / "home")
    try:
        with store.write() as s:
            exp = add_experiment(s, tmp_path / "runs", metric="loss")
            live = add_trial(s, exp, request_id=1, state="RUNNING", told_step=1)
            paused = add_trial(s, exp, request_id=2, state="PAUSED", told_step=2)
            attempts = {t.id: _attempt(t.id, 0, ENDED, OLD, OLD) for t in (live, paused)}
            s.add_all(attempts.values())
            s.flush()
            for t, step in ((live, 1), (live, 2), (paused, 2), (paused, 3)):
                s.add(
                    Metric(
                        trial_id=t.id,
                        attempt_id=attempts[t.id].id,
                        name="loss",
                        step=step,
                        value=step / 10,
                        time=0.0,
                    )
                )
            ids = (exp.id, live.id, paused.id)
        exp_id, live_id, paused_id = ids
        searcher = _Searcher()
        with store.write() as s:
            exp_row = s.get(type(exp), exp_id)
            loaded = s.get(Trial, live_id)
            assert exp_row is not None and loaded is not None
            sp = SearchPass(s, exp_row, _Cfg(), searcher, NOW, tmp_path)  # type: ignore[arg-type]
            sp.tell([loaded], [paused_id] if pass_settled else [])
        expected = [(1, 2, 0.2), (2, 3, 0.3)] if pass_settled else [(1, 2, 0.2)]
        assert [(r, st, v) for r, st, v in searcher.told if not math.isnan(v)] == expected
        with store.read() as s:
            row = s.get(Trial, paused_id)
            assert row is not None and row.told_step == (3 if pass_settled else 2)
    finally:
        store.close()
