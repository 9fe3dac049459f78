"""A trial's checkpoint folder, reached from the configured root without a symlink.

Jobs can write (and replace with a symlink) every folder below the configured
``checkpoint.dir``: the experiment's, the trial's, each ``ckpt-*`` one. So the
login node never resolves those paths: it opens the configured root as the user
configured it, then each folder below with ``O_NOFOLLOW`` relative to its
parent's descriptor (:func:`~dlhpc.store.checkpoint_dirs.open_trial_dir`), and
acts on names relative to the trial folder's descriptor. A symlink anywhere below
the root is refused (:class:`~dlhpc.errors.UnsafePathError`), and a swap after the
check is not followed: the check and the act use the same descriptor.

:func:`remove_own_checkpoint` (the GC's delete) renames the folder out of sight
and removes it bottom-up through descriptors (``os.fwalk``, which follows no
symlink), counting the bytes it frees itself: the blocks allocated to each file
(``st_blocks`` x 512, as ``du`` counts them: a sparse file frees what it holds, not
its apparent size), taken by ``stat`` just before it unlinks it, never the size a
job recorded.
:func:`checked_checkpoint` is the registry's and export's check: the trial's own
folder, the recorded step and size, the manifest; :func:`newest_checkpoint` finds
the trial's newest verified one the same way (``reproduce --from-checkpoint``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

from dlhpc.errors import UnsafePathError, UsageError
from dlhpc.protocol.checkpoint import (
    DELETING_PREFIX,
    latest_verified,
    list_checkpoints,
    verify_checkpoint,
)
from dlhpc.protocol.checkpoint_read import counted_on_disk
from dlhpc.store.checkpoint_dirs import (
    TrialCheckpointDir,
    foreign_checkpoint,
    open_below,
    open_trial_dir,
)

__all__ = ["checked_checkpoint", "newest_checkpoint", "remove_own_checkpoint"]


@contextlib.contextmanager
def _trial_fd(own: TrialCheckpointDir) -> Iterator[int]:
    fd = open_trial_dir(own)
    try:
        yield fd
    finally:
        os.close(fd)


def _freed_bytes(parent_fd: int, name: str, where: Path) -> int:
    """The bytes removing the folder ``name`` (in ``parent_fd``) frees: the allocated
    blocks of the regular files below it whose every link is below it too. Symlinks are not
    followed (the folder itself may not be one)."""
    top = open_below(parent_fd, name, where)
    seen: dict[tuple[int, int], list[int]] = {}  # (dev, inode) -> [links seen, size, nlink]
    try:
        for _, _, files, dir_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for f in files:
                with contextlib.suppress(OSError):
                    st = os.stat(f, dir_fd=dir_fd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        entry = seen.setdefault(
                            (st.st_dev, st.st_ino), [0, _allocated(st), st.st_nlink]
                        )
                        entry[0] += 1
    finally:
        os.close(top)
    return sum(size for links, size, nlink in seen.values() if links >= nlink)


def _allocated(st: os.stat_result) -> int:
    """The bytes a file takes on disk: its allocated 512-byte blocks (``du``)."""
    return st.st_blocks * 512


def _raise(err: OSError) -> None:
    raise err


def _remove_tree(parent_fd: int, name: str, where: Path) -> int:
    """Remove the folder ``name`` (in ``parent_fd``; not a symlink) bottom-up through
    descriptors (``os.fwalk`` follows no symlink: a symlink below is unlinked, not
    followed) and return the bytes freed: the allocated blocks of each regular file
    whose last link it removed, taken by ``stat`` just before the unlink."""
    top = open_below(parent_fd, name, where)
    freed = 0
    try:
        walk = os.fwalk(".", topdown=False, onerror=_raise, follow_symlinks=False, dir_fd=top)
        for _, dirs, files, dir_fd in walk:
            for f in files:
                st = os.stat(f, dir_fd=dir_fd, follow_symlinks=False)
                os.unlink(f, dir_fd=dir_fd)
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    freed += _allocated(st)
            for d in dirs:  # a symlink to a folder is listed here, never entered
                if stat.S_ISLNK(os.stat(d, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    os.unlink(d, dir_fd=dir_fd)
                else:
                    os.rmdir(d, dir_fd=dir_fd)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=parent_fd)
    return freed


def remove_own_checkpoint(own: TrialCheckpointDir, name: str, dry_run: bool = False) -> int | None:
    """Remove the checkpoint folder ``name`` of the trial's folder ``own`` and return the
    bytes it freed (``dry_run``: would free; nothing is touched), or None when it (or
    a folder above it) is absent. It is renamed out of sight first (a reader never
    sees it half deleted). UnsafePathError for a symlink anywhere below the
    configured root, or a ``name`` that is not a folder; OSError as it comes."""
    try:
        with _trial_fd(own) as fd:
            if dry_run:
                return _freed_bytes(fd, name, own.path)
            if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise UnsafePathError(f"{own.path / name} is a symlink or not a folder")
            doomed = f"{DELETING_PREFIX}{name}-{uuid.uuid4().hex}"
            os.rename(name, doomed, src_dir_fd=fd, dst_dir_fd=fd)  # renames a link, never follows
            try:
                freed = _remove_tree(fd, doomed, own.path)
            except UnsafePathError:  # swapped for a symlink after the check: put it back
                os.rename(doomed, name, src_dir_fd=fd, dst_dir_fd=fd)
                raise
            os.fsync(fd)
            return freed
    except FileNotFoundError:
        return None


def checked_checkpoint(
    own: TrialCheckpointDir | None,
    path: str,
    step: int,
    size: int,
    *,
    verify_hashes: bool = True,
) -> Path | None:
    """``path`` if it is a checkpoint folder of the trial whose folder is ``own``, at
    ``step``, whose manifest says that step and totals ``size`` bytes (the row's; or
    more, for a row ingest counted at its files' allocated blocks:
    :func:`~dlhpc.protocol.checkpoint_read.counted_on_disk`), and
    (``verify_hashes``: every file's sha256, else their sizes) matches it; None when
    it is gone. Anything else raises :class:`~dlhpc.errors.UsageError` saying why."""
    why = foreign_checkpoint(own, path, step)
    if why is not None or own is None:
        raise UsageError(why or "the experiment has no checkpoint folder")
    name = Path(path).name
    try:
        with _trial_fd(own) as fd:
            if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise UsageError(f"{path} is a symlink or not a folder")
    except FileNotFoundError:
        return None
    except UnsafePathError as err:
        raise UsageError(str(err)) from err
    found = [c for c in list_checkpoints(own.path) if c.path.name == name]
    if not found or found[0].step != step:
        raise UsageError(f"{path}: its MANIFEST.json is missing or does not say step {step}")
    why = verify_checkpoint(found[0], verify_hashes)
    total = found[0].size_bytes
    if why is None and size != total and not (size < total and counted_on_disk(total, size)):
        why = f"its recorded size {size} is not its manifest's total {total}"
    if why is not None:
        raise UsageError(f"{path}: {why}")
    return found[0].path


def newest_checkpoint(own: TrialCheckpointDir) -> Path | None:
    """The newest verified checkpoint folder of the trial whose folder is ``own``,
    checked as :func:`checked_checkpoint` checks a row (its manifest's own total as
    the size); None when there is none. A symlink anywhere below the configured root
    raises :class:`~dlhpc.errors.UsageError`: the folders are never reached through one."""
    try:
        with _trial_fd(own):
            pass  # the experiment's and the trial's folders: no symlink
    except FileNotFoundError:
        return None
    except UnsafePathError as err:
        raise UsageError(str(err)) from err
    ckpt, _ = latest_verified(own.path)
    if ckpt is None:
        return None
    return checked_checkpoint(own, str(ckpt.path), ckpt.step, ckpt.size_bytes)
