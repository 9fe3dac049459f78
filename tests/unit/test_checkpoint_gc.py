"""Checkpoint lifecycle: the keep policy (a table), GC on a real store and real folders,
the checkpoint's metric from the job, the CLI (checkpoints, pin, gc, export), the
in-job prune that deletes no published checkpoint, and the Lustre quota parser."""

from __future__ import annotations

import csv
import json
import math
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from sqlalchemy import select

from dlhpc.cli._views import human_bytes
from dlhpc.cli.main import cli
from dlhpc.config import load_experiment
from dlhpc.errors import LeaseHeldError
from dlhpc.harness.context import TrialContext
from dlhpc.orchestrator.checkpoints import CkptInfo, GcPolicy, experiment_plan, gc, gc_pass, plan_gc
from dlhpc.orchestrator.tick import TickReport
from dlhpc.protocol import EventWriter, TrialSpec
from dlhpc.protocol.checkpoint import latest_verified, list_checkpoints, prune, publish_checkpoint
from dlhpc.report.quota import Quota, parse_lfs_quota, quota_warning
from dlhpc.report.status import status_data
from dlhpc.search import SearcherTable
from dlhpc.store import Attempt, Checkpoint, Decision, Experiment, Metric, Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._db import add_experiment, add_trial

NAN = float("nan")

# -- the policy table ------------------------------------------------------------------

# A checkpoint: (trial, step, metric) or (trial, step, metric, "pinned"); ids are 1, 2, ...
# in list order. Policy: (experiment best N, trial best M, trial latest K).
POLICY_CASES: list[
    tuple[str, list[tuple[Any, ...]], tuple[int, int, int], bool, set[int], set[int]]
] = [
    # name, checkpoints, (N, M, K), smaller_is_better, protected trials, kept ids
    ("latest only", [(1, 1, 0.1), (1, 2, 0.9), (1, 3, 0.5)], (0, 0, 1), False, set(), {3}),
    ("latest two", [(1, 1, 0.1), (1, 2, 0.9), (1, 3, 0.5)], (0, 0, 2), False, set(), {2, 3}),
    (
        "best + latest, larger",
        [(1, 1, 0.5), (1, 2, 0.9), (1, 3, 0.7)],
        (0, 1, 1),
        False,
        set(),
        {2, 3},
    ),
    (
        "best + latest, smaller",
        [(1, 1, 0.5), (1, 2, 0.9), (1, 3, 0.7)],
        (0, 1, 1),
        True,
        set(),
        {1, 3},
    ),
    ("best is latest", [(1, 1, 0.1), (1, 2, 0.2), (1, 3, 0.9)], (0, 1, 1), False, set(), {3}),
    ("tie: newer wins", [(1, 1, 0.9), (1, 2, 0.9), (1, 3, 0.1)], (0, 1, 1), False, set(), {2, 3}),
    ("tie, smaller", [(1, 1, 0.2), (1, 2, 0.2), (1, 3, 0.9)], (0, 1, 1), True, set(), {2, 3}),
    (
        "unknown never best",
        [(1, 1, 0.3), (1, 2, NAN), (1, 3, None), (1, 4, None)],
        (0, 2, 1),
        True,
        set(),
        {1, 4},
    ),
    ("inf is unknown", [(1, 1, 0.3), (1, 2, math.inf), (1, 3, 0.4)], (0, 1, 0), False, set(), {3}),
    ("unknown can be latest", [(1, 1, None), (1, 2, None)], (0, 3, 1), False, set(), {2}),
    ("M above count", [(1, 1, 0.1), (1, 2, 0.2)], (0, 5, 1), False, set(), {1, 2}),
    (
        "re-save of a step: newer row is latest",
        [(1, 3, 0.1), (1, 3, 0.2)],
        (0, 0, 1),
        False,
        set(),
        {2},
    ),
    (
        "pinned stays",
        [(1, 1, 0.1, "pinned"), (1, 2, 0.2), (1, 3, 0.3)],
        (0, 0, 1),
        False,
        set(),
        {1, 3},
    ),
    ("nothing kept when policy is 0", [(1, 1, 0.1), (1, 2, 0.2)], (0, 0, 0), False, set(), set()),
    ("live trial keeps its newest", [(1, 1, 0.9), (1, 2, 0.1)], (0, 0, 0), False, {1}, {2}),
    (
        "paused: best and newest",
        [(1, 1, 0.9), (1, 2, 0.1), (1, 3, 0.2)],
        (0, 1, 0),
        False,
        {1},
        {1, 3},
    ),
    (
        "live only protects its own trial",
        [(1, 1, 0.9), (1, 2, 0.1), (2, 1, 0.5), (2, 2, 0.4)],
        (0, 0, 0),
        False,
        {2},
        {4},
    ),
    (
        "experiment best across trials",
        [(1, 1, 0.9), (1, 2, 0.1), (2, 1, 0.5), (2, 2, 0.2)],
        (1, 0, 1),
        False,
        set(),
        {1, 2, 4},
    ),
    (
        "experiment best 2, smaller",
        [(1, 1, 0.9), (1, 2, 0.1), (2, 1, 0.5), (2, 2, 0.2), (3, 1, 0.15), (3, 2, 0.3)],
        (2, 0, 0),
        True,
        set(),
        {2, 5},
    ),
    ("experiment best tie: newer row", [(1, 5, 0.7), (2, 5, 0.7)], (1, 0, 0), False, set(), {2}),
    (
        "union of all three",
        [(1, 1, 0.95), (1, 2, 0.5), (1, 3, 0.6), (2, 1, 0.9), (2, 2, 0.1), (2, 3, 0.2)],
        (1, 1, 1),
        False,
        set(),
        {1, 3, 4, 6},
    ),
]


