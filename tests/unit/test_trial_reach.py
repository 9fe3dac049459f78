"""A trial's reach is its own folders: a checkpoint record naming another trial's
folder is not stored, GC deletes only through its trial's own folder reached
without a symlink (a symlinked experiment folder, a folder swapped mid-delete),
the bytes it reports freed are measured, and the registry and export verify the
trial, the step and the checksums. Real files, a real SQLite store."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select

from dlhpc.cli.main import cli
from dlhpc.errors import UsageError
from dlhpc.orchestrator.checkpoints import gc
from dlhpc.orchestrator.export import export_trial
from dlhpc.orchestrator.model_registry import register
from dlhpc.protocol import EventWriter, trial_dir
from dlhpc.protocol.checkpoint import publish_checkpoint
from dlhpc.report.status import status_data
from dlhpc.store import Checkpoint, Event, Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit.test_checkpoint_gc import _experiment, _trial

FORGED = 1000 * 2**30  # "GC freed 931 GiB"


def _own(root: Path, exp_id: int, trial_id: int) -> Path:
    return root / f"exp-{exp_id:06d}" / f"trial-{trial_id:06d}"


def _publish(folder: Path, step: int, payload: bytes = b"w" * 100) -> Path:
    return publish_checkpoint(folder, step, lambda f: (f / "w.bin").write_bytes(payload)).path


def _disk_bytes(folder: Path) -> int:
    """The blocks allocated to the files below ``folder`` (as ``du`` counts them)."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def _record(store: Store, trial_id: int, key: str, *records: dict[str, Any]) -> None:
    """Ingest one attempt folder of ``trial_id`` holding ``records`` (checkpoints)."""
    with store.read() as s:
        run_dir = Path(s.get(Trial, trial_id).run_dir)  # type: ignore[union-attr]
    w = EventWriter(run_dir / "attempts" / key, "user-r0")
    for rec in records:
        w.add("checkpoint", **rec)
    w.flush()
    with store.write() as s:
        trial = s.get(Trial, trial_id)
        assert trial is not None
        ingest_attempt(s, trial, run_dir / "attempts" / key, utcnow())


