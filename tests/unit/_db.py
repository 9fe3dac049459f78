"""Rows for tests that use a real :class:`~dlhpc.store.Store`: an experiment, its trials."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from dlhpc.store import Experiment, Store, Submission, Trial, utcnow
from dlhpc.store.ingest import new_attempt


def add_experiment(s: Session, run_dir: Path | str, **fields: Any) -> Experiment:
    """An ACTIVE local experiment (flushed: it has its id); ``fields`` override the defaults."""
    row: dict[str, Any] = {
        "name": "e",
        "state": "ACTIVE",
        "backend": "local",
        "site": "local",
        "searcher": "single",
        "metric": "val_loss",
        "smaller_is_better": True,
        "source_path": "x",
        "yaml_text": "",
        "config_json": "{}",
        "run_dir": str(run_dir),
        "created_at": utcnow(),
    }
    exp = Experiment(**{**row, **fields})
    s.add(exp)
    s.flush()
    return exp


def add_trial(s: Session, exp: Experiment, **fields: Any) -> Trial:
    """A RUNNING trial of ``exp`` (flushed: it has its id); ``fields`` override the defaults."""
    row: dict[str, Any] = {
        "experiment_id": exp.id,
        "request_id": 0,
        "state": "RUNNING",
        "hparams_json": "{}",
        "max_length": 3,
        "seed": 1,
        "run_dir": "",
        "created_at": utcnow(),
    }
    t = Trial(**{**row, **fields})
    s.add(t)
    s.flush()
    return t


def exp_and_trial(store: Store, tmp_path: Path, name: str = "e") -> int:
    """One experiment with one running trial (run folder ``tmp_path/t``); the trial's id."""
    now = utcnow()
    with store.write() as s:
        exp = add_experiment(s, tmp_path, name=name, created_at=now)
        return add_trial(s, exp, run_dir=str(tmp_path / "t"), created_at=now).id


def submitted_attempt(store: Store, trial_id: int, key: str, folder: str, log_path: str) -> None:
    """A submission of trial ``trial_id`` (its job folder ``folder``) and its RUNNING
    attempt ``key`` with that log, as the submit step records them."""
    with store.write() as s:
        t = s.get(Trial, trial_id)
        assert t is not None
        sub = Submission(
            experiment_id=t.experiment_id,
            name=f"job-{key}",  # unique, as each submission's name is
            state="SUBMITTED",
            trial_ids_json=f"[{trial_id}]",
            folder=folder,
            created_at=utcnow(),
        )
        s.add(sub)
        s.flush()
        attempt = new_attempt(
            trial_id, key, "RUNNING", utcnow(), submission_id=sub.id, log_path=log_path
        )
        s.add(attempt)
