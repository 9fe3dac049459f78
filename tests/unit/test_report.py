"""``dlhpc report``: the HDF5 curve archive, the page model, escaping, atomic writes, size."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import math
import os
import re
import time
from datetime import datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import delete, select

from dlhpc.cli.main import cli
from dlhpc.orchestrator.clock import SYSTEM_CLOCK
from dlhpc.orchestrator.tick import TickReport, _ingest_batches
from dlhpc.protocol import EventWriter
from dlhpc.report._curves import (
    Curve,
    archive_trials,
    curves_path,
    read_curves,
    write_curves,
)
from dlhpc.report._html import render_page
from dlhpc.report._load import load_page
from dlhpc.report._page_data import (
    AttemptView,
    Page,
    TrialView,
    Usage,
    attempt_spans,
    compute_usage,
    hparam_views,
    pick_best,
    rungs_of,
    step_seconds,
)
from dlhpc.report._record import parse_record, repro_record
from dlhpc.report.build import page_file, write_all, write_report
from dlhpc.store import Attempt, Event, Experiment, GpuSample, Metric, Store, Trial

T0 = datetime(2025, 1, 1, 12, 0, 0)
HOSTILE = (
    "<script>alert(1)</script>",
    '"onmouseover="alert(2)',
    "'><img src=x onerror=alert(3)>",
    "</svg><script>alert(4)</script>",
    "</title></textarea><script>alert(5)</script>",
)


def _config(space: dict[str, Any], gpus: int = 0, nodes: int = 1) -> str:
    return json.dumps(
        {
            "entrypoint": "python train.py",
            "resources": {
                "nodes": nodes,
                "gpus_per_node": gpus,
                "tasks_per_node": max(1, gpus),
                "cpus_per_task": 2,
            },
            "searcher": {"name": "asha", "max_length": 9, "divisor": 3, "max_rungs": 3},
            "hyperparameters": space,
            "reproducibility": {"seed": 1, "deterministic": False},
        }
    )


def _experiment(
    store: Store,
    root: Path,
    *,
    name: str = "exp",
    metric: str = "val_loss",
    space: dict[str, Any] | None = None,
    gpus: int = 0,
    nodes: int = 1,
) -> int:
    space = space if space is not None else {"lr": {"type": "log"}, "bs": {"type": "categorical"}}
    with store.write() as s:
        e = Experiment(
            name=name,
            description=f"about {name}",
            state="COMPLETED",
            backend="local",
            site="local",
            searcher="asha",
            metric=metric,
            smaller_is_better=True,
            source_path=str(root / "exp.yaml"),
            yaml_text=f"name: {name}\n",
            config_json=_config(space, gpus, nodes),
            run_dir=str(root / "run"),
            user="me",
            created_at=T0,
            ended_at=T0 + timedelta(hours=2),
        )
        s.add(e)
        s.flush()
        return e.id


def _trial(
    store: Store,
    exp_id: int,
    root: Path,
    *,
    hparams: dict[str, Any],
    state: str,
    losses: list[float],
    attempts: list[tuple[float, float | None, str]],
    metric: str = "val_loss",
    seconds_per_step: float = 60.0,
) -> int:
    """A trial with metric rows (one per loss, steps 1..n) and attempts (start, end
    minutes after T0, cause)."""
    with store.write() as s:
        t = Trial(
            experiment_id=exp_id,
            request_id=s.query(Trial).filter(Trial.experiment_id == exp_id).count(),
            state=state,
            hparams_json=json.dumps(hparams),
            max_length=9,
            seed=0,
            run_dir="",
            steps_completed=len(losses),
            best_metric=min(losses) if losses else None,
            latest_metric=losses[-1] if losses else None,
            created_at=T0,
            ended_at=T0 + timedelta(hours=2),
        )
        s.add(t)
        s.flush()
        t.run_dir = str(root / f"trial-{t.id}")
        a_ids = []
        for i, (start, end, cause) in enumerate(attempts):
            a = Attempt(
                trial_id=t.id,
                attempt_key=f"{t.id}_0.r{i}",
                job_id=f"{t.id}_0",
                state="COMPLETED" if end is not None else "RUNNING",
                started_at=T0 + timedelta(minutes=start),
                ended_at=None if end is None else T0 + timedelta(minutes=end),
                cause=cause,
                exit_code=0 if end is not None else None,
                created_at=T0 + timedelta(minutes=start),
            )
            s.add(a)
            s.flush()
            a_ids.append(a.id)
        t0 = (T0 + timedelta(minutes=attempts[0][0])).timestamp() if attempts else 0.0
        for step, v in enumerate(losses, start=1):
            s.add(
                Metric(
                    trial_id=t.id,
                    attempt_id=a_ids[-1],
                    step=step,
                    name=metric,
                    value=None if math.isnan(v) else v,
                    time=t0 + step * seconds_per_step,
                )
            )
        return t.id


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "home")


# -- the HDF5 archive -----------------------------------------------------------------


def test_curves_round_trip_with_nan_and_hostile_names(tmp_path: Path) -> None:
    curves = {
        "val/loss<x>": Curve((1, 2, 3), (0.5, math.nan, 0.25), (10.0, 20.0, 30.0)),
        HOSTILE[0]: Curve((5,), (1.0,), (1.5,)),
        "empty": Curve((), (), ()),
    }
    path = tmp_path / "curves.h5"
    write_curves(path, 7, curves)
    back = read_curves(path)
    assert back is not None and (back.rows, back.max_step) == (4, 5)
    assert set(back.curves) == set(curves)
    got = back.curves["val/loss<x>"]
    assert got.steps == (1, 2, 3) and got.times == (10.0, 20.0, 30.0)
    assert got.values[0] == 0.5 and math.isnan(got.values[1])
    assert [p.name for p in tmp_path.iterdir()] == ["curves.h5"]  # no temp file left
    assert read_curves(tmp_path / "missing.h5") is None
    (tmp_path / "torn.h5").write_bytes(path.read_bytes()[:100])
    assert read_curves(tmp_path / "torn.h5") is None  # unreadable: the report uses the DB


def test_the_tick_writes_no_archive_and_the_report_keeps_them(store: Store, tmp_path: Path) -> None:
    """The tick only ingests; the first page build finds no archive, takes the curve
    from the rows and writes the archive; the next one reads it (even once the DB
    dropped the rows: it keeps the summaries)."""
    exp_id = _experiment(store, tmp_path)
    tid = _trial(
        store, exp_id, tmp_path, hparams={"lr": 0.1}, state="COMPLETED", losses=[], attempts=[]
    )
    adir = tmp_path / f"trial-{tid}" / "attempts" / "9_0.r0"
    w = EventWriter(adir, "user-r0")
    for step in (1, 2, 3):
        w.add("metric", step=step, metrics={"val_loss": 1.0 / step, "acc": step / 10})
    w.flush()
    report = TickReport()
    _ingest_batches(store, [(tid, adir)], report, SYSTEM_CLOCK)
    assert report.metrics == 6 and report.errors == []
    assert not curves_path(tmp_path / f"trial-{tid}").exists()
    page = load_page(store, exp_id, T0 + timedelta(hours=3))
    assert page.curve_sources == {"hdf5": 0, "db": 1, "none": 0}
    assert page.trials[0].curve is not None and page.trials[0].curve.steps == (1, 2, 3)
    archive = read_curves(curves_path(tmp_path / f"trial-{tid}"))
    assert archive is not None and archive.rows == 6
    assert archive.curves["val_loss"].values == (1.0, 0.5, 1.0 / 3)
    with store.write() as s:
        s.execute(delete(Metric).where(Metric.trial_id == tid))
    page = load_page(store, exp_id, T0 + timedelta(hours=3))
    (t,) = page.trials
    assert t.curve is not None and t.curve.steps == (1, 2, 3)
    assert page.curve_sources == {"hdf5": 1, "db": 0, "none": 0}
    assert page.other_metrics == ("acc",)
    assert "1 trial(s), from the DB for 0" in render_page(page)


def test_a_page_rewrites_a_bounded_number_of_stale_archives(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ended trials' stale archives first, up to their budget; running trials' only
    when older than REFRESH_EVERY, oldest first, up to theirs. The rest of the
    curves come from the rows, and are the same."""
    load = importlib.import_module("dlhpc.report._load")
    monkeypatch.setattr(load, "REFRESH_ENDED", 1)
    monkeypatch.setattr(load, "REFRESH_RUNNING", 1)
    exp_id = _experiment(store, tmp_path)
    states = ["COMPLETED", "STOPPED_EARLY", "RUNNING", "RUNNING", "RUNNING"]
    tids = [
        _trial(
            store,
            exp_id,
            tmp_path,
            hparams={"lr": 0.1 * (i + 1)},
            state=st,
            losses=[0.5, 0.4],
            attempts=[(0, 10, "completed")],
        )
        for i, st in enumerate(states)
    ]
    ended, running = tids[:2], tids[2:]

    def path(tid: int) -> Path:
        return curves_path(tmp_path / f"trial-{tid}")

    # running trials' archives: one fresh (not due), two stale of different ages
    for tid, age in zip(running, (10.0, 700.0, 7000.0), strict=True):
        archive_trials(store, {tid: str(tmp_path / f"trial-{tid}")})
        stamp = time.time() - age
        os.utime(path(tid), (stamp, stamp))
    with store.write() as s:
        for tid in tids:
            aid = s.scalar(select(Attempt.id).where(Attempt.trial_id == tid))
            s.add(
                Metric(trial_id=tid, attempt_id=aid, step=9, name="val_loss", value=0.3, time=1.0)
            )
    page = load_page(store, exp_id, T0)
    assert all(t.curve is not None and t.curve.values[-1] == 0.3 for t in page.trials)
    assert page.curve_sources == {"hdf5": 0, "db": 5, "none": 0}

    def rows(tid: int) -> int | None:
        archive = read_curves(path(tid))
        return None if archive is None else archive.rows

    # ended: the first one (budget 1); running: the oldest due one
    assert [rows(t) for t in ended] == [3, None]
    assert [rows(t) for t in running] == [2, 2, 3]
    page = load_page(store, exp_id, T0)  # the next build: the others' turn
    assert [rows(t) for t in ended] == [3, 3]
    assert [rows(t) for t in running] == [2, 3, 3]
    assert page.curve_sources == {"hdf5": 2, "db": 3, "none": 0}