@pytest.fixture
def two(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """One experiment (keep latest 1, best 0) with two COMPLETED trials."""
    store = Store(tmp_path / "home")
    root = tmp_path / "ckpt"
    with store.write() as s:
        exp = _experiment(s, root, k=1, m=0)
        t1, t2 = _trial(s, exp, "COMPLETED", 0), _trial(s, exp, "COMPLETED", 1)
        for t in (t1, t2):
            t.run_dir = str(trial_dir(store.runs_root, exp.id, t.id))
        world = {"store": store, "root": root, "exp": exp.id, "t1": t1.id, "t2": t2.id}
    yield world
    store.close()


def _rows(store: Store, trial_id: int) -> list[tuple[int, str, str]]:
    with store.read() as s:
        q = select(Checkpoint.step, Checkpoint.path, Checkpoint.state)
        return [tuple(r) for r in s.execute(q.where(Checkpoint.trial_id == trial_id))]  # type: ignore[misc]


def test_a_record_naming_another_trials_folder_is_not_stored_and_gc_spares_it(
    two: dict[str, Any],
) -> None:
    store, root = two["store"], two["root"]
    theirs = _publish(_own(root, two["exp"], two["t1"]), 5)  # trial 1's only checkpoint
    _record(store, two["t1"], "1_0.r0", {"step": 5, "path": str(theirs), "size": 100})
    mine = _own(root, two["exp"], two["t2"])
    forged = [
        {"step": 5, "path": str(theirs), "size": FORGED},  # another trial's folder
        {"step": 1, "path": f"{mine}/../trial-{two['t1']:06d}/{theirs.name}", "size": 1},
        {"step": 1, "path": str(theirs.parent.parent / theirs.name), "size": 1},  # not a trial's
        {"step": 2, "path": str(mine / "ckpt-0000000003"), "size": 1},  # another step's name
    ]
    own = [_publish(mine, step) for step in (6, 7)]
    _record(
        store,
        two["t2"],
        "2_0.r0",
        *forged,
        *({"step": step, "path": str(p), "size": 100} for step, p in zip((6, 7), own, strict=True)),
    )
    assert [step for step, _, _ in _rows(store, two["t2"])] == [6, 7]  # its own only
    with store.read() as s:
        warnings = list(s.scalars(select(Event.message).where(Event.trial_id == two["t2"])))
    assert len(warnings) == len(forged)
    assert all(w.startswith("checkpoint record refused (not stored):") for w in warnings)
    assert "not inside the trial's own checkpoint folder" in warnings[0]
    assert "is the folder of step 3, not of step 2" in warnings[3]

    report = gc(store, two["exp"])
    assert report.deleted == [str(own[0])] and report.refused == []
    assert theirs.is_dir() and (theirs / "w.bin").is_file()
    assert _rows(store, two["t1"]) == [(5, str(theirs), "ACTIVE")]


def test_a_forged_cross_trial_row_is_refused_by_gc(two: dict[str, Any]) -> None:
    """A row stored before ingest checked (or written by hand) naming another trial's
    folder: GC keeps its row and the folder."""
    store, root = two["store"], two["root"]
    theirs = _publish(_own(root, two["exp"], two["t1"]), 5)
    with store.write() as s:
        s.add(Checkpoint(trial_id=two["t2"], step=5, path=str(theirs), created_at=utcnow()))
        s.add(Checkpoint(trial_id=two["t2"], step=9, path="/nowhere/ckpt-9", created_at=utcnow()))
    report = gc(store, two["exp"])
    assert report.refused == [str(theirs)] and report.deleted == []
    assert theirs.is_dir()


def test_gc_never_follows_a_symlinked_experiment_folder(
    two: dict[str, Any], tmp_path: Path
) -> None:
    store, root = two["store"], two["root"]
    outside = tmp_path / "outside"
    victims = [_publish(outside / f"trial-{two['t1']:06d}", step) for step in (1, 2)]
    root.mkdir()
    (root / f"exp-{two['exp']:06d}").symlink_to(outside, target_is_directory=True)  # a job's doing
    mine = _own(root, two["exp"], two["t1"])  # spelled as the trial's own folder
    with store.write() as s:
        for step in (1, 2):
            path = str(mine / f"ckpt-{step:010d}")
            s.add(Checkpoint(trial_id=two["t1"], step=step, path=path, created_at=utcnow()))
    for dry_run in (True, False):
        report = gc(store, two["exp"], dry_run=dry_run)
        assert report.deleted == [] and report.bytes_freed == 0
        assert report.refused == [str(mine / "ckpt-0000000001")]
    assert all((v / "w.bin").is_file() for v in victims)
    assert [state for _, _, state in _rows(store, two["t1"])] == ["ACTIVE", "ACTIVE"]

    (root / f"exp-{two['exp']:06d}").unlink()
    mine.parent.mkdir()
    mine.symlink_to(outside / f"trial-{two['t1']:06d}")  # the trial folder a symlink
    assert gc(store, two["exp"]).refused == [str(mine / "ckpt-0000000001")]
    assert all((v / "w.bin").is_file() for v in victims)


def test_a_trial_folder_swapped_for_a_symlink_mid_delete_is_not_followed(
    two: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the check and the delete a job replaces the trial folder with a symlink
    to a folder holding a checkpoint of the same name: the delete acts on the folder
    that was checked."""
    store, root = two["store"], two["root"]
    mine = _own(root, two["exp"], two["t1"])
    doomed = _publish(mine, 1)
    _publish(mine, 2)
    victim = _publish(tmp_path / "outside", 1)
    with store.write() as s:
        for step in (1, 2):
            path = str(mine / f"ckpt-{step:010d}")
            s.add(Checkpoint(trial_id=two["t1"], step=step, path=path, created_at=utcnow()))
    real_rename = os.rename
    moved = mine.parent / "moved-away"

    def swap_then_rename(src: Any, dst: Any, **kwargs: Any) -> None:
        if not moved.exists():
            real_rename(mine, moved)
            mine.symlink_to(victim.parent, target_is_directory=True)
        real_rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "rename", swap_then_rename)
    report = gc(store, two["exp"])
    monkeypatch.undo()
    assert (victim / "w.bin").is_file() and [p.name for p in victim.parent.iterdir()] == [
        victim.name
    ]
    assert report.deleted == [str(doomed)]
    assert sorted(p.name for p in moved.iterdir()) == ["ckpt-0000000002"]  # the checked one


def test_gc_reports_the_bytes_it_removed_not_the_recorded_size(
    two: dict[str, Any], tmp_path: Path
) -> None:
    store, root = two["store"], two["root"]
    mine = _own(root, two["exp"], two["t1"])
    old, new = _publish(mine, 1, b"x" * 5000), _publish(mine, 2)
    shared = tmp_path / "elsewhere.bin"  # a hard link into the folder: removing frees nothing
    shared.write_bytes(b"s" * 7000)
    os.link(shared, old / "linked.bin")
    real = _disk_bytes(old) - shared.stat().st_blocks * 512
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "kept.bin").write_bytes(b"k" * 3000)
    (old / "sub").mkdir()
    (old / "sub" / "escape").symlink_to(tmp_path / "dir", target_is_directory=True)  # unlinked only
    # the sizes the manifests list (a size that does not fit is not stored at all:
    # test_checkpoint_sizes.py); the folder holds more than its manifest lists
    _record(
        store,
        two["t1"],
        "1_0.r0",
        {"step": 1, "path": str(old), "size": 5000},
        {"step": 2, "path": str(new), "size": 100},
    )
    assert real != 5000
    assert gc(store, two["exp"], dry_run=True).bytes_freed == real
    report = gc(store, two["exp"])
    assert (report.deleted, report.bytes_freed) == ([str(old)], real)
    assert not old.exists() and shared.read_bytes() == b"s" * 7000
    assert (tmp_path / "dir" / "kept.bin").read_bytes() == b"k" * 3000
    assert [p.name for p in mine.iterdir()] == [new.name]  # nothing left out of sight
    with store.read() as s:
        disk = status_data(s, two["exp"]).to_json()["experiments"][0]["disk"]
    assert (disk["deleted_checkpoints"], disk["freed_bytes"]) == (1, real)


# -- the registry and export ------------------------------------------------------------


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def cli_two(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """Two trials of one experiment in $DLHPC_HOME: trial 1 with a verified checkpoint
    at step 5 (its only row), trial 2 with none."""
    monkeypatch.setenv("DLHPC_SITE", "local")
    store = Store(home)
    root = tmp_path / "ckpt"
    with store.write() as s:
        exp = _experiment(s, root)
        t1, t2 = _trial(s, exp, "COMPLETED", 0), _trial(s, exp, "COMPLETED", 1)
        world = {"store": store, "root": root, "exp": exp.id, "t1": t1.id, "t2": t2.id}
    theirs = _publish(_own(root, world["exp"], world["t1"]), 5)
    world["theirs"] = theirs
    with store.write() as s:
        world["c1"] = _add(s, world["t1"], theirs, 5)
    yield world
    store.close()


def _add(s: Any, trial_id: int, path: Path, step: int, size: int = 100) -> int:
    """A checkpoint row of ``size`` bytes (:func:`_publish`'s payload by default)."""
    c = Checkpoint(
        trial_id=trial_id,
        step=step,
        path=str(path),
        size_bytes=size,
        metric=0.5,
        created_at=utcnow(),
    )
    s.add(c)
    s.flush()
    return c.id


def _refused(world: dict[str, Any], trial: int, cid: int, message: str, tmp_path: Path) -> None:
    """``model register`` and ``export`` of checkpoint ``cid`` through ``trial`` both
    exit 2 with ``message``, writing nothing."""
    res = _run("model", "register", str(trial), "m", "--checkpoint", str(cid))
    assert res.exit_code == 2 and message in res.output, res.output
    with pytest.raises(UsageError, match=message):
        register(world["store"], trial, "m", cid)
    res = _run("export", str(trial), str(tmp_path / "out"))
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.export-*"))
    res = _run("model", "list", "--json")
    assert '"m"' not in res.output


def test_registry_and_export_refuse_another_trials_checkpoint(
    cli_two: dict[str, Any], tmp_path: Path
) -> None:
    world = cli_two
    with world["store"].write() as s:
        cid = _add(s, world["t2"], world["theirs"], 5)
    _refused(world, world["t2"], cid, "is not inside the trial's own checkpoint folder", tmp_path)
    with pytest.raises(UsageError, match="is not inside the trial's own checkpoint folder"):
        export_trial(world["store"], world["t2"], tmp_path / "direct")
    assert _run("model", "register", str(world["t1"]), "m").exit_code == 0  # its own: fine


def test_registry_and_export_refuse_a_step_mismatch(
    cli_two: dict[str, Any], tmp_path: Path
) -> None:
    world = cli_two
    mine = _own(world["root"], world["exp"], world["t2"])
    named = _publish(mine, 3)
    with world["store"].write() as s:  # the row says 4, the folder's name and manifest say 3
        cid = _add(s, world["t2"], named, 4)
    _refused(world, world["t2"], cid, "is the folder of step 3, not of step 4", tmp_path)
    with world["store"].write() as s:
        s.delete(s.get(Checkpoint, cid))
    renamed = mine / "ckpt-0000000008"
    _publish(mine, 7).rename(renamed)  # the folder's name says 8, its manifest 7
    with world["store"].write() as s:
        cid = _add(s, world["t2"], renamed, 8)
    _refused(world, world["t2"], cid, "MANIFEST.json is missing or does not say step 8", tmp_path)


def test_registry_and_export_refuse_a_bad_checksum(cli_two: dict[str, Any], tmp_path: Path) -> None:
    world = cli_two
    mine = _own(world["root"], world["exp"], world["t2"])
    bad = _publish(mine, 4)
    (bad / "w.bin").write_bytes(b"X" * 100)  # the same size, other bytes
    with world["store"].write() as s:
        cid = _add(s, world["t2"], bad, 4)
    _refused(world, world["t2"], cid, "sha256 mismatch", tmp_path)
    shutil.rmtree(bad)  # gone: export passes over it
    res = _run("export", str(world["t2"]), str(tmp_path / "out"))
    assert res.exit_code == 0 and not (tmp_path / "out" / "checkpoint").exists(), res.output
