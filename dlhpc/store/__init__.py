"""State store: SQLite through SQLAlchemy, written by one reconciler at a time."""

from dlhpc.store.lab_tables import ModelVersion, Note, Tag
from dlhpc.store.lease import LeaseLostError
from dlhpc.store.store import Store, default_home, is_disk_full, lab_databases, utcnow
from dlhpc.store.tables import (
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
    "is_disk_full",
    "lab_databases",
    "utcnow",
]
