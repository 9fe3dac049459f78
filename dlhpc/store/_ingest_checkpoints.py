"""What ingest makes of a ``checkpoint`` record (:mod:`dlhpc.store.ingest`): refused
when its folder is not one of the trial's own or its size does not fit the folder
(read through descriptors from the configured root, no symlink followed), else its
row, counting what its files take on disk when that is far below its size, with the
keep-best score it is fixed with."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dlhpc.errors import UnsafePathError
from dlhpc.protocol.checkpoint_read import RecordedSize, counted_on_disk, measure_recorded
from dlhpc.store._records import checkpoint_row, finite, finite_int, log_row
from dlhpc.store.checkpoint_dirs import (
    TrialCheckpointDir,
    foreign_checkpoint,
    open_trial_dir,
    trial_checkpoint_dir,
)
from dlhpc.store.tables import Attempt, Metric, Trial

__all__ = ["checkpoint_metric", "checkpoint_record", "checkpoint_row_of"]


def checkpoint_metric(
    session: Session, trial: Trial, rec: dict[str, Any], pending: list[dict[str, Any]]
) -> float | None:
    """A checkpoint's score for the keep-best policy, fixed at ingest.

    The job's own ``metric`` (the searcher metric reported since its previous
    checkpoint; null: none) when the record has the key. Older records lack it:
    then the searcher metric reported at exactly the checkpoint's step, from this
    file's rows not yet inserted (``pending``) or the table, else None (unknown).
    """
    if "metric" in rec:
        return finite(rec["metric"])
    step, name = finite_int(rec.get("step", 0)), trial.experiment.metric
    for row in reversed(pending):
        if row["step"] == step and row["name"] == name:
            return finite(row["value"])
    value = session.scalar(
        select(Metric.value).where(
            Metric.trial_id == trial.id, Metric.step == step, Metric.name == name
        )
    )
    return finite(value)


def checkpoint_record(
    trial: Trial, rec: dict[str, Any], now: datetime
) -> tuple[dict[str, Any] | None, RecordedSize]:
    """The warning ``events`` row that replaces a ``checkpoint`` record whose folder is
    not one of the trial's own (:func:`~dlhpc.store.checkpoint_dirs.foreign_checkpoint`:
    another trial's, elsewhere, or another step's), is reached through a symlink, or
    whose size does not fit that folder
    (:func:`~dlhpc.protocol.checkpoint_read.measure_recorded`), or None to store it;
    and what its folder showed (the bytes its files take on disk)."""
    step = finite_int(rec.get("step", 0))
    own = trial_checkpoint_dir(trial.experiment, trial.id)
    path = str(rec.get("path", ""))
    why = "its step is not an integer" if step is None else foreign_checkpoint(own, path, step)
    found = RecordedSize()
    if why is None and step is not None and own is not None:  # its own: the size must fit
        found = _measure(own, Path(path).name, step, int(rec.get("size") or 0))
        why = found.problem
    if why is None:
        return None, found
    message = f"checkpoint record refused (not stored): {why}"
    row = log_row(trial, {"level": "warning", "message": message, "time": rec.get("time")}, now)
    return row, found


def _measure(own: TrialCheckpointDir, name: str, step: int, size: int) -> RecordedSize:
    """:func:`~dlhpc.protocol.checkpoint_read.measure_recorded` of the folder ``name``
    in the trial's checkpoint folder, reached from the configured root without a
    symlink (:func:`~dlhpc.store.checkpoint_dirs.open_trial_dir`); a folder not
    there yet fits (as a manifest not there yet does)."""
    try:
        fd = open_trial_dir(own)
    except FileNotFoundError:
        return RecordedSize()
    except (UnsafePathError, OSError) as err:
        return RecordedSize(f"its trial's checkpoint folder does not open: {err}")
    try:
        return measure_recorded(fd, own.path, name, step, size)
    finally:
        os.close(fd)


def checkpoint_row_of(
    trial: Trial, attempt: Attempt, rec: dict[str, Any], disk: int | None, now: datetime
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ``checkpoint`` row of a record that was not refused, but its ``metric``;
    when its files take far less space than its size says
    (:func:`~dlhpc.protocol.checkpoint_read.counted_on_disk`), the row counts what
    they take, and a warning ``events`` row says so (else None)."""
    row = checkpoint_row(trial.id, attempt.id, rec, now)
    claimed = row["size_bytes"]
    if disk is None or not counted_on_disk(claimed, disk):
        return row, None
    row["size_bytes"] = disk
    message = (
        f"checkpoint {row['path']}: its files take {disk} bytes on disk of the {claimed}"
        " its manifest gives (sparse or compressed): counted as "
        f"{disk} bytes"
    )
    return row, log_row(
        trial, {"level": "warning", "message": message, "time": rec.get("time")}, now
    )
