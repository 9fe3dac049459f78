"""The status model: what ``dlhpc status`` shows, as plain data (also its --json)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from dlhpc.errors import NotFoundError
from dlhpc.store import Experiment, Trial

__all__ = ["status_data"]


def _trial(t: Trial) -> dict[str, Any]:
    return {
        "id": t.id,
        "state": t.state,
        "hparams": json.loads(t.hparams_json),
        "steps_completed": t.steps_completed,
        "max_length": t.max_length,
        "best_metric": t.best_metric,
        "latest_metric": t.latest_metric,
        "restarts": t.restarts,
        "crashes": t.crashes,
        "slurm_job_ids": list(dict.fromkeys(a.job_id for a in t.attempts)),
        "error": t.error,
        "attempts": [
            {
                "key": a.attempt_key,
                "job_id": a.job_id,
                "state": a.state,
                "cause": a.cause,
                "exit_code": a.exit_code,
                "lost_steps": a.lost_steps,
                "node_list": a.node_list,
                "started_at": _iso(a.started_at),
                "ended_at": _iso(a.ended_at),
            }
            for a in t.attempts
        ],
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() + "Z" if value else None


def status_data(session: Session, experiment_id: int | None = None) -> dict[str, Any]:
    """``{"experiments": [...]}``, newest first; one experiment when an id is given."""
    query = (
        select(Experiment)
        .options(selectinload(Experiment.trials).selectinload(Trial.attempts))
        .order_by(Experiment.id.desc())
    )
    if experiment_id is not None:
        query = query.where(Experiment.id == experiment_id)
    exps = session.scalars(query).all()
    if experiment_id is not None and not exps:
        raise NotFoundError(f"no experiment {experiment_id}")
    return {
        "experiments": [
            {
                "id": e.id,
                "name": e.name,
                "state": e.state,
                "searcher": e.searcher,
                "metric": e.metric,
                "smaller_is_better": e.smaller_is_better,
                "backend": e.backend,
                "created_at": _iso(e.created_at),
                "ended_at": _iso(e.ended_at),
                "run_dir": e.run_dir,
                "trials": [_trial(t) for t in e.trials],
            }
            for e in exps
        ]
    }
