"""One live trial per call: bring its attempts and state up to date.

:func:`reconcile_trial` applies the scheduler's view to the trial's attempts,
asks :func:`~dlhpc.orchestrator.recovery.judge` about the current one, and acts:
a restart (the job is cancelled and the trial waits for a new one), a pause (the
job trained to its grant and ended; the searcher decides what comes next), an
end (COMPLETED, FAILED after ``max_restarts`` crashes), or the end of a trial
the searcher stopped while it ran.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeGuard

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from dlhpc.orchestrator.clock import Clock, not_before, trial_time
from dlhpc.orchestrator.decide import pending_promotion, stop_grace
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.recovery import (
    Verdict,
    exit_confirmed,
    heartbeat_stale,
    judge,
    superseded_cause,
)
from dlhpc.protocol import (
    HEARTBEAT_FILE,
    PROGRESS_FILE,
    UnsafeFile,
    attempt_dir,
    check_trial_folders,
    read_state_file,
)
from dlhpc.protocol.record_check import MAX_STEP
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.states import LIVE_ATTEMPT_STATES, SUPERSEDED, TrialState
from dlhpc.store import Attempt, Decision, Trial

__all__ = ["TrialPass", "reconcile_trial", "settled_paused", "settled_paused_ids"]

_LONG_AGO = 10 * 365 * 86400.0  # a heartbeat age beyond any timedelta judge compares


@dataclass
class TrialPass:
    """What one pass over an experiment's trials needs and collects."""

    statuses: dict[str, JobStatus]
    clock: Clock
    max_restarts: int
    final_length: int  # the searcher's max_length: a trial that reached it is done
    # promotions not acted on yet, by trial (decide.pending_promotions: one query)
    promotions: dict[int, list[Decision]] = field(default_factory=dict)
    # the scheduler's word for each run of a job it restarted under one id (run_states)
    runs: dict[str, list[str]] = field(default_factory=dict)
    cancels: list[str] = field(default_factory=list)  # job ids to scancel after commit
    warnings: list[str] = field(default_factory=list)  # heartbeat/progress files not read
    stopping: list[Trial] = field(default_factory=list)  # stop requested, job still live
    file_times: dict[Path, float] = field(default_factory=dict)  # read once per folder

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def file_now(self, folder: Path) -> float:
        """:meth:`Clock.file_time` of ``folder``, read once per pass."""
        if folder not in self.file_times:
            self.file_times[folder] = self.clock.file_time(folder)
        return self.file_times[folder]


def _apply_status(a: Attempt, st: JobStatus | None, now: datetime) -> None:
    """Record the scheduler's view of the attempt's job (its exit record is kept apart)."""
    if st is None:
        return
    a.raw_state = st.raw_state or st.state.value
    a.node_list = st.node_list or a.node_list
    a.started_at = a.started_at or st.start
    a.state = st.state.value
    if st.state.is_terminal or st.state == JobState.UNKNOWN:
        a.ended_at = a.ended_at or st.end
        a.terminal_seen_at = a.terminal_seen_at or not_before(now, a.created_at)
    else:
        a.terminal_seen_at = None


def _attempt_file(t: Trial, a: Attempt, name: str, p: TrialPass) -> dict[str, object] | None:
    """The attempt's heartbeat or progress file; None when absent or unsafe (a
    symlink, or below one (:func:`~dlhpc.protocol.check_trial_folders`), not a small
    regular file, not a JSON object: a warning in ``p``)."""
    if not t.run_dir:
        return None
    adir = attempt_dir(Path(t.run_dir), a.attempt_key)
    try:
        check_trial_folders(Path(t.run_dir), adir.parent, adir)
        return read_state_file(adir / name)
    except (UnsafeFile, OSError) as err:
        p.warnings.append(f"trial {t.id}: {name} not read, {err}")
        return None


