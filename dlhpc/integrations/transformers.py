"""Hugging Face ``Trainer`` under dlhpc: one ``TrainerCallback`` and the
``TrainingArguments`` fields dlhpc owns.

The lines a Trainer script adds (``templates/examples/hf-trainer/``), for a script
that already resumes the usual way, as Hugging Face's example scripts do::

    from dlhpc.integrations.transformers import DlhpcCallback, hparams
    args = hparams(parse_args())             # the trial's values (and seed) over the defaults
    trainer = Trainer(..., callbacks=[DlhpcCallback()])

A script that calls ``trainer.train()`` bare adds a fourth: the Trainer resumes only
from the checkpoint ``train()`` is given (``TrainingArguments.resume_from_checkpoint``
is not read by the Trainer itself, and no public Trainer API lets a callback load one)::

    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)

:func:`training_args` sets the fields dlhpc owns; :class:`DlhpcCallback` applies it
to the Trainer's own arguments when the Trainer is built (``on_init_end``), so the
script needs no line for it (calling it by hand on the ``TrainingArguments``
first is the same):

* ``output_dir``: ``<trial checkpoint folder>/hf-output``, where the Trainer
  writes each ``checkpoint-<step>`` before the callback publishes it;
* ``num_train_epochs`` (``unit="epochs"``, the default) or ``max_steps``
  (``unit="steps"``) = the trial's grant (``max_length``);
* ``save_strategy`` = the unit (a save at each epoch end, or at the grant's end
  and every ``save_steps``), ``save_total_limit`` = None (dlhpc's GC deletes);
* ``resume_from_checkpoint`` = the newest *verified* dlhpc checkpoint folder (or
  None on a first run).

When training begins the callback tells dlhpc the step it starts from
(:meth:`~dlhpc.harness.context.TrialContext.training_started`) and prints
``resumed at step N from ckpt-...`` only when the Trainer did resume. A Trainer that
starts below the newest checkpoint (``train()`` not given it) gets a warning in the
trial's log naming the line to add, and the steps it trains again count as lost in
``dlhpc status``.

What the callback does in a dlhpc job:

* **Checkpoints.** Each folder the Trainer saves (weights, optimizer, scheduler,
  scaler, RNG states, ``trainer_state.json``: Hugging Face's own format) is moved,
  file by file, into a dlhpc checkpoint folder (``ckpt-<global_step>``: atomic,
  sha256 manifest) and registered with the reconciler. The Trainer resumes from
  it as from its own (``MANIFEST.json`` beside its files is ignored); a torn save
  is never published. Why Hugging Face's format: the Trainer's resume (loading
  each part, skipping the batches already trained in the epoch, RNG states)
  works only from it.
* **Metrics.** ``on_log`` values (``loss``, ``learning_rate``...) and
  ``on_evaluate`` metrics (``eval_loss``, ``eval_<name>`` from ``compute_metrics``)
  are reported under their names at each evaluation, step = epochs done
  (``round(state.epoch)``) or ``global_step`` (``unit="steps"``); a save with no
  evaluation since reports the logged values alone.
* **Stopping.** A preemption (TERM), time limit (USR2) or the searcher's stop
  is seen at the next step end (all ranks agree through one all-reduce): the
  callback sets ``control.should_save`` and ``control.should_training_stop``;
  once the Trainer's save is published it exits with code 75 for requeue. Seen
  at an epoch's last step, the save waits for the epoch's end (its log and
  evaluation first, as in an uninterrupted run): the evaluation draws from the
  RNG, whose state the checkpoint holds and a resume at an epoch start restores.

Outside a dlhpc job the callback only prints the metrics it would report and
changes no argument. ``load_best_model_at_end`` is refused (the best folder is
moved away from where the Trainer looks for it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlhpc.errors import DlhpcError
from dlhpc.integrations._common import destroy_process_group_at_exit, hparams, require
from dlhpc.protocol.checkpoint import Checkpoint, latest_verified, prune, publish_checkpoint

require("transformers", __name__)
# after the check, so that a missing extra is the error shown
from transformers import TrainerCallback, TrainingArguments  # noqa: E402
from transformers.trainer_utils import SaveStrategy  # noqa: E402

import dlhpc  # noqa: E402

if TYPE_CHECKING:
    from dlhpc.harness.context import TrialContext

__all__ = ["OUTPUT_SUBDIR", "DlhpcCallback", "hparams", "training_args"]

OUTPUT_SUBDIR = "hf-output"
_UNITS = ("epochs", "steps")
_SKIP = {"epoch", "total_flos"}  # log fields that are no metrics


def training_args(
    args: TrainingArguments, unit: str = "epochs", ctx: TrialContext | None = None
) -> TrainingArguments:
    """Set, in place, the fields dlhpc owns (module docstring); returns ``args``.

    Outside a dlhpc job (``ctx.spec`` None) nothing changes. Torn ``checkpoint-*``
    folders a killed attempt left in ``output_dir`` are removed.
    """
    if unit not in _UNITS:
        raise DlhpcError(f"training_args(unit={unit!r}): one of {', '.join(_UNITS)}")
    _own_fields(args, unit, ctx if ctx is not None else dlhpc.init(local_hparams={}))
    return args


def _own_fields(args: TrainingArguments, unit: str, ctx: TrialContext) -> Checkpoint | None:
    """:func:`training_args`' work; returns the checkpoint to resume from (None: none)."""
    if ctx.spec is None:
        return None
    if args.load_best_model_at_end:
        raise DlhpcError(
            "TrainingArguments.load_best_model_at_end is not supported under dlhpc: "
            "checkpoints move into dlhpc's folders (keep the best with checkpoint.keep_best)"
        )
    root = Path(ctx.spec.checkpoint_dir)
    output = root / OUTPUT_SUBDIR
    if ctx.rank == 0 and output.is_dir():
        for stale in output.glob("checkpoint-*"):  # a save that never got published
            shutil.rmtree(stale, ignore_errors=True)
    args.output_dir = str(output)
    if unit == "epochs":
        args.num_train_epochs, args.max_steps = float(ctx.max_length), -1
        args.save_strategy = SaveStrategy.EPOCH
    else:
        args.max_steps = ctx.max_length
        args.save_strategy = SaveStrategy.STEPS
    args.save_total_limit = None
    ckpt, torn = latest_verified(root, verify_hashes=True)
    for t in torn:
        ctx.log("warning", f"skipped torn checkpoint {t.path}: {t.reason}")
    args.resume_from_checkpoint = str(ckpt.path) if ckpt is not None else None
    return ckpt