def test_a_trial_without_a_run_folder_gets_its_curve_from_the_db(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a relative "curves.h5" must not be looked at or written
    exp_id = _experiment(store, tmp_path)
    tid = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.1},
        state="COMPLETED",
        losses=[0.9, 0.5],
        attempts=[(0, 10, "completed")],
    )
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        t.run_dir = ""
    page = load_page(store, exp_id, T0)
    assert page.trials[0].curve is not None and page.trials[0].curve.values == (0.9, 0.5)
    assert page.curve_sources == {"hdf5": 0, "db": 1, "none": 0}
    assert not (tmp_path / "curves.h5").exists()


def test_a_stale_or_missing_archive_falls_back_to_the_db(store: Store, tmp_path: Path) -> None:
    exp_id = _experiment(store, tmp_path)
    a = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.1},
        state="COMPLETED",
        losses=[0.9, 0.5],
        attempts=[(0, 10, "completed")],
    )
    b = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.2},
        state="COMPLETED",
        losses=[0.8],
        attempts=[(0, 10, "completed")],
    )
    assert archive_trials(store, {a: str(tmp_path / f"trial-{a}")})[1] == []
    with store.write() as s:  # a point the archive has not seen (killed before rewriting)
        s.add(Metric(trial_id=a, attempt_id=1, step=3, name="val_loss", value=0.4, time=1.0))
    page = load_page(store, exp_id, T0)
    by_id = {t.id: t for t in page.trials}
    assert by_id[a].curve is not None and by_id[a].curve.values == (0.9, 0.5, 0.4)
    assert by_id[b].curve is not None and by_id[b].curve.values == (0.8,)
    assert page.curve_sources == {"hdf5": 0, "db": 2, "none": 0}


