"""Path traversal: names cannot escape their folders, and nothing dlhpc derives from
stored or job-written values (checkpoint paths, attempt folders, event files, stop
files, export sources) is followed, deleted or written outside its root."""

from __future__ import annotations

import os
import re
import shutil
import types
from pathlib import Path

import pytest
from sqlalchemy import delete, select

from dlhpc._safepath import inside, is_inside
from dlhpc.config import name_slug
from dlhpc.errors import UnsafePathError, UsageError
from dlhpc.orchestrator import trials as trials_mod
from dlhpc.orchestrator._scan import TrialRef, pending_attempt_dirs
from dlhpc.orchestrator.checkpoints import gc
from dlhpc.orchestrator.decide import write_stop_files
from dlhpc.orchestrator.export import export_trial
from dlhpc.protocol import STOP_FILE, EventWriter, iter_attempt_dirs, trial_dir
from dlhpc.protocol.checkpoint import publish_checkpoint
from dlhpc.store import Checkpoint, IngestedFile, Metric, Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._cli import run
from tests.unit.test_checkpoint_gc import _ckpt, _experiment, _folder, _trial


def test_inside_is_the_one_check(tmp_path: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "a").mkdir(parents=True)
    out.mkdir()
    (root / "link").symlink_to(out)
    assert inside(root, root / "a" / "x") == (root / "a" / "x").resolve()
    for bad in (root / ".." / "out", root / "link" / "x", root, "relative/x", "", f"{root}/\0"):
        with pytest.raises(UnsafePathError):
            inside(root, bad)
        assert not is_inside(root, bad)


def test_names_that_could_escape_are_refused_at_load(tmp_path: Path, home: Path) -> None:
    (tmp_path / "train.py").write_text("")
    # Experiment names are free text: they never become a path (below).
    cases = {
        "name: ok\nhyperparameters:\n  ../evil: 1\n": "exp.yaml:3: hyperparameters.../evil",
        "name: ok\nhyperparameters:\n  a/b: 1\n": "exp.yaml:3: hyperparameters.a/b",
    }
    for text, message in cases.items():
        (tmp_path / "exp.yaml").write_text(text + "entrypoint: python train.py\n")
        res = run("launch", str(tmp_path / "exp.yaml"), "--site", "local")
        assert res.exit_code == 2, (text, res.output)
        assert message in res.output, (text, res.output)
        assert not home.exists()  # nothing written


def test_a_name_never_becomes_a_path(tmp_path: Path, home: Path) -> None:
    (tmp_path / "train.py").write_text("")
    names = ("../../x", "a/b", "/etc/passwd")
    for name in names:
        (tmp_path / "exp.yaml").write_text(f"name: {name}\nentrypoint: 'true'\n")
        res = run("launch", str(tmp_path / "exp.yaml"), "--site", "local", "--dry-run")
        assert res.exit_code == 0 and name not in res.output.replace(f"({name})", ""), res.output
        res = run("launch", str(tmp_path / "exp.yaml"), "--site", "local")
        assert res.exit_code == 0, res.output
    runs = sorted(p.name for p in (home / "runs").iterdir())
    assert runs == [f"exp-{i:06d}-{name_slug(n)}" for i, n in enumerate(names, 1)]
    assert all(re.fullmatch(r"exp-\d{6}-[a-z0-9-]+", r) for r in runs), runs
    assert not (tmp_path.parent / "x").exists() and not (home / "a").exists()
    assert [p for p in home.rglob("*") if p.name in ("x", "a", "b", "passwd")] == []


def test_a_percent_in_the_slurm_state_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home %j"  # sbatch would read %j in --output as the job id
    monkeypatch.setenv("DLHPC_HOME", str(home))
    (tmp_path / "train.py").write_text("")
    (tmp_path / "exp.yaml").write_text("name: ok\nentrypoint: python train.py\n")
    res = run("launch", str(tmp_path / "exp.yaml"), "--site", "generic", "--dry-run")
    assert res.exit_code == 2, res.output
    assert "contains '%'" in res.output and not home.exists()
    res = run("launch", str(tmp_path / "exp.yaml"), "--site", "local", "--dry-run")
    assert res.exit_code == 0, res.output  # local jobs have no Slurm file-name patterns