def _infos(spec: list[tuple[Any, ...]]) -> list[CkptInfo]:
    return [
        CkptInfo(i, c[0], c[1], c[2], pinned=len(c) > 3 and c[3] == "pinned", size_bytes=10)
        for i, c in enumerate(spec, start=1)
    ]


@pytest.mark.parametrize(
    ("name", "spec", "nmk", "smaller", "protected", "kept"),
    POLICY_CASES,
    ids=[c[0] for c in POLICY_CASES],
)
def test_policy_table(
    name: str,
    spec: list[tuple[Any, ...]],
    nmk: tuple[int, int, int],
    smaller: bool,
    protected: set[int],
    kept: set[int],
) -> None:
    infos = _infos(spec)
    plan = plan_gc(infos, protected, GcPolicy(*nmk), smaller)
    assert set(plan.keep) == kept, name
    assert plan.delete == sorted({c.id for c in infos} - kept)  # each id in exactly one
    assert all(plan.keep.values())  # every kept one says why


def test_policy_reasons() -> None:
    infos = _infos([(1, 1, 0.9, "pinned"), (1, 2, 0.1), (2, 1, 0.5)])
    plan = plan_gc(infos, {2}, GcPolicy(1, 1, 1), smaller_is_better=False)
    assert plan.keep == {
        1: ("pinned", "experiment-best", "trial-best"),
        2: ("trial-latest",),
        3: ("trial-best", "trial-latest", "live"),
    }
    assert plan_gc([], {1}, GcPolicy(), False) == ({}, [])


# -- a real store with real folders ---------------------------------------------------


def _config(root: Path, n: int = 0, m: int = 1, k: int = 1) -> str:
    ck = {"dir": str(root), "keep_experiment_best": n, "keep_best": m, "keep_latest": k}
    return json.dumps({"name": "e", "checkpoint": ck})


def _experiment(s: Any, root: Path, smaller: bool = False, **policy: int) -> Experiment:
    return add_experiment(
        s,
        root.parent / "runs",
        searcher="asha",
        metric="acc",
        smaller_is_better=smaller,
        source_path="exp.yaml",
        yaml_text="name: e  # as given\n",
        config_json=_config(root, **policy),
        repro_json=json.dumps({"code": {"git": "abc123"}}),
    )


def _trial(s: Any, exp: Experiment, state: str, rid: int) -> Trial:
    hparams = json.dumps({"lr": 0.1 * (rid + 1)})
    return add_trial(s, exp, request_id=rid, state=state, hparams_json=hparams, seed=rid)


def _folder(root: Path, exp_id: int, trial_id: int, step: int, size: int = 1000) -> Path:
    tdir = root / f"exp-{exp_id:06d}" / f"trial-{trial_id:06d}"
    ck = publish_checkpoint(tdir, step, lambda f: (f / "w.bin").write_bytes(b"\1" * size))
    return ck.path


