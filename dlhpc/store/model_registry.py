"""Reads of the model registry (``model_versions``): what ``dlhpc model list|show``,
the models index page and the checkpoint GC need. Read-only: the writes are
:mod:`dlhpc.orchestrator.model_registry`'s (under the reconciler lease).

A reference to a version is ``NAME:VERSION``, or ``NAME`` for its latest version
(:func:`parse_ref`). A model name matches :data:`MODEL_NAME_RE`: a letter or digit,
then up to 127 letters, digits, ``.``, ``_`` or ``-`` (no ``:``, so a reference
splits at its last colon without ambiguity).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dlhpc.errors import NotFoundError, UsageError
from dlhpc.store.lab_tables import ModelVersion
from dlhpc.store.tables import Checkpoint, Experiment, Trial

__all__ = [
    "MODEL_NAME_RE",
    "MODEL_NAME_RULE",
    "VersionRow",
    "check_model_name",
    "find_version",
    "names",
    "parse_ref",
    "registered_checkpoints",
    "trial_experiment",
    "version_rows",
]

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MODEL_NAME_RULE = "a letter or digit, then up to 127 letters, digits, '.', '_' or '-'"


def check_model_name(name: str) -> str:
    """``name`` if it is a valid model name, else :class:`~dlhpc.errors.UsageError`."""
    if not MODEL_NAME_RE.match(name):
        raise UsageError(f"bad model name {name!r}: {MODEL_NAME_RULE} ({MODEL_NAME_RE.pattern})")
    return name


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``NAME:VERSION`` -> (NAME, VERSION); ``NAME`` -> (NAME, None) for its latest.
    :class:`~dlhpc.errors.UsageError` for a bad name or a version that is not a
    positive integer."""
    name, sep, version = ref.rpartition(":")
    if not sep:
        return check_model_name(ref), None
    if not version.isascii() or not version.isdigit() or int(version) < 1:
        raise UsageError(f"bad model version {version!r} in {ref!r}: a positive integer")
    return check_model_name(name), int(version)


@dataclass(frozen=True)
class VersionRow:
    """One model version with what it points at (its checkpoint, trial, experiment)."""

    name: str
    version: int
    experiment_id: int
    experiment_name: str
    trial_id: int
    checkpoint_id: int
    step: int
    metric: float | None
    metric_name: str
    smaller_is_better: bool
    note: str
    user: str
    created_at: datetime
    checkpoint_path: str
    checkpoint_state: str

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``created_at`` as ISO 8601 UTC with ``Z``)."""
        out = dict(self.__dict__)
        out["created_at"] = self.created_at.isoformat() + "Z"
        return out


def _select() -> Any:  # a Select of VersionRow's columns, in its field order
    return (
        select(
            ModelVersion.name,
            ModelVersion.version,
            ModelVersion.experiment_id,
            Experiment.name,
            ModelVersion.trial_id,
            ModelVersion.checkpoint_id,
            ModelVersion.step,
            ModelVersion.metric,
            Experiment.metric,
            Experiment.smaller_is_better,
            ModelVersion.note,
            ModelVersion.user,
            ModelVersion.created_at,
            Checkpoint.path,
            Checkpoint.state,
        )
        .join(Experiment, Experiment.id == ModelVersion.experiment_id)
        .join(Checkpoint, Checkpoint.id == ModelVersion.checkpoint_id)
    )


def version_rows(s: Session, name: str | None = None) -> list[VersionRow]:
    """Every version (of ``name`` only when given), by name then version."""
    q = _select()
    if name is not None:
        q = q.where(ModelVersion.name == name)
    rows = s.execute(q.order_by(ModelVersion.name, ModelVersion.version)).all()
    return [VersionRow(*row) for row in rows]


def find_version(s: Session, name: str, version: int | None) -> VersionRow:
    """Version ``version`` of ``name`` (its latest when None);
    :class:`~dlhpc.errors.NotFoundError` when there is none."""
    q = _select().where(ModelVersion.name == name)
    if version is None:
        q = q.order_by(ModelVersion.version.desc()).limit(1)
    else:
        q = q.where(ModelVersion.version == version)
    row = s.execute(q).first()
    if row is None:
        known = s.scalars(
            select(ModelVersion.version).where(ModelVersion.name == name).order_by("version")
        ).all()
        if not known:
            raise NotFoundError(f"no model {name!r} (dlhpc model list shows the registered ones)")
        raise NotFoundError(f"no version {version} of model {name!r} (versions: {list(known)})")
    return VersionRow(*row)


def registered_checkpoints(s: Session, experiment_id: int) -> dict[int, list[str]]:
    """The experiment's checkpoints that model versions name: checkpoint id ->
    ``["NAME:VERSION", ...]`` (what the checkpoint GC never deletes)."""
    rows = s.execute(
        select(ModelVersion.checkpoint_id, ModelVersion.name, ModelVersion.version)
        .where(ModelVersion.experiment_id == experiment_id)
        .order_by(ModelVersion.name, ModelVersion.version)
    ).all()
    out: dict[int, list[str]] = defaultdict(list)
    for checkpoint_id, name, version in rows:
        out[checkpoint_id].append(f"{name}:{version}")
    return dict(out)


def trial_experiment(s: Session, trial_id: int) -> tuple[Trial, Experiment]:
    """The trial and its experiment; :class:`~dlhpc.errors.NotFoundError` if unknown."""
    trial = s.get(Trial, trial_id)
    if trial is None:
        raise NotFoundError(f"no trial {trial_id}")
    return trial, trial.experiment


def names(rows: Iterable[VersionRow]) -> dict[str, list[VersionRow]]:
    """``rows`` grouped by model name, in name order, versions ascending."""
    out: dict[str, list[VersionRow]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r.name, r.version)):
        out[r.name].append(r)
    return dict(out)
