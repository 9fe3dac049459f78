"""Every state name the database stores, and the sets the code asks about.

The one definition of the experiment, trial, submission, job (attempt) and checkpoint
states: the schedulers fold their own words into :class:`JobState`, the orchestrator
writes the others, the reports and the simulator read them, and all import them from
here. A leaf at the bottom of the layers (standard library only), so that both the
scheduler backends and the store can name it and the report's start-up path can read it
without loading anything else.

``attempts.state`` holds the scheduler's job state (a :class:`JobState` value) or
:data:`SUPERSEDED`; :data:`LIVE_ATTEMPT_STATES` is derived from ``JobState.is_terminal``.
"""

from __future__ import annotations

import enum

__all__ = [
    "LIVE_ATTEMPT_STATES",
    "TERMINAL_EXPERIMENT_STATES",
    "TERMINAL_TRIAL_STATES",
    "SUPERSEDED",
    "CheckpointState",
    "ExperimentState",
    "JobState",
    "SubmissionState",
    "TrialState",
]


class ExperimentState(str, enum.Enum):
    """``experiments.state``."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_terminal(self) -> bool:
        return self.value in TERMINAL_EXPERIMENT_STATES


class TrialState(str, enum.Enum):
    """``trials.state``."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    STOPPED_EARLY = "STOPPED_EARLY"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_terminal(self) -> bool:
        return self.value in TERMINAL_TRIAL_STATES


class SubmissionState(str, enum.Enum):
    """``submissions.state``: SUBMITTING until the scheduler answered, then one of the others
    (DEFERRED: refused for a site limit, nothing submitted; its trials wait for a slot)."""

    SUBMITTING = "SUBMITTING"
    SUBMITTED = "SUBMITTED"
    FAILED = "FAILED"
    DEFERRED = "DEFERRED"


class JobState(str, enum.Enum):
    """Scheduler-neutral job states (Slurm's, folded)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"  # also CONFIGURING, COMPLETING, SUSPENDED
    REQUEUED = "REQUEUED"  # requeued / preempted and waiting to run again
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"  # FAILED, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"  # preempted and not requeued
    NODE_FAIL = "NODE_FAIL"
    UNKNOWN = "UNKNOWN"  # neither the queue nor accounting knows the job

    @property
    def is_terminal(self) -> bool:
        return self not in {JobState.PENDING, JobState.RUNNING, JobState.REQUEUED, JobState.UNKNOWN}


#: ``attempts.state`` holds the scheduler's job state (a :class:`JobState` value), or
#: this: the orchestrator's own mark for an attempt that a newer one of the same trial
#: replaced while its job still looked live.
SUPERSEDED = "SUPERSEDED"


# the values, as plain strings: SQL ``IN`` lists and membership tests on column values
TERMINAL_EXPERIMENT_STATES: frozenset[str] = frozenset(
    {ExperimentState.COMPLETED.value, ExperimentState.FAILED.value, ExperimentState.KILLED.value}
)
TERMINAL_TRIAL_STATES: frozenset[str] = frozenset(
    {
        TrialState.COMPLETED.value,
        TrialState.STOPPED_EARLY.value,
        TrialState.FAILED.value,
        TrialState.KILLED.value,
    }
)
# a job still held by the scheduler: its hours run to now, its GPUs may be idle
LIVE_ATTEMPT_STATES: frozenset[str] = frozenset(s.value for s in JobState if not s.is_terminal)


class CheckpointState(str, enum.Enum):
    """``checkpoints.state``: ACTIVE on disk, DELETED once the GC (or a prune) removed it."""

    ACTIVE = "ACTIVE"
    DELETED = "DELETED"
