"""Ingest an attempt's published event files into the DB, exactly once.

The caller supplies the write transaction; everything an event file implies
(metrics, attempt facts, the ``ingested_files`` row that marks it done) lands
in that one transaction, so a reconciler killed at any line either applied a
file completely or not at all, and a second pass skips what the first applied.
``gpu`` records become ``gpu_samples`` rows (one per GPU per sample; a row already
there is kept, and a GPU entry without a usable index is skipped).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from dlhpc._failpoints import failpoint
from dlhpc.protocol import read_event_batches
from dlhpc.repro import merge_env_record
from dlhpc.store.models import (
    Attempt,
    Checkpoint,
    Event,
    GpuSample,
    IngestedFile,
    Metric,
    Trial,
)

__all__ = ["IngestResult", "ingest_attempt", "refresh_trial_metrics"]

_KEY_RE = re.compile(r"^(?P<job>.+)\.r(?P<restart>\d+)$")
# what a re-published checkpoint (a folder name whose row the GC deleted) takes anew
_REPUBLISHED = ("attempt_id", "step", "size_bytes", "state", "created_at", "metric")


@dataclass
class IngestResult:
    files: int = 0
    metrics: int = 0
    gpu_samples: int = 0  # rows offered (a row already stored is kept, not counted apart)
    exited: bool = False


def _ts(value: Any) -> datetime | None:
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return datetime.fromtimestamp(value, tz=timezone.utc).replace(tzinfo=None)


def _num(value: Any) -> float | None:
    """A finite number, else None (telemetry is best effort: a bad value is dropped)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        v = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return v if math.isfinite(v) else None


def _int(value: Any) -> int | None:
    v = _num(value)
    return None if v is None or abs(v) >= 2**63 else int(v)  # SQLite's INTEGER is 64-bit


