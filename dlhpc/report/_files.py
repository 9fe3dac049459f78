"""Where and how report files are written: the file names of an ``--all`` folder
and the atomic publication every page uses (``build``, ``models``, ``compare``).

Each file is published with :func:`dlhpc.protocol.atomic_write_bytes` (temp name in
the same folder, fsync, rename), so a reader sees the old file or the new one.
"""

from __future__ import annotations

from pathlib import Path

from dlhpc._perms import make_dirs
from dlhpc.errors import DlhpcError
from dlhpc.protocol import atomic_write_bytes
from dlhpc.store import Store

__all__ = ["INDEX_FILE", "MODELS_FILE", "ensure_folder", "page_file", "publish_file"]

MODELS_FILE = "models.html"
INDEX_FILE = "index.html"


def page_file(experiment_id: int) -> str:
    """The file name of an experiment's page in an ``--all`` folder."""
    return f"exp-{experiment_id:06d}.html"


def publish_file(path: Path, data: bytes) -> None:
    """Atomically, with the mode the umask (the site's policy) gives; an existing
    target that is not a regular file (``-o /dev/null``, a FIFO, ``/dev/stdout``) is
    written into instead: a rename would replace the device itself (as root,
    ``/dev/null`` for the whole machine)."""
    try:
        if path.exists() and not path.is_file():
            with open(path, "wb") as f:
                f.write(data)
            return
        atomic_write_bytes(path, data)
    except OSError as err:
        raise DlhpcError(f"cannot write {path}: {err.strerror or err}") from err


def ensure_folder(path: Path, store: Store) -> None:
    """Create the output folder under the site's policy (group mode: shared, setgid)."""
    try:
        make_dirs(path.absolute(), store.permissions)
    except OSError as err:
        raise DlhpcError(f"cannot create {path}: {err.strerror or err}") from err
