"""What one event record implies, for :mod:`dlhpc.store.ingest`: the rows it adds
(dicts for Core executemany) and the facts it sets on its attempt.

Pure: none of these touches a session; ingest owns the transaction. The reader
checked each record's stored fields (:mod:`dlhpc.protocol.record_check`), so these
convert them as they are; telemetry (``gpu`` records) is best effort: a bad value
is dropped. A file the reader could not use is quarantined (:func:`quarantine`).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from dlhpc.states import CheckpointState
from dlhpc.store.tables import EXIT_PREEMPTED, Attempt, Trial

__all__ = [
    "ATTEMPT_FACTS",
    "apply_exit",
    "apply_start",
    "checkpoint_row",
    "finite",
    "finite_int",
    "gpu_rows",
    "log_row",
    "metric_rows",
    "quarantine",
    "utc_time",
]


def utc_time(value: Any) -> datetime | None:
    """A record's ``time`` (seconds since the epoch) as a naive UTC datetime, else None."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return datetime.fromtimestamp(value, tz=timezone.utc).replace(tzinfo=None)


def finite(value: Any) -> float | None:
    """A finite number, else None (telemetry is best effort: a bad value is dropped)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        v = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return v if math.isfinite(v) else None


def finite_int(value: Any) -> int | None:
    """:func:`finite` as an int that SQLite's 64-bit INTEGER holds, else None."""
    v = finite(value)
    return None if v is None or abs(v) >= 2**63 else int(v)  # SQLite's INTEGER is 64-bit


def metric_rows(trial_id: int, attempt_id: int, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``metrics`` rows of one ``metric`` record, one per name (a non-finite value
    is stored as NULL)."""
    rows = []
    step = int(rec["step"])
    for name, value in rec.get("metrics", {}).items():
        v = float(value) if value is not None else None
        rows.append(
            {
                "trial_id": trial_id,
                "attempt_id": attempt_id,
                "step": step,
                "name": str(name),
                "value": v if v is not None and math.isfinite(v) else None,
                "time": float(rec.get("time") or 0.0),
            }
        )
    return rows


# the attempt's columns that apply_start, apply_exit and an env record set
ATTEMPT_FACTS = (
    "started_at",
    "host",
    "node_list",
    "exit_code",
    "exit_reason",
    "ended_at",
    "lost_steps",
    "env_json",
)


def apply_start(attempt: Attempt, rec: dict[str, Any]) -> None:
    """A ``start`` record: the attempt's first start time, its host and node list."""
    attempt.started_at = attempt.started_at or utc_time(rec.get("time"))
    attempt.host = str(rec.get("host", ""))
    attempt.node_list = str(rec.get("nodes", "")) or attempt.node_list


def _exit_reason(rec: dict[str, Any], before: str) -> str:
    """``reason/SIGNAL`` of an exit record, + :data:`EXIT_PREEMPTED` when it says
    ``"preempted": true`` or an earlier rank's record did (rank 0 alone asks)."""
    sig = rec.get("signal")
    mark = rec.get("preempted") is True or before.endswith(EXIT_PREEMPTED)
    return (
        str(rec.get("reason", "")) + (f"/{sig}" if sig else "") + (EXIT_PREEMPTED if mark else "")
    )


def apply_exit(attempt: Attempt, rec: dict[str, Any]) -> None:
    """An ``exit`` record: the attempt's exit code, reason, end time and the steps it
    lost since its last checkpoint (when the record gives its step)."""
    attempt.exit_code = int(rec.get("code", 1))
    attempt.exit_reason = _exit_reason(rec, attempt.exit_reason)
    attempt.ended_at = utc_time(rec.get("time"))
    at, ckpt = rec.get("step"), rec.get("checkpoint_step")
    if isinstance(at, int):
        attempt.lost_steps = max(0, at - (ckpt if isinstance(ckpt, int) else 0))


def checkpoint_row(
    trial_id: int, attempt_id: int, rec: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """The ``checkpoints`` row of one ``checkpoint`` record, but its ``metric`` (the
    caller adds it last: it may need the table)."""
    return {
        "trial_id": trial_id,
        "attempt_id": attempt_id,
        "step": int(rec.get("step") or 0),
        "path": str(rec.get("path", "")),
        "size_bytes": int(rec.get("size") or 0),
        "state": CheckpointState.ACTIVE.value,
        "created_at": utc_time(rec.get("time")) or now,
    }


def gpu_rows(attempt_id: int, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``gpu_samples`` rows of one ``gpu`` record (none without a usable time)."""
    at = finite(rec.get("time"))
    gpus = rec.get("gpus")
    if at is None or not isinstance(gpus, list):
        return []
    host = str(rec.get("host", ""))[:255]
    rows = []
    for gpu in gpus:
        index = finite_int(gpu.get("index")) if isinstance(gpu, dict) else None
        if index is None:
            continue
        rows.append(
            {
                "attempt_id": attempt_id,
                "time": at,
                "host": host,
                "gpu_index": index,
                "util": finite_int(gpu.get("util")),
                "mem_used": finite_int(gpu.get("mem_used")),
                "mem_total": finite_int(gpu.get("mem_total")),
                "power_w": finite(gpu.get("power_w")),
            }
        )
    return rows


def log_row(trial: Trial, rec: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The ``events`` row of one ``log`` record (its message cut to 4000 characters)."""
    return {
        "experiment_id": trial.experiment_id,
        "trial_id": trial.id,
        "time": utc_time(rec.get("time")) or now,
        "kind": f"log.{rec.get('level', 'info')}",
        "message": str(rec.get("message", ""))[:4000],
    }


QUARANTINED = "ingest.quarantined"  # the event kind of a file not ingested
_ERROR_CHARS = 4000


def quarantine(trial: Trial, path: str, reason: str, now: datetime) -> tuple[str, dict[str, Any]]:
    """A file of ``trial``'s attempt folders that is not ingested: the warning that
    names it (one line) and its ``events`` row; the warning goes into the trial's
    ``error`` too (what ``dlhpc status`` shows), after what is there already."""
    problem = f"quarantined {path}: {reason}"
    if problem not in (trial.error or ""):
        trial.error = "\n".join(x for x in (trial.error, problem) if x)[:_ERROR_CHARS]
    row = {
        "experiment_id": trial.experiment_id,
        "trial_id": trial.id,
        "time": now,
        "kind": QUARANTINED,
        "message": problem[:_ERROR_CHARS],
    }
    return f"trial {trial.id}: {problem}", row
