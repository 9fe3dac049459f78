"""Hyperband (Li et al., JMLR 2018), each bracket run as asynchronous successive halving.

With ``R`` rungs (:func:`~dlhpc.search._rungs.rung_lengths`), ``s_max = R-1``
and bracket ``s`` (``s = s_max .. 0``) starts ``n_s = ceil((s_max+1)/(s+1) *
divisor**s)`` configurations at ``max_length // divisor**s``: it is an ASHA
over the top ``s+1`` rungs. As in Determined's ``adaptive_asha``, brackets run
side by side and asynchronously; once all of a rung's results are in before
any of its promotions (e.g. unlimited slots), a rung of ``n`` results
promotes ``floor(n / divisor)``, the paper's synchronous table.

``mode`` picks the brackets (:func:`~dlhpc.search._rungs.hyperband_plan`):
``aggressive`` = ``s_max`` only, ``standard`` (the default) = the
``ceil((s_max+1)/2)`` most aggressive, ``conservative`` = all (the paper).
``max_trials`` is split over them in proportion to ``n_s``
(:func:`~dlhpc.search._rungs.split_trials`); conservative mode with
``max_trials = sum(n_s)`` reproduces the paper's ``n_s`` exactly.

Free slots go to promotions first (brackets from the most aggressive, rungs
from the top), then to new trials, interleaved in the paper's proportions: the
next one goes to the open bracket with the smallest ``created / n_s`` (ties: the
more aggressive), so every bracket starts within its first ``n_s`` trials and
the order does not depend on ``max_trials`` (which only caps each bracket).
Each bracket of the paper spends about the same budget, so this spreads the
compute evenly over them.
Request ids are global across brackets.
Everything else (pausing, ranking, ending) is :class:`ASHASearcher`'s.
``stop_once`` is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from fractions import Fraction

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.config.searcher_rules import Report
from dlhpc.search._asha import ASHASearcher
from dlhpc.search._rungs import HYPERBAND_MODES, BracketPlan, hyperband_plan

__all__ = ["HyperbandSearcher"]


class HyperbandSearcher(ASHASearcher):
    """Hyperband over asynchronous brackets; :attr:`brackets` is the plan."""

    kind = "hyperband"
    # It knows stop_once (a rung searcher) but refuses it, naming the ones that take it.
    options = frozenset({"mode", "min_length", "stop_once", "proposer", "max_budget"})

    @classmethod
    def check_settings(
        cls, config: SearcherConfig, space: Mapping[str, HParam], report: Report
    ) -> SearcherConfig:
        """Refuses ``stop_once``; ``mode`` defaults to ``standard``; the proposer's and the
        budget's rules as ASHA's."""
        if config.stop_once:
            report.add(
                ("searcher", "stop_once"), "only applies to 'sha' and 'asha', not 'hyperband'"
            )
        config = super().check_settings(config, space, report)
        return dataclasses.replace(config, mode=config.mode or "standard")

    def _check_mode(self, config: SearcherConfig) -> None:
        if config.stop_once:
            raise ValueError("hyperband searcher: 'stop_once' only applies to sha and asha")
        if config.mode is not None and config.mode not in HYPERBAND_MODES:
            raise ValueError(
                f"hyperband searcher: mode must be one of {', '.join(HYPERBAND_MODES)}, "
                f"got {config.mode!r}"
            )

    @property
    def mode(self) -> str:
        """The bracket mode (``standard`` when the config gives none)."""
        return self.config.mode or "standard"

    def _plan(self, lengths: list[int]) -> list[BracketPlan]:
        return hyperband_plan(lengths, self.config.divisor, self.mode, self.config.max_trials)

    def _pick(self, open_: list[int]) -> int:
        """The open bracket with the smallest ``created / n_s`` (ties: the more aggressive)."""
        plans = self.brackets
        return min(open_, key=lambda i: (Fraction(self._b[i].created, plans[i].paper_trials), i))
