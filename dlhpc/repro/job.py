"""The in-job half of the reproducibility record: what the worker and the training
context call inside a job.

The harness imports this module rather than the :mod:`dlhpc.repro` package, whose
launch-side half (:func:`dlhpc.repro.collect_launch_record`) reaches the config
layer, which jobs never load. Everything here depends on the standard library
only; the determinism switches import torch when they are called.
"""

from dlhpc.repro._attempt import attempt_record, deterministic_env
from dlhpc.repro._determinism import dataloader_generator, seed_worker, set_torch_deterministic

__all__ = [
    "attempt_record",
    "dataloader_generator",
    "deterministic_env",
    "seed_worker",
    "set_torch_deterministic",
]
