"""Atomic checkpoint folders: publish, verify, skip torn ones, prune, survive crashes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dlhpc.protocol import checkpoint as ck
from dlhpc.protocol.checkpoint import (
    MANIFEST_NAME,
    Checkpoint,
    latest_verified,
    list_checkpoints,
    prune,
    publish_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]


def payload(data: bytes, extra: dict[str, bytes] | None = None) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        (folder / "model.pt").write_bytes(data)
        for rel, body in (extra or {}).items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(body)

    return write


def save(root: Path, step: int, data: bytes | None = None) -> Checkpoint:
    body = data if data is not None else f"weights@{step}".encode() * 10
    return publish_checkpoint(root, step, payload(body), {"step": step})


def test_publish_and_latest_verified(tmp_path: Path) -> None:
    ck1 = save(tmp_path, 1)
    extra = {"shards/opt-0.bin": b"x" * 100, "shards/opt-1.bin": b""}
    ck2 = publish_checkpoint(tmp_path, 42, payload(b"abc", extra), {"epoch": 3})
    assert ck2.path == tmp_path / "ckpt-0000000042"
    assert set(ck2.files) == {"model.pt", "shards/opt-0.bin", "shards/opt-1.bin"}
    assert ck2.files["model.pt"].sha256 == hashlib.sha256(b"abc").hexdigest()
    assert ck2.size_bytes == 103
    manifest = json.loads((ck2.path / MANIFEST_NAME).read_text())
    assert manifest["format"] == 1 and manifest["step"] == 42
    assert manifest["metadata"] == {"epoch": 3}
    assert manifest["files"]["model.pt"] == {"size": 3, "sha256": ck2.files["model.pt"].sha256}
    best, torn = latest_verified(tmp_path)
    assert best == ck2 and torn == []
    assert [c.step for c in list_checkpoints(tmp_path)] == [42, 1]
    assert list_checkpoints(tmp_path)[1] == ck1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_empty_or_missing_root(tmp_path: Path) -> None:
    assert latest_verified(tmp_path / "nope") == (None, [])
    assert list_checkpoints(tmp_path / "nope") == []
    assert prune(tmp_path / "nope", 1) == []


def _truncate(c: Checkpoint) -> None:
    (c.path / "model.pt").write_bytes(b"short")


def _flip(c: Checkpoint) -> None:
    p = c.path / "model.pt"
    data = bytearray(p.read_bytes())
    data[3] ^= 0x01
    p.write_bytes(bytes(data))


def _edit_manifest(**changes: object) -> Callable[[Checkpoint], None]:
    def edit(c: Checkpoint) -> None:
        m = json.loads((c.path / MANIFEST_NAME).read_text())
        m.update(changes)
        (c.path / MANIFEST_NAME).write_text(json.dumps(m))

    return edit


CORRUPTIONS: dict[str, tuple[Callable[[Checkpoint], None], str]] = {
    "no manifest": (lambda c: (c.path / MANIFEST_NAME).unlink(), "no manifest"),
    "missing file": (lambda c: (c.path / "model.pt").unlink(), "file model.pt: missing"),
    "truncated": (_truncate, "file model.pt: size 5 != 100"),
    "sha mismatch": (_flip, "file model.pt: sha256 mismatch"),
    "garbage manifest": (
        lambda c: (c.path / MANIFEST_NAME).write_bytes(b"{\x00nope"),
        "not valid JSON",
    ),
    "manifest not a dict": (lambda c: (c.path / MANIFEST_NAME).write_text("[]"), "format"),
    "wrong step": (_edit_manifest(step=7), "manifest step 7 != folder step 2"),
    "unsafe name": (
        _edit_manifest(files={"../x": {"size": 1, "sha256": "0" * 64}}),
        "unsafe file name",
    ),
    "bad sha field": (_edit_manifest(files={"model.pt": {"size": 100, "sha256": 5}}), "sha256"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_torn_newest_is_skipped_with_reason(tmp_path: Path, kind: str) -> None:
    good = save(tmp_path, 1, b"a" * 100)
    bad = save(tmp_path, 2, b"b" * 100)
    corrupt, reason = CORRUPTIONS[kind]
    corrupt(bad)
    best, torn = latest_verified(tmp_path)
    assert best == good
    assert [(t.path, t.step) for t in torn] == [(bad.path, 2)]
    assert reason in torn[0].reason
    if kind == "sha mismatch":  # a size-only check cannot see a flipped bit
        assert latest_verified(tmp_path, verify_hashes=False)[0] == bad


def test_temp_and_stray_folders(tmp_path: Path) -> None:
    good = save(tmp_path, 1)
    tmp = tmp_path / f".tmp-ckpt-5-{'a' * 32}"
    tmp.mkdir()
    (tmp / "model.pt").write_bytes(b"half")
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / "ckpt-0000000009").write_text("a file, not a folder")
    best, torn = latest_verified(tmp_path)
    assert best == good
    assert [(t.step, t.path.name) for t in torn] == [(9, "ckpt-0000000009"), (5, tmp.name)]
    assert "not a folder" in torn[0].reason and "temp folder" in torn[1].reason
    assert [c.step for c in list_checkpoints(tmp_path)] == [1]


def test_all_torn(tmp_path: Path) -> None:
    c = save(tmp_path, 3)
    (c.path / MANIFEST_NAME).unlink()
    best, torn = latest_verified(tmp_path)
    assert best is None and [t.reason for t in torn] == ["no manifest"]


def test_prune_keeps_newest_n_and_protected(tmp_path: Path) -> None:
    cks = [save(tmp_path, s) for s in (1, 2, 3, 4, 5)]
    removed = prune(tmp_path, 2, protect={cks[0].path.name})
    assert sorted(removed) == [cks[1].path, cks[2].path]
    assert [c.step for c in list_checkpoints(tmp_path)] == [5, 4, 1]
    assert prune(tmp_path, 2, protect={str(cks[0].path)}) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    with pytest.raises(ValueError):
        prune(tmp_path, 0)


def test_prune_never_removes_newest_verified(tmp_path: Path) -> None:
    old = save(tmp_path, 1)
    good = save(tmp_path, 2)
    newest = save(tmp_path, 3)
    _flip(newest)  # torn and newer than every verified one: may be in progress, left alone
    removed = prune(tmp_path, 1)
    assert removed == [old.path]
    assert latest_verified(tmp_path)[0] == good
    assert newest.path.exists()
    # once something newer is verified, the torn one goes too
    fresh = save(tmp_path, 4)
    assert sorted(prune(tmp_path, 1)) == [good.path, newest.path]
    assert latest_verified(tmp_path) == (fresh, [])


def test_prune_torn_between_verified(tmp_path: Path) -> None:
    a = save(tmp_path, 1)
    b = save(tmp_path, 2)
    c = save(tmp_path, 3)
    (b.path / MANIFEST_NAME).unlink()
    assert prune(tmp_path, 2) == [b.path]
    assert [x.step for x in list_checkpoints(tmp_path)] == [3, 1]
    assert latest_verified(tmp_path) == (c, [])
    assert a.path.exists()


def test_prune_stale_temp_folders(tmp_path: Path) -> None:
    save(tmp_path, 1)
    stale = tmp_path / f".tmp-ckpt-2-{'b' * 32}"
    fresh = tmp_path / f".tmp-ckpt-3-{'c' * 32}"
    leftover = tmp_path / ".del-ckpt-ckpt-0000000000-x"
    for d in (stale, fresh, leftover):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f").write_bytes(b"1")
    old = time.time() - 2 * ck.STALE_TMP_SECONDS
    for p in (stale / "sub" / "f", stale / "sub", stale):
        os.utime(p, (old, old))
    assert prune(tmp_path, 1) == [stale]
    assert fresh.exists() and not stale.exists() and not leftover.exists()
    assert prune(tmp_path, 1, stale_after=-1) == [fresh]


def test_crash_in_write_files_keeps_previous(tmp_path: Path) -> None:
    good = save(tmp_path, 1)

    def boom(folder: Path) -> None:
        (folder / "model.pt").write_bytes(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        publish_checkpoint(tmp_path, 2, boom, {})
    assert latest_verified(tmp_path) == (good, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.path.name]


def test_failed_manifest_write_keeps_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = save(tmp_path, 1)

    def fail(path: Path, data: bytes) -> None:
        raise OSError("EIO on manifest")

    monkeypatch.setattr(ck, "atomic_write_bytes", fail)
    with pytest.raises(OSError, match="EIO"):
        save(tmp_path, 2)
    monkeypatch.undo()
    assert latest_verified(tmp_path) == (good, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.path.name]


_CHILD = """
import sys
from pathlib import Path
from dlhpc.protocol.checkpoint import publish_checkpoint
def write(folder):
    (folder / "model.pt").write_bytes(b"new" * 1000)
