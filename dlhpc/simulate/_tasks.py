"""The simulated cluster's records: its spec, its statistics, its tasks and arrays."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dlhpc.protocol import EventWriter
from dlhpc.scheduler.base import JobState
from dlhpc.simulate._curves import Curve

__all__ = ["ClusterSpec", "SimStats", "Task", "TaskArray"]


@dataclass(frozen=True)
class ClusterSpec:
    gpus: int = 8
    queue_wait_s: float = 60.0  # mean of the exponential wait drawn per (re)queued task
    preempt_rate: float = 0.0  # preemptions per running GPU-hour
    startup_s: float = 30.0  # from start to the first epoch (imports, data, restore)
    teardown_s: float = 0.0  # from the last epoch of a grant to the job's exit
    seed: int = 0


@dataclass
class SimStats:
    """What happened on the cluster (GPU seconds are summed over run segments)."""

    gpu_s: float = 0.0  # run time x GPUs of every attempt
    wasted_gpu_s: float = 0.0  # of which not in checkpointed epochs (startup, lost work)
    starts: int = 0
    preemptions: int = 0
    timeouts: int = 0
    stops: int = 0
    cancels: int = 0
    events: int = 0  # task events processed (starts, epochs, exits)
    epochs: int = 0  # trial-epochs trained and checkpointed (lost ones not counted)


@dataclass(eq=False)  # compared by identity
class Task:
    """One array task: its queue position, and its running segment while it runs."""

    job_id: str
    array: str
    trial_dir: Path
    gpus: int
    limit_s: float
    seq: int
    eligible_at: float
    state: JobState = JobState.PENDING
    restart: int = 0
    start: float | None = None
    end: float | None = None
    exit_code: int | None = None
    # the running segment
    seg_start: float = 0.0
    useful_s: float = 0.0  # of the segment, spent in epochs that were checkpointed
    epoch_len: float = 0.0  # of the epoch in progress
    grant: int = 0
    metric: str = ""
    epoch: int = 0
    next_epoch_end: float = 0.0
    preempt_at: float = float("inf")
    limit_at: float = float("inf")
    stop_at: float = float("inf")
    tearing_down: bool = False  # its grant is trained; it exits at next_epoch_end
    curve: Curve | None = None
    ckpt_dir: str = ""  # the trial's checkpoint folder (trial.json), where its records point
    writer: EventWriter | None = None
    last_beat: float = 0.0
    version: int = 0


@dataclass
class TaskArray:
    """One submission (``sbatch --array``): its throttle and its tasks."""

    name: str
    max_concurrent: int
    running: int = 0
    job_ids: list[str] = field(default_factory=list)
