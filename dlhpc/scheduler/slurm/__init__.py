"""The Slurm backend: job arrays via submitit, state via squeue/sacct."""

from dlhpc.scheduler.slurm.scheduler import DEFAULT_MAX_ARRAY_SIZE, SlurmScheduler

__all__ = ["DEFAULT_MAX_ARRAY_SIZE", "SlurmScheduler"]