def test_archive_errors_are_reported_not_raised(store: Store, tmp_path: Path) -> None:
    exp_id = _experiment(store, tmp_path)
    tid = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={},
        state="COMPLETED",
        losses=[1.0],
        attempts=[(0, 1, "completed")],
    )
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    _, errors = archive_trials(store, {tid: str(blocker / "trial")})
    assert len(errors) == 1 and errors[0].startswith(f"trial {tid}: archiving curves")


# -- the page model ---------------------------------------------------------------------


def test_page_model_summary_usage_and_rungs(store: Store, tmp_path: Path) -> None:
    exp_id = _experiment(store, tmp_path, gpus=4, nodes=2)
    best = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.01, "bs": 64},
        state="COMPLETED",
        losses=[0.9, 0.5, 0.3, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1],
        attempts=[(0, 30, "preempted"), (35, 65, "completed")],
    )
    stopped = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.1, "bs": 32},
        state="STOPPED_EARLY",
        losses=[0.95, 0.9, 0.85],
        attempts=[(0, 3, "paused"), (5, 10, "paused")],
    )
    with store.write() as s:
        s.add(
            Event(
                experiment_id=exp_id, trial_id=stopped, time=T0, kind="log.info", message="chatter"
            )
        )
        s.add(
            Event(
                experiment_id=exp_id,
                trial_id=stopped,
                time=T0,
                kind="trial.stop",
                message="stopped early by the searcher",
            )
        )
        a_id = s.query(Attempt.id).filter(Attempt.trial_id == best).first()[0]  # type: ignore[index]
        for i, util in enumerate((80, 100)):
            s.add(
                GpuSample(
                    attempt_id=a_id, time=T0.timestamp() + 60 * i, host="n1", gpu_index=0, util=util
                )
            )
    page = load_page(store, exp_id, T0 + timedelta(hours=3))
    assert page.best is not None and page.best.id == best and page.best.best == 0.1
    assert page.rungs == (1, 3, 9) and page.max_length == 9
    assert [e.kind for e in page.events] == ["trial.stop"]  # log.info is left out
    assert page.elapsed_s == 7200.0
    u = page.usage
    assert (u.unit, u.per_attempt) == ("GPU", 8)
    # runs: 30 + 30 + 3 + 5 = 68 minutes on 8 GPUs
    assert u.used_h == pytest.approx(68 / 60 * 8, abs=1e-3)
    # stopped: 6 steps left at the median report interval of 60 s, on 8 GPUs
    assert u.stopped_trials == 1 and u.saved_h == pytest.approx(6 * 60 * 8 / 3600)
    t = next(t for t in page.trials if t.id == best)
    assert [a.cause for a in t.attempts] == ["preempted", "completed"]
    assert t.attempts[0].gpu_util == 90.0
    assert {h.name: h.kind for h in page.hparams} == {"bs": "categorical", "lr": "log"}
    assert page.repro["experiment file (as given)"].endswith("exp.yaml")
    assert page.repro["code snapshot"].endswith("run/code")
    assert page.disk is not None and page.disk.checkpoints == 0
    html = render_page(page)
    assert "GPU-hours saved by early stopping" in html and "rung 3: 9" in html
    assert "(measured, 1 trials stopped early)" in html  # its own 60 s steps, no start-up
    assert "checkpoint disk use" in html and "0 B in 0 checkpoint(s)" in html


