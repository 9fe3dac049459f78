"""Reading the checkpoint format: what a folder under a trial's checkpoint folder is.

A folder named ``ckpt-<step:010d>[-<n>]`` is a checkpoint only if its
``MANIFEST.json`` (read bounded, never through a symlink: a job wrote it) parses,
says the folder's step, lists safe relative names with sizes in range whose total
is at most :data:`~dlhpc.protocol.record_check.MAX_BYTES`, and every file it lists
exists as a regular file with the recorded size (and sha256). Anything else is
*torn* and is never returned as loadable: :func:`latest_verified` gives the newest
verified one and the torn ones newer than it, :func:`list_checkpoints` those whose
manifest parses. :mod:`dlhpc.protocol.checkpoint` publishes and prunes with the
same rules. Standard library only: cheap to import inside a job.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from dlhpc.protocol.record_check import MAX_BYTES, MAX_TIME
from dlhpc.protocol.safe_read import (
    MANIFEST_LIMIT,
    UnsafeFile,
    open_regular,
    parse_json,
    read_bounded,
)

__all__ = [
    "CHECKPOINT_NAME_RE",
    "FORMAT",
    "MANIFEST_NAME",
    "TMP_NAME_RE",
    "Checkpoint",
    "Entry",
    "FileRecord",
    "TornCheckpoint",
    "SPARSE_RATIO",
    "SPARSE_SLACK",
    "check_entry",
    "counted_on_disk",
    "hash_file",
    "is_count",
    "latest_verified",
    "list_checkpoints",
    "parse_manifest",
    "RecordedSize",
    "measure_recorded",
    "scan_folder",
    "verify_checkpoint",
]

MANIFEST_NAME = "MANIFEST.json"
FORMAT = 1
# a published checkpoint folder's name
CHECKPOINT_NAME_RE = re.compile(r"^ckpt-(?P<step>\d{10,})(?:-(?P<seq>[1-9]\d*))?$")
TMP_NAME_RE = re.compile(r"^\.tmp-ckpt-(?P<step>\d+)-[0-9a-f]{32}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 8 << 20
# a checkpoint whose files take under 1/SPARSE_RATIO of the bytes its manifest claims,
# and SPARSE_SLACK fewer or more, is counted at what its files take (counted_on_disk)
SPARSE_RATIO = 8
SPARSE_SLACK = 2**20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
class Entry:
    """A checkpoint or temp folder's name under a trial's checkpoint folder."""

    path: Path
    step: int
    seq: int  # re-save number; -1 for a temp folder (sorts below a published twin)

    @property
    def is_tmp(self) -> bool:
        return self.seq < 0


def scan_folder(root: Path) -> list[Entry]:
    """Checkpoint and temp folders under ``root``, newest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    entries = []
    for name in names:
        if m := CHECKPOINT_NAME_RE.match(name):
            entries.append(Entry(root / name, int(m["step"]), int(m["seq"] or 0)))
        elif m := TMP_NAME_RE.match(name):
            entries.append(Entry(root / name, int(m["step"]), -1))
    return sorted(entries, key=lambda e: (e.step, e.seq), reverse=True)


