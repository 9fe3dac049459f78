"""A checkpoint's size is the job's word, so it is checked against its files: a
manifest whose sizes total more than any checkpoint, or that lists a symlink, is
torn (never loaded, registered or resumed from); a ``checkpoint`` record whose size
does not fit its folder is not stored, and a row whose size does not fit is refused
by the registry and export. Real files, a real SQLite store."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from dlhpc.errors import UsageError
from dlhpc.orchestrator._contained import checked_checkpoint
from dlhpc.orchestrator.checkpoints import gc
from dlhpc.protocol.checkpoint import MANIFEST_NAME, latest_verified, publish_checkpoint
from dlhpc.protocol.checkpoint_read import list_checkpoints, parse_manifest
from dlhpc.protocol.record_check import MAX_BYTES, check_record
from dlhpc.store import Checkpoint, Event
from dlhpc.store.checkpoint_dirs import TrialCheckpointDir
from tests.unit.test_trial_reach import _own, _publish, _record, _rows, two  # noqa: F401


def _rewrite_manifest(folder: Path, change: Any) -> None:
    path = folder / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    change(manifest)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(manifest))


def test_a_manifest_whose_sizes_total_too_much_is_torn(tmp_path: Path) -> None:
    folder = _publish(tmp_path, 3)
    big = {"size": MAX_BYTES // 2 + 1, "sha256": "0" * 64}
    _rewrite_manifest(folder, lambda m: m["files"].update({"a.bin": big, "b.bin": big}))
    why = parse_manifest(folder, 3)
    assert isinstance(why, str) and "total" in why
    assert list_checkpoints(tmp_path) == []
    assert latest_verified(tmp_path)[0] is None


def test_a_file_listed_as_a_symlink_does_not_verify(tmp_path: Path) -> None:
    """A job links another file (another trial's weights, a secret) into its folder
    with the size and sha256 the manifest gives: still not its checkpoint."""
    elsewhere = tmp_path / "elsewhere"
    other = _publish(elsewhere, 1, b"secret" * 10)
    mine = tmp_path / "mine"
    folder = _publish(mine, 2, b"secret" * 10)
    (folder / "w.bin").unlink()
    (folder / "w.bin").symlink_to(other / "w.bin")
    ckpt, torn = latest_verified(mine)
    assert ckpt is None and "symlink" in torn[0].reason
    (folder / "w.bin").unlink()
    (folder / "w.bin").write_bytes(b"secret" * 10)  # the same bytes, a file of its own
    assert latest_verified(mine)[0] is not None


def test_a_record_of_an_absurd_size_is_quarantined() -> None:
    with pytest.raises(ValueError, match="'size'"):
        check_record({"type": "checkpoint", "step": 1, "path": "x", "size": 2**62})
    check_record({"type": "checkpoint", "step": 1, "path": "x", "size": 2**40})


def test_a_record_whose_size_does_not_fit_its_folder_is_not_stored(
    two: dict[str, Any],  # noqa: F811
) -> None:
    store, root = two["store"], two["root"]
    mine = _own(root, two["exp"], two["t1"])
    forged, resized, fine = (_publish(mine, step) for step in (1, 2, 3))
    (resized / "w.bin").chmod(0o644)
    (resized / "w.bin").write_bytes(b"w" * 10)  # no longer the size its manifest says
    _record(
        store,
        two["t1"],
        "1_0.r0",
        {"step": 1, "path": str(forged), "size": 1000 * 2**30},
        {"step": 2, "path": str(resized), "size": 100},
        {"step": 3, "path": str(fine), "size": 100},
        {"step": 4, "path": str(mine / "ckpt-0000000004"), "size": 7},  # not (yet) visible
    )
    assert [step for step, _, _ in _rows(store, two["t1"])] == [3, 4]
    with store.read() as s:
        warnings = list(s.scalars(select(Event.message).where(Event.trial_id == two["t1"])))
    assert len(warnings) == 2
    assert "its size 1073741824000 is not its manifest's total 100" in warnings[0]
    assert "size 10 != 100" in warnings[1]


def test_registry_and_export_refuse_a_row_whose_size_does_not_fit(tmp_path: Path) -> None:
    own = TrialCheckpointDir(tmp_path, "exp-000001", "trial-000001")
    folder = publish_checkpoint(own.path, 5, lambda f: (f / "w.bin").write_bytes(b"w" * 100)).path
    assert checked_checkpoint(own, str(folder), 5, 100) == folder
    with pytest.raises(UsageError, match="recorded size 7 is not its manifest's total 100"):
        checked_checkpoint(own, str(folder), 5, 7, verify_hashes=False)


@pytest.mark.parametrize("linked", ["experiment", "trial"])
def test_ingest_reaches_the_manifest_without_a_symlink(
    two: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    linked: str,
) -> None:
    """The size check reads the manifest and stats the files through descriptors from
    the configured root: a job that replaced its trial's (or experiment's) checkpoint
    folder with a symlink to a well-formed checkpoint elsewhere has its record refused."""
    store, root = two["store"], two["root"]
    mine = _own(root, two["exp"], two["t1"])
    swapped = mine if linked == "trial" else mine.parent
    elsewhere = tmp_path / "elsewhere" / swapped.name
    target = elsewhere if linked == "trial" else elsewhere / mine.name
    _publish(target, 1)
    swapped.parent.mkdir(parents=True, exist_ok=True)
    swapped.symlink_to(elsewhere, target_is_directory=True)
    _record(
        store, two["t1"], "1_0.r0", {"step": 1, "path": str(mine / "ckpt-0000000001"), "size": 100}
    )
    assert _rows(store, two["t1"]) == []
    with store.read() as s:
        (warning,) = s.scalars(select(Event.message).where(Event.trial_id == two["t1"]))
    assert "checkpoint record refused" in warning and "symlink" in warning, warning


def test_a_sparse_checkpoint_counts_what_its_files_take_on_disk(
    two: dict[str, Any],  # noqa: F811
) -> None:
    """Sizes count allocated blocks (as ``du`` does): a checkpoint whose one file is a
    64 MiB hole is stored (a compressed filesystem shows the same) but counts the few
    bytes it takes, the registry still accepts it, and GC reports what it freed on
    disk, not the apparent 64 MiB."""
    store, root = two["store"], two["root"]
    mine = _own(root, two["exp"], two["t1"])
    hole = 64 * 2**20

    def sparse(folder: Path) -> None:
        with open(folder / "w.bin", "wb") as f:
            f.truncate(hole)

    holey = publish_checkpoint(mine, 1, sparse).path
    dense = _publish(mine, 2)
    _record(
        store,
        two["t1"],
        "1_0.r0",
        {"step": 1, "path": str(holey), "size": hole},
        {"step": 2, "path": str(dense), "size": 100},
    )
    on_disk = (holey / "w.bin").stat().st_blocks * 512
    assert on_disk < hole // 8
    with store.read() as s:
        sizes = dict(s.execute(select(Checkpoint.step, Checkpoint.size_bytes)).all())
        (note,) = s.scalars(select(Event.message).where(Event.trial_id == two["t1"]))
    assert sizes == {1: on_disk, 2: 100}  # a dense file counts its manifest's size
    assert f"take {on_disk} bytes on disk of the {hole}" in note and "sparse" in note
    own = TrialCheckpointDir(root, mine.parent.name, mine.name)
    assert checked_checkpoint(own, str(holey), 1, on_disk, verify_hashes=False) == holey
    du = sum(p.lstat().st_blocks * 512 for p in holey.rglob("*") if p.is_file())
    report = gc(store, two["exp"])
    assert report.deleted == [str(holey)] and report.bytes_freed == du < 2**20
