"""``core_context.checkpoint`` of the stand-in: Determined's checkpoint calls on dlhpc
checkpoints.

A Determined checkpoint is named by a storage id (a UUID). Here it is a dlhpc
checkpoint folder (``ckpt-<step>``, :mod:`dlhpc.protocol.checkpoint`) in the trial's
checkpoint folder whose manifest metadata holds that id under ``storage_id`` next to
the user's metadata. ``store_path`` hands out a private temp folder; when its block
ends without an error the files are moved into a checkpoint published atomically
(sealed, renamed, ``MANIFEST.json`` last) through :meth:`TrialContext.checkpoint`, so
the metrics reported so far are flushed first and the same ``checkpoint`` event (with
the searcher metric's newest value, for the keep-best policy) is recorded. Restores
load only verified checkpoints (every file's size and sha256 checked).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlhpc.harness.context import TrialContext
from dlhpc.protocol.checkpoint import (
    Checkpoint,
    latest_verified,
    list_checkpoints,
    prune,
    publish_checkpoint,
    temp_checkpoint_dir,
    verify_checkpoint,
)

__all__ = ["CheckpointContext", "DownloadMode", "latest_storage_id"]

STORAGE_ID = "storage_id"


class DownloadMode:
    """Determined's download modes; every rank reads the shared folder directly here."""

    DirectDownload = "DIRECT_DOWNLOAD"
    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


def storage_id_of(ckpt: Checkpoint) -> str:
    """The id a script sees for ``ckpt``: its ``storage_id``, else its folder name
    (a checkpoint written by other dlhpc code)."""
    sid = ckpt.metadata.get(STORAGE_ID)
    return sid if isinstance(sid, str) and sid else ckpt.path.name


def latest_storage_id(root: Path) -> str | None:
    """The storage id of the newest verified checkpoint under ``root``, or None."""
    ckpt, _torn = latest_verified(root, verify_hashes=True)
    return storage_id_of(ckpt) if ckpt is not None else None


class _Staged:
    """What :meth:`TrialContext.checkpoint` saves: the files of a staging folder,
    moved into a checkpoint of ``step`` published atomically."""

    def __init__(self, root: Path, step: int, staging: Path, metadata: dict[str, Any]) -> None:
        self.root, self.step, self.staging, self.metadata = root, step, staging, metadata
        self.published: Checkpoint | None = None

    def save(self) -> Checkpoint | None:
        def move(folder: Path) -> None:
            for name in os.listdir(self.staging):
                os.replace(self.staging / name, folder / name)

        self.published = publish_checkpoint(self.root, self.step, move, self.metadata)
        prune(self.root, None, {self.published.path.name}, verify_hashes=False)  # stale temps
        return self.published


class CheckpointContext:
    """``core_context.checkpoint``: ``store_path``, ``restore_path``, ``upload``,
    ``download``, ``get_metadata`` on the trial's checkpoint folder ``root``."""

    def __init__(self, ctx: TrialContext, root: Path, steps: list[int]) -> None:
        self._ctx = ctx
        self._root = root
        self._steps = steps  # [last steps_completed the train context saw]

    def _step(self, metadata: dict[str, Any] | None) -> int:
        """The checkpoint's step: ``metadata["steps_completed"]`` (Determined requires it),
        else the highest ``steps_completed`` reported so far."""
        value = (metadata or {}).get("steps_completed", self._steps[0])
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"checkpoint metadata steps_completed must be an int >= 0: {value!r}")
        return value

    @contextlib.contextmanager
    def store_path(
        self, metadata: dict[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[Path, str]]:
        """A fresh folder to save into and its storage id; published when the block ends
        without an error (on an error nothing is published and the folder is removed)."""
        if shard:
            raise NotImplementedError("dlhpc: checkpoint.store_path(shard=True) is not supported")
        if self._ctx.rank != 0:
            raise RuntimeError(
                "cannot call CheckpointContext.store_path(shard=False) from non-chief worker "
                f"(rank={self._ctx.rank})"
            )
        step = self._step(metadata)
        storage_id = str(uuid.uuid4())
        self._root.mkdir(parents=True, exist_ok=True)
        staging = temp_checkpoint_dir(self._root, step)
        staging.mkdir()
        try:
            yield staging, storage_id
            meta = {**(metadata or {}), "steps_completed": step, STORAGE_ID: storage_id}
            self._ctx.checkpoint(_Staged(self._root, step, staging, meta))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: dict[str, Any] | None = None,
        *,
        shard: bool = False,
    ) -> str:
        """Publish a copy of ``ckpt_dir``'s files; returns the storage id."""
        with self.store_path(metadata, shard=shard) as (path, storage_id):
            if ckpt_dir is not None:
                shutil.copytree(Path(ckpt_dir), path, dirs_exist_ok=True)
        return storage_id

    def _find(self, storage_id: str) -> Checkpoint:
        for ckpt in list_checkpoints(self._root):
            if storage_id_of(ckpt) == storage_id or ckpt.path.name == storage_id:
                reason = verify_checkpoint(ckpt, verify_hashes=True)
                if reason is not None:
                    raise RuntimeError(f"checkpoint {storage_id} ({ckpt.path}) is torn: {reason}")
                return ckpt
        raise FileNotFoundError(f"no checkpoint {storage_id!r} in {self._root}")

    @contextlib.contextmanager
    def restore_path(self, storage_id: str, *, selector: Any = None) -> Iterator[Path]:
        """The verified checkpoint's folder (read it, do not change it)."""
        if selector is not None:
            raise NotImplementedError("dlhpc: checkpoint.restore_path(selector=...) unsupported")
        yield self._find(storage_id).path

    def download(
        self,
        storage_id: str,
        ckpt_dir: str | os.PathLike[str],
        download_mode: str = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Any = None,
    ) -> None:
        """Copy the verified checkpoint's files (not its manifest) into ``ckpt_dir``."""
        if selector is not None:
            raise NotImplementedError("dlhpc: checkpoint.download(selector=...) unsupported")
        ckpt = self._find(storage_id)
        for rel in ckpt.files:
            target = Path(ckpt_dir) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ckpt.path / rel, target)

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The metadata given at store time (with ``steps_completed``)."""
        meta = dict(self._find(storage_id).metadata)
        meta.pop(STORAGE_ID, None)
        return meta

    def delete(self, storage_id: str) -> None:
        """Refused: only dlhpc's reconciler deletes checkpoints (its keep policy)."""
        raise NotImplementedError(
            "dlhpc: checkpoints are deleted by the keep policy (checkpoint.keep_*), not the script"
        )
