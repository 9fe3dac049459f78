"""An experiment row's stored settings, decoded and encoded: its config
(``experiments.config_json``: :func:`config_of`) and its searcher's state
(``experiments.searcher_state``: :func:`searcher_of`, :func:`state_json`).
"""

from __future__ import annotations

import json

import orjson

from dlhpc.config.schema import ExperimentConfig
from dlhpc.config.serde import from_jsonable
from dlhpc.search import BaseSearcher, make_searcher
from dlhpc.store import Experiment

__all__ = ["config_of", "searcher_of", "state_json"]


def config_of(exp: Experiment) -> ExperimentConfig:
    """The experiment's config as launched (it never changes after launch)."""
    return from_jsonable(ExperimentConfig, json.loads(exp.config_json))


def searcher_of(cfg: ExperimentConfig, state_json: str) -> BaseSearcher:
    """The experiment's searcher, restored from its stored state (``""`` or ``"{}"``: new)."""
    searcher = make_searcher(cfg.hyperparameters, cfg.searcher)
    state = orjson.loads(state_json or "{}")
    if state:
        searcher.load_state_dict(state)
    return searcher


def state_json(searcher: BaseSearcher) -> str:
    """The searcher's state as stored (``experiments.searcher_state``): compact JSON.
    orjson would write a NaN or infinite float as ``null``: by the searcher contract a
    state holds none (:mod:`dlhpc.search.base`)."""
    return orjson.dumps(searcher.state_dict()).decode()
