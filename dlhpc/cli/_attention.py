"""What needs a person's attention, for ``dlhpc tick -q`` (cron mails any output) and
``dlhpc digest``: trials that failed and experiments that ended in a time window, and
GPUs idle now, each idle spell said once (the spells already said are kept in a small
JSON file under ``$DLHPC_HOME/cron/``, written atomically).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dlhpc.protocol import atomic_write_text
from dlhpc.report.status import idle_gpus, status_data
from dlhpc.store import Attempt, Experiment, GpuSample, Store, Trial, utcnow

__all__ = [
    "Attention",
    "atomic_write_json",
    "collect",
    "failed_line",
    "idle_key",
    "idle_line",
    "new_idle",
    "read_json",
    "state_dir",
    "utcnow",
]


def state_dir(store: Store) -> Path:
    return store.home / "cron"


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    """Write-temp, fsync, rename: a reader sees the old file or the new one, never half."""
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))


@dataclass
class Attention:
    finished: list[dict[str, Any]]  # experiments that ended in the window
    failed: list[dict[str, Any]]  # trials that failed in the window
    idle: list[dict[str, Any]]  # GPUs idle now (status_data's idle_gpus + experiment)

    def __bool__(self) -> bool:
        return bool(self.finished or self.failed or self.idle)


def _finished(s: Session, since: datetime, until: datetime) -> list[dict[str, Any]]:
    exps = s.scalars(
        select(Experiment)
        .where(Experiment.ended_at >= since, Experiment.ended_at < until)
        .order_by(Experiment.ended_at)
    ).all()
    out = []
    for e in exps:
        data = status_data(s, e.id)["experiments"][0]
        scored = [t for t in data["trials"] if t["best_metric"] is not None]
        pick = min if e.smaller_is_better else max
        best = pick(scored, key=lambda t: t["best_metric"]) if scored else None
        out.append(
            {
                "id": e.id,
                "name": e.name,
                "state": e.state,
                "trials": len(data["trials"]),
                "failed_trials": sum(t["state"] == "FAILED" for t in data["trials"]),
                "metric": e.metric,
                "best": None if best is None else best["best_metric"],
                "best_trial": None if best is None else best["id"],
                "gpu_hours": data["gpu_hours"],
                "cpu_hours": data["cpu_hours"],
            }
        )
    return out


def _failed(s: Session, since: datetime, until: datetime) -> list[dict[str, Any]]:
    rows = s.execute(
        select(Trial.id, Trial.experiment_id, Experiment.name, Trial.error)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .where(Trial.state == "FAILED", Trial.ended_at >= since, Trial.ended_at < until)
        .order_by(Trial.id)
    ).all()
    return [
        {"trial_id": tid, "experiment_id": eid, "experiment": name, "error": err or ""}
        for tid, eid, name, err in rows
    ]


def _idle_now(s: Session) -> list[dict[str, Any]]:
    """Idle GPUs of the live attempts of active experiments (none without telemetry)."""
    live = (
        select(Attempt.id)
        .join(Trial, Trial.id == Attempt.trial_id)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .where(Experiment.state == "ACTIVE", Attempt.state == "RUNNING", Attempt.ended_at.is_(None))
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
        out.extend({"experiment_id": exp_id, **g} for g in idle_gpus(s, exp_id))
    return out


def collect(store: Store, since: datetime, until: datetime, idle: bool = True) -> Attention:
    """Experiments ended and trials failed in ``[since, until)``, and the idle GPUs now."""
    with store.read() as s:
        return Attention(
            _finished(s, since, until), _failed(s, since, until), _idle_now(s) if idle else []
        )


def idle_key(g: dict[str, Any]) -> str:
    return f"{g['trial_id']}/{g['attempt_key']}/{g['host']}/{g['gpu_index']}/{g['idle_since']}"


def new_idle(idle: list[dict[str, Any]], state_file: Path) -> list[dict[str, Any]]:
    """The idle GPUs not said before (one line per idle spell); remembers the current ones."""
    said = set(read_json(state_file).get("idle_said", []))
    now = {idle_key(g): g for g in idle}
    if set(now) != said:
        atomic_write_json(state_file, {"idle_said": sorted(now)})
    return [g for k, g in now.items() if k not in said]


def idle_line(g: dict[str, Any]) -> str:
    return (
        f"GPU idle: experiment {g['experiment_id']} trial {g['trial_id']} on {g['host']} "
        f"GPU {g['gpu_index']}: below {g['below_pct']:g}% for {g['idle_minutes']:.0f} min"
    )


def failed_line(t: dict[str, Any]) -> str:
    why = f": {t['error']}" if t["error"] else ""
    exp = f"experiment {t['experiment_id']} ({t['experiment']})"
    return f"trial {t['trial_id']} of {exp} failed{why}"