def _gpu_rows(attempt_id: int, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``gpu_samples`` rows of one ``gpu`` record (none without a usable time)."""
    at = _num(rec.get("time"))
    gpus = rec.get("gpus")
    if at is None or not isinstance(gpus, list):
        return []
    host = str(rec.get("host", ""))[:255]
    rows = []
    for gpu in gpus:
        index = _int(gpu.get("index")) if isinstance(gpu, dict) else None
        if index is None:
            continue
        rows.append(
            {
                "attempt_id": attempt_id,
                "time": at,
                "host": host,
                "gpu_index": index,
                "util": _int(gpu.get("util")),
                "mem_used": _int(gpu.get("mem_used")),
                "mem_total": _int(gpu.get("mem_total")),
                "power_w": _num(gpu.get("power_w")),
            }
        )
    return rows


def _checkpoint_metric(
    session: Session, trial: Trial, rec: dict[str, Any], pending: list[dict[str, Any]]
) -> float | None:
    """A checkpoint's score for the keep-best policy, fixed at ingest.

    The job's own ``metric`` (the searcher metric reported since its previous
    checkpoint; null: none) when the record has the key. Older records lack it:
    then the searcher metric reported at exactly the checkpoint's step, from this
    file's rows not yet inserted (``pending``) or the table, else None (unknown).
    """
    if "metric" in rec:
        return _num(rec["metric"])
    step, name = _int(rec.get("step", 0)), trial.experiment.metric
    for row in reversed(pending):
        if row["step"] == step and row["name"] == name:
            return _num(row["value"])
    value = session.scalar(
        select(Metric.value).where(
            Metric.trial_id == trial.id, Metric.step == step, Metric.name == name
        )
    )
    return _num(value)


def get_or_create_attempt(session: Session, trial: Trial, key: str, now: datetime) -> Attempt:
    attempt = session.scalar(
        select(Attempt).where(Attempt.trial_id == trial.id, Attempt.attempt_key == key)
    )
    if attempt is not None:
        return attempt
    m = _KEY_RE.match(key)
    job_id, restart = (m["job"], int(m["restart"])) if m else (key, 0)
    array_index = int(job_id.rsplit("_", 1)[1]) if re.search(r"_\d+$", job_id) else None
    attempt = Attempt(
        trial_id=trial.id,
        attempt_key=key,
        job_id=job_id,
        array_index=array_index,
        restart_count=restart,
        state="RUNNING",
        created_at=now,
    )
    session.add(attempt)
    session.flush()
    return attempt


def ingest_attempt(
    session: Session, trial: Trial, attempt_path: Path, now: datetime
) -> IngestResult:
    """Apply the not-yet-ingested event files of one attempt folder."""
    result = IngestResult()
    attempt = get_or_create_attempt(session, trial, attempt_path.name, now)
    done = session.scalars(
        select(IngestedFile.name).where(IngestedFile.attempt_id == attempt.id)
    ).all()
    for batch in read_event_batches(attempt_path, skip=done):
        rows = []
        gpu_rows: list[dict[str, Any]] = []
        for rec in batch.records:
            kind = rec.get("type")
            if kind == "metric":
                step = int(rec["step"])
                for name, value in rec.get("metrics", {}).items():
                    v = float(value) if value is not None else None
                    rows.append(
                        {
                            "trial_id": trial.id,
                            "attempt_id": attempt.id,
                            "step": step,
                            "name": str(name),
                            "value": v if v is not None and math.isfinite(v) else None,
                            "time": float(rec.get("time", 0.0)),
                        }
                    )
            elif kind == "start":
                attempt.started_at = attempt.started_at or _ts(rec.get("time"))
                attempt.host = str(rec.get("host", ""))
                attempt.node_list = str(rec.get("nodes", "")) or attempt.node_list
            elif kind == "exit":
                attempt.exit_code = int(rec.get("code", 1))
                sig = rec.get("signal")
                attempt.exit_reason = str(rec.get("reason", "")) + (f"/{sig}" if sig else "")
                attempt.ended_at = _ts(rec.get("time"))
                at, ckpt = rec.get("step"), rec.get("checkpoint_step")
                if isinstance(at, int):
                    attempt.lost_steps = max(0, at - (ckpt if isinstance(ckpt, int) else 0))
                result.exited = True
            elif kind == "checkpoint":
                ins = sqlite_insert(Checkpoint).values(
                    trial_id=trial.id,
                    attempt_id=attempt.id,
                    step=int(rec.get("step", 0)),
                    path=str(rec.get("path", "")),
                    size_bytes=int(rec.get("size", 0)),
                    state="ACTIVE",
                    created_at=_ts(rec.get("time")) or now,
                    metric=_checkpoint_metric(session, trial, rec, rows),
                )
                # a folder name the GC freed and a job published again: a new checkpoint
                revive = {k: ins.excluded[k] for k in _REPUBLISHED}
                session.execute(
                    ins.on_conflict_do_update(
                        index_elements=["trial_id", "path"],
                        set_={**revive, "pinned": False, "deleted_at": None},
                        where=Checkpoint.state == "DELETED",
                    )
                )
            elif kind == "gpu":
                gpu_rows.extend(_gpu_rows(attempt.id, rec))
            elif kind == "env":  # the job's reproducibility record (dlhpc.repro)
                attempt.env_json = merge_env_record(attempt.env_json, rec)
            elif kind == "log":
                session.add(
                    Event(
                        experiment_id=trial.experiment_id,
                        trial_id=trial.id,
                        time=_ts(rec.get("time")) or now,
                        kind=f"log.{rec.get('level', 'info')}",
                        message=str(rec.get("message", ""))[:4000],
                    )
                )
        if rows:
            stmt = sqlite_insert(Metric).values(rows)
            stmt = stmt.on_conflict_do_update(
                index_elements=["trial_id", "step", "name"],
                set_={
                    "value": stmt.excluded.value,
                    "attempt_id": stmt.excluded.attempt_id,
                    "time": stmt.excluded.time,
                },
            )
            session.execute(stmt)
            result.metrics += len(rows)
        if gpu_rows:  # executemany: no limit on bound parameters however long the file
            session.execute(
                sqlite_insert(GpuSample).on_conflict_do_nothing(
                    index_elements=["attempt_id", "host", "gpu_index", "time"]
                ),
                gpu_rows,
            )
            result.gpu_samples += len(gpu_rows)
        failpoint("ingest.before_mark")
        session.add(
            IngestedFile(
                attempt_id=attempt.id, name=batch.name, records=len(batch.records), ingested_at=now
            )
        )
        result.files += 1
    if result.metrics:
        session.flush()
    return result


def refresh_trial_metrics(
    session: Session, trial: Trial, metric: str, smaller_is_better: bool
) -> None:
    """Recompute steps_completed, best and latest of the searcher metric from the rows."""
    trial.steps_completed = int(
        session.scalar(select(func.max(Metric.step)).where(Metric.trial_id == trial.id)) or 0
    )
    agg = func.min if smaller_is_better else func.max
    trial.best_metric = session.scalar(
        select(agg(Metric.value)).where(Metric.trial_id == trial.id, Metric.name == metric)
    )
    trial.latest_metric = session.scalar(
        select(Metric.value)
        .where(Metric.trial_id == trial.id, Metric.name == metric)
        .order_by(Metric.step.desc())
        .limit(1)
    )
