"""The trial's working folder: where its entrypoint runs, beside the code snapshot.

The snapshot (``code/``) is read-only and shared by every trial of the experiment.
Each trial runs in its own folder (:func:`~dlhpc.protocol.work_dir`), which holds a
relative symlink to each top-level entry of the snapshot: ``python train.py``, an
import of the script's own modules (Python puts the resolved script's folder on
``sys.path``), ``python -m pkg`` and relative reads such as ``data/labels.csv`` work
as in the workdir, while what the script or its framework writes by default
(``lightning_logs/``, ``runs/``, ``wandb/``, ``outputs/``) lands in the trial's
folder. Writing into a folder that is part of the snapshot fails (it is read-only).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["prepare_work_dir"]


def prepare_work_dir(code: Path, work: Path) -> Path:
    """Create ``work`` (if missing) with a relative symlink to each top-level entry of
    ``code`` that it lacks; returns ``work``. Idempotent, and safe when several ranks of
    the trial run it at once; an entry the trial created under the same name is kept."""
    work.mkdir(parents=True, exist_ok=True)
    for entry in sorted(os.listdir(code)):
        link = work / entry
        if not os.path.lexists(link):
            with contextlib.suppress(FileExistsError):  # another rank made it first
                os.symlink(os.path.relpath(code / entry, work), link)
    return work
