"""State store: SQLite through SQLAlchemy, written by one reconciler at a time."""

from dlhpc.store.lab_models import ModelVersion, Note, Tag
from dlhpc.store.lease import LeaseLostError
from dlhpc.store.models import (
    EXIT_PREEMPTED,
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
from dlhpc.store.store import Store, default_home, utcnow

__all__ = [
    "EXIT_PREEMPTED",
    "Attempt",
    "Checkpoint",
    "Decision",
    "Event",
    "Experiment",
    "GpuSample",
    "IngestedFile",
    "LeaseLostError",
    "Metric",
    "ModelVersion",
    "Note",
    "Store",
    "Submission",
    "Tag",
    "Trial",
    "default_home",
    "utcnow",
]
