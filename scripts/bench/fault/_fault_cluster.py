"""The dev cluster as ``bench_fault.py requeue`` sees it: ``dlhpc`` commands and ticks in
a benchmark-own DLHPC_HOME, its database's attempt rows, squeue and sacct; plus the
records the harness and the timing wrapper write in an attempt's folder."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def _ts(dt: str | None) -> float | None:
    """An SQLite naive-UTC datetime -> epoch seconds."""
    if not dt:
        return None
    return datetime.fromisoformat(dt).replace(tzinfo=timezone.utc).timestamp()


def _worker_events(attempt_dir: Path) -> dict[str, dict[str, Any]]:
    """The first ``start`` and ``exit`` records of the attempt's worker (``worker-r0``)."""
    from dlhpc.protocol import read_event_batches

    out: dict[str, dict[str, Any]] = {}
    if attempt_dir.is_dir():
        for b in read_event_batches(attempt_dir):
            for rec in b.records:
                if rec["type"] in ("start", "exit") and b.name.startswith("worker-r0"):
                    out.setdefault(rec["type"], rec)
    return out


class Cluster:
    """One repetition's view of the dev cluster: ``dlhpc`` runs with DLHPC_HOME ``home``
    (site dev-cluster); ``maybe_tick`` keeps the ticks (start, end) it ran in ``ticks``."""

    def __init__(self, home: Path, interval: float) -> None:
        self.env = {**os.environ, "DLHPC_HOME": str(home), "DLHPC_SITE": "dev-cluster"}
        self.home = home
        self.interval = interval
        self.ticks: list[tuple[float, float]] = []
        self._next_tick = 0.0

    def dlhpc(self, *a: str) -> str:
        """``python -m dlhpc *a``'s stdout; RuntimeError when it exits non-zero."""
        p = subprocess.run(
            [sys.executable, "-m", "dlhpc", *a],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if p.returncode != 0:
            raise RuntimeError(f"dlhpc {' '.join(a)}: {p.stdout}\n{p.stderr}")
        return p.stdout

    def maybe_tick(self) -> None:
        """A tick (a fresh process, as cron runs it) every ``interval`` s from the last start."""
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.interval
            t0 = time.time()
            self.dlhpc("tick", "-q")
            self.ticks.append((t0, time.time()))

    def next_tick_in(self, seconds: float) -> None:
        """The next ``maybe_tick`` ticks ``seconds`` from now (not before)."""
        self._next_tick = time.monotonic() + seconds

    def attempts(self, exp_id: int) -> list[dict[str, Any]]:
        """The experiment's attempt rows (with their trial's run_dir), oldest first."""
        con = sqlite3.connect(f"file:{self.home / 'dlhpc.db'}?mode=ro", uri=True, timeout=30)
        con.row_factory = sqlite3.Row
        rows = con.execute(
            "SELECT a.* , t.run_dir FROM attempts a JOIN trials t ON a.trial_id = t.id"
            " WHERE t.experiment_id = ? ORDER BY a.id",
            (exp_id,),
        ).fetchall()
        con.close()
        return [dict(x) for x in rows]

    def squeue(self, job_id: str, fmt: str) -> str:
        """squeue's line for the job in format ``fmt`` (empty once it left the queue)."""
        p = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", fmt],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return p.stdout.strip()

    def job_state(self, job_id: str) -> str:
        """``STATE|REASON`` of the job in squeue."""
        return self.squeue(job_id, "%T|%r")

    def sacct(self, job_ids: list[str]) -> list[str]:
        """sacct's rows (JobID|Partition|State|ExitCode|Start|End) of the jobs."""
        p = subprocess.run(
            [
                "sacct",
                "-X",
                "-D",
                "-n",
                "-P",
                "-j",
                ",".join(job_ids),
                "-o",
                "JobID,Partition,State,ExitCode,Start,End",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return p.stdout.split()

    def squeue_node(self, node: str) -> list[str]:
        """The ids of the jobs running on ``node``."""
        p = subprocess.run(
            ["squeue", "-h", "-r", "-w", node, "-o", "%i"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return p.stdout.split()


class Interrupted(Exception):
    """Something other than this benchmark stopped the trial (a shared dev cluster)."""


def _first_step_files(out: Path) -> list[Path]:
    """The wrapper's records (``<attempt key>.json``, written at the first step)."""
    return sorted(p for p in out.glob("*.json") if not p.name.endswith(".exit.json"))
