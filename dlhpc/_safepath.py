"""The one check that a derived path stays under its root.

Every path dlhpc derives from stored or job-written values before it deletes,
writes or copies there (a checkpoint folder a job reported, a trial's stop file, an
export's source) goes through :func:`inside`: both paths are resolved (symlinks
followed, ``..`` removed) and the result must lie *strictly* below the root. A path
that is relative, or that names the root itself, is refused too. Standard library
only (imported inside jobs through :mod:`dlhpc.protocol`'s neighbours).
"""

from __future__ import annotations

import os
from pathlib import Path

from dlhpc.errors import UnsafePathError

__all__ = ["inside", "is_inside"]


def inside(
    root: str | os.PathLike[str],
    path: str | os.PathLike[str],
    what: str = "path",
    *,
    root_resolved: bool = False,
) -> Path:
    """``path`` resolved, if it lies strictly under ``root`` (resolved); else raise
    :class:`~dlhpc.errors.UnsafePathError` naming ``what``. ``root_resolved``: the
    caller resolved ``root`` already (``os.path.realpath``: one call for many paths)."""
    raw = os.fspath(path)
    if not raw or "\0" in raw or not os.path.isabs(raw):
        raise UnsafePathError(f"{what} {raw!r} is not an absolute path")
    real_root = Path(root if root_resolved else os.path.realpath(root))
    real = Path(os.path.realpath(raw))
    if real == real_root or not real.is_relative_to(real_root):
        raise UnsafePathError(f"{what} {raw} is not inside {root}")
    return real


def is_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Whether :func:`inside` accepts ``path``."""
    try:
        inside(root, path)
    except UnsafePathError:
        return False
    return True