publish_checkpoint(Path(sys.argv[1]), 2, write, {})
"""


@pytest.mark.parametrize(
    ("point", "survivor"),
    [
        ("ckpt-after-write", 1),
        ("ckpt-after-seal", 1),
        ("ckpt-after-rename", 1),
        ("ckpt-after-manifest", 2),
    ],
)
def test_sigkill_at_each_stage(tmp_path: Path, point: str, survivor: int) -> None:
    """A hard kill (no cleanup runs) at each stage never loses the previous checkpoint."""
    save(tmp_path, 1)
    env = {**os.environ, "DLHPC_FAILPOINTS": point}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, cwd=REPO)
    assert proc.returncode == -9
    best, torn = latest_verified(tmp_path)
    assert best is not None and best.step == survivor
    assert len(torn) == (0 if survivor == 2 else 1)
    redo = save(tmp_path, 2)  # the restarted job redoes the save and prunes the wreck
    prune(tmp_path, 1, stale_after=-1)
    assert [p.name for p in tmp_path.iterdir()] == [redo.path.name]


def test_resave_same_step(tmp_path: Path) -> None:
    first = save(tmp_path, 5, b"first")
    second = save(tmp_path, 5, b"second")
    assert second.path.name == "ckpt-0000000005-1"
    assert latest_verified(tmp_path)[0] == second
    assert prune(tmp_path, 1) == [first.path]
    third = save(tmp_path, 5, b"third")  # numbering continues past the highest, not the gap
    assert third.path.name == "ckpt-0000000005-2"
    assert latest_verified(tmp_path)[0] == third


def test_resave_over_torn_folder(tmp_path: Path) -> None:
    save(tmp_path, 1)
    torn = tmp_path / "ckpt-0000000005"
    torn.mkdir()
    (torn / "model.pt").write_bytes(b"half")  # killed before its manifest
    fresh = save(tmp_path, 5)
    assert fresh.path.name == "ckpt-0000000005-1"
    assert latest_verified(tmp_path) == (fresh, [])
    assert torn in prune(tmp_path, 1)
    assert [p.name for p in tmp_path.iterdir()] == [fresh.path.name]


def test_publish_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="step"):
        save(tmp_path, -1)
    with pytest.raises(ValueError, match="no files"):
        publish_checkpoint(tmp_path, 1, lambda folder: None, {})
    with pytest.raises(ValueError, match=MANIFEST_NAME):
        publish_checkpoint(tmp_path, 1, payload(b"x", {MANIFEST_NAME: b"{}"}), {})
    with pytest.raises(TypeError):
        publish_checkpoint(tmp_path, 1, payload(b"x"), {"bad": object()})

    def link(folder: Path) -> None:
        (folder / "model.pt").symlink_to(tmp_path / "elsewhere")

    (tmp_path / "elsewhere").write_bytes(b"x")
    with pytest.raises(ValueError, match="regular file"):
        publish_checkpoint(tmp_path, 1, link, {})
    assert latest_verified(tmp_path) == (None, [])
    assert [p.name for p in tmp_path.iterdir()] == ["elsewhere"]
