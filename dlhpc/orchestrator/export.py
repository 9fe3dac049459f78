"""``dlhpc export TRIAL_ID DIR``: one trial's result, to share or publish.

``DIR`` receives:

* ``checkpoint/``: a copy of the trial's best ACTIVE checkpoint by the searcher
  metric (its newest when none has a metric, or with ``latest=True``), verified
  against its manifest (sizes and sha256) after the copy; absent when the trial has
  no checkpoint folder left (``repro.json`` then says ``"checkpoint": null``). Only a
  folder of the trial's own with the row's step is copied
  (:mod:`dlhpc.store.checkpoint_dirs`, no symlink below the configured root); one
  elsewhere (another trial's), of another step, holding a symlink, or not matching
  its manifest (step, sizes, sha256) is refused (:class:`~dlhpc.errors.UsageError`);
  a folder that is gone is passed over;
* ``config.yaml``: the resolved config the trial ran with; ``experiment.yaml``: the
  experiment YAML as given at launch;
* ``metrics.csv``: ``step,name,value,time`` for every metric the trial reported
  (an empty value is NaN);
* ``hparams.json``: the trial's hyperparameters;
* ``repro.json``: the experiment's reproducibility record (``experiments.repro_json``),
  the trial's facts, each attempt's own record (``attempts.env_json``) and the
  exported checkpoint's facts. Whatever those columns hold is exported as it is.

With ``checkpoint_id`` (``dlhpc model export``) that checkpoint of the trial is
exported, or nothing: a deleted one, or one whose folder is gone, is an error; the
caller's ``extra`` files (name -> text) are written beside the others.

Everything is written into a temporary sibling folder and renamed to ``DIR`` at the
end, so ``DIR`` is either complete or as it was. An existing non-empty ``DIR`` is
refused. Reads the database only: no lease needed.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

from dlhpc._perms import copy_file, make_dirs, share_dir
from dlhpc.errors import DlhpcError, NotFoundError, UnsafePathError, UsageError
from dlhpc.orchestrator._contained import checked_checkpoint
from dlhpc.protocol.checkpoint import MANIFEST_NAME, FileRecord, verify_checkpoint
from dlhpc.protocol.checkpoint import Checkpoint as CkptFolder
from dlhpc.states import CheckpointState
from dlhpc.store import Attempt, Checkpoint, Experiment, Metric, Store, Trial
from dlhpc.store.checkpoint_dirs import TrialCheckpointDir, trial_checkpoint_dir

__all__ = ["ExportResult", "export_trial"]


@dataclass
class ExportResult:
    folder: Path
    files: list[str]  # top-level names written
    checkpoint: dict[str, Any] | None  # the exported checkpoint's facts


def _json(text: str | None) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text  # exported as it is


def _candidates(rows: list[Checkpoint], smaller: bool, latest: bool) -> list[Checkpoint]:
    """ACTIVE checkpoints in order of preference: best by metric, then newest."""
    newest = sorted(rows, key=lambda c: (c.step, c.id), reverse=True)
    if latest:
        return newest
    sign = 1.0 if smaller else -1.0
    scored = [c for c in newest if c.metric is not None and math.isfinite(c.metric)]
    best = sorted(scored, key=lambda c: sign * float(c.metric or 0.0))  # stable: newer first
    return best + [c for c in newest if c not in best]


def _verify_copy(folder: Path, step: int) -> None:
    """The copy matches its manifest: its step is ``step`` and every file's size and
    sha256 are the manifest's (:class:`~dlhpc.errors.UsageError` if not)."""
    try:
        m = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
        files = {k: FileRecord(int(v["size"]), str(v["sha256"])) for k, v in m["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DlhpcError(f"the copied checkpoint's manifest does not read: {err}") from err
    if m.get("step") != step:
        raise UsageError(f"the checkpoint's manifest says step {m.get('step')!r}, not {step}")
    why = verify_checkpoint(CkptFolder(folder, step, 0.0, files, {}))
    if why is not None:
        raise UsageError(f"the checkpoint does not match its manifest: {why}")


def _no_links(folder: Path) -> None:
    """A published checkpoint holds regular files only; a symlink (planted later) would
    hand out whatever it points to."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise UnsafePathError(f"the checkpoint holds a symlink: {name}; not exported")


def _copy_checkpoint(src: Path, dst: Path, c: Checkpoint) -> None:
    """Copy ``src`` (checked) to ``dst`` and verify the copy; a copy that holds a
    symlink or does not verify is refused, naming checkpoint ``c``."""
    shutil.copytree(src, dst, symlinks=True, copy_function=copy_file)
    _no_links(dst)
    try:
        _verify_copy(dst, c.step)
    except UsageError as err:
        raise UsageError(f"checkpoint {c.id} (step {c.step}) is not exported: {err}") from err


def _write_checkpoint(
    tmp: Path, rows: list[Checkpoint], smaller: bool, latest: bool, own: TrialCheckpointDir | None
) -> dict[str, Any] | None:
    for rank, c in enumerate(_candidates(rows, smaller, latest)):
        try:  # sizes here; every sha256 on the copy
            src = checked_checkpoint(own, c.path, c.step, c.size_bytes, verify_hashes=False)
        except UsageError as err:
            raise UsageError(f"checkpoint {c.id} (step {c.step}) is not exported: {err}") from err
        if src is None:
            continue  # gone: the next preferred one
        _copy_checkpoint(src, tmp / "checkpoint", c)
        chosen = "latest" if latest or c.metric is None else "best"
        return {
            "id": c.id,
            "step": c.step,
            "metric": c.metric,
            "size_bytes": c.size_bytes,
            "source": c.path,
            "chosen_as": chosen if rank == 0 else f"{chosen} (preferred ones' folders missing)",
        }
    return None


def _check_target(folder: Path) -> None:
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise UsageError(f"{folder} exists and is not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        raise UsageError(f"{folder} is not empty; export into a new or empty folder")


@dataclass(frozen=True)
class _Facts:
    """What an export writes besides the checkpoint's files, read from the database."""

    rows: list[Checkpoint]  # the candidate checkpoints (ACTIVE; only the given one, if any)
    metrics: Sequence[Any]  # (step, name, value, time) rows, by step and name
    attempts: list[dict[str, Any]]
    trial: dict[str, Any]
    hparams: Any
    config: Any
    yaml_text: str
    repro: Any
    smaller: bool  # the searcher metric's direction
    own: TrialCheckpointDir | None  # the trial's checkpoint folder


def _attempt_facts(a: Attempt) -> dict[str, Any]:
    """One attempt's entry of ``repro.json``: its facts and its own record."""
    return {
        "key": a.attempt_key,
        "job_id": a.job_id,
        "state": a.state,
        "cause": a.cause,
        "exit_code": a.exit_code,
        "node_list": a.node_list,
        "env": _json(a.env_json),
    }


def _trial_facts(trial: Trial, exp: Experiment) -> dict[str, Any]:
    """The trial's entry of ``repro.json``."""
    return {
        "id": trial.id,
        "experiment_id": exp.id,
        "experiment_name": exp.name,
        "state": trial.state,
        "seed": trial.seed,
        "steps_completed": trial.steps_completed,
        "metric": exp.metric,
        "smaller_is_better": exp.smaller_is_better,
        "best_metric": trial.best_metric,
        "latest_metric": trial.latest_metric,
    }


def _read(store: Store, trial_id: int, checkpoint_id: int | None) -> _Facts:
    """Read what the export needs in one read transaction. NotFoundError for an unknown
    trial, or a ``checkpoint_id`` that is not one of its ACTIVE checkpoints."""
    with store.read() as s:
        trial = s.get(Trial, trial_id)
        if trial is None:
            raise NotFoundError(f"no trial {trial_id}")
        exp = trial.experiment
        q = select(Checkpoint).where(
            Checkpoint.trial_id == trial_id, Checkpoint.state == CheckpointState.ACTIVE.value
        )
        if checkpoint_id is not None:
            q = q.where(Checkpoint.id == checkpoint_id)
        rows = list(s.scalars(q))
        if checkpoint_id is not None and not rows:
            raise NotFoundError(f"trial {trial_id} has no active checkpoint {checkpoint_id}")
        metrics = s.execute(
            select(Metric.step, Metric.name, Metric.value, Metric.time)
            .where(Metric.trial_id == trial_id)
            .order_by(Metric.step, Metric.name)
        ).all()
        return _Facts(
            rows=rows,
            metrics=metrics,
            attempts=[_attempt_facts(a) for a in trial.attempts],
            trial=_trial_facts(trial, exp),
            hparams=_json(trial.hparams_json),
            config=_json(exp.config_json),
            yaml_text=exp.yaml_text,
            repro=_json(exp.repro_json),
            smaller=exp.smaller_is_better,
            own=trial_checkpoint_dir(exp, trial_id),
        )


def _write_files(
    tmp: Path, facts: _Facts, ckpt: dict[str, Any] | None, extra: dict[str, str]
) -> None:
    """Write the files beside ``checkpoint/`` into ``tmp``: the caller's ``extra``, then
    ``config.yaml``, ``experiment.yaml``, ``metrics.csv``, ``hparams.json`` and
    ``repro.json`` (with ``ckpt``, the exported checkpoint's facts)."""
    for name, text in extra.items():
        (tmp / name).write_text(text, encoding="utf-8")
    (tmp / "config.yaml").write_text(
        "# the resolved config this trial ran with (dlhpc export)\n"
        + yaml.safe_dump(facts.config, sort_keys=False, allow_unicode=True),
        encoding="utf-8",
    )
    (tmp / "experiment.yaml").write_text(facts.yaml_text, encoding="utf-8")
    with open(tmp / "metrics.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["step", "name", "value", "time"])
        w.writerows(
            [step, name, "" if v is None else repr(v), t] for step, name, v, t in facts.metrics
        )
    (tmp / "hparams.json").write_text(json.dumps(facts.hparams, indent=2, sort_keys=True) + "\n")
    record = {
        "experiment": facts.repro,
        "trial": facts.trial,
        "attempts": facts.attempts,
        "checkpoint": ckpt,
    }
    (tmp / "repro.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


def export_trial(
    store: Store,
    trial_id: int,
    folder: Path,
    latest: bool = False,
    *,
    checkpoint_id: int | None = None,
    extra: dict[str, str] | None = None,
) -> ExportResult:
    """Write the trial's export into ``folder`` (see the module docstring).

    :class:`~dlhpc.errors.NotFoundError` for an unknown trial (or a ``checkpoint_id``
    that is not one of its ACTIVE checkpoints),
    :class:`~dlhpc.errors.UsageError` for a non-empty or non-folder target,
    :class:`~dlhpc.errors.DlhpcError` when the copied checkpoint fails verification.
    """
    folder = folder.expanduser().absolute()
    facts = _read(store, trial_id, checkpoint_id)
    _check_target(folder)
    make_dirs(folder.parent, store.permissions)
    tmp = folder.parent / f".{folder.name}.export-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        share_dir(tmp, store.permissions)
        ckpt = _write_checkpoint(tmp, facts.rows, facts.smaller, latest, facts.own)
        if checkpoint_id is not None:
            if ckpt is None:
                raise DlhpcError(f"checkpoint {checkpoint_id}'s folder is gone or not exportable")
            ckpt["chosen_as"] = "given"
        _write_files(tmp, facts, ckpt, extra or {})
        names = sorted(p.name for p in tmp.iterdir())
        os.replace(tmp, folder)  # onto an absent or empty folder: atomic on POSIX
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DlhpcError(f"export to {folder} failed: {err}") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(folder, names, ckpt)
