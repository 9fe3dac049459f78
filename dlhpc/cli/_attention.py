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

from dlhpc.protocol import atomic_write_text
from dlhpc.report.attention import failed_trials, finished_experiments, idle_now
from dlhpc.store import Store, utcnow

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


def collect(store: Store, since: datetime, until: datetime, idle: bool = True) -> Attention:
    """Experiments ended and trials failed in ``[since, until)``, and the idle GPUs now."""
    with store.read() as s:
        return Attention(
            finished_experiments(s, since, until),
            failed_trials(s, since, until),
            idle_now(s) if idle else [],
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