def test_saved_hours_use_each_stopped_trials_own_measured_step_time() -> None:
    """GPU-hours saved: remaining steps x the trial's own seconds per step, from its
    reports within an attempt; from attempt start when it reported once per attempt."""

    def att(key: str, start: float) -> AttemptView:
        return AttemptView(key, key, "COMPLETED", "paused", start=start, end=start + 60)

    # rung 1 in attempt x (25 s start-up + 5 s), steps 2-3 in attempt y: one 7 s step
    # within an attempt; the first report of each attempt (start-up) is not used
    resumed = TrialView(
        1,
        "STOPPED_EARLY",
        {},
        3,
        0.5,
        0.5,
        attempts=(att("x", 100.0), att("y", 200.0)),
        curve=Curve((1, 2, 3), (0.5,) * 3, (130.0, 230.0, 237.0)),
    )
    # one report per attempt: start to report, start-up included (30 + 50 s over 3 steps)
    once = TrialView(
        2,
        "STOPPED_EARLY",
        {},
        3,
        0.4,
        0.4,
        attempts=(att("p", 0.0), att("q", 100.0)),
        curve=Curve((1, 3), (0.4, 0.4), (30.0, 150.0)),
    )
    fast = TrialView(  # its own 2 s per step, whatever the others take
        3,
        "STOPPED_EARLY",
        {},
        4,
        0.3,
        0.3,
        attempts=(att("r", 0.0),),
        curve=Curve((1, 2, 3, 4), (0.3,) * 4, (40.0, 42.0, 44.0, 46.0)),
    )
    assert step_seconds(resumed) == (7.0, False)
    assert step_seconds(once) == pytest.approx((80.0 / 3, True))
    assert step_seconds(fast) == (2.0, False)
    u = compute_usage([resumed, once, fast], {"gpus_per_node": 2}, 9)
    assert (u.stopped_trials, u.startup_trials) == (3, 1)
    assert u.saved_h == pytest.approx((6 * 7.0 + 6 * 80.0 / 3 + 5 * 2.0) * 2 / 3600)


