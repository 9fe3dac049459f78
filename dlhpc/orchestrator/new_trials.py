"""New trials: a searcher's ``Create`` operations recorded as PENDING trial rows.

Launch records the first ones, the tick's decide step the ones its searcher asks
for later (:class:`~dlhpc.orchestrator.decide.SearchPass`); both through
:func:`add_trials`, which gives each its seed (:func:`trial_seed`) and its run
folder. The rows carry no job: the submit step (:mod:`dlhpc.orchestrator.submit`)
sends them.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from dlhpc.config.schema import ExperimentConfig
from dlhpc.orchestrator.clock import not_before
from dlhpc.protocol import recorded_slug, trial_dir
from dlhpc.search import Create
from dlhpc.states import TrialState
from dlhpc.store import Experiment, Trial

__all__ = ["add_trials", "trial_seed"]


def trial_seed(experiment_seed: int, request_id: int) -> int:
    """A per-trial seed derived from the experiment seed (stable across versions)."""
    return (experiment_seed * 1_000_003 + request_id * 7_919 + 12_345) % (2**31 - 1)


def add_trials(
    session: Session,
    exp: Experiment,
    creates: list[Create],
    cfg: ExperimentConfig,
    runs_root: Path,
    now: datetime,
) -> list[Trial]:
    """Record new PENDING trials for the searcher's Create operations, their run folders
    in ``exp``'s (named as recorded: :func:`~dlhpc.protocol.recorded_slug`), created
    ``now`` or, when ``exp`` was recorded later (another login node's clock), then."""
    created = not_before(now, exp.created_at)
    trials = [
        Trial(
            experiment_id=exp.id,
            request_id=op.request_id,
            state=TrialState.PENDING.value,
            hparams_json=json.dumps(op.hparams, sort_keys=True),
            max_length=op.length,
            seed=(
                cfg.reproducibility.trial_seed  # dlhpc reproduce: the original trial's
                if cfg.reproducibility.trial_seed is not None
                else trial_seed(cfg.reproducibility.seed, op.request_id)
            ),
            run_dir="",
            created_at=created,
        )
        for op in creates
    ]
    session.add_all(trials)
    session.flush()
    slug = recorded_slug(exp.id, exp.run_dir)
    for t in trials:
        t.run_dir = str(trial_dir(runs_root, exp.id, t.id, slug))
    return trials
