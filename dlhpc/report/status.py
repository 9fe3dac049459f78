"""The status model: what ``dlhpc status`` shows, as plain data (also its --json).

GPU telemetry (``gpu_samples``) comes in through one aggregate query per call, one row
per (attempt, host, GPU): the samples' count and sum of utilization, the first, newest
and last busy sample time. From it each attempt gets a ``gpu`` summary (GPUs seen, mean
utilization over the attempt, newest sample) and each live attempt (``RUNNING``, no exit
record yet) the idle rule of :func:`dlhpc.harness.telemetry.idle_since`, judged at the
attempt's newest sample: every idle GPU is listed in ``idle_gpus``, per trial and per
experiment.

Resource use: each attempt's run time (start to end, or to now while it runs) times the
experiment's ``nodes x gpus_per_node`` is its ``gpu_hours`` (``nodes x tasks_per_node x
cpus_per_task``: ``cpu_hours``), summed per trial and per experiment; CPU-only runs have 0
GPU-hours. A trial's ``target_length`` is what its progress counts toward: the searcher's
final ``max_length`` for a ``PAUSED`` or ``STOPPED_EARLY`` trial (its grant, ``max_length``,
was only a rung), else the grant.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from statistics import median
from typing import Any

from sqlalchemy import Row, case, func, or_, select
from sqlalchemy.orm import Session, selectinload

from dlhpc.errors import NotFoundError
from dlhpc.harness.telemetry import IDLE_BELOW_PCT, IDLE_WINDOW_S, idle_since
from dlhpc.store import Attempt, Checkpoint, Decision, Experiment, GpuSample, Trial

__all__ = ["status_data"]

_GpuRows = dict[int, list[Row[Any]]]  # attempt id -> one row per (host, GPU)
_LIVE = {"PENDING", "RUNNING", "REQUEUED", "UNKNOWN"}  # orchestrator.trials.LIVE_ATTEMPT_STATES
_RUNG_STATES = {"PAUSED", "STOPPED_EARLY"}  # grant was a rung: progress toward the final length


@dataclass(frozen=True)
class _Shape:
    """What an experiment's resolved config says about each job (for resource hours)."""

    gpus: int  # per job: nodes x gpus_per_node
    cpus: int  # per job: nodes x tasks_per_node x cpus_per_task
    max_length: int | None  # the searcher's final length

    @classmethod
    def of(cls, config_json: str) -> _Shape:
        try:
            cfg = json.loads(config_json or "{}")
        except ValueError:
            cfg = {}
        res = cfg.get("resources") or {}
        nodes = int(res.get("nodes") or 1)
        gpn = int(res.get("gpus_per_node") or 0)
        tasks = int(res.get("tasks_per_node") or max(1, gpn))
        length = (cfg.get("searcher") or {}).get("max_length")
        return cls(nodes * gpn, nodes * tasks * int(res.get("cpus_per_task") or 1), length)


def _run_hours(a: Attempt, now: datetime) -> float:
    """Hours the attempt held its allocation (to ``now`` while it still runs)."""
    if a.started_at is None:
        return 0.0
    end = a.ended_at
    if end is None:
        end = now if a.state in _LIVE else a.terminal_seen_at
    if end is None:
        return 0.0
    return max(0.0, (end - a.started_at).total_seconds()) / 3600.0


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


def _trial(
    t: Trial, gpu: _GpuRows, below_pct: float, window_s: float, shape: _Shape, now: datetime
) -> dict[str, Any]:
    attempts = []
    latest_gpu = None
    idle: list[dict[str, Any]] = []
    gpu_h = cpu_h = 0.0
    for a in t.attempts:
        hours = _run_hours(a, now)
        gpu_h += hours * shape.gpus
        cpu_h += hours * shape.cpus
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
                "gpu_hours": round(hours * shape.gpus, 4),
                "cpu_hours": round(hours * shape.cpus, 4),
            }
        )
    target = t.max_length
    if t.state in _RUNG_STATES and shape.max_length:
        target = max(t.max_length, int(shape.max_length))
    return {
        "id": t.id,
        "state": t.state,
        "hparams": json.loads(t.hparams_json),
        "steps_completed": t.steps_completed,
        "max_length": t.max_length,
        "target_length": target,
        "best_metric": t.best_metric,
        "latest_metric": t.latest_metric,
        "restarts": t.restarts,
        "crashes": t.crashes,
        "slurm_job_ids": list(dict.fromkeys(a.job_id for a in t.attempts)),
        "error": t.error,
        "gpu": latest_gpu,  # the newest attempt with samples
        "idle_gpus": idle,
        "gpu_hours": round(gpu_h, 4),
        "cpu_hours": round(cpu_h, 4),
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


def _disk_usage(session: Session, exps: list[Experiment]) -> dict[int, dict[str, Any]]:
    """Per experiment, from the checkpoint rows (no disk scan): ACTIVE checkpoints and
    their bytes (manifest sizes), those the GC deleted and the bytes it freed, and the
    experiment's checkpoint folder (``checkpoint.dir/exp-<id>``)."""
    rows = session.execute(
        select(Trial.experiment_id, Checkpoint.state, func.count(), func.sum(Checkpoint.size_bytes))
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .where(Trial.experiment_id.in_([e.id for e in exps]))
        .group_by(Trial.experiment_id, Checkpoint.state)
    ).all()
    out: dict[int, dict[str, Any]] = {}
    for e in exps:
        try:
            ck_dir = (json.loads(e.config_json or "{}").get("checkpoint") or {}).get("dir")
        except (ValueError, AttributeError):
            ck_dir = None
        out[e.id] = {
            "checkpoints": 0,
            "checkpoint_bytes": 0,
            "deleted_checkpoints": 0,
            "freed_bytes": 0,
            "checkpoint_root": f"{ck_dir}/exp-{e.id:06d}" if ck_dir else None,
        }
    for exp_id, state, n, size in rows:
        active = state == "ACTIVE"
        out[exp_id]["checkpoints" if active else "deleted_checkpoints"] += n
        out[exp_id]["checkpoint_bytes" if active else "freed_bytes"] += int(size or 0)
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
    disk = _disk_usage(session, list(exps)) if exps else {}
    out = []
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # the DB's naive UTC
    for e in exps:
        shape = _Shape.of(e.config_json)
        trials = [_trial(t, gpu, idle_below_pct, idle_window_s, shape, now) for t in e.trials]
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
                "max_length": shape.max_length,
                "gpus_per_job": shape.gpus,
                "cpus_per_job": shape.cpus,
                "gpu_hours": round(sum(t["gpu_hours"] for t in trials), 4),
                "cpu_hours": round(sum(t["cpu_hours"] for t in trials), 4),
                "idle_gpus": [g for t in trials for g in t["idle_gpus"]],
                "decisions": decisions.get(e.id),
                "disk": disk.get(e.id),  # checkpoint bytes (see _disk_usage)
                "trials": trials,
            }
        )
    return {"experiments": out}
