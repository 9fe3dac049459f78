"""``dlhpc.init()``: the in-job API's entry, the context of the trial this process runs.

Typical use (the few lines a script adds)::

    import dlhpc
    ctx = dlhpc.init()
    state = ctx.train_state(model=model, optimizer=opt, scheduler=sched)
    state.restore()                          # resume from the newest verified checkpoint
    while state.epoch < ctx.max_length:
        for i, batch in enumerate(batches(epoch=state.epoch)):
            if i < state.batch:
                continue                     # mid-epoch resume: skip what was trained
            ...                              # one training step
            state.batch, state.step = i + 1, state.step + 1
            ctx.step(state)                  # checkpoints and exits if preempted
        state.epoch, state.batch = state.epoch + 1, 0
        ctx.report(state.epoch, {"val_loss": ...})
        ctx.checkpoint(state)
    ctx.close()

Inside a job the worker names the trial's and the attempt's folders in the environment
(:data:`~dlhpc.protocol.TRIAL_DIR_VAR`, :data:`~dlhpc.protocol.ATTEMPT_DIR_VAR`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlhpc.errors import DlhpcError
from dlhpc.harness.context import POLL_GRACE_S, TrialContext
from dlhpc.protocol import ATTEMPT_DIR_VAR, TRIAL_DIR_VAR, TrialSpec, trial_file

__all__ = ["init"]


def init(
    local_hparams: dict[str, Any] | None = None,
    flush_every: int = 10_000,
    flush_interval_s: float = 30.0,
    poll_grace_s: float | None = POLL_GRACE_S,
) -> TrialContext:
    """The context of the trial this process runs.

    Inside a dlhpc job the hyperparameters come from the trial's ``trial.json``.
    Outside one (a quick local run of the script) pass ``local_hparams``;
    without them this raises, rather than silently training on made-up values.
    ``poll_grace_s``: how long a script that does not poll is given after a stop
    request before dlhpc ends it (see :class:`TrialContext`; None: never).
    """
    trial_dir = os.environ.get(TRIAL_DIR_VAR)
    if not trial_dir:
        if local_hparams is None:
            raise DlhpcError(
                "dlhpc.init(): not inside a dlhpc job (DLHPC_TRIAL_DIR unset); "
                "pass local_hparams={...} to run the script by hand"
            )
        return TrialContext(None, None, local_hparams, flush_every, flush_interval_s)
    spec = TrialSpec.read(trial_file(Path(trial_dir)))
    attempt = os.environ.get(ATTEMPT_DIR_VAR)
    if spec.deterministic:  # never imports torch for a script that does not use it
        from dlhpc.repro.job import set_torch_deterministic

        set_torch_deterministic(import_torch=False)
    return TrialContext(
        spec,
        Path(attempt) if attempt else None,
        spec.hparams,
        flush_every,
        flush_interval_s,
        trial_dir=Path(trial_dir),
        poll_grace_s=poll_grace_s,
    )
