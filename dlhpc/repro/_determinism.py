"""The framework switches of ``reproducibility.deterministic`` (PyTorch), and seeded
data-loader workers.

Contract: nothing here imports torch unless asked to (``import_torch=True``) or
it is already imported; without torch the switches are a no-op that says so.
The worker sets the variables that must exist before the interpreter starts
(``CUBLAS_WORKSPACE_CONFIG``, ``PYTHONHASHSEED``: see
:func:`dlhpc.repro._attempt.deterministic_env`); :func:`set_torch_deterministic`
does the rest in the training process.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

__all__ = ["dataloader_generator", "seed_worker", "set_torch_deterministic"]


def set_torch_deterministic(import_torch: bool = False) -> bool:
    """Deterministic algorithms on, cuDNN benchmark off, TF32 off. Returns whether
    torch was there to set (only an already imported torch unless ``import_torch``)."""
    if "torch" not in sys.modules and not import_torch:
        return False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts
    try:
        import torch
    except ImportError:
        return False
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return True


def seed_worker(worker_id: int) -> None:
    """``DataLoader(worker_init_fn=seed_worker)``: seeds ``random`` and NumPy in each
    worker from the seed torch gave it (itself from the loader's generator)."""
    import torch

    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def dataloader_generator(seed: int) -> Any:
    """A ``torch.Generator`` seeded with ``seed`` for ``DataLoader(generator=...)``."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    return g
