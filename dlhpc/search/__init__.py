"""Hyperparameter searchers: pure ask/tell objects (see :mod:`dlhpc.search.base`).

One algorithm per private module; this is the public surface. Build one with
:func:`make_searcher` from the experiment's space and searcher config; ask a
searcher's class by name with :func:`searcher_class` (:mod:`dlhpc.search.plugins`: the
built-ins and the installed packages' searchers).
"""

from dlhpc.search._asha import ASHASearcher
from dlhpc.search._bayes import BayesSearcher
from dlhpc.search._grid import MAX_GRID_SIZE, GridSearcher
from dlhpc.search._hyperband import HyperbandSearcher
from dlhpc.search._random import RandomSearcher
from dlhpc.search._rungs import BracketPlan, hyperband_plan, rung_lengths
from dlhpc.search._sha import SHASearcher
from dlhpc.search._single import SingleSearcher
from dlhpc.search._space import default_value, grid_points, sample
from dlhpc.search.base import BaseSearcher, Continue, Create, Operation, Stop
from dlhpc.search.plugins import (
    SearcherTable,
    expected_trials,
    make_searcher,
    rung_plan,
    searcher_class,
    searcher_names,
)

__all__ = [
    "MAX_GRID_SIZE",
    "ASHASearcher",
    "BaseSearcher",
    "BayesSearcher",
    "BracketPlan",
    "Continue",
    "Create",
    "GridSearcher",
    "HyperbandSearcher",
    "Operation",
    "RandomSearcher",
    "SHASearcher",
    "SearcherTable",
    "SingleSearcher",
    "Stop",
    "default_value",
    "expected_trials",
    "grid_points",
    "hyperband_plan",
    "make_searcher",
    "rung_lengths",
    "rung_plan",
    "sample",
    "searcher_class",
    "searcher_names",
]