def test_pure_model_functions() -> None:
    def tv(
        tid: int,
        state: str,
        steps: int,
        best: float | None,
        run_s: float = 0.0,
        times: tuple[float, ...] = (),
    ) -> TrialView:
        curve = Curve(tuple(range(1, len(times) + 1)), tuple(1.0 for _ in times), times)
        return TrialView(
            tid, state, {}, steps, best, best, curve=curve if times else None, run_s=run_s
        )

    trials = [
        tv(1, "COMPLETED", 9, 0.5, 900, (0, 10, 20, 30, 40)),  # 10 s/step
        tv(2, "STOPPED_EARLY", 3, math.nan, 300, (0, 30)),  # its own 30 s/step, not 10
        tv(3, "STOPPED_EARLY", 1, 0.7, 100),  # no curve: its run time per step
        tv(4, "FAILED", 0, None),
    ]
    assert pick_best(trials, smaller_is_better=True) is trials[0]
    assert pick_best(trials, smaller_is_better=False) is trials[2]
    assert pick_best(trials[3:], True) is None
    # no attempts: every point continues the one before (same, unknown attempt)
    assert [step_seconds(t) for t in trials] == [(10.0, False), (30.0, False), (100.0, True), None]
    u = compute_usage(trials, {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 4}, 9)
    assert (u.unit, u.per_attempt) == ("CPU", 4)
    assert u.used_h == pytest.approx(1300 * 4 / 3600)
    assert u.saved_h == pytest.approx((6 * 30 + 8 * 100) * 4 / 3600)
    assert (u.stopped_trials, u.startup_trials) == (2, 1)
    given = compute_usage(trials, {"gpus_per_node": 2}, 9, (1.25, 0.0))
    assert (given.unit, given.per_attempt, given.used_h) == ("GPU", 2, 1.25)
    assert rungs_of({"name": "hyperband", "max_length": 27, "divisor": 3, "max_rungs": 9}) == (
        1,
        3,
        9,
        27,
    )
    assert rungs_of({"name": "random", "max_length": 27}) == ()
    views = hparam_views(
        {"lr": {"type": "log"}, "n": {"type": "int"}, "c": {"type": "const"}},
        [TrialView(1, "X", {"lr": 0.1, "n": "many", "extra": 3}, 0, None, None)],
    )
    assert [(v.name, v.kind) for v in views] == [
        ("c", "const"),
        ("extra", "double"),
        ("lr", "log"),
        ("n", "categorical"),
    ]
    a = [
        AttemptView("k0", "j", "COMPLETED", "preempted", start=0.0, end=None, terminal_seen=50),
        AttemptView("k1", "j", "RUNNING", "", start=60.0),
        AttemptView("k2", "j", "PENDING", ""),
    ]
    assert attempt_spans(a, now=100.0) == [(0.0, 50.0), (60.0, 100.0), None]


def test_an_experiment_with_no_trials_or_a_bad_config_renders(store: Store, tmp_path: Path) -> None:
    exp_id = _experiment(store, tmp_path)
    with store.write() as s:
        e = s.get(Experiment, exp_id)
        assert e is not None
        e.config_json = "{not json"
    page = load_page(store, exp_id, T0)
    assert page.trials == () and page.best is None and page.rungs == ()
    html = render_page(page)
    assert "No metric reported yet" in html and "No attempt has started yet" in html


