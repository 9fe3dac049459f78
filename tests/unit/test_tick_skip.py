"""The tick's skip rule for PAUSED trials (``trials.settled_paused``): a trial it names
is one on which ``reconcile_trial`` changes nothing, so skipping it drops no decision.

Each case is a PAUSED trial on a real SQLite store; for every case the test runs
``reconcile_trial`` and checks that the rule skips exactly the trials it leaves
unchanged (a rule that skipped a trial the pass would change fails here)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from dlhpc.orchestrator.trials import TrialPass, reconcile_trial, settled_paused
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.store import Attempt, Event, Store, Trial
from tests.unit._db import add_experiment, add_trial

NOW = datetime(2026, 1, 1, 12, 0, 0)
FINAL = 9  # the searcher's max_length


class _Clock:
    def time(self) -> float:
        return NOW.timestamp()

    def now(self) -> datetime:
        return NOW

    def file_time(self, folder: Path) -> float:
        return NOW.timestamp()


def _attempt(t: Trial, r: int, **kw: Any) -> Attempt:
    fields: dict[str, Any] = {
        "state": JobState.COMPLETED.value,
        "exit_code": 0,
        "cause": "paused",
        "ended_at": NOW - timedelta(hours=1),
        "terminal_seen_at": NOW - timedelta(hours=1),
    }
    fields.update(kw)
    return Attempt(
        trial_id=t.id,
        attempt_key=f"{t.id}_0.r{r}" if r else f"{t.id}_0.r0",
        job_id=f"{t.id}_{r}",
        created_at=NOW - timedelta(hours=2),
        **fields,
    )


def _trial(t: Trial, **kw: Any) -> None:
    t.state = "PAUSED"
    t.max_length = 3
    t.steps_completed = 3
    for k, v in kw.items():
        setattr(t, k, v)


def _settled(t: Trial) -> list[Attempt]:
    _trial(t)
    return [_attempt(t, 0)]


def _promoted_once(t: Trial) -> list[Attempt]:
    _trial(t, max_length=3)
    return [_attempt(t, 0), _attempt(t, 1)]


def _restarted(t: Trial) -> list[Attempt]:
    _trial(t, restarts=1)
    return [_attempt(t, 0, cause="preempted", exit_code=75), _attempt(t, 1)]


def _stop_requested(t: Trial) -> list[Attempt]:
    _trial(t, stop_requested_at=NOW - timedelta(minutes=1))
    return [_attempt(t, 0)]


def _needs_job(t: Trial) -> list[Attempt]:
    _trial(t, needs_job=True)
    return [_attempt(t, 0)]


def _live_attempt(t: Trial) -> list[Attempt]:  # exited 0, job still ending: polled
    _trial(t)
    return [_attempt(t, 0, state=JobState.RUNNING.value, ended_at=None, terminal_seen_at=None)]


def _short_of_grant(t: Trial) -> list[Attempt]:
    _trial(t, steps_completed=2)
    return [_attempt(t, 0)]


def _final_length(t: Trial) -> list[Attempt]:
    _trial(t, max_length=FINAL, steps_completed=FINAL)
    return [_attempt(t, 0)]


def _cause_unset(t: Trial) -> list[Attempt]:
    _trial(t)
    return [_attempt(t, 0, cause="", exit_code=None), _attempt(t, 1)]


def _cause_unset_counted(t: Trial) -> list[Attempt]:  # restarts agrees, the cause is unset
    _trial(t, restarts=1)
    return [_attempt(t, 0, cause="", exit_code=None), _attempt(t, 1)]


def _last_exit_nonzero(t: Trial) -> list[Attempt]:
    _trial(t)
    return [_attempt(t, 0, exit_code=1)]


def _restarts_stale(t: Trial) -> list[Attempt]:
    _trial(t, restarts=0)
    return [_attempt(t, 0, cause="preempted", exit_code=75), _attempt(t, 1)]


def _last_not_paused(t: Trial) -> list[Attempt]:
    _trial(t)
    return [_attempt(t, 0, cause="")]


def _no_attempt(t: Trial) -> list[Attempt]:
    _trial(t)
    return []


Case = Callable[[Trial], list[Attempt]]
CASES: dict[str, tuple[Case, bool]] = {  # name: (builder, skipped)
    "settled": (_settled, True),
    "promoted once": (_promoted_once, True),
    "restarted": (_restarted, True),
    "stop requested": (_stop_requested, False),
    "needs a job": (_needs_job, False),
    "live attempt": (_live_attempt, False),
    "short of its grant": (_short_of_grant, False),
    "at the final length": (_final_length, False),
    "earlier cause unset": (_cause_unset, False),
    "restarts stale": (_restarts_stale, False),
    "earlier cause unset, counted": (_cause_unset_counted, False),
    "last attempt exited non-zero": (_last_exit_nonzero, False),
    "last attempt's cause unset": (_last_not_paused, False),
    "no attempt": (_no_attempt, False),
}


def _world(tmp_path: Path) -> tuple[Store, dict[str, int]]:
    store = Store(tmp_path / "home")
    ids: dict[str, int] = {}
    with store.write() as s:
        exp = add_experiment(
            s,
            tmp_path / "runs",
            searcher="asha",
            metric="loss",
            smaller_is_better=True,
            source_path="exp.yaml",
            yaml_text="name: e\n",
            config_json=json.dumps({"name": "e"}),
            repro_json="{}",
        )
        for rid, (name, (build, _)) in enumerate(CASES.items()):
            t = add_trial(s, exp, request_id=rid, state="PAUSED", hparams_json="{}", seed=rid)
            s.flush()
            for a in build(t):
                s.add(a)
            ids[name] = t.id
    return store, ids


def _events(s: Any) -> int:
    return int(s.scalar(select(func.count()).select_from(Event)))


def _changed(s: Any, t: Trial, events_before: int) -> bool:
    touched = [t, *t.attempts]
    return bool(s.new) or any(s.is_modified(x) for x in touched) or _events(s) != events_before


@pytest.mark.parametrize("name", list(CASES))
def test_the_rule_skips_exactly_the_trials_a_pass_leaves_unchanged(
    tmp_path: Path, name: str
) -> None:
    store, ids = _world(tmp_path)
    try:
        with store.write() as s:
            trials = [s.get(Trial, tid) for tid in ids.values()]
            skipped = settled_paused(s, [t for t in trials if t is not None], FINAL)
        with store.write() as s:
            t = s.get(Trial, ids[name])
            assert t is not None
            # the live attempt's job is still ending: the poll says so
            statuses = {a.job_id: JobStatus(a.job_id, JobState.RUNNING) for a in t.attempts}
            tp = TrialPass(statuses, _Clock(), max_restarts=3, final_length=FINAL)
            events = _events(s)
            reconcile_trial(s, t, tp)
            changed = _changed(s, t, events) or bool(tp.cancels) or bool(tp.stopping)
            s.rollback()
        assert (ids[name] in skipped) == CASES[name][1]
        if ids[name] in skipped:
            assert not changed, f"{name}: skipped, but a pass changes it"
    finally:
        store.close()
