"""The checkpoint format: atomic checkpoint folders, the unit of recovery.

Layout under a trial's checkpoint folder::

    ckpt-0000001200/            one folder per checkpoint (``ckpt-<step:010d>``)
      state.pt ...              payload files, any names, subfolders allowed
      MANIFEST.json             written LAST: the commit point
    ckpt-0000001200-1/          a re-save of the same step (after a restart)
    .tmp-ckpt-1300-<uuid>/      a publish in progress, or one that crashed

Contract: a folder is a checkpoint only if its ``MANIFEST.json`` parses and
every file it lists exists with the recorded size (and sha256); anything else
is *torn* and is never returned as loadable (reading and verifying:
:mod:`dlhpc.protocol.checkpoint_read`, whose names this module gives too;
publishing and pruning: here). A new checkpoint never replaces an
old one in place, and nothing older is deleted until :func:`prune` runs after a
newer one is verified, so a crash at any instant leaves the previous verified
checkpoint intact. The newest ``(step, re-save number)`` wins.

Under dlhpc the reconciler's GC (:mod:`dlhpc.orchestrator.checkpoints`) is the
only one that deletes published checkpoints (renamed to a :data:`DELETING_PREFIX`
name first, as :func:`prune` does); a job prunes with ``keep_latest=None``, which
removes only torn and stale temp folders (and removals interrupted earlier).

One writer per folder at a time (rank 0 of one job); readers may run anytime.
Jobs publish through the training-side API (:mod:`dlhpc.harness.state`), the
reconciler and the report list, verify and remove with the same functions.
Standard library only: cheap to import inside a job.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from dlhpc._failpoints import failpoint
from dlhpc.protocol.atomic import atomic_write_bytes, fsync_dir
from dlhpc.protocol.checkpoint_read import (
    CHECKPOINT_NAME_RE,
    FORMAT,
    MANIFEST_NAME,
    Checkpoint,
    FileRecord,
    TornCheckpoint,
    check_entry,
    hash_file,
    is_count,
    latest_verified,
    list_checkpoints,
    scan_folder,
    verify_checkpoint,
)

__all__ = [
    "CHECKPOINT_NAME_RE",
    "DELETING_PREFIX",
    "MANIFEST_NAME",
    "Checkpoint",
    "FileRecord",
    "TornCheckpoint",
    "latest_verified",
    "list_checkpoints",
    "prune",
    "publish_checkpoint",
    "temp_checkpoint_dir",
    "verify_checkpoint",
]

STALE_TMP_SECONDS = 3600.0
# a checkpoint folder being deleted is renamed to this prefix + its name + a random suffix
DELETING_PREFIX = ".del-ckpt-"


def temp_checkpoint_dir(root: Path, step: int) -> Path:
    """A fresh, unique name (not created) for a checkpoint of ``step`` being written
    under ``root``: readers skip it, :func:`prune` removes it once it is stale."""
    return root / f".tmp-ckpt-{step}-{uuid.uuid4().hex}"


def _seal(folder: Path) -> dict[str, FileRecord]:
    """fsync and hash every file below ``folder``, then fsync every folder."""
    files: dict[str, FileRecord] = {}
    dirs = [folder]
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        dirs.extend(here / d for d in dirnames)
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            p = here / name
            rel = p.relative_to(folder).as_posix()
            if rel == MANIFEST_NAME:
                raise ValueError(f"write_files may not create {MANIFEST_NAME}")
            if not stat.S_ISREG(os.lstat(p).st_mode):
                raise ValueError(f"checkpoint file {rel} is not a regular file")
            files[rel] = FileRecord(*hash_file(p, sync=True))
    if not files:
        raise ValueError("write_files wrote no files")
    for d in reversed(dirs):
        fsync_dir(d)
    return dict(sorted(files.items()))


def _reserve_name(root: Path, step: int) -> Path:
    """Create an empty, unused ``ckpt-<step>[-n]`` folder (mkdir is exclusive)."""
    base = f"ckpt-{step:010d}"
    seqs = [e.seq for e in scan_folder(root) if e.step == step and not e.is_tmp]
    n = max(seqs, default=-1) + 1
    while True:
        target = root / (base if n == 0 else f"{base}-{n}")
        try:
            target.mkdir()
            return target
        except FileExistsError:
            n += 1


def _moved_in(tmp: Path, final: Path, files: dict[str, FileRecord]) -> bool:
    """True when the folder rename of ``tmp`` onto ``final`` that reported an error
    happened anyway (an NFS retransmit answered ENOENT/ESTALE): the uniquely named
    temp folder is gone and ``final`` holds every sealed file at its size."""
    try:
        sizes = {rel: os.lstat(final / rel).st_size for rel in files}
    except OSError:
        return False
    return not os.path.lexists(tmp) and sizes == {k: v.size for k, v in files.items()}


def publish_checkpoint(
    root: Path,
    step: int,
    write_files: Callable[[Path], None],
    metadata: dict[str, Any] | None = None,
) -> Checkpoint:
    """Publish a new checkpoint for ``step`` under ``root`` and return it.

    ``write_files(folder)`` writes the payload into a private temp folder. The
    files are then fsynced and hashed, the folder is renamed to
    ``ckpt-<step:010d>`` (``-<n>`` appended if that step was saved before) and
    ``MANIFEST.json`` is written last, atomically. If anything raises, the
    partial folder is removed and the error propagates; a hard kill leaves a torn
    folder that readers skip and :func:`prune` removes. ``metadata`` must be
    JSON-serialisable. Nothing existing is modified or deleted.
    """
    if not is_count(step):
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    meta = json.loads(json.dumps(metadata or {}, allow_nan=False))  # fail before any I/O
    root.mkdir(parents=True, exist_ok=True)
    tmp = temp_checkpoint_dir(root, step)
    tmp.mkdir()
    final: Path | None = None
    try:
        write_files(tmp)
        failpoint("ckpt-after-write")
        files = _seal(tmp)
        failpoint("ckpt-after-seal")
        final = _reserve_name(root, step)
        try:
            os.replace(tmp, final)  # onto the empty reserved folder: atomic on POSIX
        except OSError:
            if not _moved_in(tmp, final, files):
                raise
        fsync_dir(root)
        failpoint("ckpt-after-rename")
        created = time.time()
        manifest = {
            "format": FORMAT,
            "step": step,
            "created": created,
            "files": {k: {"size": v.size, "sha256": v.sha256} for k, v in files.items()},
            "metadata": meta,
        }
        body = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False)
        atomic_write_bytes(final / MANIFEST_NAME, body.encode("utf-8"))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if final is not None:
            shutil.rmtree(final, ignore_errors=True)
        raise
    failpoint("ckpt-after-manifest")
    return Checkpoint(final, step, created, files, meta)


def _newest_mtime(folder: Path) -> float:
    """Latest mtime of ``folder`` or anything below it (a live writer keeps it fresh)."""
    newest = os.lstat(folder).st_mtime
    for dirpath, _, filenames in os.walk(folder):
        for name in [*filenames, "."]:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
    return newest


def _remove(root: Path, folder: Path) -> bool:
    """Rename ``folder`` out of sight (atomic), then delete it."""
    doomed = root / f"{DELETING_PREFIX}{folder.name}-{uuid.uuid4().hex}"
    try:
        os.rename(folder, doomed)
    except FileNotFoundError:
        return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def prune(
    root: Path,
    keep_latest: int | None,
    protect: AbstractSet[str] = frozenset(),
    *,
    verify_hashes: bool = True,
    stale_after: float = STALE_TMP_SECONDS,
) -> list[Path]:
    """Delete old checkpoints; return the folders removed.

    Keeps the newest ``keep_latest`` (>= 1; None: every one) verified
    checkpoints, so never the newest verified one. Removes published folders
    (verified or torn) older than the newest verified one once ``keep_latest``
    are kept, torn folders older than the newest verified one, and temp folders
    untouched for ``stale_after`` seconds. Torn folders newer than every verified
    checkpoint are left alone: they may be a publish in progress, and go once a
    newer one is verified. ``protect`` holds folder names (or paths) that are
    never removed.
    """
    if keep_latest is not None and (not isinstance(keep_latest, int) or keep_latest < 1):
        raise ValueError(f"keep_latest must be an int >= 1 or None, got {keep_latest!r}")
    removed: list[Path] = []
    kept = 0
    now = time.time()
    for e in scan_folder(root):
        if e.path.name in protect or str(e.path) in protect:
            if (keep_latest is None or kept < keep_latest) and isinstance(
                check_entry(e, verify_hashes), Checkpoint
            ):
                kept += 1
            continue
        if e.is_tmp:
            try:
                doomed = now - _newest_mtime(e.path) > stale_after
            except OSError:  # vanished meanwhile
                doomed = False
        elif keep_latest is None or kept < keep_latest:
            if isinstance(check_entry(e, verify_hashes), Checkpoint):
                kept += 1
                doomed = False
            else:  # torn: garbage once something newer is verified
                doomed = kept > 0
        else:
            doomed = True
        if doomed and _remove(root, e.path):
            removed.append(e.path)
    for name in os.listdir(root) if root.is_dir() else []:
        if name.startswith(DELETING_PREFIX):  # a removal interrupted earlier
            shutil.rmtree(root / name, ignore_errors=True)
    if removed:
        fsync_dir(root)
    return removed
