"""The checkpoint format: atomic checkpoint folders, the unit of recovery.

Layout under a trial's checkpoint folder::

    ckpt-0000001200/            one folder per checkpoint (``ckpt-<step:010d>``)
      state.pt ...              payload files, any names, subfolders allowed
      MANIFEST.json             written LAST: the commit point
    ckpt-0000001200-1/          a re-save of the same step (after a restart)
    .tmp-ckpt-1300-<uuid>/      a publish in progress, or one that crashed

Contract: a folder is a checkpoint only if its ``MANIFEST.json`` parses and
every file it lists exists with the recorded size (and sha256). Anything else
is *torn* and is never returned as loadable. A new checkpoint never replaces an
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
import hashlib
import json
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from dlhpc._failpoints import failpoint
from dlhpc.protocol.atomic import atomic_write_bytes, fsync_dir
from dlhpc.protocol.record_check import MAX_BYTES, MAX_TIME
from dlhpc.protocol.safe_read import MANIFEST_LIMIT, UnsafeFile, parse_json, read_bounded

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

MANIFEST_NAME = "MANIFEST.json"
FORMAT = 1
STALE_TMP_SECONDS = 3600.0
# a published checkpoint folder's name
CHECKPOINT_NAME_RE = re.compile(r"^ckpt-(?P<step>\d{10,})(?:-(?P<seq>[1-9]\d*))?$")
_TMP_RE = re.compile(r"^\.tmp-ckpt-(?P<step>\d+)-[0-9a-f]{32}$")
# a checkpoint folder being deleted is renamed to this prefix + its name + a random suffix
DELETING_PREFIX = ".del-ckpt-"
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class FileRecord:
    size: int
    sha256: str


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint as its manifest describes it (not necessarily verified)."""

    path: Path
    step: int
    created: float
    files: dict[str, FileRecord] = field(hash=False)
    metadata: dict[str, Any] = field(hash=False)

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files.values())


@dataclass(frozen=True)
class TornCheckpoint:
    """A folder that is not a loadable checkpoint, and why."""

    path: Path
    step: int
    reason: str


@dataclass(frozen=True)
class _Entry:
    path: Path
    step: int
    seq: int  # re-save number; -1 for a temp folder (sorts below a published twin)

    @property
    def is_tmp(self) -> bool:
        return self.seq < 0


def temp_checkpoint_dir(root: Path, step: int) -> Path:
    """A fresh, unique name (not created) for a checkpoint of ``step`` being written
    under ``root``: readers skip it, :func:`prune` removes it once it is stale."""
    return root / f".tmp-ckpt-{step}-{uuid.uuid4().hex}"


def _scan(root: Path) -> list[_Entry]:
    """Checkpoint and temp folders under ``root``, newest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    entries = []
    for name in names:
        if m := CHECKPOINT_NAME_RE.match(name):
            entries.append(_Entry(root / name, int(m["step"]), int(m["seq"] or 0)))
        elif m := _TMP_RE.match(name):
            entries.append(_Entry(root / name, int(m["step"]), -1))
    return sorted(entries, key=lambda e: (e.step, e.seq), reverse=True)


def _is_count(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _hash_file(path: Path, sync: bool = False) -> tuple[int, str]:
    """(size, sha256) of ``path``; fsyncs it too if ``sync``."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(f.fileno())
    return size, h.hexdigest()


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
            files[rel] = FileRecord(*_hash_file(p, sync=True))
    if not files:
        raise ValueError("write_files wrote no files")
    for d in reversed(dirs):
        fsync_dir(d)
    return dict(sorted(files.items()))


def _reserve_name(root: Path, step: int) -> Path:
    """Create an empty, unused ``ckpt-<step>[-n]`` folder (mkdir is exclusive)."""
    base = f"ckpt-{step:010d}"
    seqs = [e.seq for e in _scan(root) if e.step == step and not e.is_tmp]
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
    if not _is_count(step):
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


