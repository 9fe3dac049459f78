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
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from dlhpc._failpoints import failpoint
from dlhpc.protocol import read_event_batches
from dlhpc.repro import merge_env_record
from dlhpc.states import TERMINAL_TRIAL_STATES, CheckpointState, JobState
from dlhpc.store.models import (
    EXIT_PREEMPTED,
    Attempt,
    Base,
    Checkpoint,
    Event,
    Experiment,
    GpuSample,
    IngestedFile,
    Metric,
    Trial,
)

__all__ = [
    "SETTLE_WINDOW",
    "IngestResult",
    "ingest_attempt",
    "ingest_attempts",
    "new_attempt",
    "settling",
]

# How long a trial's folders are still listed after it ended. Shared filesystems
# show a file late: NFS caches directory listings for up to ``acdirmax`` (60 s by
# default) and a job's last writes can land after its exit was seen. A window,
# not a final marker listing every file, because a job killed hard (OOM, node
# loss) writes no marker at all, and user streams are not known to the worker.
SETTLE_WINDOW = timedelta(minutes=5)

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


def _table(model: type[Base]) -> Table:
    return cast(Table, model.__table__)


def _metric_upsert() -> Any:
    ins = sqlite_insert(_table(Metric))
    return ins.on_conflict_do_update(
        index_elements=["trial_id", "step", "name"],
        set_={
            "value": ins.excluded.value,
            "attempt_id": ins.excluded.attempt_id,
            "time": ins.excluded.time,
        },
    )


def _checkpoint_upsert() -> Any:
    ins = sqlite_insert(_table(Checkpoint))
    # a folder name the GC freed and a job published again: a new checkpoint
    revive = {k: ins.excluded[k] for k in _REPUBLISHED}
    return ins.on_conflict_do_update(
        index_elements=["trial_id", "path"],
        set_={**revive, "pinned": False, "deleted_at": None},
        where=_table(Checkpoint).c.state == CheckpointState.DELETED.value,
    )


# Core statements (compiled once, run as executemany): the ORM's per-row bookkeeping
# cost more than the SQL for files of many records
_METRIC_UPSERT = _metric_upsert()
_CHECKPOINT_UPSERT = _checkpoint_upsert()
_GPU_INSERT = sqlite_insert(_table(GpuSample)).on_conflict_do_nothing(
    index_elements=["attempt_id", "host", "gpu_index", "time"]
)


def new_attempt(
    trial_id: int,
    key: str,
    state: str,
    now: datetime,
    *,
    submission_id: int | None = None,
    log_path: str = "",
) -> Attempt:
    """A new (unsaved) attempt row of ``trial_id`` named by its attempt folder ``key``
    (``<job id>.r<restart>``; a key of another form is a job id at restart 0).
    Launch builds the first attempt of a submitted task; ingest, one the job's files
    show (a restart the scheduler made)."""
    m = _KEY_RE.match(key)
    job_id, restart = (m["job"], int(m["restart"])) if m else (key, 0)
    array_index = int(job_id.rsplit("_", 1)[1]) if re.search(r"_\d+$", job_id) else None
    return Attempt(
        trial_id=trial_id,
        submission_id=submission_id,
        attempt_key=key,
        job_id=job_id,
        array_index=array_index,
        restart_count=restart,
        state=state,
        log_path=log_path,
        created_at=now,
    )


def _attempts_of(
    session: Session, folders: Sequence[tuple[Trial, Path]], now: datetime
) -> list[Attempt]:
    """The attempt of each (trial, attempt folder), created when new: one query."""
    keys = {(t.id, p.name) for t, p in folders}
    found = {
        (a.trial_id, a.attempt_key): a
        for a in session.scalars(
            select(Attempt).where(
                Attempt.trial_id.in_(sorted({tid for tid, _ in keys})),
                Attempt.attempt_key.in_(sorted({k for _, k in keys})),
            )
        )
    }
    new = False
    for t, p in folders:
        if (t.id, p.name) not in found:
            found[(t.id, p.name)] = new_attempt(t.id, p.name, JobState.RUNNING.value, now)
            session.add(found[(t.id, p.name)])
            new = True
    if new:
        session.flush()  # their ids
    return [found[(t.id, p.name)] for t, p in folders]


@dataclass
class _Rows:
    """The rows an ingest batch inserts, by table, in file order."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # log records
    marks: list[dict[str, Any]] = field(default_factory=list)  # ingested_files rows
    pending: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # trial -> metrics


def ingest_attempt(
    session: Session, trial: Trial, attempt_path: Path, now: datetime
) -> IngestResult:
    """Apply the not-yet-ingested event files of one attempt folder."""
    return ingest_attempts(session, [(trial, attempt_path)], now)[0]


def ingest_attempts(
    session: Session, folders: Sequence[tuple[Trial, Path]], now: datetime
) -> list[IngestResult]:
    """Apply the not-yet-ingested event files of each (trial, attempt folder), one
    result each. The rows of all the files go in one executemany per table, and
    the ``ingested_files`` rows with them, in the caller's transaction."""
    if not folders:
        return []
    attempts = _attempts_of(session, folders, now)
    done: dict[int, set[str]] = {a.id: set() for a in attempts}
    for attempt_id, name in session.execute(
        select(IngestedFile.attempt_id, IngestedFile.name).where(
            IngestedFile.attempt_id.in_(list(done))
        )
    ):
        done[attempt_id].add(name)
    rows = _Rows()
    results = []
    for (trial, path), attempt in zip(folders, attempts, strict=True):
        results.append(_read_folder(session, trial, attempt, path, done[attempt.id], rows, now))
    conn = session.connection()
    if rows.metrics:  # a later row of a key wins (executemany runs them in order)
        conn.execute(_METRIC_UPSERT, rows.metrics)
    if rows.checkpoints:
        conn.execute(_CHECKPOINT_UPSERT, rows.checkpoints)
    if rows.gpu:  # executemany: no limit on bound parameters however long the file
        conn.execute(_GPU_INSERT, rows.gpu)
    if rows.events:
        conn.execute(insert(_table(Event)), rows.events)
    failpoint("ingest.before_mark")
    if rows.marks:  # the same transaction as everything the files implied
        conn.execute(insert(_table(IngestedFile)), rows.marks)
    session.flush()  # the attempts' new facts
    return results


