"""What the tick reads before it decides: the rows of its poll step and the folders
of its ingest step (:mod:`dlhpc.orchestrator.tick`).

:func:`scan` is one read transaction, columns only (no ORM objects): this user's
ACTIVE experiments, their live jobs by backend, the trials whose folders are listed
this pass (live ones not quiet for longer than the settle window, and ended ones
still settling) and the files already ingested from them.
:func:`pending_attempt_dirs` lists those folders for event files not ingested yet.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import DateTime, Select, case, func, select
from sqlalchemy.orm import Session

from dlhpc import _perms
from dlhpc.protocol import EVENT_FILE_RE, iter_attempt_dirs
from dlhpc.states import LIVE_ATTEMPT_STATES, TERMINAL_TRIAL_STATES, ExperimentState
from dlhpc.store import Attempt, Experiment, IngestedFile, Store, Trial
from dlhpc.store.ingest import SETTLE_WINDOW
from dlhpc.store.ingest import settling as settling_trials

__all__ = ["Scan", "TrialRef", "pending_attempt_dirs", "quiet_trials", "scan"]


class TrialRef(NamedTuple):
    """The columns of a trial the tick's scan needs (no ORM object)."""

    id: int
    experiment_id: int
    run_dir: str


@dataclass(frozen=True)
class Scan:
    """What the pass reads first (:func:`scan`), columns only."""

    exp_ids: list[int]  # this user's ACTIVE experiments
    backend_of: dict[int, str]  # their backends, by experiment
    jobs: dict[str, list[str]]  # the live trials' live attempts' jobs, by backend
    scanned: list[TrialRef]  # live trials whose folders are listed
    settling: list[TrialRef]  # ended trials still listed (files show late)
    done_files: dict[tuple[int, str], set[str]]  # their ingested files, by attempt


def scan(store: Store, now: datetime) -> Scan:
    """One read transaction: this user's ACTIVE experiments (or unrecorded: Slurm would
    submit and scancel as us), their live trials' live jobs (grouped by backend once
    read), the trials whose folders are listed this pass, and the files already
    ingested from them."""
    users = ("", _perms.current_user())
    with store.read() as s:
        exps = s.scalars(
            select(Experiment).where(
                Experiment.state == ExperimentState.ACTIVE.value, Experiment.user.in_(users)
            )
        ).all()
        exp_ids = [e.id for e in exps]
        backend_of = {e.id: e.backend for e in exps}
        live = Trial.experiment_id.in_(exp_ids), Trial.state.not_in(TERMINAL_TRIAL_STATES)
        # (job id, experiment) of the live trials' live attempts: columns, no ORM objects
        live_jobs = s.execute(
            select(Attempt.job_id, Trial.experiment_id)
            .join(Trial, Trial.id == Attempt.trial_id)
            .where(*live, Attempt.state.in_(LIVE_ATTEMPT_STATES))
        ).all()
        # the live trials whose folders are listed: not those quiet (see quiet_trials)
        scanned = [
            TrialRef(tid, eid, run_dir)
            for tid, eid, run_dir in s.execute(
                select(Trial.id, Trial.experiment_id, Trial.run_dir)
                .where(*live, Trial.id.not_in(quiet_trials(exp_ids, now)))
                .order_by(Trial.id)
            )
        ]
        # ended trials keep being listed for a while: shared filesystems show files late
        settling = [TrialRef(*row) for row in settling_trials(s, now, users)]
        done_files = _ingested_names(s, [t.id for t in (*scanned, *settling)])
    by_backend: dict[str, list[str]] = defaultdict(list)
    for job_id, exp_id in live_jobs:
        by_backend[backend_of[exp_id]].append(job_id)
    return Scan(exp_ids, backend_of, by_backend, scanned, settling, done_files)


def _ingested_names(s: Session, trial_ids: list[int]) -> dict[tuple[int, str], set[str]]:
    rows = s.execute(
        select(Attempt.trial_id, Attempt.attempt_key, IngestedFile.name)
        .join(IngestedFile, IngestedFile.attempt_id == Attempt.id)
        .where(Attempt.trial_id.in_(trial_ids))
    ).all()
    out: dict[tuple[int, str], set[str]] = defaultdict(set)
    for trial_id, key, name in rows:
        out[(trial_id, key)].add(name)
    return out


def quiet_trials(exp_ids: list[int], now: datetime) -> Select[int]:
    """The live trials of ``exp_ids`` whose folders need no listing, as one SQL
    aggregate: every attempt ended (no live job) before the settle window (e.g. a
    PAUSED trial, or one waiting for a new job). An attempt without an end time
    (neither ``ended_at`` nor ``terminal_seen_at``), and a trial without attempts,
    are listed. An attempt's end is the later of the two times it has."""
    open_ = Attempt.state.in_(LIVE_ATTEMPT_STATES) | (
        Attempt.ended_at.is_(None) & Attempt.terminal_seen_at.is_(None)
    )
    # SQLite's two-argument max() is a scalar: the later of the two (the one set, if one)
    end = func.max(
        func.coalesce(Attempt.ended_at, Attempt.terminal_seen_at),
        func.coalesce(Attempt.terminal_seen_at, Attempt.ended_at),
        type_=DateTime,
    )
    return (
        select(Attempt.trial_id)
        .join(Trial, Trial.id == Attempt.trial_id)
        .where(Trial.experiment_id.in_(exp_ids), Trial.state.not_in(TERMINAL_TRIAL_STATES))
        .group_by(Attempt.trial_id)
        .having(
            func.sum(case((open_, 1), else_=0)) == 0,
            func.max(end, type_=DateTime) < now - SETTLE_WINDOW,
        )
    )


def pending_attempt_dirs(
    trials: list[TrialRef], done: dict[tuple[int, str], set[str]], errors: list[str]
) -> list[tuple[int, Path]]:
    """(trial id, attempt folder) pairs that hold event files not ingested yet. A
    folder that does not list (its job made it unreadable) is left out for this pass,
    its error (one line) in ``errors``: it stops no other."""
    todo = []
    for t in trials:
        if not t.run_dir:
            continue
        try:
            adirs = list(iter_attempt_dirs(Path(t.run_dir)))
        except OSError as err:
            errors.append(f"trial {t.id}: attempt folders not listed: {err}")
            continue
        for adir in adirs:
            try:
                names = {n for n in os.listdir(adir) if EVENT_FILE_RE.match(n)}  # no Path each
            except OSError as err:
                errors.append(f"trial {t.id}: attempt folder not listed: {err}")
                continue
            if names - done.get((t.id, adir.name), set()):
                todo.append((t.id, adir))
    return todo
