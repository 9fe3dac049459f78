"""The in-job Python API a training script uses (``dlhpc.init()``).

Runs on compute nodes: it never opens the database, only writes event files
through :mod:`dlhpc.protocol`. Importing it costs no torch import.

Typical use::

    import dlhpc
    with dlhpc.init() as ctx:
        lr = ctx.hparams["lr"]
        for epoch in range(ctx.max_length):
            ...
            ctx.report(epoch + 1, {"val_loss": loss, "val_accuracy": acc})
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from dlhpc.errors import DlhpcError
from dlhpc.protocol import EventWriter, TrialSpec

__all__ = ["TrialContext", "init"]

ENV_TRIAL_DIR = "DLHPC_TRIAL_DIR"
ENV_ATTEMPT_DIR = "DLHPC_ATTEMPT_DIR"


def _rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class TrialContext:
    """Facts about the running trial and the channel to report metrics.

    ``report`` buffers; records are published (atomically) every
    ``flush_every`` reports, on :meth:`flush` and on :meth:`close`. Only rank 0
    publishes metrics; other ranks' reports are dropped, so every rank may call
    it unconditionally.
    """

    def __init__(
        self,
        spec: TrialSpec | None,
        attempt_dir: Path | None,
        hparams: dict[str, Any],
        flush_every: int = 1,
    ) -> None:
        self.spec = spec
        self.hparams: dict[str, Any] = dict(hparams)
        self.rank = _rank()
        self.flush_every = max(1, flush_every)
        self._writer: EventWriter | None = None
        if attempt_dir is not None and self.rank == 0:
            self._writer = EventWriter(attempt_dir, f"user-r{self.rank}")

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
    def checkpoint_dir(self) -> Path | None:
        return Path(self.spec.checkpoint_dir) if self.spec else None

    def report(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at ``step`` (the resource unit count, e.g. epoch)."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise DlhpcError(f"report(): step must be a non-negative int, got {step!r}")
        clean: dict[str, float] = {}
        for name, value in metrics.items():
            v = float(value)
            if not math.isfinite(v):
                v = float("nan") if math.isnan(v) else v
            clean[str(name)] = v
        if self._writer is None:
            if self.spec is None:
                print(f"[dlhpc] step {step}: {clean}", flush=True)
            return
        self._writer.add("metric", step=step, metrics=clean)
        if self._writer.pending() >= self.flush_every:
            self._writer.flush()

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

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


def init(local_hparams: dict[str, Any] | None = None, flush_every: int = 1) -> TrialContext:
    """The context of the trial this process runs.

    Inside a dlhpc job the hyperparameters come from the trial's ``trial.json``.
    Outside one (a quick local run of the script) pass ``local_hparams``;
    without them this raises, rather than silently training on made-up values.
    """
    trial_dir = os.environ.get(ENV_TRIAL_DIR)
    if not trial_dir:
        if local_hparams is None:
            raise DlhpcError(
                "dlhpc.init(): not inside a dlhpc job (DLHPC_TRIAL_DIR unset); "
                "pass local_hparams={...} to run the script by hand"
            )
        return TrialContext(None, None, local_hparams, flush_every)
    spec = TrialSpec.read(Path(trial_dir) / "trial.json")
    attempt = os.environ.get(ENV_ATTEMPT_DIR)
    return TrialContext(spec, Path(attempt) if attempt else None, spec.hparams, flush_every)