def is_count(v: object) -> TypeGuard[int]:
    """An int (not a bool) >= 0."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def hash_file(path: Path, sync: bool = False) -> tuple[int, str]:
    """(size, sha256) of the regular file ``path``; fsyncs it too if ``sync``. It is
    opened as any file a job wrote (:func:`~dlhpc.protocol.safe_read.open_regular`:
    a symlink or FIFO raises :class:`UnsafeFile`)."""
    h = hashlib.sha256()
    size = 0
    fd, _ = open_regular(path)
    with open(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(f.fileno())
    return size, h.hexdigest()


def parse_manifest(folder: Path, step: int, folder_fd: int | None = None) -> Checkpoint | str:
    """The checkpoint ``folder``'s manifest for ``step``, or why it is none. Read
    bounded and never through a symlink (a job wrote it); ``folder_fd``: the manifest
    is opened relative to that descriptor of ``folder`` (named in messages only)."""
    path = folder / MANIFEST_NAME
    try:
        raw = read_bounded(
            Path(MANIFEST_NAME) if folder_fd is not None else path, MANIFEST_LIMIT, folder_fd
        )
        m = parse_json(raw, path)
    except FileNotFoundError:
        return "no manifest"
    except UnsafeFile as e:
        return f"manifest unusable: {e.reason}"
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        return "manifest has an unknown format"
    if m.get("step") != step or not is_count(m.get("step")):
        return f"manifest step {m.get('step')!r} != folder step {step}"
    created, files_raw, meta = m.get("created"), m.get("files"), m.get("metadata")
    if not isinstance(created, int | float) or not 0 <= created <= MAX_TIME:
        return "manifest: bad 'created'"
    if not isinstance(files_raw, dict) or not files_raw or not isinstance(meta, dict):
        return "manifest: bad 'files' or 'metadata'"
    files: dict[str, FileRecord] = {}
    total = 0
    for rel, rec in files_raw.items():
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts or rel == MANIFEST_NAME:
            return f"manifest: unsafe file name {rel!r}"
        size, sha = (rec.get("size"), rec.get("sha256")) if isinstance(rec, dict) else (0, 0)
        if not is_count(size) or size > MAX_BYTES:
            return f"manifest: bad size or sha256 for {rel}"
        if not isinstance(sha, str) or not _SHA_RE.match(sha):
            return f"manifest: bad size or sha256 for {rel}"
        files[rel] = FileRecord(size, sha)
        total += size
    if total > MAX_BYTES:  # each size in range, their sum not: no checkpoint is that big
        return f"manifest: its files total {total} bytes, over {MAX_BYTES}"
    return Checkpoint(folder, step, float(created), files, meta)


def verify_checkpoint(ckpt: Checkpoint, verify_hashes: bool = True) -> str | None:
    """Why ``ckpt``'s files do not match its manifest, or None if they do. Each file
    must be a regular file, not a symlink, in folders below ``ckpt.path`` that are
    not symlinks either (a job's link never makes another file part of it)."""
    for rel, rec in ckpt.files.items():
        p = ckpt.path / rel
        try:
            linked = [d for d in p.relative_to(ckpt.path).parents if (ckpt.path / d).is_symlink()]
            st = os.lstat(p)
        except OSError:
            return f"file {rel}: missing"
        if linked or not stat.S_ISREG(st.st_mode):
            return f"file {rel}: not a regular file (or a symlink)"
        if st.st_size != rec.size:
            return f"file {rel}: size {st.st_size} != {rec.size}"
        if verify_hashes:
            try:
                size, sha = hash_file(p)
            except UnsafeFile as e:
                return f"file {rel}: {e.reason}"
            except OSError as e:
                return f"file {rel}: unreadable: {e}"
            if size != rec.size or sha != rec.sha256:
                return f"file {rel}: sha256 mismatch"
    return None


def counted_on_disk(claimed: int, disk: int) -> bool:
    """Whether a checkpoint whose manifest claims ``claimed`` bytes but whose files take
    ``disk`` bytes on disk (allocated blocks) is counted at ``disk``: far below the
    claim (under 1/:data:`SPARSE_RATIO` of it, by :data:`SPARSE_SLACK` or more), its
    files are sparse or compressed, and the claim is not what the space holds."""
    return disk * SPARSE_RATIO < claimed and claimed - disk >= SPARSE_SLACK


@dataclass(frozen=True)
class RecordedSize:
    """What a ``checkpoint`` record's folder says of its ``size``: why it does not fit
    (``problem``), else the bytes its files take on disk (``disk_bytes``: allocated
    blocks, as ``du`` counts them; None when the folder shows no manifest yet)."""

    problem: str | None = None
    disk_bytes: int | None = None


def measure_recorded(
    trial_fd: int, trial_path: Path, name: str, step: int, size: int
) -> RecordedSize:
    """Check a ``checkpoint`` record's ``size`` against its folder ``name`` in the
    trial's checkpoint folder (the descriptor ``trial_fd`` of ``trial_path``, which
    names it in messages), never following a symlink: the folder, its manifest, each
    listed file (and each folder on the way to it) are opened relative to their
    parent's descriptor. It fits when the folder is a checkpoint of ``step`` whose
    manifest totals ``size`` and whose files are the sizes it says (no hashing); or
    when the folder shows no manifest (yet: a shared filesystem may show it late;
    whoever uses the checkpoint verifies it then)."""
    folder = trial_path / name
    try:
        folder_fd = os.open(name, _DIR_FLAGS, dir_fd=trial_fd)
    except FileNotFoundError:
        return RecordedSize()
    except OSError as err:
        return RecordedSize(f"its folder {folder} does not open ({err.strerror}: a symlink?)")
    try:
        ckpt = parse_manifest(folder, step, folder_fd)
        if ckpt == "no manifest":
            return RecordedSize()
        if isinstance(ckpt, str):
            return RecordedSize(f"its folder is not a checkpoint ({ckpt})")
        if ckpt.size_bytes != size:
            return RecordedSize(f"its size {size} is not its manifest's total {ckpt.size_bytes}")
        disk = 0
        for rel, rec in ckpt.files.items():
            st = _stat_below(folder_fd, rel)
            if isinstance(st, str) or st.st_size != rec.size:
                why = st if isinstance(st, str) else f"size {st.st_size} != {rec.size}"
                return RecordedSize(f"its folder does not match its manifest (file {rel}: {why})")
            disk += st.st_blocks * 512
        return RecordedSize(None, disk)
    finally:
        os.close(folder_fd)


def _stat_below(folder_fd: int, rel: str) -> os.stat_result | str:
    """``lstat`` of the regular file ``rel`` below the folder ``folder_fd``, each folder
    on the way opened without following a symlink; else why not."""
    *dirs, last = PurePosixPath(rel).parts
    fd = folder_fd
    try:
        for d in dirs:
            below = os.open(d, _DIR_FLAGS, dir_fd=fd)
            if fd != folder_fd:
                os.close(fd)
            fd = below
        st = os.stat(last, dir_fd=fd, follow_symlinks=False)
    except OSError as err:
        return "missing" if err.errno == errno.ENOENT else "not a regular file (or a symlink)"
    finally:
        if fd != folder_fd:
            os.close(fd)
    return st if stat.S_ISREG(st.st_mode) else "not a regular file (or a symlink)"


def check_entry(entry: Entry, verify_hashes: bool) -> Checkpoint | str:
    if entry.is_tmp:
        return "unpublished temp folder (a save in progress or one that crashed)"
    if entry.path.is_symlink() or not entry.path.is_dir():
        return "not a folder (or a symlink)"
    ckpt = parse_manifest(entry.path, entry.step)
    if isinstance(ckpt, str):
        return ckpt
    reason = verify_checkpoint(ckpt, verify_hashes)
    return ckpt if reason is None else reason


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Published checkpoints whose manifest parses, newest first. Files are not checked."""
    out = []
    for e in scan_folder(root):
        if not e.is_tmp and isinstance(ckpt := parse_manifest(e.path, e.step), Checkpoint):
            out.append(ckpt)
    return out


def latest_verified(
    root: Path, verify_hashes: bool = True
) -> tuple[Checkpoint | None, list[TornCheckpoint]]:
    """The newest verified checkpoint (or None), and every torn folder newer than it."""
    torn: list[TornCheckpoint] = []
    for e in scan_folder(root):
        result = check_entry(e, verify_hashes)
        if isinstance(result, Checkpoint):
            return result, torn
        torn.append(TornCheckpoint(e.path, e.step, result))
    return None, torn
