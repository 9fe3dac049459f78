"""Every state name the database stores, and the sets the code asks about.

The one definition of the experiment, trial, submission, attempt and checkpoint states: the
orchestrator writes them, the reports and the simulator read them, all import them
from here. A leaf: it imports only the standard library, so the report's start-up
path can read it without loading the orchestrator.

``attempts.state`` holds the scheduler's job state (``dlhpc.scheduler.JobState``'s
values). The scheduler layer may not import the store, so the attempt state names
the store, the orchestrator and the reports use are spelled here, and
``tests/unit/test_states.py`` holds ``JobState``'s live states equal to
``LIVE_ATTEMPT_STATES``.
"""

from __future__ import annotations

import enum

__all__ = [
    "LIVE_ATTEMPT_STATES",
    "TERMINAL_EXPERIMENT_STATES",
    "TERMINAL_TRIAL_STATES",
    "AttemptState",
    "CheckpointState",
    "ExperimentState",
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
    """``submissions.state``: SUBMITTING until the scheduler answered, then one of the others."""

    SUBMITTING = "SUBMITTING"
    SUBMITTED = "SUBMITTED"
    FAILED = "FAILED"


class AttemptState(str, enum.Enum):
    """The ``attempts.state`` values the store, orchestrator and reports name themselves.

    Any ``dlhpc.scheduler.JobState`` value may be stored; these are the ones named in
    code, plus SUPERSEDED: the orchestrator's own mark for an attempt a newer one of the
    same trial replaced while its job still looked live."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
    UNKNOWN = "UNKNOWN"
    CANCELLED = "CANCELLED"
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
LIVE_ATTEMPT_STATES: frozenset[str] = frozenset(
    {
        AttemptState.PENDING.value,
        AttemptState.RUNNING.value,
        AttemptState.REQUEUED.value,
        AttemptState.UNKNOWN.value,
    }
)


class CheckpointState(str, enum.Enum):
    """``checkpoints.state``: ACTIVE on disk, DELETED once the GC (or a prune) removed it."""

    ACTIVE = "ACTIVE"
    DELETED = "DELETED"
