"""PyTorch Lightning under dlhpc: one callback, one helper for the hyperparameters.

The lines a Lightning script adds (``templates/examples/lightning/``)::

    from dlhpc.integrations.lightning import DlhpcCallback, hparams
    args = hparams(parse_args())             # the trial's values (and seed) over the defaults
    trainer = L.Trainer(..., callbacks=[DlhpcCallback()])

What :class:`DlhpcCallback` does inside a dlhpc job:

* **Length.** ``max_epochs`` (``unit="epochs"``, the default) or ``max_steps``
  (``unit="steps"``) becomes the trial's grant, ``ctx.max_length``: an ASHA rung
  ends the fit normally and a promotion resumes it.
* **Metrics.** Every scalar in ``trainer.callback_metrics`` (what ``self.log``
  logged, under its name) is reported at each epoch end, step = epochs done
  (``unit="steps"``: at each validation end, step = ``global_step``).
* **Checkpoints.** At each epoch end (and, with ``unit="steps"``, when the fit
  ends) Lightning's own checkpoint (``trainer.save_checkpoint``'s content:
  weights, optimizers, LR schedulers, AMP scaler, loop progress, callbacks'
  and datamodule's states, plus this callback's RNG snapshot) is published as
  ``lightning.ckpt`` in a dlhpc checkpoint folder (atomic, sha256 manifest) and
  registered with the reconciler. Why Lightning's format rather than a
  :class:`~dlhpc.harness.state.TrainState`: only Lightning knows how to put its
  loop progress back, and it restores each part at the right moment of ``fit``
  (optimizers after the strategy set them up); the file also stays loadable by
  ``Model.load_from_checkpoint``. On start the newest *verified* folder is
  handed to Lightning's own restore (torn folders are skipped and logged).
* **Stopping.** A preemption (TERM), time limit (USR2) or the searcher's stop
  is seen at the next batch end (every rank agrees through one all-reduce) and
  at each epoch end: the trial saves and exits with code 75 for requeue. A stop
  in the middle of an epoch saves there only if the train dataloader is
  resumable (``state_dict``/``load_state_dict``, e.g. torchdata's
  ``StatefulDataLoader``); otherwise the next attempt resumes from the last
  epoch-end checkpoint and trains that epoch again, which is bitwise the same
  as an uninterrupted run, where a mid-epoch resume of a plain ``DataLoader``
  would not be (Lightning restarts its iterator: other samples, fewer batches).
* **Signals.** Lightning replaces SIGTERM (its notifier, which also broadcasts
  inside the signal handler) and, under Slurm, SIGUSR1 (auto-requeue:
  ``scontrol requeue`` and ``hpc_ckpt_*.ckpt``). Once training starts the
  callback puts back the handlers the process had before ``fit`` (dlhpc's), so
  only dlhpc requeues; Lightning's handlers are gone for good at its teardown.
* **Ranks.** Lightning's cluster environment reads the ranks of the allocation
  (Slurm's ``SLURM_PROCID``...; dlhpc sets ``MASTER_ADDR``/``MASTER_PORT``,
  which it honours). Only rank 0 writes checkpoints and metrics. The Trainer's
  ``devices`` x ``num_nodes`` must be the job's rank count (``WORLD_SIZE``):
  ``setup`` refuses any other (a 1-process Trainer in a 2-task job would train the
  trial twice, each process as rank 0, both writing the same checkpoints). Sharded
  strategies (FSDP, DeepSpeed) are not supported by this callback.

Outside a dlhpc job it only prints the metrics it would report.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlhpc.errors import DlhpcError
from dlhpc.integrations._common import destroy_process_group_at_exit, hparams, require
from dlhpc.protocol.checkpoint import Checkpoint, latest_verified, prune, publish_checkpoint

require("lightning.pytorch", __name__)
# after the check, so that a missing extra is the error shown
from lightning.pytorch import Callback  # noqa: E402
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402

import dlhpc  # noqa: E402
from dlhpc.harness.state import rng_state, set_rng_state  # noqa: E402

if TYPE_CHECKING:
    from dlhpc.harness.context import TrialContext

__all__ = ["CKPT_FILE", "DlhpcCallback", "hparams"]

CKPT_FILE = "lightning.ckpt"
_UNITS = ("epochs", "steps")
_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class _Save:
    """A :class:`~dlhpc.harness.context.Saveable`: Lightning's checkpoint dict,
    published by rank 0 as a dlhpc checkpoint folder (every rank must call save)."""

    def __init__(self, trainer: Any, checkpoint_dir: Path) -> None:
        self.trainer = trainer
        self.checkpoint_dir = checkpoint_dir
        self.step = int(trainer.global_step)

    def save(self) -> Checkpoint | None:
        trainer = self.trainer
        content = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        ckpt = None
        if trainer.is_global_zero:
            done = int(trainer.fit_loop.epoch_progress.current.processed)  # epochs trained
            meta = {"epoch": done, "step": self.step, "format": "lightning"}

            def write(folder: Path) -> None:
                trainer.strategy.checkpoint_io.save_checkpoint(content, folder / CKPT_FILE)

            ckpt = publish_checkpoint(self.checkpoint_dir, self.step, write, meta)
            prune(self.checkpoint_dir, None, {ckpt.path.name}, verify_hashes=False)
        trainer.strategy.barrier("dlhpc.checkpoint")
        return ckpt


class DlhpcCallback(Callback):
    """Reports metrics, checkpoints and resumes, and stops for dlhpc (module docstring).

    ``unit``: what the searcher's ``max_length`` counts, ``"epochs"`` (default)
    or ``"steps"`` (optimizer steps, ``trainer.global_step``). ``ctx``: the
    trial context, by default ``dlhpc.init()`` (outside a job: a local one that
    prints). One callback per process: it owns the process's trial context.
    """

    def __init__(self, unit: str = "epochs", ctx: TrialContext | None = None) -> None:
        if unit not in _UNITS:
            raise DlhpcError(f"DlhpcCallback(unit={unit!r}): one of {', '.join(_UNITS)}")
        self.unit = unit
        self.ctx = ctx if ctx is not None else dlhpc.init(local_hparams={})
        self.restored_from: Checkpoint | None = None
        self._handlers: dict[int, Any] = {}
        self._rng: dict[str, Any] | None = None
        self._saved_step: int | None = None

    # -- setup and resume ----------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        _check_world(trainer, self.ctx)
        destroy_process_group_at_exit()  # a no-op at exit when no group was started
        if threading.current_thread() is threading.main_thread():
            self._handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        ctx = self.ctx
        if ctx.spec is None:
            return
        if self.unit == "epochs":
            trainer.fit_loop.max_epochs = ctx.max_length
        else:
            trainer.fit_loop.epoch_loop.max_steps = ctx.max_length
        self._resume(trainer, Path(ctx.spec.checkpoint_dir))

    def _resume(self, trainer: Any, checkpoint_dir: Path) -> None:
        ckpt, torn = latest_verified(checkpoint_dir, verify_hashes=True)
        for t in torn:
            self.ctx.log("warning", f"skipped torn checkpoint {t.path}: {t.reason}")
        if ckpt is None:
            return
        if CKPT_FILE not in ckpt.files:
            raise DlhpcError(f"{ckpt.path} has no {CKPT_FILE}: not a checkpoint of this callback")
        # Lightning's own restore then runs from this loaded content: the model,
        # datamodule and callbacks after setup, optimizers and loops after the
        # strategy's setup. weights_only=False: the RNG states are numpy/python
        # objects; the file's sha256 was just checked against its manifest.
        trainer._checkpoint_connector.resume_start(ckpt.path / CKPT_FILE, weights_only=False)
        self.restored_from = ckpt
        self._saved_step = ckpt.step
        epoch = ckpt.metadata.get("epoch")
        self.ctx.log("info", f"restored {ckpt.path.name} (epoch {epoch}, step {ckpt.step})")
        print(f"resumed at epoch {epoch}, step {ckpt.step}", flush=True)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Restored before fit draws anything: the train iterator is created after.
        set_rng_state(state_dict["rng"])

    # -- signals -------------------------------------------------------------

    def _own_signals(self) -> None:
        """Put back the pre-fit handlers Lightning replaced (TERM, and USR1 under Slurm)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._own_signals()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._own_signals()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # Lightning raises SIGTERMException (exit code 0) if TERM came while its own
        # handler was installed (before training started): exit for requeue instead.
        if isinstance(exception, SIGTERMException):
            if self.ctx.stop_reason is None:
                self.ctx.stop_reason = "TERM"
            self.ctx.exit_for_requeue()

    # -- the loop ------------------------------------------------------------

    def _stop_agreed(self, trainer: Any) -> bool:
        """Whether any rank was asked to stop (one all-reduce when there are several)."""
        local = self.ctx.should_stop()
        if trainer.world_size <= 1:
            return local
        agreed = bool(trainer.strategy.reduce_boolean_decision(local, all=False))
        if agreed and not local:
            self.ctx.stop_reason = "PEER"
        return agreed

    def _checkpoint(self, trainer: Any) -> None:
        spec = self.ctx.spec
        if spec is None or self._saved_step == trainer.global_step:
            return
        self.ctx.checkpoint(_Save(trainer, Path(spec.checkpoint_dir)))
        self._saved_step = int(trainer.global_step)

    def _metrics(self, trainer: Any) -> dict[str, float]:
        out = {}
        for name, value in trainer.callback_metrics.items():
            if getattr(value, "numel", lambda: 1)() == 1:
                out[str(name)] = float(value)
        return out

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.ctx.progress(int(trainer.global_step))
        if not self._stop_agreed(trainer):
            return
        if self.unit == "steps" or _resumable(trainer):
            self._checkpoint(trainer)
        else:
            self.ctx.log(
                "info",
                f"stopping in epoch {trainer.current_epoch} after batch {batch_idx + 1}; its train "
                "dataloader is not resumable, so the next attempt resumes from the last epoch-end "
                "checkpoint and trains this epoch again (bitwise as an uninterrupted run)",
            )
        self.ctx.exit_for_requeue()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.unit == "steps" and not trainer.sanity_checking:
            self.ctx.report(int(trainer.global_step), self._metrics(trainer))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.unit == "epochs":
            self.ctx.report(int(trainer.current_epoch) + 1, self._metrics(trainer))
        self._checkpoint(trainer)
        if self._stop_agreed(trainer):
            self.ctx.exit_for_requeue()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.unit == "steps":
            self._checkpoint(trainer)  # the grant may end mid-epoch
        self.ctx.flush()


def _check_world(trainer: Any, ctx: TrialContext) -> None:
    """Refuse a Trainer whose process count is not the job's rank count (``WORLD_SIZE``,
    from the allocation): its ranks would each train the trial alone, all as rank 0,
    writing and resuming the same checkpoints. Outside a dlhpc job: no check."""
    if ctx.spec is None or trainer.world_size == ctx.world_size:
        return
    raise DlhpcError(
        f"DlhpcCallback: this job runs {ctx.world_size} ranks (resources: nodes x "
        f"tasks_per_node) but the Trainer has {trainer.world_size} process(es); give it "
        "devices=int(os.environ['LOCAL_WORLD_SIZE']), num_nodes=int(os.environ['WORLD_SIZE']) "
        "// int(os.environ['LOCAL_WORLD_SIZE']) and strategy='ddp', or ask for one task"
    )


def _resumable(trainer: Any) -> bool:
    """Whether every train dataloader can save and restore its position."""
    loader = trainer.fit_loop._combined_loader
    if loader is None:
        return False
    return all(
        callable(getattr(dl, "state_dict", None)) and callable(getattr(dl, "load_state_dict", None))
        for dl in loader.flattened
    )
