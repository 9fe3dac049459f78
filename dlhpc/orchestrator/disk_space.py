"""Whether checkpoints can fill the state database's filesystem.

A tick whose database cannot commit (its filesystem full) records nothing until
space returns; it frees only what the keep policy frees (:mod:`.tick`). Checkpoints
written beside the database on a small filesystem are how that happens: ``dlhpc
doctor`` and ``dlhpc launch`` warn about it (:func:`shared_small_filesystem`).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SMALL_FILESYSTEM_BYTES", "shared_small_filesystem"]

# below this size a filesystem holding both is "small": a few runs' checkpoints fill it
SMALL_FILESYSTEM_BYTES = 16 << 30


def _nearest_existing(path: Path) -> Path:
    """``path``, or its nearest ancestor that exists (a folder made on first use)."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def shared_small_filesystem(
    state_dir: Path, checkpoint_dir: Path, small: int = SMALL_FILESYSTEM_BYTES
) -> str | None:
    """A one-line warning when ``checkpoint_dir`` is on the filesystem of the state
    folder (the database's) and that filesystem is smaller than ``small`` bytes;
    None otherwise, or when either cannot be examined (``OSError``: said by the
    callers' own checks of those folders)."""
    try:
        home, ckpt = _nearest_existing(state_dir), _nearest_existing(checkpoint_dir)
        if os.stat(home).st_dev != os.stat(ckpt).st_dev:
            return None
        fs = os.statvfs(home)
    except OSError:
        return None
    size = fs.f_blocks * fs.f_frsize
    if size >= small:
        return None
    return (
        f"the checkpoint folder {checkpoint_dir} is on the state database's filesystem"
        f" ({state_dir}, {size >> 20:,} MiB): checkpoints can fill it, and while it"
        " is full no tick records anything (each frees only the superseded checkpoints);"
        " put checkpoint.dir (the site's scratch) on another filesystem"
    )
