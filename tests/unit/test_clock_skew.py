"""Login nodes whose clocks differ by 10 minutes reconcile one experiment: the times
recorded for it never go backwards, whichever clock wrote them (an end is never
before the creation or the times it closes, a new attempt is created after its
trial and the attempts before it, a job seen ended after it was submitted), and a
grace period one node started (the reconciler lease's too) lasts as long when the
other judges it.

No cluster: one trial on an in-process backend (the fake of ``test_exit_confirmed``)
whose job ends; the first records are moved as a clock 10 minutes ahead would have
written them, and the tick runs on an injected clock (``tests._clock``).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from dlhpc._fileclock import file_time
from dlhpc.errors import LeaseHeldError
from dlhpc.orchestrator import kill_experiment
from dlhpc.orchestrator.recovery import EXIT_RECORD_GRACE
from dlhpc.orchestrator.tick import tick
from dlhpc.protocol import EventWriter
from dlhpc.scheduler import JobState
from dlhpc.store import Attempt, Decision, Experiment, Store, Submission, Trial
from dlhpc.store import store as store_mod
from tests._clock import LaterClock, SkewedClock
from tests.unit.test_exit_confirmed import _launched

SKEW = timedelta(minutes=10)
# (how far ahead the first records were written, how far off the ticking node's clock is)
NODES = {"written ahead": (SKEW, timedelta(0)), "tick behind": (timedelta(0), -SKEW)}


def _as_written(s: Session, by: timedelta) -> None:
    """Every time recorded so far, as a login node ``by`` off would have written it."""
    rows: list[Experiment | Trial | Submission | Attempt] = []
    for model in (Experiment, Trial, Submission, Attempt):
        rows.extend(s.scalars(select(model)))
    for row in rows:
        row.created_at += by


def _in_order(s: Session) -> list[str]:
    """Every pair of recorded times that goes backwards, named."""
    bad: list[str] = []

    def after(what: str, later: datetime | None, *earlier: datetime | None) -> None:
        if later is not None and any(e is not None and later < e for e in earlier):
            bad.append(f"{what}: {later} before one of {earlier}")

    for exp in s.scalars(select(Experiment)):
        ends = [t.ended_at for t in exp.trials]
        after(f"experiment {exp.id} ended", exp.ended_at, exp.created_at, *ends)
        for sub in s.scalars(select(Submission)):
            after(f"submission {sub.id}", sub.created_at, exp.created_at)
        for t in exp.trials:
            after(f"trial {t.id} created", t.created_at, exp.created_at)
            times = [x for a in t.attempts for x in (a.created_at, a.terminal_seen_at)]
            after(f"trial {t.id} ended", t.ended_at, t.created_at, *times)
            for prev, a in zip([None, *t.attempts], t.attempts, strict=False):
                old = (prev.created_at, prev.terminal_seen_at) if prev else ()
                after(f"attempt {a.attempt_key} created", a.created_at, t.created_at, *old)
                after(f"attempt {a.attempt_key} seen ended", a.terminal_seen_at, a.created_at)
    for d in s.scalars(select(Decision)):
        after(f"decision {d.id} acted", d.acted_at, d.decided_at)
    return bad


def _publish_exit(adir: Path, code: int) -> None:
    """The job's last records (its one step, then its exit), as its worker writes them."""
    now = time.time()
    reason = "completed" if code == 0 else "error"
    EventWriter(adir, "worker-r0").publish(
        [
            {"type": "metric", "time": now, "step": 1, "metrics": {"loss": 0.5}},
            {"type": "exit", "time": now, "code": code, "reason": reason},
        ]
    )


@pytest.mark.parametrize("nodes", NODES.values(), ids=NODES.keys())
def test_an_ended_experiment_ends_after_it_began(
    tmp_path: Path, nodes: tuple[timedelta, timedelta]
) -> None:
    written, ticking = nodes
    store, pool, backend, _tid, adir = _launched(tmp_path)
    with store.write() as s:
        _as_written(s, written)
    _publish_exit(adir, 0)
    backend.state = JobState.COMPLETED
    report = tick(store, pool, SkewedClock(ticking))
    assert report.errors == [] and report.finished, report
    with store.read() as s:
        assert s.scalars(select(Experiment.state)).all() == ["COMPLETED"]
        assert _in_order(s) == []


