"""The stand-in for Determined's Core API (``det.get_cluster_info()``, ``det.core.init()``),
on :mod:`dlhpc.harness`.

Mapping (each object has the methods Determined's Core API tutorials call):

* ``get_cluster_info()``: None outside a dlhpc job; in one, ``trial.hparams``,
  ``trial.trial_id``, ``trial.experiment_id``, ``trial.trial_seed``, ``user_data``
  and ``latest_checkpoint`` (the newest *verified* checkpoint's storage id).
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
* ``distributed``: rank and size from the allocation (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK`` ...); its collectives are trivial with one process and use
  ``torch.distributed`` object collectives with more.
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
from dlhpc.integrations.determined import ENV_NESTED, ENV_TIME_METRIC, ENV_UNIT, ENV_USER_DATA
from dlhpc.integrations.determined.checkpoints import CheckpointContext, latest_storage_id
from dlhpc.integrations.determined.distributed import DistributedContext
from dlhpc.protocol import ATTEMPT_DIR_VAR, TRIAL_DIR_VAR

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


class TrialInfo:
    """``info.trial``: this trial's facts."""

    def __init__(self, ctx: TrialContext, user_data: dict[str, Any]) -> None:
        self.trial_id = ctx.trial_id
        self.experiment_id = ctx.experiment_id
        self.trial_seed = ctx.seed
        self.hparams: dict[str, Any] = nest(ctx.hparams, os.environ.get(ENV_NESTED, ""))
        self.user_data = user_data


def nest(hparams: dict[str, Any], roots_json: str) -> dict[str, Any]:
    """``hparams`` with the ``outer.inner`` names of the nested roots (a JSON list, as
    ``dlhpc convert`` writes it) turned back into Determined's nested mappings."""
    roots = set(json.loads(roots_json)) if roots_json else set()
    out: dict[str, Any] = {}
    for name, value in hparams.items():
        parts = name.split(".")
        if len(parts) == 1 or parts[0] not in roots:
            out[name] = value
            continue
        here = out
        for part in parts[:-1]:
            here = here.setdefault(part, {})
        here[parts[-1]] = value
    return out


class ClusterInfo:
    """``det.get_cluster_info()`` inside a dlhpc job."""

    def __init__(self, ctx: TrialContext) -> None:
        raw = os.environ.get(ENV_USER_DATA, "")
        self.user_data: dict[str, Any] = json.loads(raw) if raw else {}
        self.task_type = "TRIAL"
        self.task_id = f"{ctx.experiment_id}.{ctx.trial_id}"
        self.allocation_id = os.environ.get(ATTEMPT_DIR_VAR, "")
        self.container_rank = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
        self.master_url = ""
        self.cluster_id = "dlhpc"
        self._trial = TrialInfo(ctx, self.user_data)
        root = ctx.checkpoint_dir
        self._latest_checkpoint = latest_storage_id(root) if root is not None else None

    @property
    def trial(self) -> TrialInfo:
        return self._trial

    @property
    def latest_checkpoint(self) -> str | None:
        """The storage id of the trial's newest verified checkpoint (None on a first run)."""
        return self._latest_checkpoint


# One TrialContext per process: Determined's API is module functions (get_cluster_info,
# core.init), and two contexts would write the same event stream twice.
_CONTEXT: list[TrialContext] = []


def _context() -> TrialContext:
    """This process's trial context, made on first use (signal handlers installed then)."""
    if not _CONTEXT:
        _CONTEXT.append(harness.init())
    return _CONTEXT[0]


def get_cluster_info() -> ClusterInfo | None:
    """This trial's :class:`ClusterInfo`; None outside a dlhpc job (as Determined off-cluster)."""
    if not os.environ.get(TRIAL_DIR_VAR):
        return None
    return ClusterInfo(_context())


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
            rank=ctx.rank,
            size=ctx.world_size,
            local_rank=ctx.local_rank,
            local_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            cross_rank=int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
            cross_size=int(os.environ.get("NNODES", os.environ.get("SLURM_NNODES", "1"))),
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
        self._ctx.close()


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: Any = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: Any = None,
    async_checkpointing: bool = False,
) -> Context:
    """The Core API context of this dlhpc trial (raises outside a dlhpc job)."""
    if checkpoint_storage is not None:
        warnings.warn(
            "dlhpc: checkpoint_storage is ignored; checkpoints go to the trial's checkpoint.dir",
            stacklevel=2,
        )
    if not os.environ.get(TRIAL_DIR_VAR):
        raise RuntimeError(
            "det.core.init(): dlhpc's determined stand-in runs only inside dlhpc jobs"
            " (DLHPC_TRIAL_DIR unset)"
        )
    return Context(_context(), distributed, preempt_mode)
