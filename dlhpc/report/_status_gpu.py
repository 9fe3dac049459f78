"""GPU telemetry and attempt rows for :mod:`dlhpc.report.status`.

One row per (attempt, host, GPU): the samples' count and sum of utilization and the
newest sample time, from ``gpu_summaries`` (kept by a trigger at ingest) for an ended
attempt; for a live one (``RUNNING``, no exit record yet) an aggregate of its own
samples adds the first and last busy sample time, which the idle rule of
:func:`dlhpc.protocol.gpu.idle_since` needs.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.orm import Session

from dlhpc.protocol.gpu import IDLE_BELOW_PCT, IDLE_WINDOW_S, idle_since
from dlhpc.report.status_types import GpuUse, IdleGpu
from dlhpc.states import JobState
from dlhpc.store import Attempt, GpuSample, Trial

__all__ = [
    "ATTEMPT_COLS",
    "GpuRows",
    "Row",
    "gpu_summary",
    "idle_of",
    "idle_gpus",
    "live_idle",
    "live_gpu_rows",
    "utc",
]

Row = Any  # a result row (sqlalchemy.Row) read by attribute
GpuRows = dict[int, list[Row]]  # attempt id -> one row per (host, GPU)
ATTEMPT_COLS = (
    Attempt.id,
    Attempt.trial_id,
    Attempt.attempt_key,
    Attempt.job_id,
    Attempt.state,
    Attempt.cause,
    Attempt.exit_code,
    Attempt.lost_steps,
    Attempt.node_list,
    Attempt.started_at,
    Attempt.ended_at,
    Attempt.terminal_seen_at,
    Attempt.exit_reason,
)


def utc(value: float) -> datetime:
    """An epoch time as the DB's naive UTC."""
    return datetime.fromtimestamp(value, tz=timezone.utc).replace(tzinfo=None)


def live_gpu_rows(session: Session, live: Select[Any] | list[int], below_pct: float) -> GpuRows:
    """The per-GPU digests of the ``live`` attempts (ids), from their own samples."""
    out: GpuRows = defaultdict(list)
    busy = or_(GpuSample.util.is_(None), GpuSample.util >= below_pct)  # protocol.gpu.is_busy
    running = (
        select(
            GpuSample.attempt_id,
            GpuSample.host,
            GpuSample.gpu_index,
            func.count(GpuSample.util).label("n_util"),
            func.sum(GpuSample.util).label("sum_util"),
            func.min(GpuSample.time).label("first"),
            func.max(GpuSample.time).label("newest"),
            func.max(case((busy, GpuSample.time))).label("last_busy"),
        )
        .where(GpuSample.attempt_id.in_(live))
        .group_by(GpuSample.attempt_id, GpuSample.host, GpuSample.gpu_index)
    )
    for row in session.connection().execute(running):
        out[row.attempt_id].append(row)
    return out


def live_idle(
    session: Session, exp_ids: list[int], below_pct: float, window_s: float
) -> tuple[GpuRows, dict[int, list[IdleGpu]]]:
    """The live attempts' per-GPU digests (by attempt id) and the idle GPUs they show
    (by trial id, in attempt order): two queries, whatever the number of trials."""
    live = (
        select(Attempt.id)
        .join(Trial)
        .where(
            Trial.experiment_id.in_(exp_ids),
            Attempt.state == JobState.RUNNING.value,
            Attempt.ended_at.is_(None),
        )
    )
    attempts = (
        session.connection()
        .execute(
            select(*ATTEMPT_COLS).where(Attempt.id.in_(live)).order_by(Attempt.trial_id, Attempt.id)
        )
        .all()
    )
    gpu = live_gpu_rows(session, [a.id for a in attempts], below_pct)  # by id: no second scan
    idle: dict[int, list[IdleGpu]] = defaultdict(list)
    for a in attempts:
        idle[a.trial_id].extend(idle_of(a.trial_id, a, gpu.get(a.id, []), below_pct, window_s))
    return gpu, idle


def idle_gpus(
    session: Session,
    experiment_id: int,
    *,
    idle_below_pct: float = IDLE_BELOW_PCT,
    idle_window_s: float = IDLE_WINDOW_S,
) -> list[IdleGpu]:
    """The experiment's ``idle_gpus`` of :func:`status_data`, reading only its live
    attempts (two queries, whatever the number of trials)."""
    _, idle = live_idle(session, [experiment_id], idle_below_pct, idle_window_s)
    return [g for tid in sorted(idle) for g in idle[tid]]


def gpu_summary(rows: list[Row]) -> GpuUse | None:
    """An attempt's GPU use from its per-GPU digests (None without samples)."""
    if not rows:
        return None
    n = sum(r.n_util for r in rows)
    total = sum(r.sum_util or 0 for r in rows)
    return GpuUse(len(rows), round(total / n, 1) if n else None, utc(max(r.newest for r in rows)))


def idle_of(
    trial_id: int, a: Row, rows: list[Row], below_pct: float, window_s: float
) -> list[IdleGpu]:
    """The idle GPUs of a live attempt, judged at its newest sample (none once it ended)."""
    if a.state != JobState.RUNNING.value or a.ended_at is not None or not rows:
        return []
    now = max(r.newest for r in rows)
    out = []
    for r in sorted(rows, key=lambda r: (r.host, r.gpu_index)):
        since = idle_since(r.first, r.newest, r.last_busy, now, window_s)
        if since is not None:
            minutes = round((now - since) / 60.0, 1)
            out.append(
                IdleGpu(
                    trial_id, a.attempt_key, r.host, r.gpu_index, minutes, utc(since), below_pct
                )
            )
    return out
