"""The stand-in for Determined's Core API (``det.get_cluster_info()``, ``det.core.init()``),
on :mod:`dlhpc.harness`.

Mapping (each object has the methods Determined's Core API tutorials call):

* ``get_cluster_info()``: :mod:`~dlhpc.integrations.determined.cluster` (the trial's
  facts, ``latest_checkpoint``, the container layout).
* ``train.report_training_metrics`` / ``report_validation_metrics`` /
  ``report_metrics``: ``ctx.report(steps_completed, metrics)``; training metrics are
  named ``train_<name>`` (unless they start with ``train``), so a training value never
  counts as the searcher's validation metric. With ``searcher.time_metric``
  (Determined 0.38; env :data:`~dlhpc.integrations.determined.ENV_TIME_METRIC`) a
  validation report carrying it is recorded at that metric's value.
* ``checkpoint``: :class:`~dlhpc.integrations.determined.checkpoints.CheckpointContext`.
* ``preempt.should_preempt()``: ``ctx.should_stop()`` (preemption, time limit, the
  searcher's stop). A script that saw it true and leaves ``with core.init()`` normally
  exits with dlhpc's requeue code, so the trial resumes (or, stopped by the searcher,
  ends ``STOPPED_EARLY``) instead of counting as completed.
* ``searcher.operations()``: one operation whose ``length`` is the trial's grant
  (``ctx.max_length``: the rung's length under ASHA); ``report_completed(value)``
  reports the searcher metric at that length. A promotion is a new job with a longer
  grant that resumes from ``latest_checkpoint``.
* ``distributed``: the ``DistributedContext`` the script passes (required, as in
  Determined, when the trial has several slots or containers); its ranks become the
  process's ``RANK``/``WORLD_SIZE``/... so that only the chief publishes.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from dlhpc import harness
from dlhpc.harness.context import TrialContext
from dlhpc.integrations.determined import ENV_TIME_METRIC, ENV_UNIT
from dlhpc.integrations.determined.checkpoints import CheckpointContext
from dlhpc.integrations.determined.cluster import (
    ENV_CONTAINER_ADDRS,
    ENV_CONTAINER_RANK,
    ClusterInfo,
    TrialInfo,
    container_layout,
    get_cluster_info,
)
from dlhpc.integrations.determined.distributed import DistributedContext

__all__ = [
    "ClusterInfo",
    "Context",
    "DistributedContext",
    "PreemptContext",
    "PreemptMode",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TrainContext",
    "TrialInfo",
    "Unit",
    "get_cluster_info",
    "init",
]

logger = logging.getLogger("determined.core")


class Unit(enum.Enum):
    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class PreemptMode(enum.Enum):
    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    ExplicitMode = "EXPLICIT_MODE"


class SearcherMode(enum.Enum):
    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHEIF_ONLY"  # sic, as Determined spells it


# One TrialContext per process: Determined's API is module functions (core.init), and
# two contexts would write the same event stream twice.
_CONTEXT: list[TrialContext] = []


def _context() -> TrialContext:
    """This process's trial context, made on first use (signal handlers installed then)."""
    if not _CONTEXT:
        _CONTEXT.append(harness.init())
    return _CONTEXT[0]


def _adopt_ranks(distributed: DistributedContext) -> None:
    """Make ``distributed``'s ranks this process's (``RANK``, ``WORLD_SIZE``, ...), so that
    the trial context it is about to get (which reads them) publishes from the chief only:
    workers a script starts itself inherit their launcher's. The container's own rank and
    addresses are pinned first, so ``get_cluster_info()`` keeps reporting them."""
    if not os.environ.get(ENV_CONTAINER_RANK):
        rank, addrs = container_layout(os.environ)
        os.environ[ENV_CONTAINER_RANK] = str(rank)
        os.environ[ENV_CONTAINER_ADDRS] = json.dumps(addrs)
    os.environ.update(
        RANK=str(distributed.rank),
        WORLD_SIZE=str(distributed.size),
        LOCAL_RANK=str(distributed.local_rank),
        LOCAL_WORLD_SIZE=str(distributed.local_size),
    )