def _ckpt(s: Any, t: Trial, path: Path | str, step: int, metric: float | None, size: int) -> int:
    c = Checkpoint(
        trial_id=t.id,
        step=step,
        path=str(path),
        size_bytes=size,
        metric=metric,
        created_at=utcnow(),
    )
    s.add(c)
    s.flush()
    return c.id


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Store, dict[str, Any]]]:
    """Experiment 1: trial A COMPLETED (steps 1-4, metrics .1 .8 .3 .2; step 3 pinned),
    trial B PAUSED (steps 1-2, unknown metrics), trial C KILLED whose step-1 folder is
    gone and whose step-2 row points outside the root, and trial D COMPLETED with a
    pending promotion (steps 1-2). Policy: trial best 1, trial latest 1."""
    store = Store(tmp_path / "home")
    root = tmp_path / "ckpt"
    outside = publish_checkpoint(tmp_path / "elsewhere", 2, lambda f: (f / "x").write_text("x"))
    ids: dict[str, Any] = {}
    with store.write() as s:
        exp = _experiment(s, root)
        a, b = _trial(s, exp, "COMPLETED", 0), _trial(s, exp, "PAUSED", 1)
        c, d = _trial(s, exp, "KILLED", 2), _trial(s, exp, "COMPLETED", 3)
        for step, metric in zip((1, 2, 3, 4), (0.1, 0.8, 0.3, 0.2), strict=True):
            ids[f"a{step}"] = _ckpt(s, a, _folder(root, exp.id, a.id, step), step, metric, 1000)
        for step in (1, 2):
            ids[f"b{step}"] = _ckpt(s, b, _folder(root, exp.id, b.id, step, 10), step, None, 10)
            ids[f"d{step}"] = _ckpt(s, d, _folder(root, exp.id, d.id, step, 7), step, 0.5, 7)
        gone = _folder(root, exp.id, c.id, 1)
        ids["c1"] = _ckpt(s, c, gone, 1, 0.1, 1000)
        ids["c2"] = _ckpt(s, c, outside.path, 2, 0.05, 1)
        s.get(Checkpoint, ids["a3"]).pinned = True  # type: ignore[union-attr]
        s.add(
            Decision(
                experiment_id=exp.id, trial_id=d.id, kind="promote", length=9, decided_at=utcnow()
            )
        )
        ids.update(exp=exp.id, a=a.id, b=b.id, c=c.id, d=d.id, root=root, outside=outside.path)
    shutil.rmtree(gone)
    yield store, ids
    store.close()


def _disk_bytes(folder: Path) -> int:
    """The blocks allocated to the files below ``folder`` (as ``du`` counts them)."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def _doomed_bytes(store: Store, ids: dict[str, Any]) -> int:
    """The bytes on disk of the world's folders the GC deletes (a1, b1, d1)."""
    with store.read() as s:
        paths = [s.get(Checkpoint, ids[k]).path for k in ("a1", "b1", "d1")]  # type: ignore[union-attr]
    return sum(_disk_bytes(Path(p)) for p in paths)


def _states(store: Store) -> dict[int, str]:
    with store.read() as s:
        return {c.id: c.state for c in s.scalars(select(Checkpoint))}


def test_gc_dry_run_then_real_then_noop(world: tuple[Store, dict[str, Any]]) -> None:
    store, ids = world
    with store.read() as s:
        paths = {c.id: c.path for c in s.scalars(select(Checkpoint))}
    # A: best a2 (.8), newest a4, pinned a3: a1 goes. B: newest b2 (unknown metrics are
    # never best): b1 goes. C: best c1 (.1), newest c2: both stay. D: a tie, the newer d2
    # is best and newest: d1 goes.
    doomed = [ids["a1"], ids["b1"], ids["d1"]]
    on_disk = sum(_disk_bytes(Path(paths[i])) for i in doomed)  # payload + manifest
    assert on_disk > 1000 + 10 + 7  # the payloads the rows' sizes count
    dry = gc(store, ids["exp"], dry_run=True)
    assert dry.deleted == [paths[i] for i in doomed]
    assert dry.bytes_freed == on_disk
    assert all(Path(paths[i]).is_dir() for i in doomed)
    assert set(_states(store).values()) == {"ACTIVE"}

    real = gc(store, ids["exp"])
    assert (real.deleted, real.bytes_freed, real.errors) == (dry.deleted, on_disk, [])
    assert real.kept == len(paths) - 3
    assert not any(Path(paths[i]).exists() for i in doomed)
    for i, p in paths.items():
        if i not in doomed and i != ids["c1"]:
            assert Path(p).is_dir(), p
    states = _states(store)
    assert {i for i, st in states.items() if st == "DELETED"} == set(doomed)
    with store.read() as s:
        assert all(s.get(Checkpoint, i).deleted_at is not None for i in doomed)  # type: ignore[union-attr]
    trial_dir = Path(paths[ids["a1"]]).parent
    assert not [p for p in trial_dir.iterdir() if p.name.startswith(".del-")]

    again = gc(store, ids["exp"])
    assert (again.deleted, again.bytes_freed, again.missing, again.errors) == ([], 0, [], [])
    assert _states(store) == states