def _heartbeat_age(t: Trial, a: Attempt | None, p: TrialPass) -> timedelta | None:
    """How long ago the attempt's heartbeat file was written, by the clock of the
    filesystem that stamped it (:meth:`TrialPass.file_now` of the experiment's run
    folder, beside its ``trials/``, so nothing that lists trials meets the probe):
    never this machine's clock against the compute node's. None when it has none
    (or it is unsafe to read: a warning in ``p``)."""
    if a is None or _attempt_file(t, a, HEARTBEAT_FILE, p) is None:
        return None
    beat = attempt_dir(Path(t.run_dir), a.attempt_key) / HEARTBEAT_FILE
    try:
        now = p.file_now(Path(t.run_dir).parent.parent)
        age = now - os.stat(beat, follow_symlinks=False).st_mtime
    except OSError as err:
        p.warnings.append(f"trial {t.id}: heartbeat age not read, {err}")
        return None
    return timedelta(seconds=min(max(0.0, age), _LONG_AGO))


def _lost_steps(t: Trial, a: Attempt, p: TrialPass) -> int | None:
    if a.lost_steps is not None:
        return a.lost_steps
    progress = _attempt_file(t, a, PROGRESS_FILE, p) or {}
    step, ckpt = progress.get("step"), progress.get("checkpoint_step")
    if not _is_step(step):
        return None
    return max(0, step - (ckpt if _is_step(ckpt) else 0))


def _count_retrained(t: Trial, previous: Attempt, current: Attempt, p: TrialPass) -> None:
    """Raise ``previous``'s lost steps to every step of it past where ``current``'s
    training started (``start_step`` in its progress file, when its script says; a
    start below ``previous``'s checkpoint trains those steps again)."""
    start = (_attempt_file(t, current, PROGRESS_FILE, p) or {}).get("start_step")
    if not _is_step(start):
        return
    step = (_attempt_file(t, previous, PROGRESS_FILE, p) or {}).get("step")
    if _is_step(step) and step - start > (previous.lost_steps or 0):
        previous.lost_steps = step - start


def _is_step(v: object) -> TypeGuard[int]:
    """A step a job's progress file may give: an int SQLite's INTEGER holds."""
    return type(v) is int and 0 <= v <= MAX_STEP


def _log_tail(a: Attempt, lines: int = 5) -> str:
    if not a.log_path:
        return ""
    err = Path(a.log_path).with_name(Path(a.log_path).name.replace(".out", ".err"))
    try:
        text = err.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])


def end_trial(
    s: Session, t: Trial, state: TrialState, now: datetime, last: Attempt | None, error: str
) -> None:
    t.state = state.value
    t.ended_at = trial_time(t, now)
    t.needs_job = False
    if error:
        t.error = "\n".join(x for x in (error, _log_tail(last) if last else "") if x)
    log_event(s, f"trial.{state.value.lower()}", error or state.value, t.experiment_id, t.id)


def _settle_stop(s: Session, t: Trial, current: Attempt | None, p: TrialPass) -> None:
    """A trial the searcher stopped while it ran: end it once its job has ended,
    or cancel the job once it ignored the stop for :func:`stop_grace`."""
    assert t.stop_requested_at is not None  # the caller checked
    now = p.now
    grace = stop_grace()
    st = p.statuses.get(current.job_id) if current is not None else None
    job_gone = current is None or current.state not in LIVE_ATTEMPT_STATES
    # an exit record of a job still running is not final: the stop grace ends it
    exited = current is not None and current.exit_code is not None
    if current is not None and (job_gone or exited and exit_confirmed(current, st)):
        done = current.exit_code == 0 and t.steps_completed >= p.final_length
        if not current.cause:
            current.cause = "completed" if done else "stopped"
        end_trial(s, t, TrialState.COMPLETED if done else TrialState.STOPPED_EARLY, now, None, "")
        return
    if now - t.stop_requested_at > grace and current is not None:
        p.cancels.append(current.job_id)
        current.state = JobState.CANCELLED.value
        current.cause = "stopped"
        end_trial(s, t, TrialState.STOPPED_EARLY, now, None, "")
        log_event(
            s,
            "trial.stop",
            f"job {current.job_id} did not stop within {grace.total_seconds():.0f} s"
            " of the searcher's decision: cancelled",
            t.experiment_id,
            t.id,
        )
        return
    if st is not None and st.state == JobState.RUNNING:
        t.state = TrialState.RUNNING.value
    p.stopping.append(t)


