"""Ingest an attempt's published event files into the DB, exactly once.

The caller supplies the write transaction; everything an event file implies
(metrics, attempt facts, the ``ingested_files`` row that marks it done) lands
in that one transaction, so a reconciler killed at any line either applied a
file completely or not at all, and a second pass skips what the first applied.
Each file is read once, through one descriptor, and applied as it is read; a line
that fails (a job may rewrite its file meanwhile) undoes what the file implied and
quarantines it whole.
``gpu`` records become ``gpu_samples`` rows (one per GPU per sample; a row already
there is kept, and a GPU entry without a usable index is skipped). A ``checkpoint``
record whose folder is not one of the trial's own
(:mod:`dlhpc.store.checkpoint_dirs`), or whose size does not fit that folder's
manifest and files (read through descriptors from the configured root, no symlink
followed), is not stored: a warning event takes its place. One whose files take far
less space than its size says (sparse or compressed) is stored counting what they
take on disk, with a warning event.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import NestedTransaction, insert, select
from sqlalchemy.orm import Session

from dlhpc._failpoints import failpoint
from dlhpc.protocol import UnsafeFile, event_file_names, iter_records
from dlhpc.repro import merge_env_record
from dlhpc.states import TERMINAL_TRIAL_STATES, JobState
from dlhpc.store._ingest_checkpoints import (
    checkpoint_metric,
    checkpoint_record,
    checkpoint_row_of,
)
from dlhpc.store._ingest_rows import Mark, Rows, table
from dlhpc.store._records import (
    ATTEMPT_FACTS,
    apply_exit,
    apply_start,
    gpu_rows,
    log_row,
    metric_rows,
    quarantine,
)
from dlhpc.store.tables import (
    Attempt,
    Experiment,
    IngestedFile,
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
# rows held before they are written (executemany, in the caller's transaction): what a
# long file costs in memory is bounded by this, not by its length
_SPILL_ROWS = 20_000


@dataclass
class IngestResult:
    files: int = 0
    metrics: int = 0
    gpu_samples: int = 0  # rows offered (a row already stored is kept, not counted apart)
    exited: bool = False
    warnings: list[str] = field(default_factory=list)  # files quarantined or not read yet


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
    """The attempt of each (trial, attempt folder), created when new: one query, and
    one more when some are new (see :func:`_job_origins`)."""
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
    created = []
    for t, p in folders:
        if (t.id, p.name) not in found:
            found[(t.id, p.name)] = new_attempt(t.id, p.name, JobState.RUNNING.value, now)
            created.append(found[(t.id, p.name)])
    if created:
        origins = _job_origins(session, created)
        for a in created:
            a.submission_id, a.log_path = origins.get((a.trial_id, a.job_id), (None, ""))
        session.add_all(created)
        session.flush()  # their ids
    return [found[(t.id, p.name)] for t, p in folders]


def _job_origins(
    session: Session, attempts: Sequence[Attempt]
) -> dict[tuple[int, str], tuple[int | None, str]]:
    """(trial, job id) -> (submission, log path) recorded for an earlier attempt of
    the same job, for the new ``attempts``: a job the scheduler restarted under its
    own id (Slurm's requeue) writes on to its log file. A job whose first attempt is
    not recorded yet (its submission is adopted later, which fills both in) has none."""
    rows = session.execute(
        select(Attempt.trial_id, Attempt.job_id, Attempt.submission_id, Attempt.log_path)
        .where(
            Attempt.trial_id.in_(sorted({a.trial_id for a in attempts})),
            Attempt.job_id.in_(sorted({a.job_id for a in attempts})),
            Attempt.log_path != "",
        )
        .order_by(Attempt.id)
    )
    origins: dict[tuple[int, str], tuple[int | None, str]] = {}
    for trial_id, job_id, sub_id, log_path in rows:
        origins.setdefault((trial_id, job_id), (sub_id, log_path))
    return origins


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
    rows = Rows()
    results = []
    for (trial, path), attempt in zip(folders, attempts, strict=True):
        results.append(_read_folder(session, trial, attempt, path, done[attempt.id], rows, now))
    rows.write(session)
    failpoint("ingest.before_mark")
    if rows.marks:  # the same transaction as everything the files implied
        session.connection().execute(insert(table(IngestedFile)), rows.marks)
    session.flush()  # the attempts' new facts
    return results


def _read_folder(
    session: Session,
    trial: Trial,
    attempt: Attempt,
    attempt_path: Path,
    done: set[str],
    out: Rows,
    now: datetime,
) -> IngestResult:
    """Read one attempt folder's files not in ``done`` (then added to it): attempt
    facts onto ``attempt``, rows into ``out``, each file's ``ingested_files`` row
    after its records' (:func:`_ingest_file`). A file the reader refused is
    quarantined: marked with no records (never read again), an event and the
    trial's ``error`` naming it; one it could not read for now (an I/O error) is
    left for the next pass."""
    result = IngestResult()
    out.pending.setdefault(trial.id, [])
    for name in event_file_names(attempt_path, skip=done):
        path = attempt_path / name
        try:
            applied = _ingest_file(session, trial, attempt, path, out, result, now)
        except FileNotFoundError:  # gone since it was listed
            continue
        except UnsafeFile as err:
            if err.transient:
                result.warnings.append(f"trial {trial.id}: {path} not read: {err.reason}")
                continue
            warning, event = quarantine(trial, str(path), err.reason, now)
            result.warnings.append(warning)
            out.events.append(event)
            applied = 0
        out.marks.append(
            {"attempt_id": attempt.id, "name": name, "records": applied, "ingested_at": now}
        )
        done.add(name)
        result.files += 1
    return result


@dataclass(frozen=True)
class _Undo:
    """What applying one file changes before it is known to be whole: the rows held,
    the attempt's facts and the counts; :meth:`restore` puts them back."""

    mark: Mark
    facts: dict[str, Any]
    counts: tuple[int, int, bool]

    @classmethod
    def take(cls, attempt: Attempt, out: Rows, result: IngestResult) -> _Undo:
        facts = {k: getattr(attempt, k) for k in ATTEMPT_FACTS}
        return cls(out.mark(), facts, (result.metrics, result.gpu_samples, result.exited))

    def restore(self, attempt: Attempt, out: Rows, result: IngestResult) -> None:
        out.truncate(self.mark)
        for key, value in self.facts.items():
            setattr(attempt, key, value)
        result.metrics, result.gpu_samples, result.exited = self.counts


def _ingest_file(
    session: Session,
    trial: Trial,
    attempt: Attempt,
    path: Path,
    out: Rows,
    result: IngestResult,
    now: datetime,
) -> int:
    """Apply one event file in one pass through one descriptor
    (:func:`~dlhpc.protocol.iter_records`), whole or not at all; returns its record
    count. Rows are written every :data:`_SPILL_ROWS`: once this file's own are, in a
    savepoint. At the first line that fails (:class:`UnsafeFile`, raised; the job may
    have rewritten the file while it was read) everything it implied is undone: the
    rows held and written, the attempt's facts, ``result``'s counts."""
    undo = _Undo.take(attempt, out, result)
    savepoint: NestedTransaction | None = None
    applied = 0
    try:
        for rec in iter_records(path):
            _apply(session, trial, attempt, rec, out, result, now)
            applied += 1
            if out.held() >= _SPILL_ROWS:
                if savepoint is None:  # the earlier files' rows, then this file's apart
                    session.flush()
                    out.write(session, upto=undo.mark)
                    undo = replace(undo, mark=Mark((0,) * len(undo.mark.held), undo.mark.pending))
                    savepoint = session.connection().begin_nested()
                out.write(session)
    except BaseException:
        if savepoint is not None:
            savepoint.rollback()
        undo.restore(attempt, out, result)
        raise
    if savepoint is not None:
        savepoint.commit()
    return applied


def _apply(
    session: Session,
    trial: Trial,
    attempt: Attempt,
    rec: dict[str, Any],
    out: Rows,
    result: IngestResult,
    now: datetime,
) -> None:
    """Apply one event record (:mod:`dlhpc.store._records`): facts onto ``attempt``,
    rows into ``out`` (a metric row into the trial's ``out.pending`` too), counts into
    ``result``. A record of another type is skipped."""
    kind = rec.get("type")
    if kind == "metric":
        rows = metric_rows(trial.id, attempt.id, rec)
        out.pending[trial.id].extend(rows)
        out.metrics.extend(rows)
        result.metrics += len(rows)
    elif kind == "start":
        apply_start(attempt, rec)
    elif kind == "exit":
        apply_exit(attempt, rec)
        result.exited = True
    elif kind == "checkpoint":
        refused, found = checkpoint_record(trial, rec, now)
        if refused is not None:
            out.events.append(refused)
            return
        row, note = checkpoint_row_of(trial, attempt, rec, found.disk_bytes, now)
        row["metric"] = checkpoint_metric(session, trial, rec, out.pending[trial.id])
        out.checkpoints.append(row)
        out.events.extend([note] if note else [])
    elif kind == "gpu":
        rows = gpu_rows(attempt.id, rec)
        out.gpu.extend(rows)
        result.gpu_samples += len(rows)
    elif kind == "env":  # the job's reproducibility record (dlhpc.repro)
        attempt.env_json = merge_env_record(attempt.env_json, rec)
    elif kind == "log":
        out.events.append(log_row(trial, rec, now))


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
