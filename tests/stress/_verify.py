"""The stress run's verdict: every published record is in the DB exactly once,
nothing else is, and the DB passes ``PRAGMA integrity_check``."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from dlhpc.protocol.checkpoint import list_checkpoints, verify_checkpoint
from dlhpc.protocol.events import read_event_batches
from dlhpc.store import Attempt, Event, IngestedFile, Metric, Store, Submission
from dlhpc.store.tables import Checkpoint as CheckpointRow
from tests.stress._backend import LEDGER, TrialRun


@dataclass
class StressResult:
    writers: int = 0
    reconcilers: int = 0
    writers_killed: int = 0
    reconcilers_killed: int = 0
    reconciler_starts: int = 0
    files_published: int = 0  # event files under their final names
    temp_files_left: int = 0  # publications a kill interrupted (never ingested)
    metrics: int = 0
    log_events: int = 0
    checkpoints: int = 0
    ledger_lines: int = 0
    reconciler_passes: int = 0  # completed `dlhpc tick` passes (reports printed)
    passes_lease_held: int = 0  # ... that found another reconciler holding the lease
    files_by_reconcilers: int = 0  # committed by the reconcilers (the rest: the final tick)
    files_by_final_tick: int = 0
    seconds: float = 0.0
    writer_phase_s: float = 0.0
    problems: list[str] = field(default_factory=list)


def _disk_records(attempt_dir: Path) -> tuple[dict[str, int], list[dict[str, Any]], int]:
    """(final event file name -> record count, their records, temp files left)."""
    files: dict[str, int] = {}
    records: list[dict[str, Any]] = []
    if not attempt_dir.is_dir():
        return files, records, 0
    # the reconciler's own reader: a packed 'metrics' line stands for its 'metric' records
    for batch in read_event_batches(attempt_dir):
        files[batch.name] = len(batch.records)
        records += batch.records
    temps = sum(p.name.startswith(".") and p.name.endswith(".tmp") for p in attempt_dir.iterdir())
    return files, records, temps


def _ledger_of(run: TrialRun) -> tuple[int, set[int], int]:
    """(steps published up to, checkpoint steps published, lines) from a writer's ledger."""
    path = run.trial_dir / LEDGER
    upto, ckpts, lines = 0, set(), 0
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        kind, _, num = line.partition(" ")
        if not num.isdigit():
            continue  # a line torn by the kill: it recorded nothing
        lines += 1
        if kind == "m":
            upto = max(upto, int(num))
        elif kind == "c":
            ckpts.add(int(num))
    return upto, ckpts, lines


@dataclass
class _Db:
    """What the DB holds, per trial."""

    metrics: dict[int, set[int]] = field(default_factory=dict)  # trial -> steps
    logs: Counter[tuple[int, str]] = field(default_factory=Counter)  # (trial, message) -> rows
    ckpts: dict[int, dict[str, tuple[int, str]]] = field(
        default_factory=dict
    )  # path -> step, state
    ingested: dict[str, dict[str, int]] = field(default_factory=dict)  # attempt -> file -> records
    attempts: Counter[int] = field(default_factory=Counter)
    submissions: int = 0


def _read_db(home: Path) -> _Db:
    db = _Db()
    store = Store(home)
    try:
        with store.read() as s:
            for trial_id, step in s.execute(select(Metric.trial_id, Metric.step)):
                db.metrics.setdefault(trial_id, set()).add(step)
            logs = select(Event.trial_id, Event.message).where(Event.kind == "log.info")
            db.logs.update((t, m) for t, m in s.execute(logs))
            rows = select(
                CheckpointRow.trial_id, CheckpointRow.path, CheckpointRow.step, CheckpointRow.state
            )
            for trial_id, path, step, state in s.execute(rows):
                db.ckpts.setdefault(trial_id, {})[path] = (step, state)
            files = select(Attempt.attempt_key, IngestedFile.name, IngestedFile.records).join(
                IngestedFile, IngestedFile.attempt_id == Attempt.id
            )
            for key, name, n in s.execute(files):
                db.ingested.setdefault(key, {})[name] = n
            db.attempts.update(s.scalars(select(Attempt.trial_id)))
            db.submissions = s.scalar(select(func.count(Submission.id))) or 0
    finally:
        store.close()
    return db


def _check_trial(run: TrialRun, db: _Db, res: StressResult) -> None:
    tid, p = run.trial_id, res.problems
    files, records, temps = _disk_records(run.attempt_dir)
    upto, ledger_ckpts, lines = _ledger_of(run)
    res.files_published += len(files)
    res.temp_files_left += temps
    res.ledger_lines += lines
    disk_steps = {r["step"] for r in records if r["type"] == "metric"}
    disk_logs = {r["message"] for r in records if r["type"] == "log"}
    disk_ckpts = {r["path"]: r["step"] for r in records if r["type"] == "checkpoint"}
    db_steps = db.metrics.get(tid, set())
    db_logs = {m for (t, m) in db.logs if t == tid}
    db_ckpts = db.ckpts.get(tid, {})
    if db.ingested.get(run.attempt_dir.name, {}) != files:
        p.append(f"trial {tid}: ingested {db.ingested.get(run.attempt_dir.name)}, on disk {files}")
    if db_steps != disk_steps or not set(range(1, upto + 1)) <= db_steps:
        p.append(f"trial {tid}: steps in DB {sorted(db_steps)}, published {sorted(disk_steps)}")
    if db_logs != disk_logs or len(db_logs) < upto:
        p.append(f"trial {tid}: logs in DB {len(db_logs)}, published {len(disk_logs)}/{upto}")
    if {k: v[0] for k, v in db_ckpts.items()} != disk_ckpts:
        p.append(f"trial {tid}: checkpoints in DB {db_ckpts}, published {disk_ckpts}")
    if not ledger_ckpts <= set(disk_ckpts.values()):
        p.append(f"trial {tid}: ledger checkpoints {ledger_ckpts}, in the DB {db_ckpts}")
    # the keep policy (the reconcilers' GC) deletes older ones; the rest must verify
    on_disk = {str(c.path): c for c in list_checkpoints(run.checkpoint_root)}
    for path, (_, state) in db_ckpts.items():
        ok = path in on_disk and verify_checkpoint(on_disk[path]) is None
        if ok != (state == "ACTIVE"):
            p.append(f"trial {tid}: checkpoint {path} is {state} in the DB, verified: {ok}")
    res.metrics += len(db_steps)
    res.log_events += len(db_logs)
    res.checkpoints += len(db_ckpts)


def check(home: Path, runs: list[TrialRun], res: StressResult) -> None:
    """Every published record is in the DB exactly once, nothing else is, and the DB
    passes ``PRAGMA integrity_check``; appends what is wrong to ``res.problems``."""
    db = _read_db(home)
    if db.submissions != 1 or set(db.attempts.values()) != {1}:
        res.problems.append(f"resubmitted: {db.submissions} submissions, {db.attempts}")
    res.problems += [
        f"trial {t}: {m!r} ingested {n} times" for (t, m), n in db.logs.items() if n > 1
    ]
    for run in runs:
        _check_trial(run, db, res)
    with sqlite3.connect(home / "dlhpc.db") as conn:
        verdict = conn.execute("PRAGMA integrity_check").fetchall()
    if verdict != [("ok",)]:
        res.problems.append(f"integrity_check: {verdict}")