@pytest.mark.parametrize("smaller", [False, True])
@pytest.mark.parametrize("nmk", [(0, 1, 1), (1, 0, 1), (3, 1, 1), (1, 2, 2), (2, 1, 0), (0, 0, 0)])
def test_gc_deletes_what_the_plan_over_every_row_deletes(
    tmp_path: Path, nmk: tuple[int, int, int], smaller: bool
) -> None:
    """gc reads only the rows whose fate can change (a trial's only checkpoint is kept
    while keep_latest >= 1): it deletes exactly what plan_gc over all rows deletes."""
    import random

    rng = random.Random(f"{nmk}{smaller}")
    store, root = Store(tmp_path / "home"), tmp_path / "ckpt"
    n, m, k = nmk
    with store.write() as s:
        exp = _experiment(s, root, smaller, n=n, m=m, k=k)
        other = _experiment(s, root, smaller, n=n, m=m, k=k)
        # the experiment's best is a trial's only checkpoint; the runner-up is an old one
        best, second = (-2.0, -1.0) if smaller else (2.0, 1.0)
        for rid, metrics in enumerate([[best], [second, 0.5]], start=1000):
            t = _trial(s, exp, "COMPLETED", rid)
            for step, metric in enumerate(metrics, start=1):
                _ckpt(s, t, root / f"t{t.id}" / f"ckpt-{step}", step, metric, 1)
        states = ["COMPLETED", "RUNNING", "PAUSED", "STOPPED_EARLY", "KILLED"]
        for rid in range(100):
            t = _trial(s, rng.choice([exp, exp, other]), rng.choice(states), rid)
            for step in range(1, rng.choice([1, 1, 1, 2, 3]) + 1):
                metric = rng.choice([None, NAN, math.inf, 0.5, round(rng.random(), 2)])
                cid = _ckpt(s, t, root / f"t{t.id}" / f"ckpt-{step}", step, metric, 1)
                c = s.get(Checkpoint, cid)
                assert c is not None
                c.pinned = rng.random() < 0.1
                c.state = "DELETED" if rng.random() < 0.1 else "ACTIVE"
        exp_id = exp.id
    with store.read() as s:
        rows, plan = experiment_plan(s, s.get(Experiment, exp_id))  # type: ignore[arg-type]
    by_id = {c.id: c.path for c in rows}
    report = gc(store, exp_id, dry_run=True)
    assert sorted(report.deleted + report.missing + report.refused) == sorted(
        by_id[i] for i in plan.delete
    )
    assert report.kept == len(plan.keep) == len(rows) - len(plan.delete)
    store.close()


