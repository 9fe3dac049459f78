"""Small read queries the CLI needs (who owns an experiment, a trial's attempt,
an experiment's checkpoints), so that no SQL lives in ``dlhpc.cli``; and a trial's
reproducibility record, which ``reproduce``/``diff``, the registry and the compare page
all build the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dlhpc.errors import NotFoundError
from dlhpc.repro import trial_record
from dlhpc.states import CheckpointState
from dlhpc.store.tables import Attempt, Checkpoint, Experiment, Submission, Trial

__all__ = [
    "experiment_checkpoints",
    "experiment_owner",
    "experiment_owners",
    "parse_record",
    "trial_attempt",
    "trial_record_of",
]


def experiment_owner(
    s: Session,
    *,
    experiment_id: int | None = None,
    trial_id: int | None = None,
    checkpoint_id: int | None = None,
) -> tuple[int, str] | None:
    """``(experiment id, user)`` of the experiment the checkpoint, else the trial, else
    ``experiment_id`` belongs to; None when that id is unknown."""
    query = select(Experiment.id, Experiment.user)
    if checkpoint_id is not None:
        query = query.join(Trial).join(Checkpoint).where(Checkpoint.id == checkpoint_id)
    elif trial_id is not None:
        query = query.join(Trial).where(Trial.id == trial_id)
    else:
        query = query.where(Experiment.id == experiment_id)
    row = s.execute(query).first()
    return None if row is None else (row.id, row.user)


def experiment_owners(s: Session) -> dict[int, str]:
    """Every experiment's user, by id (ascending)."""
    rows = s.execute(select(Experiment.id, Experiment.user).order_by(Experiment.id))
    return {eid: user for eid, user in rows}


def trial_attempt(s: Session, trial_id: int, key: str | None = None) -> tuple[Attempt, Path | None]:
    """The trial's attempt ``key`` (``<job id>.r<restart>``; None: its newest) and its
    submission's folder (None: not submitted through a recorded submission). Raises
    :class:`~dlhpc.errors.NotFoundError` for an unknown trial or key, or a trial not
    submitted yet."""
    if s.get(Trial, trial_id) is None:
        raise NotFoundError(f"no trial {trial_id}")
    query = select(Attempt).where(Attempt.trial_id == trial_id)
    if key is not None:
        query = query.where(Attempt.attempt_key == key)
    attempt = s.scalars(query.order_by(Attempt.id.desc()).limit(1)).first()
    if attempt is None and key is not None:
        keys = s.scalars(
            select(Attempt.attempt_key).where(Attempt.trial_id == trial_id).order_by(Attempt.id)
        ).all()
        raise NotFoundError(f"trial {trial_id} has no attempt {key!r} (its attempts: {list(keys)})")
    if attempt is None:
        raise NotFoundError(f"trial {trial_id} has not been submitted yet")
    folder = None
    if attempt.submission_id is not None:
        sub = s.get(Submission, attempt.submission_id)
        folder = Path(sub.folder) if sub else None
    return attempt, folder


def experiment_checkpoints(
    s: Session, experiment_id: int, include_deleted: bool
) -> list[Checkpoint]:
    """The experiment's checkpoint rows by trial, step and id (ACTIVE ones only unless
    ``include_deleted``)."""
    query = (
        select(Checkpoint)
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .where(Trial.experiment_id == experiment_id)
        .order_by(Checkpoint.trial_id, Checkpoint.step, Checkpoint.id)
    )
    if not include_deleted:
        query = query.where(Checkpoint.state == CheckpointState.ACTIVE.value)
    return list(s.scalars(query))


def parse_record(text: str | None) -> dict[str, Any]:
    """A JSON column (``repro_json``, ``config_json``, ``env_json``...) as a dict; ``{}``
    when it is empty or not a JSON object."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def trial_record_of(s: Session, trial_id: int) -> dict[str, Any]:
    """The trial's reproducibility record (:func:`dlhpc.repro.trial_record`): its
    experiment's launch record and config, its hyperparameters, seed and length, and
    the environment its newest attempt that recorded one saw ({} when none did).
    Raises :class:`~dlhpc.errors.NotFoundError` for an unknown trial."""
    trial = s.get(Trial, trial_id)
    if trial is None:
        raise NotFoundError(f"no trial {trial_id}")
    env: dict[str, Any] = {}
    for text in s.scalars(
        select(Attempt.env_json).where(Attempt.trial_id == trial_id).order_by(Attempt.id.desc())
    ):
        env = parse_record(text)
        if env:
            break
    exp = trial.experiment
    return trial_record(
        parse_record(exp.repro_json),
        parse_record(exp.config_json),
        parse_record(trial.hparams_json),
        trial.seed,
        trial.max_length,
        env,
    )
