"""The status model: what ``dlhpc status`` shows, as plain data (also its --json).

GPU telemetry (``gpu_samples``) comes in through one aggregate query per call, one row
per (attempt, host, GPU): the samples' count and sum of utilization, the first, newest
and last busy sample time. From it each attempt gets a ``gpu`` summary (GPUs seen, mean
utilization over the attempt, newest sample) and each live attempt (``RUNNING``, no exit
record yet) the idle rule of :func:`dlhpc.harness.telemetry.idle_since`, judged at the
attempt's newest sample: every idle GPU is listed in ``idle_gpus``, per trial and per
experiment.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timezone
from statistics import median
from typing import Any

from sqlalchemy import Row, case, func, or_, select
from sqlalchemy.orm import Session, selectinload

from dlhpc.errors import NotFoundError
from dlhpc.harness.telemetry import IDLE_BELOW_PCT, IDLE_WINDOW_S, idle_since
from dlhpc.store import Attempt, Decision, Experiment, GpuSample, Trial

__all__ = ["status_data"]

_GpuRows = dict[int, list[Row[Any]]]  # attempt id -> one row per (host, GPU)


def _gpu_rows(session: Session, experiment_id: int | None, below_pct: float) -> _GpuRows:
    """The per-GPU digests of the attempts shown, in one query."""
    busy = or_(GpuSample.util.is_(None), GpuSample.util >= below_pct)  # telemetry.is_busy
    query = select(
        GpuSample.attempt_id,
        GpuSample.host,
        GpuSample.gpu_index,
        func.count(GpuSample.util).label("n_util"),
        func.sum(GpuSample.util).label("sum_util"),
        func.min(GpuSample.time).label("first"),
        func.max(GpuSample.time).label("newest"),
        func.max(case((busy, GpuSample.time))).label("last_busy"),
    ).group_by(GpuSample.attempt_id, GpuSample.host, GpuSample.gpu_index)
    if experiment_id is not None:
        shown = select(Attempt.id).join(Trial).where(Trial.experiment_id == experiment_id)
        query = query.where(GpuSample.attempt_id.in_(shown))
    out: _GpuRows = defaultdict(list)
    for row in session.execute(query):
        out[row.attempt_id].append(row)
    return out


def _gpu_summary(rows: list[Row[Any]]) -> dict[str, Any] | None:
    if not rows:
        return None
    n = sum(r.n_util for r in rows)
    total = sum(r.sum_util or 0 for r in rows)
    return {
        "gpus": len(rows),
        "util_mean": round(total / n, 1) if n else None,
        "last_sample_at": _iso_epoch(max(r.newest for r in rows)),
    }


def _idle(
    t: Trial, a: Attempt, rows: list[Row[Any]], below_pct: float, window_s: float
) -> list[dict[str, Any]]:
    """The idle GPUs of a live attempt, judged at its newest sample (none once it ended)."""
    if a.state != "RUNNING" or a.ended_at is not None or not rows:
        return []
    now = max(r.newest for r in rows)
    out = []
    for r in sorted(rows, key=lambda r: (r.host, r.gpu_index)):
        since = idle_since(r.first, r.newest, r.last_busy, now, window_s)
        if since is not None:
            out.append(
                {
                    "trial_id": t.id,
                    "attempt_key": a.attempt_key,
                    "host": r.host,
                    "gpu_index": r.gpu_index,
                    "idle_minutes": round((now - since) / 60.0, 1),
                    "idle_since": _iso_epoch(since),
                    "below_pct": below_pct,
                }
            )
    return out


def _trial(t: Trial, gpu: _GpuRows, below_pct: float, window_s: float) -> dict[str, Any]:
    attempts = []
    latest_gpu = None
    idle: list[dict[str, Any]] = []
    for a in t.attempts:
        rows = gpu.get(a.id, [])
        summary = _gpu_summary(rows)
        if summary is not None:
            latest_gpu = {"attempt_key": a.attempt_key, **summary}
        idle.extend(_idle(t, a, rows, below_pct, window_s))
        attempts.append(
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
                "gpu": summary,
            }
        )
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
        "gpu": latest_gpu,  # the newest attempt with samples
        "idle_gpus": idle,
        "attempts": attempts,
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() + "Z" if value else None


def _iso_epoch(value: float) -> str | None:
    return _iso(datetime.fromtimestamp(value, tz=timezone.utc).replace(tzinfo=None))


def _decision_stats(session: Session, exp_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Per experiment: promotions and stops acted on, and their latency (from the
    newest result the searcher had seen to the decision acted on), in seconds."""
    rows = session.execute(
        select(
            Decision.experiment_id, Decision.kind, Decision.result_time, Decision.acted_at
        ).where(Decision.experiment_id.in_(exp_ids))
    ).all()
    out: dict[int, dict[str, Any]] = {}
    lat: dict[int, list[float]] = {}
    for exp_id, kind, result_time, acted_at in rows:
        d = out.setdefault(exp_id, {"promotions": 0, "stops": 0, "pending": 0})
        d["promotions" if kind == "promote" else "stops"] += 1
        if acted_at is None:
            d["pending"] += 1
        elif result_time is not None:
            lat.setdefault(exp_id, []).append(max(0.0, (acted_at - result_time).total_seconds()))
    for exp_id, d in out.items():
        values = sorted(lat.get(exp_id, []))
        d["latency_s"] = (
            {"n": len(values), "median": round(median(values), 3), "max": round(values[-1], 3)}
            if values
            else None
        )
    return out


def status_data(
    session: Session,
    experiment_id: int | None = None,
    *,
    idle_below_pct: float = IDLE_BELOW_PCT,
    idle_window_s: float = IDLE_WINDOW_S,
) -> dict[str, Any]:
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
    gpu = _gpu_rows(session, experiment_id, idle_below_pct) if exps else {}
    decisions = _decision_stats(session, [e.id for e in exps]) if exps else {}
    out = []
    for e in exps:
        trials = [_trial(t, gpu, idle_below_pct, idle_window_s) for t in e.trials]
        out.append(
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
                "idle_gpus": [g for t in trials for g in t["idle_gpus"]],
                "decisions": decisions.get(e.id),
                "trials": trials,
            }
        )
    return {"experiments": out}
