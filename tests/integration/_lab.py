"""Two finished experiments on the dev cluster, shared by the lab tests
(tags, notes, the model registry, compare, TensorBoard, the lab index).

Made once per test session by the ``finished_lab`` fixture (``conftest.py``), so the
tests that read them do not each pay for a search. A test may add tags, notes, model
versions and pages to it, and may run checkpoint GC on ``grid_id``; it must not kill,
relaunch or delete either experiment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlhpc.states import TERMINAL_EXPERIMENT_STATES

__all__ = ["FinishedLab", "finish_two_experiments"]


@dataclass(frozen=True)
class FinishedLab:
    """``cli`` runs dlhpc with the lab's DLHPC_HOME; ``grid_id`` is the digits grid
    example (4 trials x 5 steps), ``random_id`` the digits random example (8 trials x
    5 steps); both COMPLETED, every trial with a checkpoint per step until GC."""

    cli: Any  # tests.integration.conftest.Cli (imported there: no cycle)
    grid_id: int
    random_id: int


def finish_two_experiments(cli: Any, grid_yaml: str, random_yaml: str) -> FinishedLab:
    """Launch both examples at once and tick until both have ended; raise if either
    did not complete."""
    grid_id = int(cli.json("launch", grid_yaml)["experiment_id"])
    random_id = int(cli.json("launch", random_yaml)["experiment_id"])
    for exp_id in (grid_id, random_id):
        exp = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL_EXPERIMENT_STATES, 600)
        if exp["state"] != "COMPLETED":
            raise AssertionError(f"experiment {exp_id} ended {exp['state']}: {exp}")
    return FinishedLab(cli=cli, grid_id=grid_id, random_id=random_id)
