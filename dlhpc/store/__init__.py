"""State store: SQLite through SQLAlchemy, written by one reconciler at a time."""

from dlhpc.store.lease import LeaseLostError
from dlhpc.store.models import (
    Attempt,
    Checkpoint,
    Decision,
    Event,
    Experiment,
    GpuSample,
    IngestedFile,
    Metric,
    Submission,
    Trial,
)
from dlhpc.store.states import (
    LIVE_ATTEMPT_STATES,
    TERMINAL_EXPERIMENT_STATES,
    TERMINAL_TRIAL_STATES,
    AttemptState,
    ExperimentState,
    SubmissionState,
    TrialState,
)
from dlhpc.store.store import Store, default_home, utcnow

__all__ = [
    "LIVE_ATTEMPT_STATES",
    "TERMINAL_EXPERIMENT_STATES",
    "TERMINAL_TRIAL_STATES",
    "Attempt",
    "AttemptState",
    "Checkpoint",
    "Decision",
    "Event",
    "Experiment",
    "ExperimentState",
    "GpuSample",
    "IngestedFile",
    "LeaseLostError",
    "Metric",
    "Store",
    "Submission",
    "SubmissionState",
    "Trial",
    "TrialState",
    "default_home",
    "utcnow",
]
