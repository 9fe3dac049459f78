"""The trial's context in a training script's process: facts, ``report``, stops,
checkpoints (:class:`TrialContext`; :func:`dlhpc.init` in :mod:`.entry` makes it).

Runs on compute nodes: it never opens the database, only writes event files
through :mod:`dlhpc.protocol`. Importing it costs no torch import.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from dlhpc.errors import DlhpcError
from dlhpc.harness._progress import Progress
from dlhpc.harness._publisher import BackgroundPublisher
from dlhpc.harness._watchdog import STOP_FILE_EVERY_S, STOP_SIGNALS, StopWatch, StopWatchdog
from dlhpc.protocol import REQUEUE_EXIT_CODE, EventWriter, TrialSpec, stop_requested
from dlhpc.scheduler.environment import JobEnvironment
from dlhpc.scheduler.plugins import BackendTable

if TYPE_CHECKING:
    from dlhpc.harness.state import TrainState
    from dlhpc.protocol.checkpoint import Checkpoint

__all__ = ["POLL_GRACE_S", "Saveable", "TrialContext"]

_STOP_SIGNALS = STOP_SIGNALS  # preemption, time limit (USR1 is NCCL's)
_STOP_FILE_EVERY_S = STOP_FILE_EVERY_S  # how often should_stop() looks for the stop file
_monotonic, _time_ns = time.monotonic, time.time_ns  # bound once: report() reads both per call
POLL_GRACE_S = 5.0  # a script that does not poll within this after a stop request is ended


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def _job_environment() -> JobEnvironment:
    """This process's job environment; outside any backend's job, one process here."""
    try:
        return BackendTable().job_environment(os.environ)
    except DlhpcError:
        return JobEnvironment(os.environ)


class Saveable(Protocol):
    """What :meth:`TrialContext.checkpoint` saves: a TrainState, or the DeepSpeed
    equivalent (:class:`dlhpc.harness.deepspeed.EngineState`)."""

    step: int

    def save(self) -> Checkpoint | None: ...


class TrialContext:
    """Facts about the running trial, metric reporting, and preemption handling.

    ``report`` buffers: records are handed to a background thread, which
    publishes them (atomically, in order) when ``flush_every`` are pending or
    ``flush_interval_s`` has passed; :meth:`flush`, :meth:`checkpoint`,
    :meth:`close`, the stop and the interpreter's exit return only once all
    are published. So it is cheap to call every step (a file of up to
    ``flush_every`` records spreads its write, fsync and rename over them;
    ``flush_interval_s`` still bounds how long a result waits for the
    reconciler). Only rank 0 publishes;
    other ranks' reports are dropped, so every rank may call it unconditionally.

    A SIGTERM (preemption) or SIGUSR2 (time limit near) makes :meth:`should_stop`
    true; :meth:`step` then checkpoints the given state and exits with
    :data:`~dlhpc.protocol.REQUEUE_EXIT_CODE` so the job is requeued and resumes.
    So does the searcher's decision to stop the trial early (the reconciler
    writes :data:`~dlhpc.protocol.STOP_FILE` into the trial folder; it is looked
    for every couple of seconds), after which the trial is not run again.

    A script that does not poll (never calls :meth:`step` or :meth:`should_stop`)
    is not trapped: ``poll_grace_s`` after a stop request it has not seen (or
    twice the longest gap between its polls so far, if longer), a watchdog
    thread logs why, publishes the records and ends the process with the same
    exit code (see :mod:`dlhpc.harness._watchdog`), unless something replaced
    this context's SIGTERM handler since. ``poll_grace_s=None`` turns it off.
    """

    def __init__(
        self,
        spec: TrialSpec | None,
        attempt_dir: Path | None,
        hparams: dict[str, Any],
        flush_every: int = 10_000,
        flush_interval_s: float = 30.0,
        trial_dir: Path | None = None,
        poll_grace_s: float | None = POLL_GRACE_S,
    ) -> None:
        self.spec = spec
        self.hparams: dict[str, Any] = dict(hparams)
        job = _job_environment()  # torch's variables win over the scheduler's
        self.rank = _int_env("RANK", default=job.rank)
        self.local_rank = _int_env("LOCAL_RANK", default=job.local_rank)
        self.world_size = _int_env("WORLD_SIZE", default=job.world_size)
        self.flush_every = max(1, flush_every)
        self.flush_interval_s = flush_interval_s
        self.attempt_dir = attempt_dir
        self._writer: BackgroundPublisher | None = None
        self._rows: list[Any] = []  # the publisher's buffer (report() appends its rows)
        self._flush_due = _monotonic() + flush_interval_s  # hand the buffer over by then
        self._progress = Progress(attempt_dir if self.rank == 0 else None)
        # the searcher metric's name (None: no trial), looked up by report() every step
        self._metric = spec.metric if spec is not None else None
        # (step, metrics) of the newest report holding it since the last checkpoint: kept
        # as reported, its value taken out at the checkpoint (every step, the hot path)
        self._evaluated: tuple[int, dict[str, float]] | None = None
        self._trial_dir = trial_dir
        self._last_stop_check = time.monotonic()
        self._watch = StopWatch()
        self._owner = threading.get_ident()  # the thread that created it, reports and flushes
        self._watchdog: StopWatchdog | None = None
        if attempt_dir is not None and self.rank == 0:
            self._writer = BackgroundPublisher(EventWriter(attempt_dir, f"user-r{self.rank}"))
            self._rows = self._writer.rows
            self._writer.start()
        if spec is not None and poll_grace_s is not None:
            self._watchdog = StopWatchdog(self, self._watch, trial_dir, poll_grace_s)
        self._installed = spec is not None and threading.current_thread() is threading.main_thread()
        if self._installed:
            for sig in _STOP_SIGNALS:
                signal.signal(sig, self._on_signal)
            if self._watchdog is not None:
                self._watchdog.install_wakeup_fd()
        if self._watchdog is not None:
            self._watchdog.start()
        if self._writer is not None:
            atexit.register(self.flush)  # a script that forgets close() keeps its metrics

    # -- facts -------------------------------------------------------------

    @property
    def trial_id(self) -> int | None:
        return self.spec.trial_id if self.spec else None

    @property
    def experiment_id(self) -> int | None:
        return self.spec.experiment_id if self.spec else None

    @property
    def max_length(self) -> int:
        """How many resource units (e.g. epochs) this trial may train for."""
        return self.spec.max_length if self.spec else int(self.hparams.get("max_length", 1))

    @property
    def seed(self) -> int:
        return self.spec.seed if self.spec else 0

    @property
    def deterministic(self) -> bool:
        """``reproducibility.deterministic``. When true, :func:`dlhpc.init` has already set
        PyTorch's switches if torch was imported before it (else call
        :meth:`make_deterministic` after importing torch)."""
        return bool(self.spec and self.spec.deterministic)

    def make_deterministic(self) -> None:
        """PyTorch's deterministic algorithms on, cuDNN benchmark and TF32 off
        (imports torch; see :mod:`dlhpc.repro._determinism`)."""
        from dlhpc.repro.job import set_torch_deterministic

        set_torch_deterministic(import_torch=True)

    # ``DataLoader(..., worker_init_fn=ctx.seed_worker, generator=ctx.dataloader_generator())``
    # makes the loader's shuffling and its workers' random/NumPy streams follow the seed.
    # A plain function (not a bound method), so spawned workers can pickle it.
    @staticmethod
    def seed_worker(worker_id: int) -> None:
        from dlhpc.repro.job import seed_worker

        seed_worker(worker_id)

    def dataloader_generator(self, offset: int = 0) -> Any:
        """A ``torch.Generator`` seeded with ``seed + offset`` (imports torch)."""
        from dlhpc.repro.job import dataloader_generator

        return dataloader_generator(self.seed + offset)

    @property
    def checkpoint_dir(self) -> Path | None:
        return Path(self.spec.checkpoint_dir) if self.spec else None

    # -- metrics -------------------------------------------------------------

    def report(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at ``step`` (the resource unit count, e.g. epoch)."""
        # the hot path (every step): an exact int is checked first, then the rest
        not_int = type(step) is not int and (isinstance(step, bool) or not isinstance(step, int))
        if not_int or step < 0:
            raise DlhpcError(f"report(): step must be a non-negative int, got {step!r}")
        clean = dict(metrics)  # a copy: the caller may reuse its dict
        for name, value in clean.items():
            if type(value) is not float or type(name) is not str:  # convert (the rare path)
                clean = {str(k): float(v) for k, v in metrics.items()}
                break
        if self._metric in clean:  # read at the next checkpoint (see there)
            self._evaluated = step, clean
        writer = self._writer
        if writer is None:
            if self.spec is None:
                shown = {k: v if math.isfinite(v) else str(v) for k, v in clean.items()}
                print(f"[dlhpc] step {step}: {shown}", flush=True)
            return
        rows = self._rows
        rows.append((step, _time_ns(), clean))  # a MetricRow, into the publisher's buffer
        if len(rows) >= self.flush_every or _monotonic() >= self._flush_due:
            writer.submit()  # published by the background thread
            self._flush_due = _monotonic() + self.flush_interval_s

    def flush(self) -> None:
        """Publish every record reported so far (in order) before returning."""
        if self._writer is not None:
            self._writer.flush()
        self._flush_due = _monotonic() + self.flush_interval_s

    # -- preemption, checkpoints ----------------------------------------------

    @property
    def stop_reason(self) -> str | None:
        """Why the trial must stop (``TERM``, ``USR2``, ``searcher``), or None."""
        return self._watch.reason

    @stop_reason.setter
    def stop_reason(self, reason: str | None) -> None:
        if reason is None:
            self._watch.reason = self._watch.since = None
        else:
            self._watch.request(reason)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        watch = self._watch
        if watch.exit_requested:  # the watchdog: this script does not poll
            if not watch.exit_raised:
                watch.exit_raised = True
                raise SystemExit(REQUEUE_EXIT_CODE)
            return
        watch.request(signal.Signals(signum).name.removeprefix("SIG"))
        if self._watchdog is not None:
            self._watchdog.wake(signum)

    def owns_handler(self, signum: int) -> bool:
        """Whether this context's handler is the one installed for ``signum``."""
        return bool(signal.getsignal(signum) == self._on_signal)

    def in_charge(self) -> bool:
        """Whether this context handles the stop signals: it installed its handler and
        nothing replaced it since (a later context, a script runner or a framework that
        handles stops itself; the watchdog then stands aside)."""
        return self._installed and self.owns_handler(signal.SIGTERM)

    def should_stop(self) -> bool:
        """True once the trial was asked to stop (preemption, time limit, searcher)."""
        watch = self._watch
        watch.polled()
        if watch.reason is None and self._trial_dir is not None and self._watchdog is None:
            now = time.monotonic()
            if now - self._last_stop_check >= _STOP_FILE_EVERY_S:
                self._last_stop_check = now
                if stop_requested(self._trial_dir):
                    watch.request("searcher")
        if watch.reason is not None:
            watch.noticed = True  # the script handles it: the watchdog stands aside
            return True
        return False

    def train_state(self, **objects: Any) -> TrainState:
        """A :class:`~dlhpc.harness.state.TrainState` in this trial's checkpoint folder.

        Keyword arguments are passed on (model, optimizer, scheduler, scaler,
        generators, ...). Needs torch.
        """
        from dlhpc.harness.state import TrainState

        if self.spec is None:
            raise DlhpcError("train_state() needs a dlhpc job (no checkpoint folder outside one)")
        objects.setdefault("rank", self.rank)
        objects.setdefault("keep_latest", None)  # the reconciler's GC deletes checkpoints
        objects.setdefault("on_event", self.log)
        return TrainState(Path(self.spec.checkpoint_dir), **objects)

    def log(self, level: str, message: str) -> None:
        """A line for the trial's history (``dlhpc status``/reports) and stderr."""
        print(f"[dlhpc {level}] {message}", file=sys.stderr, flush=True)
        self.record_log(level, message)

    def record_log(self, level: str, message: str) -> None:
        """A line for the trial's history only (not printed); any thread. Published
        with the next batch (at the latest when the process exits)."""
        if self._writer is None:
            return
        if threading.get_ident() == self._owner:  # the thread that reports
            self._writer.add("log", level=level, message=message)
        else:
            self._writer.add_from_thread("log", level=level, message=message)

    def last_resort_flush(self, timeout_s: float) -> None:
        """Publish what is buffered from a thread other than the main one, waiting
        at most ``timeout_s`` (the watchdog, before it ends the process)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):  # ending the process matters more
                self._writer.submit()
                self._writer.wait_idle(timeout_s)

    def checkpoint(self, state: Saveable) -> None:
        """Publish metrics reported so far, then a checkpoint of ``state``.

        Its record carries the searcher metric's newest value reported since the
        previous checkpoint (``metric``, at report step ``metric_step``), or null
        when none was (e.g. a mid-epoch save at preemption): the checkpoint's score
        for the keep-best policy (:mod:`dlhpc.orchestrator.checkpoints`)."""
        if self._writer is not None:
            self._writer.submit()  # metrics first; written while the state is saved
        self._watch.busy += 1
        try:
            ckpt = state.save()
        finally:
            self._watch.busy -= 1
        self._progress.step = self._progress.checkpoint_step = state.step
        evaluated, self._evaluated = self._evaluated, None
        if ckpt is not None and self._writer is not None:
            value = evaluated[1][self._metric] if evaluated and self._metric else None
            self._writer.add(
                "checkpoint",
                step=ckpt.step,
                path=str(ckpt.path),
                size=ckpt.size_bytes,
                metric=value if value is not None and math.isfinite(value) else None,
                metric_step=evaluated[0] if evaluated else None,
            )
        self.flush()
        self._progress.write()

    def step(self, state: Saveable | None = None) -> None:
        """Call once per training step: keeps progress fresh and, when the trial must
        stop, checkpoints ``state`` and exits for requeue (never returns then)."""
        self.progress(state.step if state is not None else None)
        if self.should_stop():
            if state is not None:
                self.checkpoint(state)
            self.exit_for_requeue()

    def progress(self, step: int | None) -> None:
        """Note the training step (None: unchanged) for lost-work accounting; writes
        ``progress.json`` (rank 0) at most every few seconds. Never stops the trial."""
        self._progress.note(step)

    def training_started(self, step: int) -> None:
        """Note the step this attempt's training starts from: the step of the checkpoint
        it resumed, 0 for a start from scratch. ``progress.json`` carries it at once
        (``start_step``): the reconciler counts every step of the previous attempt past
        it as lost (a start below that attempt's checkpoint trains them again). Work up
        to a resumed step is saved (``checkpoint_step``)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise DlhpcError(f"training_started(): step must be a non-negative int, got {step!r}")
        self._progress.started(step)

    def exit_for_requeue(self) -> NoReturn:
        """Flush and exit with the code that tells dlhpc to run this trial again."""
        self._watch.noticed = True
        self.close()
        # A second TERM/USR2 during interpreter shutdown must not turn 75 into 128+n.
        if threading.current_thread() is threading.main_thread():
            for sig in _STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        sys.exit(REQUEUE_EXIT_CODE)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> TrialContext:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