def _store_trial(tmp_path: Path, state: str = "COMPLETED") -> tuple[Store, int, int, Path]:
    store = Store(tmp_path / "home")
    root = tmp_path / "ckpt"
    with store.write() as s:
        exp = _experiment(s, root)
        t = _trial(s, exp, state, 0)
        t.run_dir = str(trial_dir(store.runs_root, exp.id, t.id))
        return store, exp.id, t.id, root


@pytest.mark.parametrize("swapped", ["trial", "trials", "run"])
def test_a_trial_folder_reached_through_a_symlink_is_not_read(tmp_path: Path, swapped: str) -> None:
    """A job that replaces its trial folder, the ``trials/`` folder or the run folder by a
    link to another trial's files gets nothing ingested: the scan names the link instead."""
    store, _, tid, _ = _store_trial(tmp_path, "RUNNING")
    with store.read() as s:
        t = s.get(Trial, tid)
        assert t is not None
        trial, exp_id = Path(t.run_dir), t.experiment_id
    folder = {"trial": trial, "trials": trial.parent, "run": trial.parent.parent}[swapped]
    elsewhere = tmp_path / "elsewhere" / folder.relative_to(tmp_path)
    w = EventWriter(elsewhere / trial.relative_to(folder) / "attempts" / "1_0.r0", "user-r0")
    w.add("metric", step=1, metrics={"acc": 666.0})
    w.flush()
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(elsewhere, target_is_directory=True)
    errors: list[str] = []
    ref = TrialRef(id=tid, experiment_id=exp_id, run_dir=str(trial))
    assert pending_attempt_dirs([ref], {}, errors) == []
    assert len(errors) == 1 and str(folder) in errors[0] and "symlink" in errors[0], errors


@pytest.mark.parametrize("swapped", ["trial", "attempt"])
def test_a_heartbeat_is_not_read_through_a_symlinked_folder(tmp_path: Path, swapped: str) -> None:
    """A job that points its trial or attempt folder at another's live heartbeat gets no
    heartbeat read for it: a warning instead."""
    store, _, tid, _ = _store_trial(tmp_path, "RUNNING")
    with store.read() as s:
        t = s.get(Trial, tid)
        assert t is not None
        trial = Path(t.run_dir)
    key = "1_0.r0"
    attempt = trial / "attempts" / key
    folder = {"trial": trial, "attempt": attempt}[swapped]
    elsewhere = tmp_path / "elsewhere" / folder.relative_to(tmp_path)
    (elsewhere / attempt.relative_to(folder)).mkdir(parents=True)
    (elsewhere / attempt.relative_to(folder) / "heartbeat.json").write_text('{"time": 1}')
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(elsewhere, target_is_directory=True)
    p = trials_mod.TrialPass.__new__(trials_mod.TrialPass)
    p.warnings = []
    ref = types.SimpleNamespace(id=tid, run_dir=str(trial))
    att = types.SimpleNamespace(attempt_key=key)
    assert trials_mod._attempt_file(ref, att, "heartbeat.json", p) is None  # type: ignore[arg-type]
    assert len(p.warnings) == 1 and "symlink" in p.warnings[0], p.warnings


def test_ingest_never_follows_a_symlink_out_of_the_attempt_folder(tmp_path: Path) -> None:
    store, _, tid, _ = _store_trial(tmp_path, "RUNNING")
    outside = tmp_path / "outside"
    w = EventWriter(outside, "worker-r0")
    w.add("metric", step=2, metrics={"acc": 666.0})
    w.flush()
    with store.read() as s:
        t = s.get(Trial, tid)
        assert t is not None
        attempts = Path(t.run_dir) / "attempts"
    good = attempts / "1_0.r0"
    w = EventWriter(good, "user-r0")
    w.add("metric", step=1, metrics={"acc": 0.5})
    w.flush()
    (good / "user-r0-00000001.jsonl").symlink_to(outside / "worker-r0-00000000.jsonl")
    os.mkfifo(good / "user-r0-00000002.jsonl")  # would block a plain read forever
    (attempts / "2_0.r0").symlink_to(outside, target_is_directory=True)
    assert list(iter_attempt_dirs(Path(t.run_dir))) == [good]
    with store.write() as s:
        trial = s.get(Trial, tid)
        assert trial is not None
        result = ingest_attempt(s, trial, good, utcnow())
    assert result.metrics == 1
    with store.read() as s:
        assert s.execute(select(Metric.step, Metric.value)).all() == [(1, 0.5)]
        marked = {n: r for n, r in s.execute(select(IngestedFile.name, IngestedFile.records))}
    # the odd files are marked done with no records, so no tick looks at them again
    assert marked == {
        "user-r0-00000000.jsonl": 1,
        "user-r0-00000001.jsonl": 0,
        "user-r0-00000002.jsonl": 0,
    }


