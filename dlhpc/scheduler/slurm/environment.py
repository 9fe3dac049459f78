"""The Slurm job's view of itself: :class:`SlurmJobEnvironment` (``SLURM_*`` variables).

Standard library only (plus :mod:`dlhpc.errors`): imported inside every Slurm job.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from typing import ClassVar

from dlhpc.errors import DlhpcError
from dlhpc.scheduler.environment import JobEnvironment, TaskLayout, int_var
from dlhpc.scheduler.slurm.hostlist import first_host, local_world_size

__all__ = ["SlurmJobEnvironment", "preempt_time_set"]

# `scontrol show job`'s field, the same on Slurm 22.05, 24.11 and 26.05: "None" until
# slurmctld picks the job for preemption, then the time it did (while the job runs; the
# requeued job shows it no more). Printed where the job's partition may be preempted.
_PREEMPT_TIME = re.compile(r"(?:^|\s)PreemptTime=(\S*)")


def preempt_time_set(show_job: str) -> bool | None:
    """Whether ``scontrol show job``'s text says the job is being preempted
    (``PreemptTime=<a time>``); None when it has no PreemptTime field."""
    m = _PREEMPT_TIME.search(show_job)
    if m is None:
        return None
    return m[1] not in ("", "None", "Unknown", "(null)", "N/A")


class SlurmJobEnvironment(JobEnvironment):
    """A Slurm job (sbatch script or srun task).

    Signals: Slurm signals every process of the job; TERM then KILL after the
    grace time on preemption (Slurm requeues preempted jobs itself), and the
    site's signal (USR2) ``lead_time`` seconds before the time limit, after which
    the job may requeue itself with ``scontrol requeue``.
    """

    name = "slurm"
    marker = "SLURM_JOB_ID"
    time_limit_signal = "USR2"
    record_vars: ClassVar[frozenset[str]] = frozenset(
        {
            "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
            "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_PER_TASK",
            "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS", "SLURM_CLUSTER_NAME",
            "SLURM_RESTART_COUNT", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_GPUS_ON_NODE",
            "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
        }
    )  # fmt: skip
    volatile_vars: ClassVar[frozenset[str]] = frozenset(
        {
            "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
            "SLURM_RESTART_COUNT",
        }
    )  # fmt: skip

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        return bool(
            environ.get("SLURM_JOB_ID")
            or (environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"))
        )

    @property
    def job_id(self) -> str:
        """``<array job>_<task>`` in an array (every dlhpc submission), else the job id."""
        env = self.environ
        if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
            return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
        if env.get("SLURM_JOB_ID"):
            return env["SLURM_JOB_ID"]
        raise DlhpcError("slurm: no SLURM_JOB_ID; not started by Slurm")

    @property
    def restart(self) -> int:
        return int_var(self.environ, "SLURM_RESTART_COUNT", default=0)

    @property
    def rank(self) -> int:
        return int_var(self.environ, "SLURM_PROCID", default=0)

    @property
    def local_rank(self) -> int:
        return int_var(self.environ, "SLURM_LOCALID", default=0)

    @property
    def world_size(self) -> int:
        return int_var(self.environ, "SLURM_NTASKS", default=1)

    @property
    def node_id(self) -> int:
        return int_var(self.environ, "SLURM_NODEID", default=0)

    @property
    def node_list(self) -> str | None:
        return self.environ.get("SLURM_JOB_NODELIST") or None

    @property
    def cpus_per_task(self) -> str | None:
        return self.environ.get("SLURM_CPUS_PER_TASK") or None

    def task_layout(self) -> TaskLayout | None:
        """From the step's variables (``SLURM_STEP_*``) where srun set them, else the
        job's. Needs ``SLURM_PROCID``; the rest falls back to one process here."""
        env = self.environ
        if not env.get("SLURM_PROCID", "").isdigit():
            return None
        world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        return TaskLayout(
            rank=int(env["SLURM_PROCID"]),
            world=world,
            local_rank=self.local_rank,
            local_world=local_world_size(per_node, self.node_id) if per_node else world,
            master_host=first_host(nodes) if nodes else None,
            job=env.get("SLURM_JOB_ID") or "0",
        )

    def preempted(self) -> bool | None:
        """One ``scontrol show job <SLURM_JOB_ID>``: True while slurmctld preempts this
        job (its PreemptTime is set). Slurm 24.11 and 26.05 requeue a preempted task under
        its own id, and without accounting nothing else records that the TERM was a
        preemption. None without ``SLURM_JOB_ID``, or when scontrol fails or says nothing."""
        job_id = self.environ.get("SLURM_JOB_ID")
        if not job_id:
            return None
        try:
            proc = subprocess.run(
                ["scontrol", "show", "job", "-o", job_id],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return preempt_time_set(proc.stdout) if proc.returncode == 0 else None

    def requeue_self(self) -> str | None:
        """``scontrol requeue <job id>``: Slurm kills this run and queues the task again.
        The error text starts with the command. None (nothing asked) in a process
        without ``SLURM_JOB_ID``."""
        if "SLURM_JOB_ID" not in self.environ:
            return None
        job_id = self.job_id
        try:
            proc = subprocess.run(
                ["scontrol", "requeue", job_id],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"scontrol requeue {job_id}: {err}"
        if proc.returncode == 0:
            return ""
        return f"scontrol requeue {job_id}: {(proc.stderr or proc.stdout).strip()}"