def test_attempt_environments_are_summarised_in_the_record() -> None:
    from dlhpc.report._record import attempt_environments

    h100 = {"name": "NVIDIA H100 80GB HBM3"}
    env = {"nodes": "node1", "cpu": {"model": "EPYC"}, "gpu": {"devices": [h100, h100],
           "driver": "580.159.04", "cuda_driver": "13.0"}}  # fmt: skip
    cpu_only = {"host": "node2", "cpu": {"model": "EPYC"}, "gpu": {"devices": []}}
    summary, lines = attempt_environments(
        [json.dumps(env), json.dumps(env), json.dumps(cpu_only), "{}"]
    )
    assert summary == "3 attempt(s) recorded, 2 distinct; 1 without a record"
    assert lines.splitlines() == [
        "2 attempt(s): node1: EPYC; 2 x NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0)",
        "1 attempt(s): node2: EPYC; no GPU",
    ]
    items, texts = repro_record({}, {}, {}, [json.dumps(env)])
    assert items["attempt environments"] == "1 attempt(s) recorded, 1 distinct"
    assert "H100" in texts["attempt environments (nodes: CPU; GPUs)"]


def test_repro_record_shows_the_launch_record_and_what_is_missing() -> None:
    facts = {"source_path": "/x/exp.yaml", "run_dir": "/runs/exp-1", "site": "s", "backend": "b"}
    items, texts = repro_record(facts, {"entrypoint": "python t.py"}, {})
    assert items["code snapshot"] == "/runs/exp-1/code" and items["user"] == "(not recorded)"
    assert items["launch record"].startswith("(none") and texts == {}
    record = {
        "code": {"kind": "git", "commit": "abc123", "branch": "main", "dirty": True,
                 "root": "/src", "diff": "+x = 1\n", "digest": "d1"},
        "config": {"yaml_sha256": "y", "resolved_sha256": "r"},
        "python": {"version": "3.11.7", "implementation": "CPython", "executable": "/py"},
        "packages": {"source": "pip freeze", "items": {"torch": "2.3.0", "dlhpc": "0.1.0"}},
        "conda": None, "modules": {"loaded": ["cuda/12.1"]}, "slurm": {"version": "22.05.8"},
        "data": [{"path": "/data", "hash": "h"}], "collected_at": 1.7e9, "host": "login1",
    }  # fmt: skip
    items, texts = repro_record(facts, {}, record)
    assert items["code"] == "git abc123 on main, uncommitted changes; /src"
    assert items["python at launch"] == "CPython 3.11.7 /py"
    assert items["dlhpc at launch"] == "0.1.0" and items["packages"] == "2 (pip freeze)"
    assert items["environment modules"] == "cuda/12.1" and items["Slurm"] == "22.05.8"
    assert items["data"] == "/data: h" and items["recorded"].endswith("on login1")
    assert texts == {
        "uncommitted diff at launch": "+x = 1\n",
        "packages at launch": "dlhpc==0.1.0\ntorch==2.3.0",
    }
    items, _ = repro_record(facts, {}, {"code": {"kind": "snapshot", "error": "too big"}})
    assert items["code"] == "snapshot: too big"
    assert parse_record("[1]") == {} and parse_record("{bad") == {} and parse_record(None) == {}


# -- escaping ---------------------------------------------------------------------------


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.scripts if self._in_script else self.text).append(data)


_ALLOWED_TAGS = {
    "html", "head", "meta", "link", "title", "style", "body", "p", "a", "h1", "h2", "h3",
    "span", "i", "dl", "dt", "dd", "div", "svg", "g", "rect", "line", "text", "polyline",
    "path", "circle", "table", "thead", "tbody", "tr", "th", "td", "details", "summary",
    "pre", "script",
    "label", "select", "option",  # the index's user filter (no form: nothing is sent)
}  # fmt: skip


def _assert_safe(html: str, hostile: tuple[str, ...]) -> _Tags:
    p = _Tags()
    p.feed(html)
    names = {t for t, _ in p.tags}
    assert names <= _ALLOWED_TAGS, names - _ALLOWED_TAGS
    assert [t for t, _ in p.tags].count("script") == 1  # ours, at the end
    for _, attrs in p.tags:
        for key, value in attrs:
            assert not key.startswith("on"), (key, value)
            assert not (value or "").strip().lower().startswith("javascript:")
    text = "".join(p.text)
    for h in hostile:
        assert h in text or h in "".join(v or "" for _, a in p.tags for _, v in a), h
    assert "alert" not in "".join(p.scripts)
    # the CSP names the one script and the one style block by their hashes
    csp = next(
        v
        for t, a in p.tags
        if t == "meta"
        for k, v in a
        if k == "content" and v and "default-src" in v
    )
    script = re.search(r"<script>(.*?)</script>", html, re.S)
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    assert script and style
    for body in (script.group(1), style.group(1)):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp
    assert not re.search(r"\b(?:src|href)=\"(?:https?:)?//", html)  # nothing remote
    assert ' style="' not in html  # the CSP allows no inline style attribute
    return p


