"""What happened to a trial's current attempt, and what to do about it.

:func:`judge` is pure: given the attempt as ingested (its exit record, if any),
the scheduler's view of its job and the age of its heartbeat, it returns a
:class:`Verdict`. An exit record is a file the job wrote, so it is final only once
confirmed (:func:`exit_confirmed`): the scheduler no longer runs the attempt, or
it still does but the heartbeat, which the worker stops before it writes its
exit, is older than the stale limit (the job hangs on its way out: it is
cancelled). Until then the attempt counts as running and stays killable. The
rules for a confirmed exit:

* exit 0: the trial is COMPLETED;
* the script checkpointed and exited to be requeued, or died of a signal Slurm
  sent (preemption TERM, time-limit USR2): not the trial's fault. While Slurm
  still has the job (it requeues preempted and self-requeued tasks under the same
  id) wait for the next attempt; once the job is gone, submit the trial again: at
  once when Slurm says it ended FAILED or COMPLETED (its own exit), else after
  a short grace in which Slurm's requeue may still show up.
  The cause says which signal: TERM is ``preempted`` (``cancelled`` when Slurm
  says CANCELLED: ``scancel`` sends TERM too), USR2 ``timeout``, also on an
  attempt superseded by Slurm's requeue of the task (else ``requeued``);
* any other non-zero exit is a crash: it counts toward ``max_restarts`` (cause
  ``setup`` when the job script's setup failed before the worker started, else
  ``crash``);
* no exit record: the worker itself died (node loss, ``kill -9`` of the job, the
  whole job OOM-killed), which is not the script's fault (a crashing script leaves
  the worker alive to record its exit code). While the job runs, a heartbeat older
  than :data:`HEARTBEAT_STALE` means a dead node or a hung job: cancel it and submit
  again; once the job is gone (after :data:`EXIT_RECORD_GRACE` for slow shared
  filesystems), submit again. Neither counts toward ``max_restarts``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from dlhpc.protocol import REQUEUE_EXIT_CODE, split_attempt_key
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.states import TrialState
from dlhpc.store import EXIT_PREEMPTED, Attempt

__all__ = [
    "EXIT_RECORD_GRACE",
    "HEARTBEAT_STALE",
    "HEARTBEAT_STALE_ENV",
    "Verdict",
    "exit_confirmed",
    "heartbeat_stale",
    "judge",
    "split_reason",
    "superseded_cause",
]

EXIT_RECORD_GRACE = timedelta(seconds=60)
HEARTBEAT_STALE = timedelta(seconds=180)
HEARTBEAT_STALE_ENV = "DLHPC_HEARTBEAT_STALE_S"
# after an interruption Slurm may requeue the same task (preemption, time limit):
# give it this long to show up again before submitting the trial anew
_INTERRUPTED_GRACE = timedelta(seconds=20)

_LIVE = {JobState.PENDING, JobState.RUNNING, JobState.REQUEUED}
_SETTLED = {JobState.FAILED, JobState.COMPLETED}
# Slurm's state word for an earlier run of a requeued job -> the attempt's cause
_CAUSE_OF_RUN = {"PREEMPTED": "preempted", "NODE_FAIL": "node_fail", "TIMEOUT": "timeout"}
_CAUSE_OF_STATE = {
    JobState.NODE_FAIL: "node_fail",
    JobState.PREEMPTED: "preempted",
    JobState.TIMEOUT: "timeout",
    JobState.CANCELLED: "cancelled",
}


@dataclass(frozen=True)
class Verdict:
    state: TrialState
    cause: str = ""  # why the attempt ended; recorded on it
    resubmit: bool = False  # the attempt is over and the trial needs a new job
    counted: bool = False  # a crash of the trial's own (counts toward max_restarts)
    cancel_job: bool = False  # the job is still in Slurm but dead to us: scancel it


def split_reason(exit_reason: str) -> tuple[str, str | None]:
    """``"requeue/USR2"`` -> ``("requeue", "USR2")``; a trailing mark
    (``"requeue/TERM/preempted"``) is not part of the signal."""
    reason, _, rest = exit_reason.partition("/")
    sig = rest.partition("/")[0]
    return reason, sig or None


def _signal_cause(sig: str | None, reason: str) -> str:
    if sig == "USR2":
        return "timeout"
    if sig == "TERM":
        return "preempted"
    return "requeue" if reason == "requeue" else "signal"


def superseded_cause(a: Attempt, runs: Sequence[str] | None = None) -> str:
    """Why an attempt that a newer one (Slurm's requeue of the same task) replaced
    ended: a time-limit signal in its exit record is a timeout; else Slurm's word
    for that run when ``runs`` has it (its record of each run of the job, oldest
    first, e.g. ``sacct -D``: ``PREEMPTED`` is how Slurm 24.11 shows a preempted
    task it requeued whatever its exit); else ``preempted`` when its worker said so
    in its exit record (asked ``scontrol`` at the TERM: all there is without
    accounting); else "requeued"."""
    if a.exit_code is not None and a.exit_code != 0 and split_reason(a.exit_reason)[1] == "USR2":
        return "timeout"
    parts = split_attempt_key(a.attempt_key)
    if runs and parts is not None and parts[1] < len(runs):
        cause = _CAUSE_OF_RUN.get(runs[parts[1]])
        if cause is not None:
            return cause
    return "preempted" if a.exit_reason.endswith(EXIT_PREEMPTED) else "requeued"


def _last_state(a: Attempt, st: JobStatus | None) -> JobState | None:
    """The job's state: polled now, or as recorded on the attempt (an ended attempt
    is no longer polled, so ``st`` is None on the passes after Slurm's verdict)."""
    if st is not None:
        return st.state
    try:
        return JobState(a.state)
    except ValueError:
        return None


def _waiting(a: Attempt, st: JobStatus | None) -> TrialState:
    started = a.started_at is not None or (st is not None and st.state == JobState.RUNNING)
    return TrialState.RUNNING if started else TrialState.PENDING


def heartbeat_stale(environ: Mapping[str, str] | None = None) -> timedelta:
    """How old a running job's heartbeat may get before the job counts as lost:
    ``$DLHPC_HEARTBEAT_STALE_S`` seconds in ``environ`` (default: ``os.environ`` as it is
    at the call), else :data:`HEARTBEAT_STALE`."""
    raw = (os.environ if environ is None else environ).get(HEARTBEAT_STALE_ENV)
    return HEARTBEAT_STALE if raw is None else timedelta(seconds=float(raw))


def exit_confirmed(
    a: Attempt,
    st: JobStatus | None,
    heartbeat_age: timedelta | None = None,
    stale: timedelta = HEARTBEAT_STALE,
) -> bool:
    """Whether ``a``'s exit record may be taken as final: the scheduler no longer runs
    the attempt (polled now, or as last recorded when this pass has no status), or its
    heartbeat is older than ``stale``. A record the job forged while it trains (its
    worker keeps the heartbeat fresh) is not final while the job runs."""
    if _last_state(a, st) != JobState.RUNNING:
        return True
    return heartbeat_age is not None and heartbeat_age > stale


def judge(
    a: Attempt | None,
    st: JobStatus | None,
    heartbeat_age: timedelta | None,
    now: datetime,
    stale: timedelta = HEARTBEAT_STALE,
) -> Verdict:
    """The verdict on the current attempt ``a`` (see the module docstring); a running
    job whose heartbeat is older than ``stale`` is lost."""
    if a is None:
        return Verdict(TrialState.PENDING)
    gone_for = now - a.terminal_seen_at if a.terminal_seen_at is not None else None
    live = st is not None and st.state in _LIVE
    if a.exit_code is not None and not exit_confirmed(a, st, heartbeat_age, stale):
        return Verdict(TrialState.RUNNING)  # the job still runs: its exit is not final
    if a.exit_code is not None:
        # still RUNNING here only when its heartbeat went stale: cancel what is left
        hung = _last_state(a, st) == JobState.RUNNING
        if a.exit_code == 0:
            return Verdict(TrialState.COMPLETED, cause="completed", cancel_job=hung)
        reason, sig = split_reason(a.exit_reason)
        if a.exit_code == REQUEUE_EXIT_CODE or reason in ("requeue", "signal"):
            cause = _signal_cause(sig, reason)
            if cause == "preempted" and _last_state(a, st) == JobState.CANCELLED:
                cause = "cancelled"  # scancel sends TERM too; Slurm's state tells them apart
            # A job that ended FAILED/COMPLETED by its own exit is over for Slurm too
            # (measured: a preempted job that exits within GraceTime is not requeued):
            # resubmit at once. Other ends may still turn into Slurm's requeue: wait
            # (also while RUNNING: that may be the requeued run, not yet in its folder).
            settled = not live and _last_state(a, st) in _SETTLED
            if not settled and (live or gone_for is None or gone_for <= _INTERRUPTED_GRACE):
                return Verdict(TrialState.PENDING, cause=cause)  # Slurm may bring it back
            return Verdict(TrialState.PENDING, cause=cause, resubmit=True)
        # a failed setup line (module load, activation) counts like a crash of the code
        cause = "setup" if reason == "setup" else "crash"
        return Verdict(TrialState.PENDING, cause, resubmit=True, counted=True, cancel_job=hung)
    if live:
        assert st is not None  # live implies a status
        if st.state == JobState.RUNNING and heartbeat_age is not None and heartbeat_age > stale:
            return Verdict(TrialState.PENDING, cause="lost", resubmit=True, cancel_job=True)
        return Verdict(_waiting(a, st))
    if gone_for is None or gone_for <= EXIT_RECORD_GRACE:
        return Verdict(_waiting(a, st))
    last = _last_state(a, st)
    cause = _CAUSE_OF_STATE.get(last, "lost") if last is not None else "lost"
    return Verdict(TrialState.PENDING, cause=cause, resubmit=True)