@pytest.mark.parametrize("nodes", NODES.values(), ids=NODES.keys())
def test_a_resubmitted_trial_attempt_comes_after_the_one_it_replaces(
    tmp_path: Path, nodes: tuple[timedelta, timedelta]
) -> None:
    """The job crashed: the tick sees it ended and submits the trial again."""
    written, ticking = nodes
    store, pool, backend, _tid, adir = _launched(tmp_path)
    with store.write() as s:
        _as_written(s, written)
    _publish_exit(adir, 1)
    backend.state = JobState.FAILED
    assert tick(store, pool, SkewedClock(ticking)).errors == []
    with store.read() as s:
        assert len(s.scalars(select(Attempt)).all()) == 2  # submitted again
        assert _in_order(s) == []


def test_a_kill_ends_the_experiment_after_it_began(tmp_path: Path) -> None:
    """``dlhpc kill`` of an experiment recorded by a clock 10 minutes ahead."""
    store, pool, _backend, _tid, _adir = _launched(tmp_path)
    with store.write() as s:
        _as_written(s, SKEW)
    with store.read() as s:
        (exp_id,) = s.scalars(select(Experiment.id)).all()
    assert kill_experiment(store, pool, exp_id) == 1
    with store.read() as s:
        assert s.scalars(select(Experiment.state)).all() == ["KILLED"]
        assert _in_order(s) == []


# (the clock of the login node that saw the job gone first, the other's)
GONE = {"right, then ahead": (timedelta(0), SKEW), "ahead, then right": (SKEW, timedelta(0))}


@pytest.mark.parametrize("nodes", GONE.values(), ids=GONE.keys())
def test_a_gone_job_gets_its_grace_whichever_login_node_saw_it_first(
    tmp_path: Path, nodes: tuple[timedelta, timedelta]
) -> None:
    """The job left the queue without an exit record (it may show late on a shared
    filesystem): the trial is submitted again once :data:`EXIT_RECORD_GRACE` has
    passed since a login node first saw it gone, not sooner or later by the
    difference of the two nodes' clocks."""
    first, second = nodes
    store, pool, backend, _tid, _adir = _launched(tmp_path)
    backend.state = JobState.COMPLETED
    assert tick(store, pool, SkewedClock(first)).errors == []
    assert tick(store, pool, SkewedClock(second)).errors == []
    assert len(backend.submitted) == 1  # within the grace: waits for the exit record
    after = EXIT_RECORD_GRACE + timedelta(seconds=5)
    assert tick(store, pool, LaterClock(after, second)).errors == []
    assert len(backend.submitted) == 2
    with store.read() as s:
        assert _in_order(s) == []


def _node(
    monkeypatch: pytest.MonkeyPatch, skew: timedelta, later: timedelta = timedelta(0)
) -> None:
    """The next lease calls run on a login node ``skew`` off, the world ``later`` on."""
    real_now = store_mod.utcnow
    monkeypatch.setattr(store_mod, "utcnow", lambda: real_now() + later + skew)
    monkeypatch.setattr(store_mod, "file_time", lambda d: file_time(d) + later.total_seconds())


@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_the_lease_lasts_its_ttl_whichever_login_node_judges_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skew: timedelta
) -> None:
    """A login node 10 minutes off neither takes the lease that another holds (within
    its time to live) nor waits for one that expired by the skew longer."""
    ttl = timedelta(seconds=Store(tmp_path).lease_ttl_s)
    holder, other = Store(tmp_path), Store(tmp_path)
    with holder.hold_lease():
        with monkeypatch.context() as m:
            _node(m, skew, ttl / 2)
            with pytest.raises(LeaseHeldError), other.hold_lease():
                pass
        with monkeypatch.context() as m:
            _node(m, skew, ttl + timedelta(seconds=5))
            with other.hold_lease(), other.write():  # expired: taken, and still held
                pass
