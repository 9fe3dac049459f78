"""The queries behind ``dlhpc tick -q`` and ``dlhpc digest`` (``cli._attention``):
experiments that ended and trials that failed in a time window, and the GPUs idle now.
Each returns plain dicts, the digest's own records (its JSON state file keeps idle
spells by :func:`dlhpc.cli._attention.idle_key`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dlhpc.report._status_gpu import idle_gpus
from dlhpc.report.status import status_data
from dlhpc.states import ExperimentState, JobState, TrialState
from dlhpc.store import Attempt, Experiment, GpuSample, Trial

__all__ = ["failed_trials", "finished_experiments", "idle_now"]


def finished_experiments(s: Session, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """Experiments that ended in ``[since, until)``, oldest end first: their trial and
    failure counts, best trial by the metric, and resource hours."""
    exps = s.scalars(
        select(Experiment)
        .where(Experiment.ended_at >= since, Experiment.ended_at < until)
        .order_by(Experiment.ended_at)
    ).all()
    out = []
    for e in exps:
        data = status_data(s, e.id).experiments[0]
        scored = [t for t in data.trials if t.best_metric is not None]
        pick = min if e.smaller_is_better else max
        best = pick(scored, key=lambda t: t.best_metric or 0.0) if scored else None
        out.append(
            {
                "id": e.id,
                "name": e.name,
                "state": e.state,
                "trials": len(data.trials),
                "failed_trials": sum(t.state == TrialState.FAILED.value for t in data.trials),
                "metric": e.metric,
                "best": None if best is None else best.best_metric,
                "best_trial": None if best is None else best.id,
                "gpu_hours": data.gpu_hours,
                "cpu_hours": data.cpu_hours,
            }
        )
    return out


def failed_trials(s: Session, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """Trials that failed in ``[since, until)``, by id, with their experiment and error."""
    rows = s.execute(
        select(Trial.id, Trial.experiment_id, Experiment.name, Trial.error)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .where(
            Trial.state == TrialState.FAILED.value, Trial.ended_at >= since, Trial.ended_at < until
        )
        .order_by(Trial.id)
    ).all()
    return [
        {"trial_id": tid, "experiment_id": eid, "experiment": name, "error": err or ""}
        for tid, eid, name, err in rows
    ]


def idle_now(s: Session) -> list[dict[str, Any]]:
    """Idle GPUs of the live attempts of active experiments (none without telemetry):
    :class:`~dlhpc.report.status_types.IdleGpu`'s JSON plus ``experiment_id``."""
    live = (
        select(Attempt.id)
        .join(Trial, Trial.id == Attempt.trial_id)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .where(
            Experiment.state == ExperimentState.ACTIVE.value,
            Attempt.state == JobState.RUNNING.value,
            Attempt.ended_at.is_(None),
        )
    )
    sampled = s.scalars(
        select(Trial.experiment_id)
        .join(Attempt, Attempt.trial_id == Trial.id)
        .join(GpuSample, GpuSample.attempt_id == Attempt.id)
        .where(Attempt.id.in_(live))
        .distinct()
    ).all()
    out: list[dict[str, Any]] = []
    for exp_id in sorted(sampled):
        out.extend({"experiment_id": exp_id, **g.to_json()} for g in idle_gpus(s, exp_id))
    return out
