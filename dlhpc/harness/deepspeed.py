"""DeepSpeed under dlhpc: one call builds the engine, checkpoints are atomic and sharded.

Imported by training scripts only; DeepSpeed itself is imported lazily (by
:func:`build_engine`, and by :meth:`EngineState.restore` to convert checkpoints).
The few lines a script adds::

    import dlhpc
    from dlhpc.harness import deepspeed as dsh

    ctx = dlhpc.init()
    engine = dsh.build_engine(ctx, model)      # config: the experiment's `deepspeed:`
    state = dsh.engine_state(ctx, engine)
    state.restore()                            # every rank; False on a fresh start
    while state.step < total:
        ...                                    # engine(x), engine.backward(loss), engine.step()
        state.step += 1
        dsh.step(ctx, state)                   # all ranks agree to stop, checkpoint, exit 75
    ctx.checkpoint(state)                      # every rank: a collective save

Checkpoints: see :mod:`dlhpc.harness.ds_checkpoint` (atomic, sharded, collective).
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dlhpc.errors import DlhpcError
from dlhpc.harness.distributed import RANK_VARS, rank_env, single_process_env
from dlhpc.harness.ds_checkpoint import ENGINE_TAG, EngineState, WorldSizeMismatch

if TYPE_CHECKING:
    from dlhpc.harness.context import TrialContext

__all__ = [
    "ENGINE_TAG",
    "EngineState",
    "WorldSizeMismatch",
    "build_engine",
    "close_process_group",
    "engine_state",
    "ensure_rank_env",
    "load_config",
    "step",
]


# -- building the engine -------------------------------------------------------


def load_config(
    ctx: TrialContext | None, config: dict[str, Any] | str | Path | None
) -> dict[str, Any]:
    """The DeepSpeed config: ``config`` (a mapping or a JSON file), else the
    experiment's ``deepspeed:`` section (``TrialSpec.deepspeed``). A fresh copy."""
    if config is None:
        config = ctx.spec.deepspeed if ctx is not None and ctx.spec is not None else None
        if config is None:
            raise DlhpcError(
                "no DeepSpeed config: set `deepspeed: {config: ds_config.json}` in the "
                "experiment, or pass config= to build_engine()"
            )
    if isinstance(config, (str, Path)):
        try:
            config = json.loads(Path(config).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise DlhpcError(f"cannot read DeepSpeed config {config}: {err}") from err
    if not isinstance(config, dict):
        raise DlhpcError(f"the DeepSpeed config must be a mapping, got {type(config).__name__}")
    copied: dict[str, Any] = json.loads(json.dumps(config))
    return copied


def ensure_rank_env() -> dict[str, str]:
    """Set missing rank variables (``RANK`` ... ``MASTER_PORT``) in ``os.environ``: from
    Slurm's inside an srun task, else rank 0 of 1 on this host. Returns what it set."""
    if all(os.environ.get(k) for k in RANK_VARS):
        return {}
    derived = rank_env(os.environ) or single_process_env(os.environ)
    added = {k: v for k, v in derived.items() if not os.environ.get(k)}
    os.environ.update(added)
    return added


def _use_cuda() -> bool:
    """CUDA when torch sees a GPU (``CUDA_VISIBLE_DEVICES`` respected) and
    ``DS_ACCELERATOR`` does not ask for another accelerator."""
    return torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") == "cuda"


def _skip_shm_op(deepspeed: Any) -> None:
    """Keep DeepSpeed's CPU accelerator from JIT-compiling its shared-memory all-reduce
    at ``init_distributed``: that needs a C++ compiler on every node (without one, init
    fails) and only inference/AutoTP use it, not ZeRO training."""
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


SETTLE_S = 0.2
"""Seconds :func:`close_process_group` sleeps at exit, GIL released (see there)."""


def build_engine(
    ctx: TrialContext | None,
    model: torch.nn.Module,
    optimizer: Any = None,
    config: dict[str, Any] | str | Path | None = None,
    *,
    model_parameters: Any = None,
    lr_scheduler: Any = None,
    **initialize_kwargs: Any,
) -> Any:
    """Initialise torch.distributed and return ``deepspeed.initialize``'s engine.

    Every rank calls it. The rank variables come from the worker (or are derived
    here, see :func:`ensure_rank_env`). With a visible GPU the backend is NCCL on
    GPU ``LOCAL_RANK % device_count`` (one GPU per task or all GPUs of the node
    both work); otherwise ``DS_ACCELERATOR=cpu`` (set before DeepSpeed is
    imported) and gloo. ``optimizer`` (a torch optimizer or None to use the
    config's ``optimizer``), ``lr_scheduler`` and the other keyword arguments go
    to ``deepspeed.initialize``; ``model_parameters`` defaults to the trainable
    parameters. The optimizer and scheduler are ``engine.optimizer`` and
    ``engine.lr_scheduler``.
    """
    cfg = load_config(ctx, config)
    ensure_rank_env()
    if _use_cuda():
        backend = "nccl"
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    else:
        backend = "gloo"
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if backend == "gloo":
        _skip_shm_op(deepspeed)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    # once per process, however many engines it builds
    atexit.unregister(close_process_group)
    atexit.register(close_process_group)
    if model_parameters is None and optimizer is None:
        model_parameters = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        model_parameters=model_parameters,
        lr_scheduler=lr_scheduler,
        config=cfg,
        **initialize_kwargs,
    )
    return engine


def close_process_group() -> None:
    """Destroy the default process group if one is up, then let the collectives'
    worker threads settle (registered with ``atexit`` by :func:`build_engine`).

    A gloo worker thread frees a finished collective's tensors after the caller's
    ``wait()`` has returned. Freeing a tensor that Python has let go of takes the
    GIL, and a thread that asks for the GIL while the interpreter finalizes
    unwinds through a C++ destructor: "terminate called without an active
    exception", SIGABRT (pytorch/pytorch#190489). A trial that trained to the
    end would then exit 134 and count as a crash. Destroying the group does not
    stop those threads (DeepSpeed holds its groups), so this handler also
    releases the GIL for :data:`SETTLE_S` while the interpreter is still whole.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    time.sleep(SETTLE_S)


def engine_state(ctx: TrialContext, engine: Any, **kwargs: Any) -> EngineState:
    """An :class:`EngineState` in the trial's checkpoint folder, with its
    events going to the trial's history; it prunes no published checkpoint (the
    reconciler's GC deletes them, by the experiment's keep policy)."""
    if ctx.spec is None:
        raise DlhpcError("engine_state() needs a dlhpc job (no checkpoint folder outside one)")
    kwargs.setdefault("keep_latest", None)
    kwargs.setdefault("on_event", ctx.log)
    return EngineState(engine, Path(ctx.spec.checkpoint_dir), **kwargs)


def step(ctx: TrialContext, state: EngineState, check_every: int = 1) -> None:
    """Call once per training step on every rank: the DeepSpeed ``ctx.step(state)``.

    Keeps progress fresh; every ``check_every`` steps the ranks agree (one
    all-reduce) whether any was asked to stop, and if so every rank saves (a
    collective checkpoint) and exits with :data:`~dlhpc.protocol.REQUEUE_EXIT_CODE`.
    Deciding together matters: a rank that saw the signal alone would wait in a
    checkpoint the others never join.
    """
    ctx.progress(state.step)
    if state.step % max(1, check_every) == 0 and state.should_stop(ctx):
        if ctx.stop_reason is None:
            ctx.stop_reason = "PEER"  # another rank got the signal first
        ctx.checkpoint(state)
        ctx.exit_for_requeue()