def test_gc_missing_folder_and_path_outside_root(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    root = tmp_path / "ckpt"
    outside = publish_checkpoint(tmp_path / "elsewhere", 1, lambda f: (f / "x").write_text("x"))
    with store.write() as s:
        exp = _experiment(s, root, k=1, m=0)
        t = _trial(s, exp, "COMPLETED", 0)
        gone = _ckpt(
            s, t, root / f"exp-{exp.id:06d}" / "trial-000001" / "ckpt-0000000001", 1, 0.1, 5
        )
        out = _ckpt(s, t, outside.path, 2, 0.2, 5)
        sneaky = _ckpt(
            s, t, f"{root}/exp-{exp.id:06d}/../../elsewhere/{outside.path.name}", 3, 0.3, 5
        )
        rel = _ckpt(s, t, "sim:4", 4, 0.4, 5)
        newest = _folder(root, exp.id, t.id, 6)
        link = newest.parent / "ckpt-0000000002"
        link.symlink_to(outside.path)
        linked = _ckpt(s, t, link, 2, 0.2, 5)
        whole = _ckpt(s, t, newest.parent, 0, 0.0, 5)  # a trial folder is no checkpoint
        _ckpt(s, t, newest, 6, 0.6, 5)
        exp_id = exp.id
    report = gc(store, exp_id)
    assert report.missing == [str(root / f"exp-{exp_id:06d}" / "trial-000001" / "ckpt-0000000001")]
    assert len(report.refused) == 5 and report.deleted == [] and report.bytes_freed == 0
    assert outside.path.is_dir() and link.is_symlink() and newest.is_dir()  # never touched
    states = _states(store)
    assert states[gone] == "DELETED"  # already gone: marked, nothing freed
    refused = (out, sneaky, rel, linked, whole)
    assert {states[i] for i in refused} == {"ACTIVE"}  # refused: left as they are


def test_gc_takes_the_lease_and_the_tick_hook_reports(
    world: tuple[Store, dict[str, Any]],
) -> None:
    store, ids = world
    other = Store(store.home)
    with other.hold_lease():
        with pytest.raises(LeaseHeldError):
            gc(store, ids["exp"])
        report = TickReport()
        gc_pass(store, ids["exp"], report)
        assert report.errors and "another reconciler" in report.errors[0]
        doomed = _doomed_bytes(store, ids)
        assert gc(store, ids["exp"], dry_run=True).bytes_freed == doomed  # no lease needed
    report = TickReport()
    with store.hold_lease():  # as inside a tick
        gc_pass(store, ids["exp"], report)
    assert (report.checkpoint_bytes_freed, report.errors) == (doomed, [])
    other.close()


def test_live_and_promoted_trials_keep_their_newest(world: tuple[Store, dict[str, Any]]) -> None:
    store, ids = world
    with store.write() as s:
        exp = s.get(Experiment, ids["exp"])
        assert exp is not None
        exp.config_json = _config(ids["root"], 0, 0, 0)  # the policy alone keeps nothing
    with store.read() as s:
        exp = s.get(Experiment, ids["exp"])
        assert exp is not None
        _, plan = experiment_plan(s, exp)
    # a3 pinned; b2: the PAUSED trial's newest; d2: a promotion not acted on yet
    assert plan.keep == {ids["a3"]: ("pinned",), ids["b2"]: ("live",), ids["d2"]: ("live",)}


def test_status_reports_disk_use(world: tuple[Store, dict[str, Any]]) -> None:
    store, ids = world
    doomed = _doomed_bytes(store, ids)
    gc(store, ids["exp"])
    with store.read() as s:
        disk = status_data(s, ids["exp"]).to_json()["experiments"][0]["disk"]
    assert disk == {
        "checkpoints": 7,
        "checkpoint_bytes": 2 * 1000 + 1000 + 10 + 7 + 1000 + 1,
        "deleted_checkpoints": 3,
        "freed_bytes": doomed,  # measured by the GC, not the rows' 1000 + 10 + 7
        "checkpoint_root": f"{ids['root']}/exp-{ids['exp']:06d}",
    }


# -- the checkpoint's metric, from the job's record -----------------------------------


class _Saver:
    def __init__(self, root: Path) -> None:
        self.root, self.step = root, 0

    def save(self) -> Any:
        return publish_checkpoint(self.root, self.step, lambda f: (f / "w").write_bytes(b"w"))


@pytest.fixture
def keep_signals() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_checkpoint_metric_comes_from_the_job_and_older_records_by_step(
    tmp_path: Path, keep_signals: None
) -> None:
    store = Store(tmp_path / "home")
    with store.write() as s:
        exp = _experiment(s, tmp_path / "ckpt")
        t = _trial(s, exp, "RUNNING", 0)
        own = tmp_path / "ckpt" / f"exp-{exp.id:06d}" / f"trial-{t.id:06d}"
        spec = TrialSpec(
            experiment_id=exp.id,
            trial_id=t.id,
            hparams={},
            max_length=3,
            seed=0,
            experiment_dir=str(tmp_path),
            code_dir=str(tmp_path),
            entry_script="",
            checkpoint_dir=str(own),
            metric="acc",
            smaller_is_better=False,
        )
    attempt = tmp_path / "attempt" / "1_0.r0"
    ctx = TrialContext(spec, attempt, {})
    saver = _Saver(own)
    for epoch, acc in ((1, 0.5), (2, NAN)):
        ctx.report(epoch, {"acc": acc, "loss": 1.0})
        saver.step = 100 * epoch  # checkpoint steps count batches, reports count epochs
        ctx.checkpoint(saver)
    saver.step = 250  # a mid-epoch save (preemption): nothing evaluated since the last one
    ctx.checkpoint(saver)
    old = tmp_path / "attempt" / "1_0.r1"  # an older job: no metric in its record
    w = EventWriter(old, "user-r0")
    w.add("metric", step=3, metrics={"acc": 0.7})
    w.add("checkpoint", step=3, path=str(own / "ckpt-0000000003"), size=1)
    w.add("checkpoint", step=4, path=str(own / "ckpt-0000000004"), size=1)
    w.flush()
    with store.write() as s:
        trial = s.get(Trial, t.id)
        assert trial is not None
        for folder in (attempt, old):
            ingest_attempt(s, trial, folder, utcnow())
    with store.read() as s:
        got = [(c.step, c.metric) for c in s.scalars(select(Checkpoint).order_by(Checkpoint.id))]
        assert s.scalar(select(Metric.value).where(Metric.step == 3)) == 0.7
    assert got == [(100, 0.5), (200, None), (250, None), (3, 0.7), (4, None)]
    # the GC deleted one; a later job publishes the same folder name again: a new checkpoint
    with store.write() as s:
        row = s.scalars(select(Checkpoint).where(Checkpoint.step == 3)).one()
        row.state, row.deleted_at, row.pinned = "DELETED", utcnow(), True
    again = tmp_path / "attempt" / "1_0.r2"
    w = EventWriter(again, "user-r0")
    w.add("checkpoint", step=3, path=str(own / "ckpt-0000000003"), size=9, metric=0.9)
    w.flush()
    with store.write() as s:
        trial = s.get(Trial, t.id)
        assert trial is not None
        ingest_attempt(s, trial, again, utcnow())
    with store.read() as s:
        row = s.scalars(select(Checkpoint).where(Checkpoint.step == 3)).one()
        assert (row.state, row.deleted_at, row.pinned, row.size_bytes, row.metric) == (
            "ACTIVE",
            None,
            False,
            9,
            0.9,
        )
    store.close()


# -- in-job pruning ---------------------------------------------------------------------


def test_in_job_prune_keeps_every_published_checkpoint(tmp_path: Path) -> None:
    cks = [publish_checkpoint(tmp_path, s, lambda f: (f / "a").write_text("a")) for s in (1, 2, 3)]
    torn = publish_checkpoint(tmp_path, 4, lambda f: (f / "a").write_text("a"))
    (torn.path / "a").write_text("torn!")  # size differs from the manifest
    newest = publish_checkpoint(tmp_path, 5, lambda f: (f / "a").write_text("a"))
    stale = tmp_path / (".tmp-ckpt-6-" + "0" * 32)
    stale.mkdir()
    removed = prune(tmp_path, None, {newest.path.name}, stale_after=-1)
    assert sorted(removed) == sorted([torn.path, stale])
    assert [c.step for c in list_checkpoints(tmp_path)] == [5, 3, 2, 1]
    assert latest_verified(tmp_path)[0] == newest
    assert all(c.path.is_dir() for c in cks)


def test_train_state_in_a_job_prunes_nothing(tmp_path: Path, keep_signals: None) -> None:
    pytest.importorskip("torch")
    from dlhpc.harness.state import TrainState

    state = TrainState(tmp_path, keep_latest=None)
    for s in (1, 2, 3):
        state.step = s
        state.save()
    assert [c.step for c in list_checkpoints(tmp_path)] == [3, 2, 1]
    spec = TrialSpec(1, 1, {}, 1, 0, str(tmp_path), "", "", str(tmp_path / "c"), "m", True)
    assert TrialContext(spec, None, {}).train_state().keep_latest is None
    with pytest.raises(ValueError, match="keep_latest"):
        TrainState(tmp_path, keep_latest=0)


# -- config -------------------------------------------------------------------------------


def test_config_keys_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")
    text = "name: t\nentrypoint: python t.py\n"
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(
        text + "checkpoint: {keep_best: 2, keep_latest: 3, keep_experiment_best: 4}\n"
    )
    a = load_experiment(tmp_path / "a.yaml", searchers=SearcherTable()).checkpoint
    b = load_experiment(tmp_path / "b.yaml", searchers=SearcherTable()).checkpoint
    assert (a.keep_experiment_best, a.keep_best, a.keep_latest) == (0, 1, 1)
    assert (b.keep_experiment_best, b.keep_best, b.keep_latest) == (4, 2, 3)
    assert GcPolicy.from_config({}) == GcPolicy(0, 1, 1)  # an older stored config


# -- CLI -----------------------------------------------------------------------------------


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def cli_world(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("DLHPC_SITE", "local")
    store = Store(home)
    root = tmp_path / "ckpt"
    ids: dict[str, Any] = {"root": root}
    with store.write() as s:
        exp = _experiment(s, root)
        t = _trial(s, exp, "COMPLETED", 0)
        for step, metric in ((1, 0.9), (2, 0.4), (3, 0.5)):
            ids[step] = _ckpt(
                s, t, _folder(root, exp.id, t.id, step, 100 * step), step, metric, 100 * step
            )
        a = Attempt(
            trial_id=t.id,
            attempt_key="9_0.r0",
            job_id="9_0",
            state="COMPLETED",
            created_at=utcnow(),
            env_json=json.dumps({"host": "n1", "gpus": []}),
        )
        s.add(a)
        s.flush()
        for step, name, value in ((1, "acc", 0.9), (1, "loss", None), (2, "acc", 0.4)):
            s.add(
                Metric(trial_id=t.id, attempt_id=a.id, step=step, name=name, value=value, time=1.0)
            )
        ids.update(exp=exp.id, trial=t.id)
    store.close()
    yield ids


def test_cli_checkpoints_pin_gc(cli_world: dict[str, Any]) -> None:
    ids = cli_world
    res = _run("checkpoints", str(ids["exp"]), "--json")
    assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in json.loads(res.output)["checkpoints"]}
    assert rows[ids[1]]["kept_because"] == ["trial-best"]
    assert rows[ids[2]]["kept_because"] == []
    assert rows[ids[3]]["kept_because"] == ["trial-latest"]
    table = _run("checkpoints", str(ids["exp"])).output
    assert "trial-best" in table and "deleted at the next GC" in table and "600 B" in table

    assert "pinned" in _run("pin", str(ids[2])).output
    dry = json.loads(_run("gc", str(ids["exp"]), "--dry-run", "--json").output)
    assert (dry["dry_run"], dry["bytes_freed"]) == (True, 0)
    assert _run("unpin", str(ids[2])).exit_code == 0
    dry = json.loads(_run("gc", str(ids["exp"]), "--dry-run", "--json").output)
    on_disk = _disk_bytes(Path(dry["experiments"][0]["deleted"][0]))  # 200 B + its manifest
    assert 200 < on_disk <= 2 * 64 * 1024  # two files: a block each (du), whatever its size
    assert dry["bytes_freed"] == on_disk and dry["experiments"][0]["deleted"][0].endswith("0002")
    shown = human_bytes(on_disk)

    res = _run("gc")
    assert res.exit_code == 0 and f"freed {shown} ({on_disk} bytes)" in res.output
    assert not Path(dry["experiments"][0]["deleted"][0]).exists()
    res = _run("checkpoints", str(ids["exp"]), "--all", "--json")
    states = {r["id"]: r["state"] for r in json.loads(res.output)["checkpoints"]}
    assert states == {ids[1]: "ACTIVE", ids[2]: "DELETED", ids[3]: "ACTIVE"}
    assert "deleted" in _run("checkpoints", str(ids["exp"]), "--all").output
    res = _run("status", str(ids["exp"]))
    assert f"checkpoints: 2 kept, 400 B; GC freed {shown} (1 deleted)" in res.output, res.output

    for args, msg in (
        (("pin", str(ids[2])), f"checkpoint {ids[2]} was deleted"),
        (("pin", "999"), "no checkpoint 999"),
        (("checkpoints", "999"), "no experiment 999"),
        (("gc", "999"), "no experiment 999"),
    ):
        res = _run(*args)
        assert res.exit_code == 2 and msg in res.output, (args, res.output)


def test_cli_export(cli_world: dict[str, Any], tmp_path: Path) -> None:
    ids = cli_world
    out = tmp_path / "share" / "run1"
    res = _run("export", str(ids["trial"]), str(out))
    assert res.exit_code == 0, res.output
    assert f"checkpoint {ids[1]} (step 1, best)" in res.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "checkpoint",
        "config.yaml",
        "experiment.yaml",
        "hparams.json",
        "metrics.csv",
        "repro.json",
    ]
    assert (out / "checkpoint" / "w.bin").read_bytes() == b"\1" * 100
    assert yaml.safe_load((out / "config.yaml").read_text())["checkpoint"]["keep_best"] == 1
    assert (out / "experiment.yaml").read_text() == "name: e  # as given\n"
    assert json.loads((out / "hparams.json").read_text()) == {"lr": 0.1}
    with open(out / "metrics.csv", newline="") as f:
        assert list(csv.reader(f)) == [
            ["step", "name", "value", "time"],
            ["1", "acc", "0.9", "1.0"],
            ["1", "loss", "", "1.0"],
            ["2", "acc", "0.4", "1.0"],
        ]
    repro = json.loads((out / "repro.json").read_text())
    assert repro["experiment"] == {"code": {"git": "abc123"}}
    assert repro["attempts"][0]["env"] == {"host": "n1", "gpus": []}
    assert repro["checkpoint"]["id"] == ids[1] and repro["trial"]["metric"] == "acc"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp left

    latest = tmp_path / "latest"
    latest.mkdir()  # an empty folder is fine
    assert "(step 3, latest)" in _run("export", str(ids["trial"]), str(latest), "--latest").output

    for args, msg in (
        (("export", str(ids["trial"]), str(out)), "is not empty"),
        (("export", "999", str(tmp_path / "x")), "no trial 999"),
    ):
        res = _run(*args)
        assert res.exit_code == 2 and msg in res.output, res.output
    assert not (tmp_path / "x").exists()


