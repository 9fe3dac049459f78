"""The file protocol between jobs and the reconciler, shared by both sides.

Compute nodes never open the database. A job writes only immutable files, each
published atomically; the reconciler (and ``dlhpc status``, the report) read
them. This package is the single definition of that contract, and the only
thing the harness (in jobs) and the orchestrator and report (on the login node)
share:

* :mod:`~dlhpc.protocol.layout`: every path and file name of the run and
  checkpoint folders, and the stop file's write and read;
* :mod:`~dlhpc.protocol.spec`: ``trial.json`` (:class:`TrialSpec`);
* :mod:`~dlhpc.protocol.events`: event files, their record format and their
  streamed reading;
* :mod:`~dlhpc.protocol.atomic`: atomic publication of small files;
* :mod:`~dlhpc.protocol.safe_read`: the one way the login node reads a file a job
  wrote (bounded, no symlink, no FIFO), and :mod:`~dlhpc.protocol.record_check`:
  the ranges an event record's stored fields must be in;
* :mod:`~dlhpc.protocol.checkpoint`: the checkpoint format (publish, remove), and
  :mod:`~dlhpc.protocol.checkpoint_read`: reading it (manifest, verify, list);
* :mod:`~dlhpc.protocol.gpu`: NVML loading and the GPU idle rule.

Standard library only (plus :mod:`dlhpc._perms` and :mod:`dlhpc._failpoints`),
so that it is cheap to import inside a job.
"""

from __future__ import annotations

from dlhpc.protocol.atomic import atomic_write_bytes, atomic_write_text, read_small_json
from dlhpc.protocol.events import (
    EVENT_FILE_RE,
    REQUEUE_EXIT_CODE,
    EventBatch,
    EventWriter,
    check_trial_folders,
    event_file_names,
    iter_attempt_dirs,
    iter_records,
    read_event_batches,
)
from dlhpc.protocol.layout import (
    ATTEMPT_DIR_VAR,
    HEARTBEAT_FILE,
    HEARTBEAT_INTERVAL_S,
    PROGRESS_FILE,
    REQUEUE_REQUEST_FILE,
    SETUP_DONE_VAR,
    SETUP_STREAM,
    STOP_FILE,
    TRIAL_DIR_VAR,
    attempt_dir,
    attempt_key,
    attempts_dir,
    checkpoint_experiment_dir,
    checkpoint_trial_dir,
    code_dir,
    entry_script,
    experiment_dir,
    experiment_dir_name,
    experiment_file,
    jobs_dir,
    launch_env_file,
    recorded_slug,
    request_stop,
    split_attempt_key,
    stop_file,
    stop_requested,
    trial_dir,
    trial_file,
    work_dir,
)
from dlhpc.protocol.safe_read import UnsafeFile, read_state_file
from dlhpc.protocol.spec import TrialSpec

__all__ = [
    "UnsafeFile",
    "ATTEMPT_DIR_VAR",
    "EVENT_FILE_RE",
    "HEARTBEAT_FILE",
    "HEARTBEAT_INTERVAL_S",
    "PROGRESS_FILE",
    "REQUEUE_EXIT_CODE",
    "REQUEUE_REQUEST_FILE",
    "SETUP_DONE_VAR",
    "SETUP_STREAM",
    "STOP_FILE",
    "TRIAL_DIR_VAR",
    "EventBatch",
    "EventWriter",
    "TrialSpec",
    "atomic_write_bytes",
    "atomic_write_text",
    "attempt_dir",
    "attempt_key",
    "split_attempt_key",
    "attempts_dir",
    "checkpoint_experiment_dir",
    "checkpoint_trial_dir",
    "code_dir",
    "entry_script",
    "experiment_dir",
    "experiment_dir_name",
    "experiment_file",
    "check_trial_folders",
    "iter_attempt_dirs",
    "jobs_dir",
    "launch_env_file",
    "read_event_batches",
    "event_file_names",
    "iter_records",
    "read_small_json",
    "read_state_file",
    "recorded_slug",
    "request_stop",
    "stop_file",
    "stop_requested",
    "trial_dir",
    "trial_file",
    "work_dir",
]
