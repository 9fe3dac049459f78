"""The compare page's model: plain frozen dataclasses (built by
:func:`dlhpc.report.compare.load_compare`, rendered by :mod:`dlhpc.report._compare_html`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlhpc.report._page_data import HParamView, TrialView

__all__ = ["CompareData", "Row", "Side"]


@dataclass(frozen=True)
class Row:
    """One line of a side-by-side table: ``values`` has one shown text per side."""

    group: str  # "summary", "space", "value", "best trial", or a record section
    name: str
    values: tuple[str, ...]

    @property
    def differs(self) -> bool:
        return len(set(self.values)) > 1


@dataclass(frozen=True)
class Side:
    """One compared experiment (all its trials) or one compared trial."""

    key: str  # "experiment 3" or "trial 12"
    experiment_id: int
    experiment_name: str
    metric: str
    smaller_is_better: bool
    state: str  # the experiment's, or the trial's in trial mode
    searcher: str
    trials: tuple[TrialView, ...]  # every trial (experiment mode) or the one trial
    best: TrialView | None  # the best of ``trials``
    space: Mapping[str, Any]  # the experiment's hyperparameter space (redacted config)
    record_trial: int | None  # whose reproducibility record is compared


@dataclass(frozen=True)
class CompareData:
    mode: str  # "experiments" or "trials"
    sides: tuple[Side, ...]
    hparams: tuple[HParamView, ...]  # the parallel-coordinates axes, over every trial
    summary: tuple[Row, ...]
    hparam_rows: tuple[Row, ...]
    record_rows: tuple[Row, ...]
    record_note: str  # which records were compared, and what was left out
    generated: float