def _parse_manifest(folder: Path, step: int) -> Checkpoint | str:
    path = folder / MANIFEST_NAME
    try:  # bounded, never through a symlink (safe_read): a job wrote it
        m = parse_json(read_bounded(path, MANIFEST_LIMIT), path)
    except FileNotFoundError:
        return "no manifest"
    except UnsafeFile as e:
        return f"manifest unusable: {e.reason}"
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        return "manifest has an unknown format"
    if m.get("step") != step or not _is_count(m.get("step")):
        return f"manifest step {m.get('step')!r} != folder step {step}"
    created, files_raw, meta = m.get("created"), m.get("files"), m.get("metadata")
    if not isinstance(created, int | float) or not 0 <= created <= MAX_TIME:
        return "manifest: bad 'created'"
    if not isinstance(files_raw, dict) or not files_raw or not isinstance(meta, dict):
        return "manifest: bad 'files' or 'metadata'"
    files: dict[str, FileRecord] = {}
    for rel, rec in files_raw.items():
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts or rel == MANIFEST_NAME:
            return f"manifest: unsafe file name {rel!r}"
        size, sha = (rec.get("size"), rec.get("sha256")) if isinstance(rec, dict) else (0, 0)
        if not _is_count(size) or size > MAX_BYTES:
            return f"manifest: bad size or sha256 for {rel}"
        if not isinstance(sha, str) or not _SHA_RE.match(sha):
            return f"manifest: bad size or sha256 for {rel}"
        files[rel] = FileRecord(size, sha)
    return Checkpoint(folder, step, float(created), files, meta)


def verify_checkpoint(ckpt: Checkpoint, verify_hashes: bool = True) -> str | None:
    """Why ``ckpt``'s files do not match its manifest, or None if they do."""
    for rel, rec in ckpt.files.items():
        p = ckpt.path / rel
        try:
            st = os.stat(p)
        except OSError:
            return f"file {rel}: missing"
        if not stat.S_ISREG(st.st_mode):
            return f"file {rel}: not a regular file"
        if st.st_size != rec.size:
            return f"file {rel}: size {st.st_size} != {rec.size}"
        if verify_hashes:
            try:
                size, sha = _hash_file(p)
            except OSError as e:
                return f"file {rel}: unreadable: {e}"
            if size != rec.size or sha != rec.sha256:
                return f"file {rel}: sha256 mismatch"
    return None


def _check(entry: _Entry, verify_hashes: bool) -> Checkpoint | str:
    if entry.is_tmp:
        return "unpublished temp folder (a save in progress or one that crashed)"
    if not entry.path.is_dir():
        return "not a folder"
    ckpt = _parse_manifest(entry.path, entry.step)
    if isinstance(ckpt, str):
        return ckpt
    reason = verify_checkpoint(ckpt, verify_hashes)
    return ckpt if reason is None else reason


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Published checkpoints whose manifest parses, newest first. Files are not checked."""
    out = []
    for e in _scan(root):
        if not e.is_tmp and isinstance(ckpt := _parse_manifest(e.path, e.step), Checkpoint):
            out.append(ckpt)
    return out


def latest_verified(
    root: Path, verify_hashes: bool = True
) -> tuple[Checkpoint | None, list[TornCheckpoint]]:
    """The newest verified checkpoint (or None), and every torn folder newer than it."""
    torn: list[TornCheckpoint] = []
    for e in _scan(root):
        result = _check(e, verify_hashes)
        if isinstance(result, Checkpoint):
            return result, torn
        torn.append(TornCheckpoint(e.path, e.step, result))
    return None, torn


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
    for e in _scan(root):
        if e.path.name in protect or str(e.path) in protect:
            if (keep_latest is None or kept < keep_latest) and isinstance(
                _check(e, verify_hashes), Checkpoint
            ):
                kept += 1
            continue
        if e.is_tmp:
            try:
                doomed = now - _newest_mtime(e.path) > stale_after
            except OSError:  # vanished meanwhile
                doomed = False
        elif keep_latest is None or kept < keep_latest:
            if isinstance(_check(e, verify_hashes), Checkpoint):
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