class _Publish:
    """A :class:`~dlhpc.harness.context.Saveable`: moves the Trainer's
    ``checkpoint-<step>`` folder into a new dlhpc checkpoint (rank 0)."""

    def __init__(self, source: Path, root: Path, step: int, epoch: float | None) -> None:
        self.source, self.root, self.step, self.epoch = source, root, step, epoch

    def save(self) -> Checkpoint | None:
        def move(folder: Path) -> None:
            for entry in os.listdir(self.source):
                os.replace(self.source / entry, folder / entry)

        meta = {"step": self.step, "epoch": self.epoch, "format": "transformers"}
        ckpt = publish_checkpoint(self.root, self.step, move, meta)
        shutil.rmtree(self.source, ignore_errors=True)
        prune(self.root, None, {ckpt.path.name}, verify_hashes=False)
        return ckpt


class DlhpcCallback(TrainerCallback):
    """Owns the arguments, reports metrics, publishes checkpoints and stops for
    dlhpc (module docstring). ``unit``: what the searcher's ``max_length`` counts,
    ``"epochs"`` (default) or ``"steps"`` (``global_step``). One per process."""

    def __init__(self, unit: str = "epochs", ctx: TrialContext | None = None) -> None:
        if unit not in _UNITS:
            raise DlhpcError(f"DlhpcCallback(unit={unit!r}): one of {', '.join(_UNITS)}")
        self.unit = unit
        self.ctx = ctx if ctx is not None else dlhpc.init(local_hparams={})
        self._logged: dict[str, float] = {}
        self._reported: int | None = None
        self._stopping = False
        self._resume: Checkpoint | None = None

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._resume = _own_fields(args, self.unit, self.ctx)
        # also at world size 1: the Trainer starts a gloo group whenever LOCAL_RANK is
        # set, as dlhpc's worker sets it in every job
        destroy_process_group_at_exit()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Says whether the Trainer resumed: its ``global_step`` is where it starts."""
        start, ckpt = int(state.global_step), self._resume
        self.ctx.training_started(start)
        if ckpt is None or start >= ckpt.step:
            if start > 0:
                source = f" from {ckpt.path.name}" if ckpt and ckpt.step == start else ""
                print(f"resumed at step {start}{source}", flush=True)
            return
        self.ctx.log(
            "warning",
            f"the Trainer started at step {start}, not from checkpoint {ckpt.path.name} "
            f"(step {ckpt.step}): its {ckpt.step - start} steps are trained again and "
            "count as lost. trainer.train() resumes only from the checkpoint it is given: "
            "call trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)",
        )

    # -- metrics -------------------------------------------------------------

    def _step(self, state: Any) -> int:
        return int(round(state.epoch or 0)) if self.unit == "epochs" else int(state.global_step)

    def _report(self, state: Any, metrics: dict[str, float]) -> None:
        self._reported = self._step(state)
        self.ctx.report(self._reported, metrics)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        for name, value in (logs or {}).items():
            if name not in _SKIP and isinstance(value, int | float):
                self._logged[str(name)] = float(value)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Any = None, **kw: Any
    ) -> None:
        clean = {
            str(k): float(v)
            for k, v in (metrics or {}).items()
            if k not in _SKIP and isinstance(v, int | float)
        }
        self._report(state, {**self._logged, **clean})

    # -- stopping and checkpoints --------------------------------------------

    def _stop_agreed(self, args: Any) -> bool:
        local = self.ctx.should_stop()
        if args.world_size <= 1:
            return local
        import torch
        import torch.distributed as dist

        flag = torch.tensor([int(local)], device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = bool(flag.item())
        if agreed and not local:
            self.ctx.stop_reason = "PEER"
        return agreed

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ctx.progress(int(state.global_step))
        if not self._stopping and self._stop_agreed(args):
            self._stopping = True
            control.should_training_stop = True
            # the epoch's last step (state.epoch whole): saved at the epoch end (on_epoch_end)
            if not float(state.epoch or 0).is_integer():
                control.should_save = True

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stopping:  # after the epoch's log and evaluation, as without the stop
            control.should_save = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        spec = self.ctx.spec
        if spec is None:
            return
        if self._logged and self._reported != self._step(state) and not self._stopping:
            self._report(state, dict(self._logged))  # a save with no evaluation since
        source = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if args.world_size > 1:  # every rank has written its part (rng_state_<rank>.pth)
            import torch.distributed as dist

            dist.barrier()
        if state.is_world_process_zero:
            root = Path(spec.checkpoint_dir)
            self.ctx.checkpoint(_Publish(source, root, int(state.global_step), state.epoch))
        if self._stopping:
            self.ctx.exit_for_requeue()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stopping:  # the save did not happen (no save strategy): still requeue
            self.ctx.exit_for_requeue()
        self.ctx.flush()
