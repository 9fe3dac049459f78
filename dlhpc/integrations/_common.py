"""What the framework adapters share: the missing-extra error, the trial's
hyperparameters read without a context, and process-wide RNG snapshots.

Standard library and :mod:`dlhpc.protocol` only at import time (torch and numpy
are imported by the functions that need them).
"""

from __future__ import annotations

import argparse
import atexit
import copy
import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from dlhpc._extras import ADAPTERS
from dlhpc.errors import DlhpcError
from dlhpc.protocol import TRIAL_DIR_VAR, TrialSpec, trial_file

__all__ = [
    "MissingExtraError",
    "destroy_process_group_at_exit",
    "hparams",
    "require",
    "trial_spec",
]

H = TypeVar("H", argparse.Namespace, dict[str, Any])


class MissingExtraError(DlhpcError, ImportError):
    """An adapter's framework is not installed; the message names the extra to install."""


def require(module: str, adapter: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra that
    :data:`dlhpc._extras.ADAPTERS` gives for ``adapter`` (the adapter's module name)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtraError(
            f"{adapter} needs the {module!r} package, which is not installed "
            f"({err}); install it with: {ADAPTERS[adapter].install}"
        ) from err


def trial_spec() -> TrialSpec | None:
    """This job's trial spec, or None outside a dlhpc job (``DLHPC_TRIAL_DIR`` unset)."""
    trial_dir = os.environ.get(TRIAL_DIR_VAR)
    return TrialSpec.read(trial_file(Path(trial_dir))) if trial_dir else None


def hparams(defaults: H) -> H:
    """``defaults`` with the trial's hyperparameters filled in (a copy, same type).

    ``defaults`` is an ``argparse.Namespace`` (e.g. ``parse_args()``) or a dict.
    Inside a dlhpc job each of the trial's hyperparameters replaces the field of
    the same name (``batch-size`` also fills ``batch_size``; a name ``defaults``
    lacks is added), and a ``seed`` field gets the trial's seed. Outside a job
    the copy is returned unchanged, so the script still runs by hand.
    """
    if not isinstance(defaults, argparse.Namespace | dict):
        raise DlhpcError(
            f"hparams(): pass an argparse.Namespace or a dict, got {type(defaults).__name__}"
        )
    out = copy.copy(defaults)
    spec = trial_spec()
    if spec is None:
        return out
    fields: dict[str, Any] = vars(out) if isinstance(out, argparse.Namespace) else out
    values: dict[str, Any] = dict(spec.hparams)
    if "seed" in fields:
        values["seed"] = spec.seed
    for name, value in values.items():
        key = name.replace("-", "_") if name not in fields else name
        fields[key] = value
    return out


def _destroy_default_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def destroy_process_group_at_exit() -> None:
    """Destroy torch's default process group at interpreter exit, if still there.

    Idempotent (registered once however often it is called); at exit it does nothing
    when no group is there. Without it a gloo rank that ends without
    ``destroy_process_group()`` can abort (SIGABRT, "terminate called without an
    active exception") while the interpreter finalizes, and the attempt of a trial
    that finished would count as crashed: a world of one rank too (a CI run saw a
    Hugging Face trial's last attempt end non-zero after its final checkpoint).
    Lightning registers such a handler for NCCL only. At exit nothing uses the group
    any more, so the handler cannot disturb a script that keeps using it after
    training.
    """
    atexit.unregister(_destroy_default_group)
    atexit.register(_destroy_default_group)