class TrainContext:
    """``core_context.train``: metrics and progress."""

    def __init__(self, ctx: TrialContext, steps: list[int]) -> None:
        self._ctx = ctx
        self._steps = steps
        self._time_metric = os.environ.get(ENV_TIME_METRIC) or None

    def _report(self, steps_completed: int, metrics: dict[str, Any]) -> None:
        numbers = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        skipped = sorted(set(metrics) - set(numbers))
        if skipped:
            logger.warning(f"dlhpc keeps numeric metrics only; not recorded: {skipped}")
        self._steps[0] = max(self._steps[0], steps_completed)
        self._ctx.report(steps_completed, numbers)

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        """Record training metrics at ``steps_completed``, each as ``train_<name>``
        (kept as is when it starts with ``train``): Determined keeps training and
        validation metrics apart, dlhpc has one namespace (the searcher reads validation)."""
        named = {(k if k.startswith("train") else f"train_{k}"): v for k, v in metrics.items()}
        self._report(steps_completed, named)

    def report_validation_metrics(self, steps_completed: int, metrics: dict[str, Any]) -> None:
        """Record validation metrics: at ``metrics[time_metric]`` where the experiment
        names a time metric and it is there, else at ``steps_completed``."""
        step = steps_completed
        if self._time_metric is not None and _is_number(metrics.get(self._time_metric)):
            step = int(metrics[self._time_metric])
        self._report(step, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: dict[str, Any]) -> None:
        if group == "validation":
            self.report_validation_metrics(steps_completed, metrics)
        elif group == "training":
            self.report_training_metrics(steps_completed, metrics)
        else:
            self._report(steps_completed, {f"{group}_{k}": v for k, v in metrics.items()})

    def report_progress(self, progress: float) -> None:
        """Accepted; dlhpc derives progress from the reported steps."""

    def report_early_exit(self, reason: Any) -> None:
        self._ctx.log("warning", f"the script reported an early exit: {reason}")

    def set_status(self, status: str) -> None:
        self._ctx.log("info", f"status: {status}")

    def get_experiment_best_validation(self) -> float | None:
        return None  # a job never reads the database

    def upload_tensorboard_files(self, *args: Any, **kwargs: Any) -> None:
        pass


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class PreemptContext:
    """``core_context.preempt``: the stop request, from ``ctx.should_stop()``.

    With several processes and ``PreemptMode.WorkersAskChief`` (Determined's default)
    every rank gets the chief's answer (a broadcast, so every rank must call
    :meth:`should_preempt` together, as in Determined): ranks never disagree about
    stopping because one saw the stop file a moment before another."""

    def __init__(self, ctx: TrialContext, dist: DistributedContext, mode: PreemptMode) -> None:
        self._ctx = ctx
        self._dist = dist
        self._mode = PreemptMode(mode)
        self.seen = False

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True once the trial must stop (preemption, time limit, searcher's stop)."""
        stop = self.seen or self._ctx.should_stop()
        if self._dist.size > 1 and self._mode == PreemptMode.WorkersAskChief:
            stop = bool(self._dist.broadcast(stop))
        self.seen = self.seen or stop
        return self.seen

    def acknowledge_preemption_signal(self) -> None:
        pass

    def close(self) -> None:
        pass


class SearcherOperation:
    """One train-then-validate cycle of ``length`` units: the trial's grant."""

    def __init__(self, ctx: TrialContext, length: int, is_chief: bool) -> None:
        self._ctx = ctx
        self._length = length
        self._is_chief = is_chief
        self._completed = False

    @property
    def length(self) -> int:
        return self._length

    def report_progress(self, length: float) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_progress() from the chief worker")
        self._ctx.progress(int(length))

    def report_completed(self, searcher_metric: Any) -> None:
        """Record ``searcher_metric`` as the searcher's metric at this operation's length."""
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_completed() from the chief worker")
        if self._completed:
            raise RuntimeError("you may only call op.report_completed() once")
        self._completed = True
        if self._ctx.spec is not None:
            self._ctx.report(self._length, {self._ctx.spec.metric: float(searcher_metric)})


class SearcherContext:
    """``core_context.searcher``: one operation per job, of the grant's length."""

    def __init__(self, ctx: TrialContext) -> None:
        self._ctx = ctx

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        op = SearcherOperation(self._ctx, self._ctx.max_length, self._ctx.rank == 0)
        yield op
        if self._ctx.rank == 0 and not op._completed:
            raise RuntimeError("you must call op.report_completed() on each operation")

    def acknowledge_out_of_ops(self) -> None:
        pass

    def get_configured_units(self) -> Unit | None:
        unit = os.environ.get(ENV_UNIT, "").upper()
        return Unit(unit) if unit in Unit.__members__ else None


class Context:
    """``core_context``: what ``with det.core.init() as core_context`` gives."""

    def __init__(
        self,
        ctx: TrialContext,
        distributed: DistributedContext | None,
        preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    ) -> None:
        root = ctx.checkpoint_dir
        if root is None:
            raise RuntimeError("dlhpc's determined stand-in runs only inside dlhpc jobs")
        steps = [0]
        self._ctx = ctx
        self.distributed = distributed or DistributedContext(
            rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1
        )
        self.train = TrainContext(ctx, steps)
        self.checkpoint = CheckpointContext(ctx, Path(root), steps)
        self.preempt = PreemptContext(ctx, self.distributed, preempt_mode)
        self.searcher = SearcherContext(ctx)

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        if exc_type is None and self.preempt.seen:
            self._ctx.log("info", f"stopped ({self._ctx.stop_reason}): exiting for requeue")
            self._ctx.exit_for_requeue()

    def close(self) -> None:
        self.distributed.close()
        self._ctx.close()


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: Any = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: Any = None,
    async_checkpointing: bool = False,
) -> Context:
    """The Core API context of this dlhpc trial (raises outside a dlhpc job). As in
    Determined, a trial of several slots or containers needs ``distributed`` (ValueError
    without it); its ranks become this process's (:func:`_adopt_ranks`)."""
    if checkpoint_storage is not None:
        warnings.warn(
            "dlhpc: checkpoint_storage is ignored; checkpoints go to the trial's checkpoint.dir",
            stacklevel=2,
        )
    info = get_cluster_info()
    if info is None:
        raise RuntimeError(
            "det.core.init(): dlhpc's determined stand-in runs only inside dlhpc jobs"
            " (DLHPC_TRIAL_DIR unset)"
        )
    if distributed is None:
        if len(info.container_addrs) > 1 or len(info.slot_ids) > 1:
            raise ValueError("you must provide a valid DistributedContext for a multi-slot task")
    else:
        _adopt_ranks(distributed)
    return Context(_context(), distributed, preempt_mode)