def _completed(s: Session, t: Trial, current: Attempt | None, p: TrialPass) -> None:
    """The job exited 0: the trial completed, or trained to its grant and pauses."""
    reached = t.steps_completed >= t.max_length
    # a promotion of a trial already PAUSED is applied at once (decide.py), so only a
    # trial whose job was still ending when promoted can have one pending
    promotion = (
        pending_promotion(t, p.promotions)
        if reached and t.state != TrialState.PAUSED.value
        else None
    )
    if current is not None and reached and t.max_length < p.final_length:
        current.cause = "paused"
    if promotion is not None:  # promoted while its job was ending: a new job, longer grant
        t.max_length = promotion.length
        t.needs_job = True
        t.state = TrialState.PENDING.value
    elif reached and t.max_length < p.final_length:
        if t.state != TrialState.PAUSED.value:
            t.state = TrialState.PAUSED.value
            log_event(s, "trial.paused", f"paused at length {t.max_length}", t.experiment_id, t.id)
    else:
        end_trial(s, t, TrialState.COMPLETED, p.now, current, "")


def reconcile_trial(s: Session, t: Trial, p: TrialPass) -> None:
    """Bring one live trial's state up to date and decide on a restart."""
    now = p.now
    _update_attempts(t, p, now)
    current = t.attempts[-1] if t.attempts else None
    if len(t.attempts) > 1:
        _count_retrained(t, t.attempts[-2], t.attempts[-1], p)
    if t.stop_requested_at is not None:
        _settle_stop(s, t, current, p)
        return
    if t.needs_job:
        return  # already judged; waits for its new job
    status = p.statuses.get(current.job_id) if current is not None else None
    # only a running job's heartbeat can matter (judge): a queued one has none to read
    running = status is not None and status.state == JobState.RUNNING
    age = _heartbeat_age(t, current, p) if running else None
    verdict = judge(current, status, age, now, heartbeat_stale())
    if current is not None and verdict.cause and (verdict.resubmit or verdict.state.is_terminal):
        current.cause = verdict.cause
        current.lost_steps = _lost_steps(t, current, p)
    if verdict.cancel_job and not verdict.resubmit and current is not None:
        p.cancels.append(current.job_id)  # its exit is final but its job hangs on: end it
        current.state = JobState.CANCELLED.value
    if verdict.resubmit and current is not None:
        _resubmit(s, t, current, verdict, p, now)
        return
    if verdict.state == TrialState.COMPLETED:
        _completed(s, t, current, p)
    elif verdict.state.value != t.state and t.state != TrialState.PAUSED.value:
        if verdict.state.is_terminal:
            end_trial(s, t, verdict.state, now, current, "")
        else:
            t.state = verdict.state.value
            log_event(
                s,
                f"trial.{verdict.state.value.lower()}",
                verdict.state.value,
                t.experiment_id,
                t.id,
            )


def _update_attempts(t: Trial, p: TrialPass, now: datetime) -> None:
    """Apply the scheduler's view to the trial's live attempts. An attempt a newer one
    replaced (requeued by Slurm or resubmitted) is SUPERSEDED if still live, and gets
    its cause and lost steps if it has no cause yet; ``t.restarts`` counts the replaced
    ones whose cause is not ``paused``."""
    for a in t.attempts:
        if a.state in LIVE_ATTEMPT_STATES:
            _apply_status(a, p.statuses.get(a.job_id), now)
    for a in t.attempts[:-1]:  # requeued by Slurm or resubmitted: a newer attempt exists
        if a.state in LIVE_ATTEMPT_STATES:
            a.state = SUPERSEDED
        if not a.cause:
            a.cause = superseded_cause(a, p.runs.get(a.job_id))
            a.lost_steps = _lost_steps(t, a, p)
    t.restarts = sum(a.cause != "paused" for a in t.attempts[:-1])