def _exit_reason(rec: dict[str, Any], before: str) -> str:
    """``reason/SIGNAL`` of an exit record, + :data:`EXIT_PREEMPTED` when it says
    ``"preempted": true`` or an earlier rank's record did (rank 0 alone asks)."""
    sig = rec.get("signal")
    mark = rec.get("preempted") is True or before.endswith(EXIT_PREEMPTED)
    return (
        str(rec.get("reason", "")) + (f"/{sig}" if sig else "") + (EXIT_PREEMPTED if mark else "")
    )


def _read_folder(
    session: Session,
    trial: Trial,
    attempt: Attempt,
    attempt_path: Path,
    done: set[str],
    out: _Rows,
    now: datetime,
) -> IngestResult:
    """Read one attempt folder's files not in ``done`` (then added to it): attempt
    facts onto ``attempt``, rows into ``out``."""
    result = IngestResult()
    pending = out.pending.setdefault(trial.id, [])
    for batch in read_event_batches(attempt_path, skip=done):
        for rec in batch.records:
            kind = rec.get("type")
            if kind == "metric":
                step = int(rec["step"])
                for name, value in rec.get("metrics", {}).items():
                    v = float(value) if value is not None else None
                    pending.append(
                        {
                            "trial_id": trial.id,
                            "attempt_id": attempt.id,
                            "step": step,
                            "name": str(name),
                            "value": v if v is not None and math.isfinite(v) else None,
                            "time": float(rec.get("time", 0.0)),
                        }
                    )
                    out.metrics.append(pending[-1])
                    result.metrics += 1
            elif kind == "start":
                attempt.started_at = attempt.started_at or _ts(rec.get("time"))
                attempt.host = str(rec.get("host", ""))
                attempt.node_list = str(rec.get("nodes", "")) or attempt.node_list
            elif kind == "exit":
                attempt.exit_code = int(rec.get("code", 1))
                attempt.exit_reason = _exit_reason(rec, attempt.exit_reason)
                attempt.ended_at = _ts(rec.get("time"))
                at, ckpt = rec.get("step"), rec.get("checkpoint_step")
                if isinstance(at, int):
                    attempt.lost_steps = max(0, at - (ckpt if isinstance(ckpt, int) else 0))
                result.exited = True
            elif kind == "checkpoint":
                out.checkpoints.append(
                    {
                        "trial_id": trial.id,
                        "attempt_id": attempt.id,
                        "step": int(rec.get("step", 0)),
                        "path": str(rec.get("path", "")),
                        "size_bytes": int(rec.get("size", 0)),
                        "state": CheckpointState.ACTIVE.value,
                        "created_at": _ts(rec.get("time")) or now,
                        "metric": _checkpoint_metric(session, trial, rec, pending),
                    }
                )
            elif kind == "gpu":
                gpu_rows = _gpu_rows(attempt.id, rec)
                out.gpu.extend(gpu_rows)
                result.gpu_samples += len(gpu_rows)
            elif kind == "env":  # the job's reproducibility record (dlhpc.repro)
                attempt.env_json = merge_env_record(attempt.env_json, rec)
            elif kind == "log":
                out.events.append(
                    {
                        "experiment_id": trial.experiment_id,
                        "trial_id": trial.id,
                        "time": _ts(rec.get("time")) or now,
                        "kind": f"log.{rec.get('level', 'info')}",
                        "message": str(rec.get("message", ""))[:4000],
                    }
                )
        out.marks.append(
            {
                "attempt_id": attempt.id,
                "name": batch.name,
                "records": len(batch.records),
                "ingested_at": now,
            }
        )
        done.add(batch.name)
        result.files += 1
    return result


def settling(session: Session, now: datetime, users: Collection[str]) -> list[tuple[int, int, str]]:
    """(id, experiment id, run folder) of the trials in a terminal state that ended
    within :data:`SETTLE_WINDOW` of ``now``, of any experiment (a finished one too)
    whose ``user`` is in ``users``: the tick still ingests files that show up late in
    their attempt folders (a trial ended without ``ended_at`` is not one). Columns,
    not ORM objects: a long search ends many trials a minute."""
    rows = session.execute(
        select(Trial.id, Trial.experiment_id, Trial.run_dir)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .where(
            Experiment.user.in_(list(users)),
            Trial.state.in_(TERMINAL_TRIAL_STATES),
            Trial.ended_at >= now - SETTLE_WINDOW,
        )
    )
    return [(tid, eid, run_dir) for tid, eid, run_dir in rows]