def test_hostile_names_and_values_are_shown_as_text(store: Store, tmp_path: Path) -> None:
    h0, h1, h2, h3, h4 = HOSTILE
    exp_id = _experiment(
        store,
        tmp_path,
        name=h3,
        metric=h0,
        space={h3: {"type": "log"}, h1: {"type": "categorical"}},
    )
    with store.write() as s:
        e = s.get(Experiment, exp_id)
        assert e is not None
        e.description, e.yaml_text, e.source_path, e.user, e.site = h4, h2, h1, h0, h3
        e.repro_json = json.dumps(
            {"code": {"kind": "git", "commit": h0, "branch": h3, "diff": h2, "root": h1},
             "packages": {"source": h4, "items": {h0: h3}}, "modules": {"loaded": [h2]}}
        )  # fmt: skip
    tid = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={h3: h2, h1: h0, "ok": 1.0},
        state=h4,
        losses=[0.5, 0.4],
        attempts=[(0, 5, h1), (6, 9, "crash")],
        metric=h0,
    )
    _trial(
        store,
        exp_id,
        tmp_path,
        hparams={h3: 0.1, h1: h3},
        state="STOPPED_EARLY",
        losses=[0.6],
        attempts=[(0, 2, "paused")],
        metric=h0,
    )
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        t.error = f"Traceback: {h2}\n{h0}"
        for a in t.attempts:
            a.node_list, a.exit_reason = h2, h4
            a.env_json = json.dumps(
                {
                    "nodes": h1,
                    "cpu": {"model": h2},
                    "gpu": {"devices": [{"name": h0}], "driver": h3},
                }
            )
        s.add(Event(experiment_id=exp_id, trial_id=tid, time=T0, kind=f"log.error{h1}", message=h0))
        s.add(
            Metric(trial_id=tid, attempt_id=t.attempts[0].id, step=1, name=h4, value=1.0, time=0.0)
        )
    archive_trials(store, {tid: str(tmp_path / f"trial-{tid}")})
    page = load_page(store, exp_id, T0 + timedelta(hours=3))
    html = render_page(page)
    _assert_safe(html, HOSTILE)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<svg") == html.count("</svg>")  # no chart was closed early
    assert html.count("<script") == 1

    out = tmp_path / "all"
    result = write_all(store, out, now=T0 + timedelta(hours=3))
    index = (out / "index.html").read_text()
    _assert_safe(index, (h3,))
    assert f'href="{page_file(exp_id)}"' in index and len(result.written) == 3
    assert 'href="models.html"' in index  # the models index, written beside it


# -- files and the command ----------------------------------------------------------------


def test_pages_are_replaced_atomically(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp_id = _experiment(store, tmp_path)
    _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.1},
        state="COMPLETED",
        losses=[0.5],
        attempts=[(0, 1, "completed")],
    )
    out = tmp_path / "r" / "page.html"
    size = write_report(store, exp_id, out)
    first = out.read_bytes()
    assert len(first) == size and first.endswith(b"</html>\n")

    def torn(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("dlhpc.protocol.atomic.os.replace", torn)
    with pytest.raises(Exception, match="cannot write .*No space left"):
        write_report(store, exp_id, out)
    assert out.read_bytes() == first  # the old page, whole
    assert sorted(p.name for p in out.parent.iterdir()) == ["page.html"]  # no temp left


def test_report_command(home: Path, tmp_path: Path) -> None:
    store = Store(home)
    exp_id = _experiment(store, tmp_path, name="digits")
    _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.1, "bs": 32},
        state="COMPLETED",
        losses=[0.5, 0.4],
        attempts=[(0, 1, "completed")],
    )
    run = CliRunner().invoke
    env = {"DLHPC_SITE": "local"}
    for args in ([], ["1", "--all"], ["--all"], ["1", "--out-dir", "x"], ["--all", "-o", "f"]):
        r = run(cli, ["report", *args], env=env)
        assert r.exit_code == 2, (args, r.output)
    r = run(cli, ["report", "99", "-o", str(tmp_path / "x.html")], env=env)
    assert r.exit_code == 2 and "no experiment 99" in r.output
    page = tmp_path / "one.html"
    r = run(cli, ["report", str(exp_id), "-o", str(page)], env=env)
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "<h1>Experiment 1: digits" in page.read_text()
    out = tmp_path / "site"
    r = run(cli, ["report", "--all", "--out-dir", str(out)], env=env)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["exp-000001.html", "index.html", "models.html"]
    # the experiment had ended before its page was written: a rebuild keeps that page
    r = run(cli, ["report", "--all", "--out-dir", str(out), "-q"], env=env)
    assert r.exit_code == 0 and r.output == ""
    r = run(cli, ["report", "--all", "--out-dir", str(out)], env=env)
    assert "1 unchanged page(s) kept" in r.output
    r = run(cli, ["report", "--all", "--out-dir", str(out), "--force"], env=env)
    assert "wrote 1 page(s)" in r.output and "kept" not in r.output


