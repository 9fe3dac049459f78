"""Determined Core API scripts under dlhpc, unmodified.

A script written for Determined's Core API (``import determined as det``,
``det.get_cluster_info()``, ``with det.core.init() as core_context:`` ...) runs in a
dlhpc job through a stand-in ``determined`` package that lives in :data:`SHIM_PATH`.
That folder is on ``PYTHONPATH`` only when the experiment's entrypoint asks for it
by starting with the launcher (what ``dlhpc convert determined`` writes)::

    entrypoint: python -m dlhpc.integrations.determined sh -c 'python3 train.py'

so outside such jobs an installed ``determined`` is never shadowed, and dlhpc never
needs it. The stand-in maps the Core API onto :mod:`dlhpc.harness`
(:mod:`dlhpc.integrations.determined.core_api`): metrics -> ``ctx.report``,
``checkpoint.store_path`` -> an atomic dlhpc checkpoint with a manifest (registered
like ``ctx.checkpoint``), ``preempt.should_preempt()`` -> ``ctx.should_stop()``, the
searcher's single operation -> the trial's grant (``ctx.max_length``).

As in Determined, the entrypoint runs once per node (a *container*,
:mod:`~dlhpc.integrations.determined.cluster`); ``determined.launch.torch_distributed``
and ``determined.launch.deepspeed`` start one worker per slot
(:mod:`~dlhpc.integrations.determined.launch`).

Importing this package costs nothing (no torch, no harness).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ENV_NESTED",
    "ENV_SLOTS",
    "ENV_TIME_METRIC",
    "ENV_UNIT",
    "ENV_USER_DATA",
    "SHIM_PATH",
    "UNSUPPORTED_APIS",
    "unsupported",
]

# the folder holding the stand-in ``determined`` package (put first on PYTHONPATH)
SHIM_PATH = Path(__file__).resolve().parent / "pythonpath"
# set by ``dlhpc convert`` in ``environment.vars``: Determined 0.38's ``searcher.time_metric``
# (a validation metric whose value is the trial's length, e.g. "batches")
ENV_TIME_METRIC = "DLHPC_DETERMINED_TIME_METRIC"
# the unit of ``searcher.max_length`` (batches, records, epochs): get_configured_units()
ENV_UNIT = "DLHPC_DETERMINED_UNIT"
# nested hyperparameters (JSON list of their top names): ``outer.inner`` names are nested
# again in ``info.trial.hparams`` (``{"outer": {"inner": ...}}``)
ENV_NESTED = "DLHPC_DETERMINED_NESTED"
# the experiment's ``data:`` mapping as JSON: ``info.user_data``
ENV_USER_DATA = "DLHPC_DETERMINED_USER_DATA"
# the slots of each container (node): ``len(info.slot_ids)``, the workers a launch layer starts
ENV_SLOTS = "DLHPC_DETERMINED_SLOTS_PER_NODE"

# Determined's modules the stand-in does not provide (its Trial APIs and framework
# adapters): importing one raises ImportError(unsupported(...)); `dlhpc convert` refuses
# scripts that use them (dlhpc.convert keeps the same names; a test holds them equal)
UNSUPPORTED_APIS = ("pytorch", "keras", "lightning", "transformers", "horovod")


def unsupported(what: str) -> str:
    """Why ``what`` (a Determined module or launcher) does not run under dlhpc, and what does."""
    return (
        f"{what} is not supported by dlhpc's Determined stand-in, which runs Core API"
        " scripts only (det.core.init(), as in Determined's examples/tutorials/core_api);"
        " train with plain PyTorch under `with det.core.init() as core_context:` instead of"
        " PyTorchTrial / det.pytorch.Trainer / det.keras, or use dlhpc's own integrations"
    )