# -- Lustre quota ---------------------------------------------------------------------------

# As the Lustre manual shows `lfs quota -u bob /mnt/testfs` (kbytes, then soft quota, hard
# limit and grace; '*' marks a value over its quota), and the wrapped form a long
# filesystem name takes.
LFS_QUOTA = """\
Disk quotas for usr bob (uid 6000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
    /mnt/testfs   30720*  30720   30920       -       1   10000   11000       -
"""
LFS_WRAPPED = """\
Disk quotas for user alice (uid 1000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
/lustre/scratch/projects/a-very-long-project-name
                9000000       0 10000000       -    1234       0       0       -
"""
LFS_NO_LIMIT = """\
Disk quotas for usr carol (uid 6001):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
    /mnt/testfs       4       0       0       -       1       0       0       -
"""
LFS_HUMAN = """\
Disk quotas for usr dave (uid 6002):
     Filesystem    used   quota   limit   grace   files   quota   limit   grace
    /mnt/testfs  1.5G      2G      3G       -      10       0       0       -
"""


def test_lfs_quota_parser_and_warning() -> None:
    q = parse_lfs_quota(LFS_QUOTA)
    assert q == Quota("/mnt/testfs", 30720 * 1024, 30720 * 1024, hard=False)
    w = parse_lfs_quota(LFS_WRAPPED)
    assert w == Quota(
        "/lustre/scratch/projects/a-very-long-project-name",
        9000000 * 1024,
        10000000 * 1024,
        hard=True,
    )
    assert parse_lfs_quota(LFS_NO_LIMIT) is None
    h = parse_lfs_quota(LFS_HUMAN)
    assert h is not None and (h.used_bytes, h.limit_bytes) == (int(1.5 * 1024**3), 2 * 1024**3)
    assert parse_lfs_quota("lfs: command failed\n") is None
    assert parse_lfs_quota(LFS_QUOTA.splitlines()[0] + "\n     Filesystem kbytes\n") is None

    warn = quota_warning(Path("/mnt/testfs/ck"), q)
    assert warn is not None and "100%" in warn and "quota" in warn
    assert "90%" in (quota_warning(Path("/x"), w) or "")  # 9e6 / 1e7 hard limit
    assert quota_warning(Path("/x"), h) is None  # 75%
    assert quota_warning(Path("/definitely/not/lustre")) is None  # not Lustre here: no warning
