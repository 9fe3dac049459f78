"""The model registry: ``dlhpc model register|show|export``.

:func:`register` makes the next version (1, 2, ...) of a model name for one
checkpoint of one trial, under the reconciler lease (the one writer). The
checkpoint is the one given, or the trial's best ACTIVE one by the experiment's
metric (ties: the newer), or its newest when none has a metric. It must be ACTIVE,
of that trial, inside the experiment's checkpoint folder, and its folder must
verify against its ``MANIFEST.json`` (sizes and sha256,
:func:`dlhpc.protocol.checkpoint.verify_checkpoint`); anything else is refused
(:class:`~dlhpc.errors.UsageError`, exit 2) and nothing is written. From then on
the checkpoint GC keeps it (``model NAME:VERSION``, :mod:`.checkpoints`).

:func:`version_facts` (``show``) adds the trial's reproducibility record, summed
up by :func:`record_summary`: the code (commit, dirty), the data fingerprints and
the environment. :func:`export_version` writes the version's trial export
(:func:`.export.export_trial` with exactly that checkpoint) plus ``model.json``
and a ``README.txt`` saying what each file is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dlhpc._perms import current_user
from dlhpc.errors import NotFoundError, UsageError
from dlhpc.orchestrator._contained import checked_checkpoint
from dlhpc.orchestrator.export import ExportResult, export_trial
from dlhpc.states import CheckpointState
from dlhpc.store import Checkpoint, ModelVersion, Store, utcnow
from dlhpc.store.checkpoint_dirs import trial_checkpoint_dir
from dlhpc.store.model_registry import (
    VersionRow,
    check_model_name,
    find_version,
    parse_ref,
    trial_experiment,
)
from dlhpc.store.queries import trial_record_of

__all__ = [
    "MAX_NOTE",
    "Registered",
    "export_version",
    "record_summary",
    "register",
    "version_facts",
]

MAX_NOTE = 4000  # characters of a version's note


@dataclass(frozen=True)
class Registered:
    """What :func:`register` wrote, and why that checkpoint (``chosen_as``)."""

    name: str
    version: int
    trial_id: int
    experiment_id: int
    checkpoint_id: int
    step: int
    metric: float | None
    path: str
    chosen_as: str  # "given", "best by <metric>" or "latest (...)"

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


def _deleted(c: Checkpoint) -> UsageError:
    when = f" at {c.deleted_at:%Y-%m-%d %H:%M} UTC" if c.deleted_at else ""
    return UsageError(f"checkpoint {c.id} (step {c.step}) was deleted{when}; not registered")


def _pick(
    s: Session, trial_id: int, checkpoint_id: int | None, smaller: bool, metric: str
) -> tuple[Checkpoint, str]:
    """The checkpoint to register and why (see the module docstring)."""
    if checkpoint_id is not None:
        c = s.get(Checkpoint, checkpoint_id)
        if c is None:
            raise NotFoundError(f"no checkpoint {checkpoint_id}")
        if c.trial_id != trial_id:
            raise UsageError(
                f"checkpoint {checkpoint_id} is trial {c.trial_id}'s, not trial {trial_id}'s"
            )
        if c.state != CheckpointState.ACTIVE.value:
            raise _deleted(c)
        return c, "given"
    rows = s.scalars(
        select(Checkpoint).where(
            Checkpoint.trial_id == trial_id, Checkpoint.state == CheckpointState.ACTIVE.value
        )
    ).all()
    if not rows:
        raise UsageError(f"trial {trial_id} has no checkpoint left (none saved, or all deleted)")
    newest = sorted(rows, key=lambda c: (c.step, c.id), reverse=True)
    scored = [c for c in newest if c.metric is not None and math.isfinite(c.metric)]
    if scored:
        sign = 1.0 if smaller else -1.0
        best = min(scored, key=lambda c: sign * float(c.metric or 0.0))  # first: the newer
        return best, f"best by {metric}"
    return newest[0], "latest (no checkpoint of the trial has a metric)"


def register(
    store: Store, trial_id: int, name: str, checkpoint_id: int | None = None, note: str = ""
) -> Registered:
    """Register the next version of ``name`` for a checkpoint of trial ``trial_id``
    (see the module docstring). Holds the reconciler lease
    (:class:`~dlhpc.errors.LeaseHeldError` while a tick runs); bad input raises
    :class:`~dlhpc.errors.UsageError` (:class:`~dlhpc.errors.NotFoundError` for an
    unknown trial or checkpoint) before anything is written."""
    check_model_name(name)
    if len(note) > MAX_NOTE:
        raise UsageError(f"the note is {len(note)} characters long; at most {MAX_NOTE}")
    with store.hold_lease():
        with store.read() as s:
            _, exp = trial_experiment(s, trial_id)
            c, chosen = _pick(s, trial_id, checkpoint_id, exp.smaller_is_better, exp.metric)
            cid, step, metric, path, size = c.id, c.step, c.metric, c.path, c.size_bytes
            exp_id, own = exp.id, trial_checkpoint_dir(exp, trial_id)
        try:
            folder = checked_checkpoint(own, path, step, size)
        except UsageError as err:
            raise UsageError(f"checkpoint {cid} (step {step}) does not verify: {err}") from err
        if folder is None:
            raise UsageError(f"checkpoint {cid} (step {step}): {path} is gone; not registered")
        with store.write() as s:
            now = s.get(Checkpoint, cid)
            if now is None or now.state != CheckpointState.ACTIVE.value:
                raise UsageError(f"checkpoint {cid} was deleted meanwhile; not registered")
            last = s.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.name == name))
            version = int(last or 0) + 1
            s.add(
                ModelVersion(
                    name=name,
                    version=version,
                    experiment_id=exp_id,
                    trial_id=trial_id,
                    checkpoint_id=cid,
                    step=step,
                    metric=metric,
                    note=note,
                    user=current_user(),
                    created_at=utcnow(),
                )
            )
    return Registered(name, version, trial_id, exp_id, cid, step, metric, path, chosen)


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def record_summary(experiment: dict[str, Any], attempt: dict[str, Any]) -> dict[str, Any]:
    """What a trial's reproducibility record says made it: ``code`` (kind, commit,
    branch, dirty, digest), ``data`` (each declared path's fingerprint), and
    ``environment`` (Python, package count, scheduler version, site, nodes, CPU,
    GPUs and driver). ``recorded`` says which of the two records exist (an older
    experiment, or a trial whose job never started, lacks one)."""
    code = _dict(experiment.get("code"))
    gpu = _dict(attempt.get("gpu"))
    devices = [_dict(d).get("name") for d in gpu.get("devices") or []]
    data_keys = ("path", "exists", "kind", "files", "bytes", "listing_sha256", "content_sha256")
    return {
        "recorded": {"experiment": bool(experiment), "attempt": bool(attempt)},
        "code": {k: code.get(k) for k in ("kind", "commit", "branch", "dirty", "digest", "error")},
        "data": [
            {k: _dict(d).get(k) for k in data_keys if k in _dict(d)}
            for d in attempt.get("data") or []
        ],
        "environment": {
            "python": _dict(experiment.get("python")).get("version")
            or _dict(attempt.get("python")).get("version"),
            "packages": len(_dict(_dict(experiment.get("packages")).get("items"))),
            "scheduler_version": _dict(experiment.get("slurm")).get("version"),
            "site": _dict(experiment.get("site")).get("name"),
            "nodes": attempt.get("nodes"),
            "cpu": _dict(attempt.get("cpu")).get("model"),
            "gpus": devices,
            "gpu_driver": gpu.get("driver"),
        },
    }


def version_facts(store: Store, ref: str) -> dict[str, Any]:
    """One version (``NAME:VERSION``, or ``NAME`` for the latest) as JSON-ready facts:
    the row, the trial's hyperparameters, seed and length, and :func:`record_summary`.
    :class:`~dlhpc.errors.NotFoundError` for an unknown name or version."""
    return _row_and_facts(store, ref)[1]


def _row_and_facts(store: Store, ref: str) -> tuple[VersionRow, dict[str, Any]]:
    name, version = parse_ref(ref)
    with store.read() as s:
        row = find_version(s, name, version)
        record = trial_record_of(s, row.trial_id)
    trial = _dict(record.get("trial"))
    return row, {
        **row.as_dict(),
        "hparams": trial.get("hparams"),
        "seed": trial.get("seed"),
        "max_length": trial.get("max_length"),
        "record": record_summary(_dict(record.get("experiment")), _dict(record.get("attempt"))),
    }


README = """\
Model {ref}: a dlhpc model registry export (dlhpc model export).

Registered by {user} on {created}. Trial {trial_id} of experiment {experiment_id}
({experiment_name}), checkpoint {checkpoint_id} at step {step}; {metric_name} = {metric}.
Note: {note}

What is what:
  checkpoint/       the weights: a copy of the checkpoint folder, verified against its
                    MANIFEST.json (file sizes and sha256) after the copy
  model.json        this version: name, version, trial, experiment, step, metric, note,
                    user, date, and a summary of the reproducibility record
  config.yaml       the resolved experiment config the trial ran with
  experiment.yaml   the experiment file as given at launch
  hparams.json      the trial's hyperparameters
  metrics.csv       every metric the trial reported: step,name,value,time
  repro.json        the full reproducibility record: the launch record (code, packages,
                    modules, scheduler), each attempt's record (nodes, CPU, GPUs, env,
                    data fingerprints) and the exported checkpoint's facts
"""


def export_version(store: Store, ref: str, folder: Path) -> tuple[VersionRow, ExportResult]:
    """Export version ``ref`` into ``folder`` (new or empty; see the module docstring).
    Raises as :func:`.export.export_trial` does; a version whose checkpoint is gone
    is an error."""
    row, facts = _row_and_facts(store, ref)
    if row.checkpoint_state != CheckpointState.ACTIVE.value:
        raise UsageError(f"model {row.ref}'s checkpoint {row.checkpoint_id} was deleted")
    readme = README.format(
        ref=row.ref,
        user=row.user or "?",
        created=facts["created_at"],
        note=row.note or "(none)",
        metric="-" if row.metric is None else f"{row.metric:.6g}",
        **{k: facts[k] for k in ("trial_id", "experiment_id", "experiment_name")},
        **{k: facts[k] for k in ("checkpoint_id", "step", "metric_name")},
    )
    extra = {
        "model.json": json.dumps(facts, indent=2, default=str) + "\n",
        "README.txt": readme,
    }
    result = export_trial(store, row.trial_id, folder, checkpoint_id=row.checkpoint_id, extra=extra)
    return row, result