def _resubmit(
    s: Session, t: Trial, current: Attempt, verdict: Verdict, p: TrialPass, now: datetime
) -> None:
    """The current attempt is over and the trial needs a new job: its job is cancelled
    (after the commit: ``p.cancels``); the trial ends FAILED once a counted crash
    exceeds ``max_restarts``, else waits PENDING for a new job (whose submission applies
    a promotion still pending: :mod:`~dlhpc.orchestrator.submit`)."""
    # Cancel the old job whatever Slurm last said of it: if Slurm requeued it
    # meanwhile, two runs of one trial would share its checkpoint folder.
    p.cancels.append(current.job_id)
    if verdict.cancel_job:
        current.state = SUPERSEDED
    if verdict.counted and t.crashes >= p.max_restarts:
        end_trial(
            s,
            t,
            TrialState.FAILED,
            now,
            current,
            f"crashed {t.crashes + 1} time(s)"
            f" (max_restarts {p.max_restarts}); last: exit code {current.exit_code}"
            f" of job {current.job_id}",
        )
        return
    t.crashes += int(verdict.counted)
    t.needs_job = True
    t.state = TrialState.PENDING.value
    log_event(
        s,
        "trial.restart",
        f"attempt {current.attempt_key} ended ({verdict.cause}); submitting again"
        f" (restart {t.restarts + 1}, crashes {t.crashes}/{p.max_restarts})",
        t.experiment_id,
        t.id,
    )


def settled_paused_ids(experiment_id: int, final_length: int) -> Select[int]:
    """The ids of the experiment's PAUSED trials on which :func:`reconcile_trial` is a
    no-op, as one SQL query (an aggregate over their attempts' columns; no ORM object
    is loaded), so a pass may skip them and need not load them at all.

    Such a trial waits for the searcher and nothing about it can change this pass: no
    stop requested, no job wanted, trained to its grant (below the final length), at
    least one attempt, none live (nothing to poll), its last attempt exited 0 with
    cause ``paused``, every attempt has its cause, and ``restarts`` matches them (the
    attempts whose cause is not ``paused``: the last one's is). Any other PAUSED trial
    is reconciled as before. The rule keeps nothing between passes: a pass killed at
    any line recomputes it from the DB."""
    no_cause = Attempt.cause.is_(None) | (Attempt.cause == "")
    restarts = case((Attempt.cause != "paused", 1), else_=0)
    agg = (
        select(Attempt.trial_id.label("trial_id"), func.max(Attempt.id).label("last_id"))
        .join(Trial, Trial.id == Attempt.trial_id)
        .where(
            Trial.experiment_id == experiment_id,
            Trial.state == TrialState.PAUSED.value,
            Trial.stop_requested_at.is_(None),
            Trial.needs_job.is_(False),
            Trial.max_length < final_length,
            Trial.steps_completed >= Trial.max_length,
        )
        .group_by(Attempt.trial_id, Trial.restarts)
        .having(
            func.sum(case((Attempt.state.in_(sorted(LIVE_ATTEMPT_STATES)), 1), else_=0)) == 0,
            func.sum(case((no_cause, 1), else_=0)) == 0,
            func.sum(restarts) == Trial.restarts,
        )
        .subquery()
    )
    return (
        select(agg.c.trial_id)
        .join(Attempt, Attempt.id == agg.c.last_id)
        .where(Attempt.exit_code == 0, Attempt.cause == "paused")
    )


def settled_paused(s: Session, trials: list[Trial], final_length: int) -> set[int]:
    """Ids of the ``trials`` that :func:`settled_paused_ids` names (one query per
    experiment among them)."""
    ids = {t.id for t in trials}
    out: set[int] = set()
    for exp_id in sorted({t.experiment_id for t in trials}):
        out.update(s.scalars(settled_paused_ids(exp_id, final_length)))
    return out & ids
