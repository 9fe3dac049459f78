"""The reproducibility record: what ran, where, on what, from which code and data.

* At launch (login node), :func:`collect_launch_record` -> ``experiments.repro_json``:
  code (git commit/branch/remote/diff, or a content-addressed manifest of the
  workdir honouring ``.gitignore``), config hashes, Python and packages (``pip
  freeze``), conda, environment modules, Slurm version, site, declared data.
* Per attempt (in the job, local rank 0 of each node), :func:`attempt_record` ->
  an ``env`` event record -> ``attempts.env_json`` (:func:`merge_env_record`):
  nodes, CPU, GPUs/driver/CUDA (NVML), the environment variables that matter
  (secrets redacted), the data fingerprint.
* :func:`diff_records` compares two trials' records (``dlhpc diff``, ``dlhpc
  reproduce``); :mod:`dlhpc.repro._determinism` holds the PyTorch switches of
  ``reproducibility.deterministic``.

Importing this package is cheap (standard library only): the worker uses it.
"""

from dlhpc.repro._attempt import (
    REDACTED,
    attempt_record,
    deterministic_env,
    is_secret_name,
    merge_env_record,
    redacted_env,
)
from dlhpc.repro._determinism import dataloader_generator, seed_worker, set_torch_deterministic
from dlhpc.repro._diff import SECTIONS, Difference, diff_records, render_differences, trial_record
from dlhpc.repro._files import code_files, fingerprint_data
from dlhpc.repro._launch import code_record, collect_launch_record

__all__ = [
    "REDACTED",
    "SECTIONS",
    "Difference",
    "attempt_record",
    "code_files",
    "code_record",
    "collect_launch_record",
    "dataloader_generator",
    "deterministic_env",
    "diff_records",
    "fingerprint_data",
    "is_secret_name",
    "merge_env_record",
    "redacted_env",
    "render_differences",
    "seed_worker",
    "set_torch_deterministic",
    "trial_record",
]