# -- size -------------------------------------------------------------------------------


def synthetic_page(n_trials: int = 1000, points: int = 100) -> Page:
    """A page of ``n_trials`` trials with ``points`` points each (no DB)."""
    trials = []
    t0 = 1.7e9
    for i in range(n_trials):
        rate = 0.01 + (i % 97) / 2000
        steps = tuple(range(1, points + 1))
        values = tuple(2.0 * math.exp(-rate * s) + 0.05 * math.sin(i + s) for s in steps)
        times = tuple(t0 + i * 30 + s * 7.5 for s in steps)
        attempts = (
            AttemptView(
                f"{i}_0.r0",
                f"{i}_0",
                "COMPLETED",
                "preempted",
                143,
                "signal/TERM",
                3,
                "node01",
                start=t0 + i * 30,
                end=t0 + i * 30 + 300,
            ),
            AttemptView(
                f"{i}_0.r1",
                f"{i}_0",
                "COMPLETED",
                "completed",
                0,
                "completed",
                None,
                "node02",
                start=t0 + i * 30 + 320,
                end=t0 + i * 30 + 800,
                gpu_util=70 + i % 30,
                gpus_seen=4,
            ),
        )
        trials.append(
            TrialView(
                i + 1,
                "COMPLETED" if i % 3 else "STOPPED_EARLY",
                {
                    "lr": 10 ** (-4 + (i % 31) / 10),
                    "batch_size": (32, 64, 128)[i % 3],
                    "dropout": (i % 11) / 20,
                    "hidden": 16 + i % 113,
                },
                points,
                min(values),
                values[-1],
                1,
                0,
                "",
                attempts,
                Curve(steps, values, times),
                780.0,
            )
        )
    space = {
        "lr": {"type": "log"},
        "batch_size": {"type": "categorical"},
        "dropout": {"type": "double"},
        "hidden": {"type": "int"},
    }
    return Page(
        id=1, name="synthetic", description="", state="COMPLETED", searcher="asha",
        metric="val_loss", smaller_is_better=True, created=t0, ended=t0 + 40000,
        generated=t0 + 40000, trials=tuple(trials), best=pick_best(trials, True),
        hparams=hparam_views(space, trials), rungs=(4, 12, 36, 100), max_length=100,
        usage=Usage("GPU", 4, 800.0, 120.0, 333, 0),
    )  # fmt: skip


def test_a_1000_trial_100_point_page_is_under_3_mb() -> None:
    page = synthetic_page()
    t = time.perf_counter()
    html = render_page(page)
    took = time.perf_counter() - t
    size = len(html.encode())
    print(f"1000 trials x 100 points: {size / 1e6:.2f} MB, rendered in {took:.2f} s")
    assert size < 3_000_000
    assert html.count("<polyline") == 1000


def test_a_page_to_a_fifo_or_device_is_written_into_not_renamed_over(tmp_path: Path) -> None:
    # `dlhpc report -o /dev/null` as root once replaced the machine's /dev/null with a file
    import stat
    import threading

    from dlhpc.report._files import publish_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    publish_file(fifo, b"<html>page</html>")
    reader.join(timeout=10)
    assert got == [b"<html>page</html>"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO, not a file renamed over it
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temp file left behind
    publish_file(Path(os.devnull), b"x")
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)
