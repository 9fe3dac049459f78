"""Atomic publication of small files, and reading them back.

A job writes only files that readers see whole or not at all: write a temp name,
fsync, ``os.replace``, fsync the folder. Standard library only (plus
:mod:`dlhpc._perms`): cheap to import inside a job.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from dlhpc._perms import fix_fd_mode
from dlhpc.protocol.safe_read import UnsafeFile, read_state_file

__all__ = ["atomic_write_bytes", "atomic_write_text", "fsync_dir", "read_small_json"]


def fsync_dir(path: Path) -> None:
    """fsync the folder ``path`` (makes a rename or create in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _landed(tmp: str, path: Path, data: bytes) -> bool:
    """True when a rename of ``tmp`` to ``path`` that reported an error happened anyway.

    On NFS a RENAME whose reply was lost is retransmitted, and the server may answer
    the retry with ENOENT or ESTALE although the first try succeeded. The temp name
    is unique to the call, so "temp gone and ``path`` holds exactly ``data``" means
    the rename is done.
    """
    if os.path.lexists(tmp):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False


def atomic_write_bytes(path: Path, data: bytes, *, private: bool = False) -> None:
    """Publish ``data`` at ``path`` atomically: readers see all of it or nothing.

    The file gets the mode the umask (the site's policy) gives, or 0600 from its
    first byte when ``private`` (secrets, also in a lab's group mode). A rename that
    reports an error but happened (NFS) counts as done, so a caller never publishes
    the same records again under another name.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if not private:
            fix_fd_mode(fd)  # mkstemp's 0600 -> what the umask (the site's policy) gives
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except OSError:
            if not _landed(tmp, path, data):
                raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, *, private: bool = False) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), private=private)


def read_small_json(path: Path) -> dict[str, Any] | None:
    """A heartbeat or progress file, or None when absent or unusable (read as
    :func:`~dlhpc.protocol.safe_read.read_state_file` does: bounded, no symlink)."""
    try:
        return read_state_file(path)
    except UnsafeFile:
        return None