def test_gc_never_deletes_outside_the_experiment_checkpoint_root(tmp_path: Path) -> None:
    store, exp_id, tid, root = _store_trial(tmp_path)
    outside = tmp_path / "outside"
    victims = [
        publish_checkpoint(outside, i, lambda f: (f / "w").write_bytes(b"w")).path
        for i in (1, 2, 3)
    ]
    tdir = root / f"exp-{exp_id:06d}" / f"trial-{tid:06d}"
    legit = _folder(root, exp_id, tid, 5)
    tdir.joinpath("ckpt-0000000002").symlink_to(victims[1], target_is_directory=True)
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        _ckpt(s, t, victims[0], 1, None, 1)  # a job reported a folder elsewhere
        _ckpt(s, t, tdir / "ckpt-0000000002", 2, None, 1)  # a symlink in the root
        _ckpt(s, t, f"{tdir}/../../../outside/ckpt-0000000003", 3, None, 1)  # dot-dot
        _ckpt(s, t, legit, 5, None, 1)
        _ckpt(s, t, _folder(root, exp_id, tid, 6), 6, None, 1)  # the newest: kept
    report = gc(store, exp_id)
    assert len(report.refused) == 3 and report.deleted == [str(legit)]
    assert all(v.is_dir() and (v / "w").is_file() for v in victims)


def test_export_copies_only_from_the_checkpoint_root_and_no_symlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, exp_id, tid, root = _store_trial(tmp_path)
    monkeypatch.setenv("DLHPC_HOME", str(store.home))
    outside = publish_checkpoint(tmp_path / "outside", 9, lambda f: (f / "w").write_text("x"))
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        _ckpt(s, t, outside.path, 9, 1.0, 1)  # the best by metric, but not ours to copy
    with pytest.raises(UsageError, match="is not inside the trial's own checkpoint folder"):
        export_trial(store, tid, tmp_path / "e1")
    assert not (tmp_path / "e1").exists() and [p.name for p in tmp_path.glob(".e1*")] == []
    with store.write() as s:
        s.execute(delete(Checkpoint))
    inner = _folder(root, exp_id, tid, 4)
    (inner / "leak").symlink_to("/etc/hostname")
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        _ckpt(s, t, inner, 4, 0.5, 1000)  # the size its manifest lists
    with pytest.raises(UnsafePathError, match="holds a symlink: leak"):
        export_trial(store, tid, tmp_path / "e2")
    assert not (tmp_path / "e2").exists() and [p.name for p in tmp_path.glob(".e2*")] == []
    (tmp_path / "target").symlink_to(tmp_path / "outside")
    res = run("export", str(tid), str(tmp_path / "target"), "--site", "local")
    assert res.exit_code == 2 and "exists and is not a folder" in res.output


def test_stop_files_only_inside_the_runs_folder(tmp_path: Path) -> None:
    store, exp_id, tid, _ = _store_trial(tmp_path, "RUNNING")
    with store.write() as s:
        exp_trial = s.get(Trial, tid)
        assert exp_trial is not None
        other = _trial(s, exp_trial.experiment, "RUNNING", 1)
        other.run_dir = str(trial_dir(store.runs_root, exp_id, other.id))
        trials = [exp_trial, other]
    Path(trials[0].run_dir).mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    Path(trials[1].run_dir).symlink_to(outside, target_is_directory=True)  # a job's doing
    write_stop_files(trials)
    assert (Path(trials[0].run_dir) / STOP_FILE).is_file()
    assert not (outside / STOP_FILE).exists()
