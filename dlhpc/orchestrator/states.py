"""Experiment and trial states."""

from __future__ import annotations

import enum

__all__ = ["ExperimentState", "TrialState"]


class ExperimentState(str, enum.Enum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_terminal(self) -> bool:
        return self in {ExperimentState.COMPLETED, ExperimentState.FAILED, ExperimentState.KILLED}


class TrialState(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    STOPPED_EARLY = "STOPPED_EARLY"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_TRIAL_STATES


TERMINAL_TRIAL_STATES = frozenset(
    {TrialState.COMPLETED, TrialState.STOPPED_EARLY, TrialState.FAILED, TrialState.KILLED}
)
