"""A trial's reach: the one folder its checkpoints may be in.

A trial's checkpoint folder is ``<checkpoint.dir>/<run folder name>/trial-<id>``
(:func:`dlhpc.protocol.checkpoint_trial_dir`), built from what the login node
recorded at launch (the experiment's resolved config and its run folder), never
from a path a job wrote. A checkpoint a trial records is one of its own only if
its path is exactly ``<that folder>/ckpt-<step>[-n]`` with the record's step:
:func:`foreign_checkpoint` says why not. Ingest refuses any other record, and
GC, the model registry and export check it again before they touch a folder.
Jobs can replace any folder below the configured root with a symlink, so the login
node reaches a trial's folder through descriptors (:func:`open_trial_dir`).
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlhpc.errors import UnsafePathError
from dlhpc.protocol import experiment_dir_name, recorded_slug
from dlhpc.protocol.checkpoint import CHECKPOINT_NAME_RE
from dlhpc.store.tables import Experiment

__all__ = [
    "TrialCheckpointDir",
    "checkpoint_config",
    "experiment_checkpoint_dir",
    "foreign_checkpoint",
    "open_below",
    "open_trial_dir",
    "trial_checkpoint_dir",
]


@dataclass(frozen=True)
class TrialCheckpointDir:
    """One trial's checkpoint folder, as its parts: the configured ``checkpoint.dir``
    (``root``), then the experiment's and the trial's folder names below it."""

    root: Path
    experiment: str
    trial: str

    @property
    def path(self) -> Path:
        return self.root / self.experiment / self.trial


def checkpoint_config(exp: Experiment) -> dict[str, Any]:
    """The ``checkpoint`` mapping of the experiment's stored resolved config ({} when
    it has none or it does not read)."""
    try:
        ck = json.loads(exp.config_json or "{}").get("checkpoint") or {}
    except (ValueError, AttributeError):
        return {}
    return ck if isinstance(ck, dict) else {}


def _configured_root(exp: Experiment) -> Path | None:
    raw = checkpoint_config(exp).get("dir")
    if not isinstance(raw, str) or not raw or "\0" in raw or not Path(raw).is_absolute():
        return None
    return Path(raw)


def experiment_checkpoint_dir(exp: Experiment) -> Path | None:
    """``<checkpoint.dir>/<its run folder's name>``, where the experiment's trials
    checkpoint; None without an absolute configured ``checkpoint.dir``."""
    root = _configured_root(exp)
    if root is None:
        return None
    return root / experiment_dir_name(exp.id, recorded_slug(exp.id, exp.run_dir))


def trial_checkpoint_dir(exp: Experiment, trial_id: int) -> TrialCheckpointDir | None:
    """Trial ``trial_id``'s checkpoint folder (a trial of ``exp``); None without an
    absolute configured ``checkpoint.dir``."""
    root = _configured_root(exp)
    if root is None:
        return None
    name = experiment_dir_name(exp.id, recorded_slug(exp.id, exp.run_dir))
    return TrialCheckpointDir(root, name, f"trial-{trial_id:06d}")


def foreign_checkpoint(own: TrialCheckpointDir | None, path: str, step: int) -> str | None:
    """Why ``path`` (as recorded) is not a checkpoint folder of the trial whose folder
    is ``own`` at ``step``, or None when it is: it must be exactly
    ``<own.path>/ckpt-<step>[-n]``, no other spelling (no ``..``, ``.``, doubled or
    trailing ``/``)."""
    if own is None:
        return "the experiment has no checkpoint folder"
    name = Path(path).name if path else ""
    m = CHECKPOINT_NAME_RE.match(name)
    if not name or path != str(own.path / name):
        return f"{path!r} is not inside the trial's own checkpoint folder {own.path}"
    if m is None:
        return f"{path!r} is not named as a checkpoint folder (ckpt-<step>[-n])"
    if int(m["step"]) != step:
        return f"{path} is the folder of step {int(m['step'])}, not of step {step}"
    return None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_below(parent_fd: int, name: str, where: Path) -> int:
    """A descriptor of the folder ``name`` in ``parent_fd``; a symlink or a non-folder
    there raises UnsafePathError, an absent one FileNotFoundError."""
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{where / name} is a symlink or not a folder") from err
        raise


def open_trial_dir(own: TrialCheckpointDir) -> int:
    """A descriptor of the trial's checkpoint folder (the caller closes it): the
    configured root as configured, then the experiment's and the trial's folders,
    neither of which may be a symlink. FileNotFoundError when one is absent."""
    root_fd = os.open(own.root, _DIR_FLAGS)
    try:
        exp_fd = open_below(root_fd, own.experiment, own.root)
    finally:
        os.close(root_fd)
    try:
        return open_below(exp_fd, own.trial, own.root / own.experiment)
    finally:
        os.close(exp_fd)
