"""An experiment row's stored settings, decoded and encoded: its config
(``experiments.config_json``: :func:`config_of`) and its searcher's state
(``experiments.searcher_state``: :func:`searcher_of`, :func:`state_json`).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager

from dlhpc.config.model import ExperimentConfig
from dlhpc.config.serde import from_jsonable
from dlhpc.search import BaseSearcher, make_searcher
from dlhpc.store import Experiment

__all__ = ["config_of", "searcher_of", "state_json"]


def config_of(exp: Experiment) -> ExperimentConfig:
    return from_jsonable(ExperimentConfig, json.loads(exp.config_json))


@contextmanager
def _acyclic() -> Iterator[None]:
    """Pause the cycle collector while a searcher's state is decoded or encoded: 100,000s
    of lists and tuples without cycles (reference counting frees them), whose creation
    sets off collector passes over the whole heap that cost more than the work itself
    (0.3 of 0.5 s CPU per pass at 100,000 trials, docs/BENCHMARKS.md)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def searcher_of(cfg: ExperimentConfig, state_json: str) -> BaseSearcher:
    searcher = make_searcher(cfg.hyperparameters, cfg.searcher)
    with _acyclic():
        state = json.loads(state_json or "{}")
        if state:
            searcher.load_state_dict(state)
    return searcher


def state_json(searcher: BaseSearcher) -> str:
    """The searcher's state as stored (``experiments.searcher_state``)."""
    with _acyclic():
        return json.dumps(searcher.state_dict())
